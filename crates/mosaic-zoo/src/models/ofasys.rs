//! OFASys (Bai et al., 2022): modality adaptors around the OFA universal model.
//!
//! The paper's OFASys has 9 encoder modules (§5.2) and the family 6 decoders (§2.1); Table 2
//! lists exactly nine input modalities, so we give each one an encoder: text, image (`vision`),
//! video, audio, depth, thermal, IMU (§5.2 names an IMU module), action and box. Table 1 fixes
//! the shapes it lists — the universal model (36 layers × 1280, i.e. OFA-huge's 24 encoder +
//! 12 decoder layers) and the vision (8), text (4) and audio (6 layers) encoders, all 1280 wide
//! — and we give every encoder OFA-huge's heads (16) and MLP (5120). The other six encoders are
//! not published and are marked assumed: sized by their input (the depth of Table 1's smallest
//! encoder, 4 layers, for the image-like depth and thermal maps and the 4096-token video; 2
//! layers for the low-rate IMU and action streams; 1 for the 4 box coordinates). Of the six
//! decoders we keep the two that are modules of their own in the OFASys code (the speech
//! decoder of `audio.py` and the motion decoder of `motion_6d.py`); text, box and image-code
//! outputs are the universal model's own output projection.

use crate::spec::{ModelSpec, ModuleSpec, Role};

/// OFA-huge (ofa_huge_architecture in OFA-Sys' ofa.py): encoder_embed_dim 1280,
/// encoder_ffn_embed_dim 4 × 1280, 16 attention heads; GELU MLP with two matrices.
const HIDDEN: u32 = 1280;
const HEADS: u32 = 16;
const FFN: u32 = 4 * 1280;
/// OFA's dictionary (computed): 50265 BPE entries (the BART/GPT-2 dictionary) + 1000 location
/// bins (num_bins) + 8192 VQGAN image codes (code_dict_size).
const VOCAB: u32 = 50265 + 1000 + 8192;
const OFA_SOURCE: &str = "ofa_huge_architecture (OFA-Sys ofa.py); layers per Mosaic Table 1";

/// OFA adds relative-position biases to the attention logits of every layer (`attn_bias` /
/// `self_attn_bias` in its MultiheadAttention and in the adaptors' `get_rel_pos_bias`), so the
/// score matrix is materialised: no fused FlashAttention kernel.
fn encoder(name: &str, layers: u32) -> ModuleSpec {
    ModuleSpec::new(name, Role::Encoder)
        .stack(layers, HIDDEN, HEADS, FFN)
        .unfused_attention()
}

/// The text adaptor + 4 transformer layers (Table 1).
fn text() -> ModuleSpec {
    encoder("text", 4)
        .tokens(2048, "text 2048 tokens (Table 2)")
        .lookup(
            "token embedding (shared with the universal model's output)",
            VOCAB as u64 * HIDDEN as u64,
            2048,
        )
        .paper(4, 1280, 0.72, 12.5)
        .source(OFA_SOURCE)
}

/// The image adaptor (`image_vit.py`: patches) + 8 transformer layers (Table 1).
fn vision() -> ModuleSpec {
    let patches = (512 / 16) * (512 / 16);
    encoder("vision", 8)
        .tokens(
            patches,
            "image 512×512 RGB (Table 2), patch 16 → 32×32 = 1024 tokens",
        )
        .matmul(
            "patch embedding 3×16×16 → 1280",
            3 * 16 * 16 * HIDDEN as u64,
            patches,
        )
        .paper(8, 1280, 1.35, 18.2)
        .source(OFA_SOURCE)
}

/// The audio adaptor (`audio.py`: 80-d fbank, Conv2dSubsampling4) + 6 layers (Table 1).
fn audio() -> ModuleSpec {
    // AudioFbankAdaptorConfig.output_frame_dim 80; Table 2: 16 kHz 8 s → 800 frames at a
    // 10 ms hop. Conv2dSubsampling4: two 3×3 stride-2 convs → time ((800−1)/2−1)/2 = 199,
    // frequency ((80−1)/2−1)/2 = 19, then Linear(1280·19 → 1280).
    let (t1, f1) = ((800 - 1) / 2, (80 - 1) / 2);
    let (t2, f2) = ((t1 - 1) / 2, (f1 - 1) / 2);
    let h = HIDDEN as u64;
    encoder("audio", 6)
        .tokens(
            t2,
            "audio 16 kHz 8 s (Table 2) → 80-d fbank × 800 frames → subsampled 4× → 199",
        )
        .matmul("subsampling conv 1 → 1280, 3×3", 9 * h, t1 * f1)
        .matmul("subsampling conv 1280 → 1280, 3×3", 9 * h * h, t2 * f2)
        .matmul("subsampling linear 1280·19 → 1280", h * f2 as u64 * h, t2)
        .paper(6, 1280, 0.95, 14.8)
        .source("ofasys/adaptor/audio.py (Conv2dSubsampling4); layers per Mosaic Table 1")
}

