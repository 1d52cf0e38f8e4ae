//! ImageBind (Girdhar et al., CVPR 2023): six modality encoders bound into one embedding space.
//!
//! Table 1 gives the vision (24 × 1024), audio (12 × 768) and text (12 × 768) encoders that
//! the paper trained; we follow it where the released `imagebind_huge` differs (vision 32 ×
//! 1280, text 24 × 1024) and take heads and MLP widths of the matching ViT shapes. Depth,
//! thermal and IMU are not in Table 1 and follow the released code.

use crate::spec::{ModelSpec, ModuleSpec, Role};

const SOURCE: &str = "facebookresearch/ImageBind imagebind/models/imagebind_model.py";

/// ImageBind: `vision`, `text`, `audio`, `depth`, `thermal`, `imu` → `align`.
pub fn imagebind() -> ModelSpec {
    // Table 2: image 512×512. The vision stem duplicates an image into 2 frames and applies a
    // Conv3d with kernel (2, 14, 14) → 36×36 patches + CLS.
    let patches = (512 / 14) * (512 / 14);
    let vision = ModuleSpec::new("vision", Role::Encoder)
        // Table 1: 24 layers, dim 1024 (ViT-L: 16 heads, MLP 4096).
        .stack(24, 1024, 16, 4096)
        // ImageBind §4 (Girdhar et al.): the image and text encoders come from OpenCLIP and
        // stay frozen; the other modalities' encoders are trained.
        .frozen()
        .tokens(
            patches + 1,
            "image 512×512 RGB (Table 2) as 2 frames, kernel (2,14,14) → 36×36 + CLS = 1297",
        )
        .matmul(
            "patch embedding 3×2×14×14 → 1024",
            3 * 2 * 14 * 14 * 1024,
            patches,
        )
        .paper(24, 1024, 4.17, 35.2)
        .source("Mosaic Table 1 (released imagebind_huge: 32 × 1280); frozen per ImageBind §4");
    let text = ModuleSpec::new("text", Role::Encoder)
        // Table 1: 12 layers, dim 768 (OpenCLIP text tower: 12 heads, MLP 3072, causal mask).
        .stack(12, 768, 12, 3072)
        .causal()
        .frozen()
        .tokens(
            2048,
            "text 2048 tokens (Table 2; the released context is 77, assumed extended)",
        )
        // imagebind_model.py: vocab_size 49408 (the CLIP BPE).
        .lookup("token embedding 49408 × 768", 49408 * 768, 2048)
        .paper(12, 768, 1.04, 20.5)
        .source("Mosaic Table 1 (released imagebind_huge: 24 × 1024); frozen per ImageBind §4");
    // imagebind_model.py: audio_num_mel_bins 128, audio_kernel_size 16, audio_stride 10, 10 ms
    // hop. Table 2: 16 kHz, 8 s → 800 frames → ((128−16)/10+1) × ((800−16)/10+1) = 12 × 79.
    let audio_patches = ((128 - 16) / 10 + 1) * ((800 - 16) / 10 + 1);
    let audio = ModuleSpec::new("audio", Role::Encoder)
        // imagebind_model.py: audio_embed_dim 768, audio_num_blocks 12, audio_num_heads 12
        // (MLP 4 × 768); Table 1 agrees: 12 layers, dim 768.
        .stack(12, 768, 12, 3072)
        .tokens(
            audio_patches + 1,
            "audio 16 kHz 8 s (Table 2) → 128 mel × 800 frames, 16×16 patches stride 10 → 948 + CLS",
        )
        .matmul("patch embedding 1×16×16 → 768", 16 * 16 * 768, audio_patches)
        .paper(12, 768, 2.09, 22.8)
        .source(SOURCE);
    // imagebind_model.py: depth_kernel_size 16 on a 1-channel map; Table 2: 224×224 → 14×14.
    let depth_patches = (224 / 16) * (224 / 16);
    let depth = ModuleSpec::new("depth", Role::Encoder)
        // imagebind_model.py: depth_embed_dim 384, depth_num_blocks 12, depth_num_heads 8.
        .stack(12, 384, 8, 4 * 384)
        .tokens(
            depth_patches + 1,
            "depth 224×224 (Table 2), patch 16 → 14×14 + CLS = 197",
        )
        .matmul(
            "patch embedding 1×16×16 → 384",
            16 * 16 * 384,
            depth_patches,
        )
        .source(SOURCE);
    // imagebind_model.py: thermal_kernel_size 16, 1 channel; Table 2: 256×256 → 16×16.
    let thermal_patches = (256 / 16) * (256 / 16);
    let thermal = ModuleSpec::new("thermal", Role::Encoder)
        // imagebind_model.py: thermal_embed_dim 768, thermal_num_blocks 12, thermal_num_heads 12.
        .stack(12, 768, 12, 4 * 768)
        .tokens(
            thermal_patches + 1,
            "thermal 256×256 (Table 2), patch 16 → 16×16 + CLS = 257",
        )
        .matmul(
            "patch embedding 1×16×16 → 768",
            16 * 16 * 768,
            thermal_patches,
        )
        .source(SOURCE);
    // imagebind_model.py: IMU windows of kernel 8 over 6 channels (6 × 2000 → 250 patches);
    // Table 2: 6 axes × 100 Hz × 8 s = 800 steps → 100 patches.
    let imu_patches = 100 * 8 / 8;
    let imu = ModuleSpec::new("imu", Role::Encoder)
        // imagebind_model.py: imu_embed_dim 512, imu_num_blocks 6, imu_num_heads 8.
        .stack(6, 512, 8, 4 * 512)
        .tokens(
            imu_patches + 1,
            "IMU 6 axes × 100 Hz × 8 s (Table 2), windows of 8 steps → 100 + CLS = 101",
        )
        .matmul("patch projection 6×8 → 512", 48 * 512, imu_patches)
        .source(SOURCE);
    // imagebind_model.py: out_embed_dim 1024; every modality head is LayerNorm + Linear(d → 1024).
    let heads = (1024 + 768 + 768 + 384 + 768 + 512) * 1024;
    let align = ModuleSpec::new("align", Role::Head)
        .width(1024)
        .tokens(
            1,
            "one pooled feature per modality and sample; InfoNCE image ↔ each modality",
        )
        .matmul("six modality heads d → 1024", heads, 1)
        .after(&["vision", "text", "audio", "depth", "thermal", "imu"])
        .source(SOURCE);
    ModelSpec::new(
        "imagebind",
        "ImageBind (Girdhar et al. 2023; facebookresearch/ImageBind): frozen image and text \
         encoders, trained audio, depth, thermal and IMU encoders, contrastive heads",
        vec![vision, text, audio, depth, thermal, imu, align],
    )
}
