//! AdamW (Loshchilov and Hutter, ICLR 2019), one per module, with state a checkpoint can save.
//!
//! candle-nn's `AdamW` keeps its moments private, so a checkpoint could not hold them and a
//! resumed run would not continue as if never stopped. This is the same update as candle-nn's
//! (decoupled weight decay `θ ← θ(1 − lr·λ)`, bias-corrected moments), with the moments and the
//! step count exposed. On a GPU the update is one fused kernel per parameter tensor
//! (`fused`, the GPU build only); elsewhere it is composed of candle ops.

use std::sync::Mutex;

use candle_core::{Result, Tensor};
use serde::{Deserialize, Serialize};

use crate::error::EngineError;
use crate::models::nn::Params;
use crate::models::{Model, Recipe};

#[cfg(mosaic_gpu)]
mod fused;

/// AdamW hyperparameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdamWConfig {
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator guard.
    pub eps: f64,
    /// Decoupled weight decay λ.
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    /// lr 3e-3 (the toy models learn in tens of steps), the usual betas and ε, λ = 0.01
    /// (candle-nn's and PyTorch's default).
    fn default() -> Self {
        AdamWConfig {
            lr: 3e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

impl AdamWConfig {
    /// The learning rate when none is asked for: the tiny models' 3e-3 (the default's) up to
    /// width 32, then scaled by 32 / width of the recipe's widest encoder, as Adam's learning
    /// rate for hidden weights goes with 1 / width (μP; Yang et al., "Tensor Programs V",
    /// 2021): real-size CLIP (width 1024) trains at 9.4e-5. Measured on an H200 (README):
    /// real-size CLIP at 3e-3 fell to chance (ln 16) by step 6 and stayed; at 1e-4 its loss went
    /// 2.76 → 2.18 in 7 steps.
    pub fn lr_for(recipe: &Recipe) -> f64 {
        const TINY_WIDTH: f64 = 32.0;
        let tiny_lr = AdamWConfig::default().lr;
        match recipe.widest() {
            Some(width) if width as f64 > TINY_WIDTH => tiny_lr * TINY_WIDTH / width as f64,
            _ => tiny_lr,
        }
    }
}

/// The optimizer of one module: a first and second moment per parameter tensor.
#[derive(Debug, Clone)]
pub struct AdamW {
    /// Hyperparameters.
    pub config: AdamWConfig,
    /// Steps taken.
    pub t: u64,
    /// First moments, in [`Params`] order.
    pub m: Vec<Tensor>,
    /// Second moments, in [`Params`] order.
    pub v: Vec<Tensor>,
}

impl AdamW {
    /// Zero moments for `params`.
    pub fn new(params: &Params, config: AdamWConfig) -> Result<AdamW> {
        let zeros = || {
            params
                .iter()
                .map(|(_, v)| v.as_tensor().zeros_like())
                .collect::<Result<Vec<_>>>()
        };
        Ok(AdamW {
            config,
            t: 0,
            m: zeros()?,
            v: zeros()?,
        })
    }

    /// One update of `params` with `grads` (in [`Params`] order): fused on a GPU (unless
    /// `MOSAIC_KERNELS=composed`), composed elsewhere.
    pub fn step(&mut self, params: &Params, grads: &[Tensor]) -> Result<()> {
        #[cfg(mosaic_gpu)]
        if params.iter().all(|(_, v)| v.device().is_cuda()) && crate::kernels::fused() {
            return self.step_fused(params, grads);
        }
        self.step_composed(params, grads)
    }

    /// The bias corrections `1 − β₁ᵗ` and `1 − β₂ᵗ` of the step about to be taken (advances
    /// the step count).
    fn next_step(&mut self) -> (f64, f64) {
        self.t += 1;
        let c = self.config;
        (
            1.0 - c.beta1.powi(self.t as i32),
            1.0 - c.beta2.powi(self.t as i32),
        )
    }

    /// The update composed of candle ops (16 per tensor): the CPU's, and the reference the
    /// fused kernel is checked against.
    pub(crate) fn step_composed(&mut self, params: &Params, grads: &[Tensor]) -> Result<()> {
        let c = self.config;
        let (bias1, bias2) = self.next_step();
        for (i, ((_, var), g)) in params.iter().zip(grads).enumerate() {
            let m = ((&self.m[i] * c.beta1)? + (g * (1.0 - c.beta1))?)?;
            let v = ((&self.v[i] * c.beta2)? + (g.sqr()? * (1.0 - c.beta2))?)?;
            let m_hat = (&m / bias1)?;
            let v_hat = (&v / bias2)?;
            let theta = var.as_detached_tensor();
            let decayed = (theta * (1.0 - c.lr * c.weight_decay))?;
            let update = (m_hat / (v_hat.sqrt()? + c.eps)?)?;
            var.set(&(decayed - (update * c.lr)?)?)?;
            self.m[i] = m;
            self.v[i] = v;
        }
        Ok(())
    }

    /// The update as one kernel per tensor, in place ([`fused`]).
    #[cfg(mosaic_gpu)]
    pub(crate) fn step_fused(&mut self, params: &Params, grads: &[Tensor]) -> Result<()> {
        let c = self.config;
        let (bias1, bias2) = self.next_step();
        let scalars = fused::Scalars {
            lr: c.lr as f32,
            beta1: c.beta1 as f32,
            beta2: c.beta2 as f32,
            one_minus_beta1: (1.0 - c.beta1) as f32,
            one_minus_beta2: (1.0 - c.beta2) as f32,
            eps: c.eps as f32,
            decay: (1.0 - c.lr * c.weight_decay) as f32,
            bias1: bias1 as f32,
            bias2: bias2 as f32,
        };
        for (i, ((_, var), g)) in params.iter().zip(grads).enumerate() {
            fused::step(var.as_tensor(), &self.m[i], &self.v[i], g, scalars)?;
        }
        Ok(())
    }

    /// A zeroed optimizer of `config` for every module of `model`, in model order, each behind
    /// its own lock (a module's job steps its own).
    pub(crate) fn per_module(
        model: &Model,
        config: AdamWConfig,
    ) -> std::result::Result<Vec<Mutex<AdamW>>, EngineError> {
        (model.modules.iter())
            .map(|m| {
                AdamW::new(&m.params, config)
                    .map(Mutex::new)
                    .map_err(EngineError::tensor(m.name))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::AdamWConfig;
    use crate::models::Recipe;

    #[test]
    fn the_default_learning_rate_falls_with_the_widest_encoder() {
        assert_eq!(AdamWConfig::lr_for(&Recipe::new("clip-tiny", 0)), 3e-3);
        let small = Recipe {
            size: 0.02,
            ..Recipe::new("clip", 0)
        };
        assert_eq!(AdamWConfig::lr_for(&small), 3e-3);
        let real = AdamWConfig::lr_for(&Recipe::new("clip", 0));
        assert!((real - 3e-3 * 32.0 / 1024.0).abs() < 1e-12, "{real}");
        assert_eq!(AdamWConfig::lr_for(&Recipe::new("imagebind", 0)), real);
    }
}