/// The OFA universal model: 24 encoder + 12 decoder layers (Table 1: 36 × 1280).
fn llm(after: &[&str]) -> ModuleSpec {
    // OFA: max_source_positions 1024, max_target_positions 1024. The adaptors' outputs are
    // packed into at most 1024 source tokens; targets take up to 1024 tokens (a 512×512 image
    // is 32×32 VQGAN codes).
    ModuleSpec::new("llm", Role::Backbone)
        .stack(24, HIDDEN, HEADS, FFN)
        .unfused_attention()
        .decoder(12, 1024)
        .tokens(
            1024,
            "1024 packed source tokens (OFA max_source_positions); 1024 target tokens",
        )
        .head("output projection 1280 → 59457", VOCAB, 1024, true)
        .after(after)
        .paper(36, 1280, 4.80, 41.6)
        .source(OFA_SOURCE)
}

/// The OFASys family as the paper evaluates it: 9 encoders, the universal model, 2 decoders.
pub fn ofasys() -> ModelSpec {
    let h = HIDDEN as u64;
    // Assumed: ViViT-style tubelets of 2 frames × 32×32 pixels keep Table 2's 32 frames of
    // 512×512 at 16 × 16×16 = 4096 tokens (per-frame 16-pixel patches would give 32768).
    let video = encoder("video", 4)
        .tokens(
            4096,
            "video 32 frames × 512×512 (Table 2), tubelets 2×32×32 → 16×16×16 = 4096",
        )
        .matmul(
            "tubelet embedding 3×2×32×32 → 1280",
            3 * 2 * 32 * 32 * h,
            4096,
        )
        .assumed()
        .source("assumed (OFASys video adaptor, tubelet size ours)");
    let depth = encoder("depth", 4)
        .tokens(
            196,
            "depth 224×224 (Table 2), 1 channel, patch 16 → 14×14 = 196",
        )
        .matmul("patch embedding 1×16×16 → 1280", 16 * 16 * h, 196)
        .assumed()
        .source("assumed (shape of Table 1's smallest OFASys encoder)");
    let thermal = encoder("thermal", 4)
        .tokens(
            256,
            "thermal 256×256 (Table 2), 1 channel, patch 16 → 16×16 = 256",
        )
        .matmul("patch embedding 1×16×16 → 1280", 16 * 16 * h, 256)
        .assumed()
        .source("assumed (shape of Table 1's smallest OFASys encoder)");
    let imu = encoder("imu", 2)
        .tokens(
            100,
            "IMU 6 axes × 100 Hz × 8 s (Table 2), windows of 8 steps → 100",
        )
        .matmul("window projection 6×8 → 1280", 48 * h, 100)
        .assumed()
        .source("assumed (windowing as ImageBind's IMU stem)");
    let action = encoder("action", 2)
        .tokens(256, "action sequence 256 tokens (Table 2)")
        .lookup("action-bin embedding 256 × 1280", 256 * h, 256)
        .assumed()
        .source("assumed");
    let boxes = encoder("box", 1)
        .tokens(
            4,
            "box (x1, y1, x2, y2) (Table 2) as 4 of OFA's 1000 location bins",
        )
        .lookup("location-bin embedding 1000 × 1280", 1000 * h, 4)
        .assumed()
        .source("assumed (OFA location tokens, num_bins 1000)");
    // audio.py AudioFbankAdaptorConfig: feat_proj Linear(1280 → 80); postnet of postnet_layers
    // 5 Conv1d with postnet_conv_dim 512, postnet_conv_kernel_size 5 (80 → 512 ×4 → 80).
    let speech = ModuleSpec::new("speech-decoder", Role::Decoder)
        .width(HIDDEN)
        .tokens(
            800,
            "8 s of 80-d fbank frames at a 10 ms hop (Table 2 audio) → 800",
        )
        .matmul("feat_proj 1280 → 80", h * 80, 800)
        .matmul(
            "postnet 5 × Conv1d k5: 80 → 512 → 512 → 512 → 512 → 80",
            5 * (2 * 80 * 512 + 3 * 512 * 512),
            800,
        )
        .after(&["llm"])
        .source("ofasys/adaptor/audio.py (AudioFbankAdaptor decoder side)");
    // motion_6d.py: frame_decoder Linear(1280 → 1280), GELU, Linear(1280 → max_data_dim 512).
    let motion = ModuleSpec::new("motion-decoder", Role::Decoder)
        .width(HIDDEN)
        .tokens(256, "256 motion frames (assumed: Table 2's action length)")
        .matmul("frame_decoder 1280 → 1280 → 512", h * h + h * 512, 256)
        .after(&["llm"])
        .source("ofasys/adaptor/motion_6d.py (Motion6dAdaptor.frame_decoder)");
    let encoders = [
        "text", "vision", "video", "audio", "depth", "thermal", "imu", "action", "box",
    ];
    ModelSpec::new(
        "ofasys",
        "OFASys (Bai et al. 2022; OFA-Sys/OFASys): 9 modality encoders around the OFA-huge \
         universal model and 2 output decoders (6 encoders and the decoders' sizes assumed)",
        vec![
            text(),
            vision(),
            video,
            audio(),
            depth,
            thermal,
            imu,
            action,
            boxes,
            llm(&encoders),
            speech,
            motion,
        ],
    )
}

/// The four-module OFASys of the paper's Fig. 14a (§5.4.1): vision, text, audio → LLM.
pub fn ofasys_4() -> ModelSpec {
    ModelSpec::new(
        "ofasys-4",
        "OFASys, the four-module workload of Mosaic Fig. 14a (Bai et al. 2022): vision, text and \
         audio encoders feeding the OFA-huge universal model (Table 1)",
        vec![text(), vision(), audio(), llm(&["text", "vision", "audio"])],
    )
}
