//! Qwen3-VL-8B (Bai et al., 2025): a ViT and a text embedding feeding the Qwen3-8B LLM.

use crate::spec::{ModelSpec, ModuleSpec, Role};

const VISION_SOURCE: &str = "Qwen/Qwen3-VL-8B-Instruct config.json (vision_config)";
const LLM_SOURCE: &str = "Qwen/Qwen3-8B config.json (the text model of Qwen3-VL-8B)";

/// Qwen3-VL-8B: `vision`, `text` → `llm` (the paper's Fig. 1b).
pub fn qwen3_vl() -> ModelSpec {
    // Table 2: image 512×512. vision_config.patch_size 16, temporal_patch_size 2 (an image is
    // two identical frames: one temporal patch) → 32×32 = 1024 patches; spatial_merge_size 2
    // merges 2×2 patches → 256 visual tokens for the LLM.
    let patches = (512 / 16) * (512 / 16);
    let visual_tokens = patches / 4;
    let text_tokens = 2048; // Table 2
    let vision = ModuleSpec::new("vision", Role::Encoder)
        // vision_config: depth 27, hidden_size 1152, num_heads 16, intermediate_size 4304
        // (gelu_pytorch_tanh MLP, two matrices). Table 1 lists dim 4096 for this module: that is
        // out_hidden_size, the merger's output; a 27-layer ViT 4096 wide would alone hold ~5B
        // parameters, more than Table 1's 8.1B model allows, so we keep the released 1152.
        .stack(27, 1152, 16, 4304)
        .tokens(
            patches,
            "image 512×512 RGB (Table 2), 2×16×16 patches → 32×32 = 1024 tokens",
        )
        .matmul(
            "patch embedding 3×2×16×16 → 1152",
            3 * 2 * 16 * 16 * 1152,
            patches,
        )
        // vision_config.num_position_embeddings 2304.
        .lookup("position embedding 2304 × 1152", 2304 * 1152, patches)
        // The merger and the 3 DeepStack mergers (deepstack_visual_indexes [8, 16, 24]) each
        // map 4 merged patches (4 × 1152 = 4608) through 4608 → 4608 → out_hidden_size 4096.
        .matmul(
            "merger + 3 DeepStack mergers, 4608 → 4608 → 4096 each",
            4 * (4608 * 4608 + 4608 * 4096),
            visual_tokens,
        )
        .paper(27, 4096, 2.58, 82.4)
        .source(VISION_SOURCE);
    let text = ModuleSpec::new("text", Role::Embedding)
        // Qwen3-8B: vocab_size 151936, hidden_size 4096; Table 1 counts the table as 1 layer.
        .width(4096)
        .tokens(text_tokens, "text 2048 tokens (Table 2)")
        .lookup("token embedding 151936 × 4096", 151936 * 4096, text_tokens)
        .paper(1, 4096, 0.15, 2.1)
        .source(LLM_SOURCE);
    let seq = text_tokens + visual_tokens;
    let llm = ModuleSpec::new("llm", Role::Backbone)
        // Qwen3-8B: num_hidden_layers 36, hidden_size 4096, num_attention_heads 32,
        // num_key_value_heads 8 (head_dim 128), intermediate_size 12288, SwiGLU.
        .stack(36, 4096, 32, 12288)
        .gqa(8)
        .gated()
        .causal()
        .tokens(seq, "2048 text + 256 visual tokens = 2304")
        // Qwen3-8B tie_word_embeddings false: the LM head is its own 151936 × 4096 matrix.
        .head("LM head 4096 → 151936", 151936, seq, false)
        .after(&["vision", "text"])
        .paper(36, 4096, 22.27, 145.2)
        .source(LLM_SOURCE);
    ModelSpec::new(
        "qwen3-vl",
        "Qwen3-VL-8B (Bai et al. 2025; Qwen/Qwen3-VL-8B-Instruct): 27-layer ViT and text \
         embedding feeding the Qwen3-8B LLM",
        vec![vision, text, llm],
    )
}
