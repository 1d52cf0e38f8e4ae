//! What one sample costs a module, independent of the hardware: FLOPs, HBM traffic, memory.
//!
//! Per transformer layer and token (hidden `h`, MLP width `f`, `c` = 2 MLP tensors of width
//! `f` for a plain MLP, 3 for a gated one, key/value width `kv`), in bf16 (2 bytes):
//! - FLOPs: 2 × the layer's matmul parameters, plus attention 4·s·h (QKᵀ and AV; 2·s·h for
//!   a causal kernel that skips the masked half);
//! - activations kept for backward: (18·h + 2·c·f) bytes — Korthikanti et al. 2022
//!   ("Reducing Activation Recomputation in Large Transformer Models", §4.1: 34·h per token
//!   for f = 4h) without the s² score term, which FlashAttention never stores;
//! - HBM traffic of matmul and attention kernels (their inputs and outputs):
//!   2·(8·h + 4·kv + (c' + 1)·f) bytes (c' = 1 plain, 2 gated);
//! - HBM traffic of the memory-bound kernels (2 norms, 2 residual adds, the MLP activation):
//!   2·(10·h + c·f) bytes.
//!
//! Unfused attention (the score matrix in HBM) adds, per score element (heads × query ×
//! key positions): 12 bytes of forward traffic (scores written, bias added, softmax in fp32,
//! dropout, read by the AV matmul) and 5 bytes kept for backward (Korthikanti et al.'s
//! 5·a·s²·b term: softmax output, dropout mask and its result).
//!
//! Cross-attention in a decoder layer adds 6·h (matmul I/O), 5·h (norm, residual) and 10·h
//! (kept) bytes per decoder token. These counts are ours (one read and one write per operand,
//! no fusion beyond FlashAttention).

use crate::spec::ModuleSpec;

/// Bytes per bf16 value.
pub(crate) const BF16: f64 = 2.0;

/// Per-sample cost of one module's forward pass.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Workload {
    /// Forward FLOPs in matmuls and attention.
    pub fwd_flops: f64,
    /// Forward HBM bytes read and written by matmul and attention kernels (activations).
    pub fwd_gemm_bytes: f64,
    /// Forward HBM bytes of memory-bound kernels (norms, residuals, activation functions,
    /// embedding gathers).
    pub fwd_elem_bytes: f64,
    /// Activation bytes kept for the backward pass.
    pub stored_bytes: f64,
    /// Activation bytes kept under full recomputation: every layer's input.
    pub checkpoint_bytes: f64,
    /// The largest single layer's activations (working set of a recomputed or frozen pass).
    pub layer_bytes: f64,
    /// Logits materialised for a loss.
    pub logits: f64,
    /// Weights multiplied by matmuls (shared ones included), read in each pass.
    pub matmul_weights: f64,
    /// Weights that must be resident: owned parameters plus shared head matrices.
    pub resident_weights: f64,
    /// Parameters the module owns (gradients and optimizer state when trainable).
    pub params: f64,
    /// Tokens per sample in the largest matmul (its M dimension).
    pub rows: f64,
}

