//! CLIP ViT-L/14 (Radford et al., ICML 2021): two encoders aligned by a contrastive head.

use crate::spec::{ModelSpec, ModuleSpec, Role};

const SOURCE: &str = "openai/clip-vit-large-patch14 config.json";

/// CLIP ViT-L/14: `vision`, `text` → `align` (the paper's Fig. 3: V, T and A).
pub fn clip() -> ModelSpec {
    // Table 2: image 512×512; ViT-L/14 cuts 14-pixel patches: 36×36 (512/14 floored) + CLS.
    let patches = (512 / 14) * (512 / 14);
    let vision = ModuleSpec::new("vision", Role::Encoder)
        // config.json vision_config: num_hidden_layers 24, hidden_size 1024,
        // num_attention_heads 16, intermediate_size 4096 (quick_gelu MLP, two matrices).
        .stack(24, 1024, 16, 4096)
        .tokens(
            patches + 1,
            "image 512×512 RGB (Table 2), patch 14 → 36×36 + CLS = 1297 tokens",
        )
        .matmul(
            "patch embedding 3×14×14 → 1024",
            3 * 14 * 14 * 1024,
            patches,
        )
        .lookup(
            "position embedding",
            (patches as u64 + 1) * 1024,
            patches + 1,
        )
        .source(SOURCE);
    let text = ModuleSpec::new("text", Role::Encoder)
        // config.json text_config: num_hidden_layers 12, hidden_size 768,
        // num_attention_heads 12, intermediate_size 3072; causal mask (Radford et al. §2.4).
        .stack(12, 768, 12, 3072)
        .causal()
        .tokens(
            2048,
            "text 2048 tokens (Table 2; the released position table has 77 entries, assumed extended)",
        )
        // config.json text_config.vocab_size 49408.
        .lookup("token embedding 49408 × 768", 49408 * 768, 2048)
        .lookup("position embedding 2048 × 768", 2048 * 768, 2048)
        .source(SOURCE);
    let align = ModuleSpec::new("align", Role::Head)
        // config.json projection_dim 768: both towers project into a 768-d joint space.
        .width(768)
        .tokens(
            1,
            "one pooled feature per modality and sample; InfoNCE over the batch",
        )
        .matmul("visual projection 1024 → 768", 1024 * 768, 1)
        .matmul("text projection 768 → 768", 768 * 768, 1)
        .after(&["vision", "text"])
        .source(SOURCE);
    ModelSpec::new(
        "clip",
        "CLIP ViT-L/14 (Radford et al. 2021; openai/clip-vit-large-patch14): vision and text \
         encoders aligned by a contrastive head",
        vec![vision, text, align],
    )
}
