//! What one sequence of `l` tokens costs a module's training step: FlowTrain's cost model
//! `α·l² + β·l` (FlowTrain §3.4, Eq. 3: attention quadratic, the rest linear) with α and β
//! derived from the module's architecture and the device's datasheet.
//!
//! Per layer and token the forward pass does 2 × the layer's matmul parameters FLOPs (the
//! linear part) and attention 4·l·h FLOPs over the sequence (QKᵀ and AV; 2·l·h with a causal
//! kernel that skips the masked half) — the counts of `workload.rs`. A trainable module's step
//! runs three passes of those FLOPs (forward, activation and weight gradients), a frozen one
//! only the forward. The rate is the device's peak × the fitted matmul efficiency for the
//! module's hidden size at large row counts ([`Calibration`]), so α and β are times on a whole
//! GPU with the kernels saturated: launch floors and small-batch effects are not per-token
//! costs and are left out.

use serde::Serialize;

use crate::analytic::Calibration;
use crate::device::DeviceSpec;
use crate::spec::ModuleSpec;

/// FlowTrain's per-sequence cost coefficients of one module on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TokenCost {
    /// Quadratic (attention) coefficient, ms per token².
    pub alpha_ms: f64,
    /// Linear (matmul) coefficient, ms per token.
    pub beta_ms: f64,
}

impl TokenCost {
    /// `α·l² + β·l` ms for one sequence of `l` tokens.
    pub fn of(&self, tokens: u64) -> f64 {
        let l = tokens as f64;
        self.alpha_ms * l * l + self.beta_ms * l
    }
}

impl Calibration {
    /// α and β of `module`'s training step on a whole `device` (see the module docs).
    pub fn token_cost(&self, module: &ModuleSpec, device: &DeviceSpec) -> TokenCost {
        let h = f64::from(module.hidden);
        let layers = f64::from(module.layers) + f64::from(module.decoder_layers);
        let passes = if module.trainable { 3.0 } else { 1.0 };
        let attention = if module.causal { 2.0 } else { 4.0 };
        let efficiency = self.gemm_efficiency * h / (h + self.hidden_half);
        let flops_per_ms = device.peak_tflops * 1e9 * efficiency;
        if flops_per_ms <= 0.0 || layers == 0.0 {
            return TokenCost {
                alpha_ms: 0.0,
                beta_ms: 0.0,
            };
        }
        let linear = 2.0 * module.layer_params() as f64;
        TokenCost {
            alpha_ms: passes * layers * attention * h / flops_per_ms,
            beta_ms: passes * layers * linear / flops_per_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{devices, model, Role};

    #[test]
    fn qwen3_vl_backbone_costs_by_hand() {
        let m = model("qwen3-vl").unwrap();
        let llm = m.modules.iter().find(|x| x.role == Role::Backbone).unwrap();
        let h100 = devices()
            .into_iter()
            .find(|d| d.short_name == "h100")
            .unwrap();
        let cal = Calibration::default();
        let c = cal.token_cost(llm, &h100);
        let h = f64::from(llm.hidden);
        let rate = h100.peak_tflops * 1e9 * cal.gemm_efficiency * h / (h + cal.hidden_half);
        let passes = if llm.trainable { 3.0 } else { 1.0 };
        let l = f64::from(llm.layers);
        let expect_beta = passes * l * 2.0 * llm.layer_params() as f64 / rate;
        assert!((c.beta_ms - expect_beta).abs() < 1e-12 * expect_beta);
        // Attention overtakes the matmuls at l = β/α tokens: for a causal LLM, 2 × layer
        // params / (2h) = params per layer / h, i.e. ~12h for a plain 4h-MLP layer.
        let crossover = c.beta_ms / c.alpha_ms;
        let attn = if llm.causal { 2.0 } else { 4.0 };
        assert!((crossover - 2.0 * llm.layer_params() as f64 / (attn * h)).abs() < 1e-6);
        assert!(c.of(8192) > 8192.0 * c.beta_ms);
    }

    #[test]
    fn frozen_modules_pay_one_pass() {
        let m = model("clip").unwrap();
        let h100 = devices()
            .into_iter()
            .find(|d| d.short_name == "h100")
            .unwrap();
        let cal = Calibration::default();
        let mut vision = m.modules[0].clone();
        vision.trainable = true;
        let trained = cal.token_cost(&vision, &h100);
        vision.trainable = false;
        let frozen = cal.token_cost(&vision, &h100);
        assert!((trained.beta_ms - 3.0 * frozen.beta_ms).abs() < 1e-15);
        assert!((trained.alpha_ms - 3.0 * frozen.alpha_ms).abs() < 1e-18);
    }
}