impl Workload {
    /// The per-sample cost of `m`.
    pub(crate) fn of(m: &ModuleSpec) -> Workload {
        let h = m.hidden as f64;
        let f = m.ffn as f64;
        let kv = m.kv_dim() as f64;
        let (c, c_io) = if m.gated_ffn { (3.0, 2.0) } else { (2.0, 1.0) };
        let (s, sd) = (m.tokens as f64, m.decoder_tokens as f64);
        let (l, ld) = (m.layers as f64, m.decoder_layers as f64);

        // Per token and layer, in bytes.
        let kept = 18.0 * h + 2.0 * c * f;
        let gemm_io = BF16 * (8.0 * h + 4.0 * kv + (c_io + 1.0) * f);
        let elem = BF16 * (10.0 * h + c * f);

        let attn = if m.causal { 2.0 } else { 4.0 };
        let cross_kv = 2.0 * h * kv; // cross-attention K and V weights, applied to encoder tokens
        let enc_flops = l * (2.0 * m.layer_params() as f64 * s + attn * s * s * h);
        let dec_flops = ld
            * (2.0 * (m.decoder_layer_params() as f64 - cross_kv) * sd
                + 2.0 * cross_kv * s
                + 2.0 * sd * sd * h
                + 4.0 * sd * s * h);

        // Score elements per sample of one encoder and one decoder layer.
        let heads = m.heads as f64;
        let (scores, dec_scores) = if m.fused_attention {
            (0.0, 0.0)
        } else {
            (heads * s * s, heads * (sd * sd + sd * s))
        };

        let mut w = Workload {
            fwd_flops: enc_flops + dec_flops,
            fwd_gemm_bytes: l * s * gemm_io + ld * sd * (gemm_io + BF16 * 6.0 * h),
            fwd_elem_bytes: l * (s * elem + 12.0 * scores)
                + ld * (sd * (elem + BF16 * 5.0 * h) + 12.0 * dec_scores),
            stored_bytes: l * (s * kept + 5.0 * scores)
                + ld * (sd * (kept + 10.0 * h) + 5.0 * dec_scores),
            checkpoint_bytes: (l * s + ld * sd) * BF16 * h,
            layer_bytes: (if l > 0.0 {
                s * kept + 5.0 * scores
            } else {
                0.0
            })
            .max(if ld > 0.0 {
                sd * (kept + 10.0 * h) + 5.0 * dec_scores
            } else {
                0.0
            }),
            logits: 0.0,
            matmul_weights: l * m.layer_params() as f64 + ld * m.decoder_layer_params() as f64,
            resident_weights: m.params as f64,
            params: m.params as f64,
            rows: s.max(sd),
        };
        for e in &m.extras {
            let (n, t) = (e.weights as f64, e.tokens as f64);
            let io = BF16 * h * t; // one h-wide activation read or written per token
            if e.lookup {
                w.fwd_elem_bytes += 2.0 * io; // gather: read the rows, write the output
            } else {
                w.fwd_flops += 2.0 * n * t;
                w.fwd_gemm_bytes += 2.0 * io;
                w.stored_bytes += io;
                w.checkpoint_bytes += io;
                w.matmul_weights += n;
                w.rows = w.rows.max(t);
            }
            if e.shared {
                w.resident_weights += n;
            }
            w.logits += e.vocab as f64 * t;
        }
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Role;

    #[test]
    fn gpt_like_layer_matches_the_textbook_counts() {
        // One plain layer, h = 1024, f = 4h, s = 2048, bidirectional.
        let m = ModuleSpec::new("x", Role::Encoder)
            .stack(1, 1024, 16, 4096)
            .tokens(2048, "");
        let w = Workload::of(&m);
        let p = 12.0 * 1024.0 * 1024.0; // 4h² + 8h²
        assert_eq!(m.params as f64, p);
        let flops = 2.0 * p * 2048.0 + 4.0 * 2048.0 * 2048.0 * 1024.0;
        assert!((w.fwd_flops - flops).abs() < 1.0);
        // Korthikanti et al.: 34·s·h bytes kept per layer for f = 4h.
        assert!((w.stored_bytes - 34.0 * 2048.0 * 1024.0).abs() < 1.0);
    }

    #[test]
    fn lookup_tables_cost_no_flops() {
        let m = ModuleSpec::new("e", Role::Embedding)
            .width(4096)
            .tokens(2048, "")
            .lookup("table", 151936 * 4096, 2048);
        let w = Workload::of(&m);
        assert_eq!(w.fwd_flops, 0.0);
        assert_eq!(w.params, 151936.0 * 4096.0);
        assert!(w.fwd_elem_bytes > 0.0);
    }
}
