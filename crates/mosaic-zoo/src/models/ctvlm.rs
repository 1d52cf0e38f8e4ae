//! CTVLM: Collaborative Training of Tiny-Large Vision Language Models (Lu et al., ACM MM 2024),
//! the paper's sixth workload (§5.1 cites it as "Lu et al., 2024b").
//!
//! Its abstract describes a large and a tiny VLM "connected via a projection layer", the tiny
//! model aligning image-text features and knowledge distillation between the two; no
//! architecture or code is public. Every module here is therefore **assumed**: a LLaVA-1.5-style
//! large VLM (a frozen CLIP ViT-L/14 and Llama-2-7B), a TinyLLaVA-style tiny VLM (SigLIP-B/16
//! and TinyLlama-1.1B), the projection layer as a LLaVA-style 2-layer MLP from the tiny
//! vision features into the large LM, and a distillation head between the two LMs' logits.

use crate::spec::{ModelSpec, ModuleSpec, Role};

/// CTVLM: `large-vision`, `tiny-vision` → `bridge`, `tiny-lm` → `large-lm` → `distill`.
pub fn ctvlm() -> ModelSpec {
    let text = 2048; // Table 2
                     // Assumed CLIP ViT-L/14 (openai/clip-vit-large-patch14 config.json: 24 layers, hidden 1024,
                     // 16 heads, MLP 4096) on Table 2's 512×512 image: 36×36 patches + CLS; frozen as in
                     // LLaVA-1.5's recipe.
    let large_patches = (512 / 14) * (512 / 14);
    let large_vision = ModuleSpec::new("large-vision", Role::Encoder)
        .stack(24, 1024, 16, 4096)
        .frozen()
        .tokens(
            large_patches + 1,
            "image 512×512 (Table 2), patch 14 → 36×36 + CLS = 1297",
        )
        .matmul(
            "patch embedding 3×14×14 → 1024",
            3 * 14 * 14 * 1024,
            large_patches,
        )
        .assumed()
        .source("assumed: CLIP ViT-L/14 (openai/clip-vit-large-patch14 config.json)");
    // Assumed SigLIP-B/16 at 512 px (google/siglip-base-patch16-512 config.json: 12 layers,
    // hidden 768, 12 heads, MLP 3072): 32×32 patches.
    let tiny_patches = (512 / 16) * (512 / 16);
    let tiny_vision = ModuleSpec::new("tiny-vision", Role::Encoder)
        .stack(12, 768, 12, 3072)
        .tokens(
            tiny_patches,
            "image 512×512 (Table 2), patch 16 → 32×32 = 1024",
        )
        .matmul(
            "patch embedding 3×16×16 → 768",
            3 * 16 * 16 * 768,
            tiny_patches,
        )
        .assumed()
        .source("assumed: SigLIP-B/16-512 (google/siglip-base-patch16-512 config.json)");
    // Assumed: the tiny→large projection layer as LLaVA-1.5's mlp2x_gelu, 768 → 4096 → 4096.
    let bridge = ModuleSpec::new("bridge", Role::Head)
        .width(4096)
        .tokens(tiny_patches, "the tiny model's 1024 visual tokens")
        .matmul(
            "projection 768 → 4096 → 4096",
            768 * 4096 + 4096 * 4096,
            tiny_patches,
        )
        .after(&["tiny-vision"])
        .assumed()
        .source("assumed: CTVLM's projection layer as a LLaVA-1.5 mlp2x_gelu projector");
    let tiny_seq = text + tiny_patches;
    // Assumed TinyLlama-1.1B (TinyLlama/TinyLlama-1.1B config.json: 22 layers, hidden 2048,
    // 32 heads, 4 kv heads, intermediate 5632 SwiGLU, vocab 32000, untied head).
    let tiny_lm = ModuleSpec::new("tiny-lm", Role::Backbone)
        .stack(22, 2048, 32, 5632)
        .gqa(4)
        .gated()
        .causal()
        .tokens(tiny_seq, "2048 text + 1024 visual tokens = 3072")
        .matmul(
            "vision projector 768 → 2048 → 2048",
            768 * 2048 + 2048 * 2048,
            tiny_patches,
        )
        .lookup("token embedding 32000 × 2048", 32000 * 2048, text)
        .head("LM head 2048 → 32000", 32000, tiny_seq, false)
        .after(&["tiny-vision"])
        .assumed()
        .source("assumed: TinyLlama-1.1B (TinyLlama/TinyLlama-1.1B config.json)");
    let large_seq = text + large_patches;
    // Assumed Llama-2-7B (meta-llama/Llama-2-7b-hf config.json: 32 layers, hidden 4096, 32
    // heads, intermediate 11008 SwiGLU, vocab 32000, untied head).
    let large_lm = ModuleSpec::new("large-lm", Role::Backbone)
        .stack(32, 4096, 32, 11008)
        .gated()
        .causal()
        .tokens(large_seq, "2048 text + 1296 visual tokens = 3344")
        .matmul(
            "vision projector 1024 → 4096 → 4096",
            1024 * 4096 + 4096 * 4096,
            large_patches,
        )
        .lookup("token embedding 32000 × 4096", 32000 * 4096, text)
        .head("LM head 4096 → 32000", 32000, large_seq, false)
        .after(&["large-vision", "bridge"])
        .assumed()
        .source("assumed: Llama-2-7B (meta-llama/Llama-2-7b-hf config.json)");
    // Assumed: a KL loss between the two LMs' 32000-way distributions on the text tokens.
    let distill = ModuleSpec::new("distill", Role::Head)
        .width(4096)
        .tokens(text, "2048 text positions of both LMs' logits")
        .loss("KL(large ‖ tiny) over 32000 classes", 32000, text)
        .after(&["tiny-lm", "large-lm"])
        .assumed()
        .source("assumed: knowledge distillation between the LMs (CTVLM abstract)");
    ModelSpec::new(
        "ctvlm",
        "CTVLM, collaborative training of tiny-large VLMs (Lu et al. 2024, ACM MM): ASSUMED \
         LLaVA-style large (ViT-L/14 + Llama-2-7B) and tiny (SigLIP-B + TinyLlama) VLMs, a \
         projection bridge and a distillation head",
        vec![
            large_vision,
            tiny_vision,
            bridge,
            tiny_lm,
            large_lm,
            distill,
        ],
    )
}
