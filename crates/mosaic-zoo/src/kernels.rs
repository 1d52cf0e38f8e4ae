//! Kernel launches per training step, counted from a module's structure: the host launch floor
//! of the device model is this count × a host cost per launch ([`crate::Calibration::launch_us`]).
//!
//! Eager PyTorch (the paper's engine, and the H100 measurements in `docs/reference.md`) launches
//! every operator as its own kernel from the host, with bf16 autocast over fp32 master weights.
//! Per transformer layer we count, for a layer with `M` weight matrices (Q, K, V, O and the MLP's
//! 2 or 3; a decoder layer adds cross-attention's 4), 2 norms and 2 residual adds:
//!
//! | operator | forward | backward (weights trained) | backward (input gradient only) |
//! |---|---|---|---|
//! | each weight matrix | 2: autocast cast of the fp32 weight to bf16, the matmul with its bias epilogue | 4: input gradient, weight gradient, bias reduction, cast of the gradient to fp32 | 1: input gradient |
//! | each norm | 1 | 2: input gradient, weight and bias gradients | 1 |
//! | attention core (SDPA) | 2: the fused kernel, the head-merging copy | 2 | 2 |
//! | each residual add | 1 | 1: gradient accumulation | 1 |
//! | MLP activation | 1 (gated: 2, the gate's product) | 1 (gated: 3) | 1 (gated: 3) |
//!
//! A plain layer (M = 6: CLIP's, ViT's, BERT's) thus launches 19 kernels forward and 33
//! backward: 52 per training step. Outside the layers, an extra matmul (patch embedding,
//! projection, head) counts as one matrix; a lookup table as a gather forward and a scatter-add
//! backward; a loss over logits as 3 forward (log-softmax, gather, reduction) and 3 backward.
//! A head without layers or logits that joins k ≥ 2 modules (CLIP's and ImageBind's `align`)
//! computes a contrastive InfoNCE loss between the first input and each other one: each input's
//! features are L2-normalised (3 kernels forward: norm, clamp, divide; 3 backward), and each
//! pair launches a similarity matmul (1 forward, 2 backward), the learned temperature (exp and
//! scale: 2 and 2), the two directions' cross-entropies (2 × 2 and 2 × 2) and their sum (1, 1).
//! The fused AdamW step launches a handful of multi-tensor kernels per step, whatever the
//! layers: it belongs to the per-step host time ([`crate::Calibration::launch_step_ms`]).
//! Recomputing layers launches their forward again.

use crate::spec::{ModuleSpec, Role};

/// Which passes a module's step runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backward {
    /// Forward only (a frozen module fed by data).
    None,
    /// Forward and the gradient of the input only (a frozen module fed by a trained one).
    InputOnly,
    /// Forward and every gradient (a trained module).
    Full,
}

/// Kernels of one operator: (forward, backward with weights, backward input only).
type Count = (f64, f64, f64);

const MATRIX: Count = (2.0, 4.0, 1.0);
const NORM: Count = (1.0, 2.0, 1.0);
const ATTENTION: Count = (2.0, 2.0, 2.0);
const RESIDUAL: Count = (1.0, 1.0, 1.0);
const ACTIVATION: Count = (1.0, 1.0, 1.0);
const GATED_ACTIVATION: Count = (2.0, 3.0, 3.0);
const LOOKUP: Count = (1.0, 1.0, 0.0);
const LOSS: Count = (3.0, 3.0, 3.0);
const NORMALISE: Count = (3.0, 3.0, 3.0);
const CONTRASTIVE_PAIR: Count = (8.0, 9.0, 9.0);

/// Kernels of one plain layer (the table above), for tests and documentation.
pub const PLAIN_LAYER_KERNELS: f64 = 52.0;

