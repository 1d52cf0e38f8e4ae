//! Unified-IO 2 XXL (Lu et al., CVPR 2024): frozen image and audio ViTs, a text embedding and
//! an encoder–decoder backbone.
//!
//! The paper counts 5 encoders and 3 decoders (§2.1). Table 1, whose modules we reproduce,
//! trains four: the image ViT, the audio ViT, the text embedding and the 48-layer backbone. The
//! image- and audio-history resamplers only run on multi-frame histories (not in Table 2's
//! inputs), and the three decoders are the backbone's decoder stack (counted in `llm`) plus
//! frozen VQGAN / ViT-VQGAN detokenisers that only turn predicted codes into pixels or
//! waveforms at inference; we assume training targets are tokenised during data preparation.

use crate::spec::{ModelSpec, ModuleSpec, Role};

const SOURCE: &str = "allenai/unified-io-2.pytorch uio2/config.py";

/// Unified-IO 2: `vision`, `audio`, `text` → `llm`.
pub fn unified_io_2() -> ModelSpec {
    // Table 2: image 512×512; ImageVitFeatureConfig.patch_size 16 → 32×32 + CLS.
    let patches = (512 / 16) * (512 / 16);
    let vision = ModuleSpec::new("vision", Role::Encoder)
        // ImageVitFeatureConfig: emb_dim 768, num_heads 12, num_layers 11, mlp_dim 3072, gelu;
        // Config.freeze_vit = True.
        .stack(11, 768, 12, 3072)
        .frozen()
        .tokens(
            patches + 1,
            "image 512×512 RGB (Table 2), patch 16 → 32×32 + CLS = 1025 tokens",
        )
        .matmul("patch embedding 3×16×16 → 768", 3 * 16 * 16 * 768, patches)
        .paper(11, 768, 1.48, 24.6)
        .source(SOURCE);
    // AUDIO_INPUT_SIZE [256, 128] spectrogram per AUDIO_SEGMENT_LENGTH 4.08 s, patch 16 →
    // 16×8 = 128 patches per segment; Table 2's 8 s → 2 segments, each with a CLS.
    let audio_tokens = 2 * (128 + 1);
    let audio = ModuleSpec::new("audio", Role::Encoder)
        // AudioVitFeatureConfig: same shape as the image ViT; frozen with it (freeze_vit).
        .stack(11, 768, 12, 3072)
        .frozen()
        .tokens(
            audio_tokens,
            "audio 16 kHz 8 s (Table 2) → 2 spectrogram segments of 4.08 s × 128 patches + CLS",
        )
        .matmul("patch embedding 16×16 → 768", 16 * 16 * 768, 2 * 128)
        .paper(11, 768, 1.06, 21.8)
        .source(SOURCE);
    let text_tokens = 2048; // Table 2 (the released MAX_TEXT_LEN is 512)
    let text = ModuleSpec::new("text", Role::Embedding)
        // T5Config.vocab_size 33280; XXL emb_dim 3072. Table 1 counts the table as 1 layer.
        .width(3072)
        .tokens(text_tokens, "text 2048 tokens (Table 2)")
        .lookup("token embedding 33280 × 3072", 33280 * 3072, text_tokens)
        .paper(1, 3072, 0.10, 4.5)
        .source(SOURCE);
    // Encoder input: the text, image and audio tokens together.
    let enc_tokens = text_tokens + patches + 2 * 128;
    // T5Config.decoder_max_image_length 1024 (the longest target: a 256×256 image as 32×32
    // VQGAN codes); we size every target at it.
    let dec_tokens = 1024;
    let llm = ModuleSpec::new("llm", Role::Backbone)
        // XXL: emb_dim 3072, num_heads 24 (head_dim 128), num_encoder_layers 24,
        // num_decoder_layers 24, mlp_dim 8192, mlp_activations ('silu', 'linear') = SwiGLU.
        // Table 1: 48 layers × 3072 — the same layers. (Table 1's "3.8B" cannot hold 48 layers
        // of this width; the released XXL is 6.8B, which is what these shapes give.)
        .stack(24, 3072, 24, 8192)
        .gated()
        .decoder(24, dec_tokens)
        .tokens(
            enc_tokens,
            "encoder: 2048 text + 1024 image + 256 audio = 3328; decoder: 1024 target tokens",
        )
        .matmul("image feature projection 768 → 3072", 768 * 3072, patches)
        .matmul("audio feature projection 768 → 3072", 768 * 3072, 2 * 128)
        // T5Config.image_vocab_size 16512, audio_vocab_size 8320: target-code embeddings.
        .lookup(
            "image target embedding 16512 × 3072",
            16512 * 3072,
            dec_tokens,
        )
        .lookup("audio target embedding 8320 × 3072", 8320 * 3072, 0)
        // logits_via_embedding = True: the output layer reuses the text embedding.
        .head("text logits 3072 → 33280", 33280, dec_tokens, true)
        .after(&["vision", "audio", "text"])
        .paper(48, 3072, 16.70, 110.5)
        .source(SOURCE);
    ModelSpec::new(
        "unified-io-2",
        "Unified-IO 2 XXL (Lu et al. 2024; allenai/unified-io-2.pytorch): frozen image and audio \
         ViTs, text embedding, 24+24-layer encoder-decoder backbone",
        vec![vision, audio, text, llm],
    )
}