/// Kernel launches of one training step of `spec`, recomputing its layers or not.
pub(crate) fn kernels(spec: &ModuleSpec, backward: Backward, recompute: bool) -> f64 {
    let pick = |c: Count| -> f64 {
        let fwd = if recompute { 2.0 * c.0 } else { c.0 };
        fwd + match backward {
            Backward::None => 0.0,
            Backward::InputOnly => c.2,
            Backward::Full => c.1,
        }
    };
    let scale = |c: Count, n: f64| (c.0 * n, c.1 * n, c.2 * n);
    let mlp = if spec.gated_ffn { 3.0 } else { 2.0 };
    let act = if spec.gated_ffn {
        GATED_ACTIVATION
    } else {
        ACTIVATION
    };
    let encoder_layer = pick(scale(MATRIX, 4.0 + mlp))
        + pick(scale(NORM, 2.0))
        + pick(ATTENTION)
        + pick(scale(RESIDUAL, 2.0))
        + pick(act);
    // Cross-attention: 4 more matrices, a norm, an attention core and a residual.
    let cross = pick(scale(MATRIX, 4.0)) + pick(NORM) + pick(ATTENTION) + pick(RESIDUAL);
    let layers = if spec.layers + spec.decoder_layers > 0 {
        spec.layers as f64 * encoder_layer + spec.decoder_layers as f64 * (encoder_layer + cross)
    } else {
        0.0
    };
    let extras: f64 = spec
        .extras
        .iter()
        .map(|e| {
            let table = if e.lookup { pick(LOOKUP) } else { 0.0 };
            let matrix = if !e.lookup && e.weights > 0 {
                pick(MATRIX)
            } else {
                0.0
            };
            let loss = if e.vocab > 0 { pick(LOSS) } else { 0.0 };
            table + matrix + loss
        })
        .sum();
    let contrastive = if spec.role == Role::Head
        && spec.layers + spec.decoder_layers == 0
        && spec.after.len() >= 2
        && spec.extras.iter().all(|e| e.vocab == 0)
    {
        let k = spec.after.len() as f64;
        pick(scale(NORMALISE, k)) + pick(scale(CONTRASTIVE_PAIR, k - 1.0))
    } else {
        0.0
    };
    layers + extras + contrastive
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer() -> ModuleSpec {
        ModuleSpec::new("x", Role::Encoder).stack(1, 768, 12, 3072)
    }

    #[test]
    fn a_plain_layer_launches_the_documented_count() {
        assert_eq!(
            kernels(&layer(), Backward::Full, false),
            PLAIN_LAYER_KERNELS
        );
        assert_eq!(kernels(&layer(), Backward::None, false), 19.0);
        // Recomputation launches the forward again.
        assert_eq!(
            kernels(&layer(), Backward::Full, true),
            PLAIN_LAYER_KERNELS + 19.0
        );
        // Input gradients only: 6 matrices, 2 norms, attention, 2 residuals, activation.
        assert_eq!(
            kernels(&layer(), Backward::InputOnly, false),
            19.0 + 6.0 + 2.0 + 2.0 + 2.0 + 1.0
        );
    }

    #[test]
    fn counts_grow_with_layers_gates_and_extras() {
        let deep = ModuleSpec::new("x", Role::Encoder).stack(12, 384, 6, 1536);
        assert_eq!(
            kernels(&deep, Backward::Full, false),
            12.0 * PLAIN_LAYER_KERNELS
        );
        let gated = layer().gated();
        assert!(kernels(&gated, Backward::Full, false) > PLAIN_LAYER_KERNELS);
        let with_head = layer().head("lm", 1000, 16, false);
        // The head: a matrix (2 + 4) and a loss (3 + 3).
        assert_eq!(
            kernels(&with_head, Backward::Full, false),
            PLAIN_LAYER_KERNELS + 12.0
        );
    }

    #[test]
    fn an_alignment_head_counts_its_contrastive_loss() {
        let align = ModuleSpec::new("align", Role::Head)
            .width(768)
            .matmul("projection", 768 * 768, 1)
            .after(&["vision", "text"]);
        // A projection (6), two normalisations (2 × 6) and one pair (17).
        assert_eq!(kernels(&align, Backward::Full, false), 6.0 + 12.0 + 17.0);
        let alone = ModuleSpec::new("p", Role::Head)
            .width(768)
            .matmul("projection", 768 * 768, 1)
            .after(&["vision"]);
        assert_eq!(kernels(&alone, Backward::Full, false), 6.0);
    }
}
