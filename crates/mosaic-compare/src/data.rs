//! Data heterogeneity in the comparison: every row's time on a global batch of variable-size
//! samples rather than on samples of one size, which is what the profiles measure.
//!
//! Each row is scaled by a *slowdown*: its time simulated on the batch over its time simulated
//! on uniform samples of the same mean cost ([`mosaic_data::evaluate_weighted`]: DP ranks of
//! 1F1B pipelines, sample cost α·l² + β·l). The simulator runs the batching policy each system
//! uses:
//! - **DistTrain**: its module groups as pipeline stages (weighted by their per-microbatch
//!   times), its microbatch count, over the largest data-parallel degree of its modules, with
//!   DistTrain's reordering (§6: greedy partitioning over DP ranks, Algorithm 3).
//! - **FlowTrain**: its consumers (backbone and heads) over their largest data-parallel degree
//!   with FlowTrain's packing, buckets and zig-zag dispatch ([`FLOWTRAIN_MICROBATCHES`] or more per
//!   rank); the producers are not slowed, since the embedding pool between the two absorbs
//!   their variance (FlowTrain §3.4).
//! - **Megatron-LM, DistMM, Spindle, Mosaic**: no data-side policy; each module's replicas get
//!   equal shares of a shuffled batch, so a module on `d` GPUs takes its time × the random
//!   policy's slowdown on `d` ranks, and each stage the slowest of its modules. Spindle is
//!   scaled as the DistMM plan its waves come from.
//!
//! One cost model serves every module (the batch's sequence lengths, the backbone's α and β):
//! encoders see the same samples but their own share of the tokens, which this leaves out.

use mosaic_data::{evaluate_weighted, DataError, Layout, Params, Policy};

use crate::CompareError;

/// Microbatches per consumer rank in FlowTrain's slowdown: packing aims at this many, or at
/// more where they would hold over [`FLOWTRAIN_CAPACITY`] tokens each.
pub const FLOWTRAIN_MICROBATCHES: usize = 8;
/// The microbatch size FlowTrain packs to in its example (§3.4: "e.g., 8192" tokens).
pub const FLOWTRAIN_CAPACITY: u64 = 8192;

/// One global batch: per-sample sequence lengths and their cost coefficients.
#[derive(Debug, Clone, PartialEq)]
pub struct DataBatch {
    /// Tokens of each sample.
    pub sizes: Vec<u32>,
    /// Quadratic cost coefficient (per token²).
    pub alpha: f64,
    /// Linear cost coefficient (per token).
    pub beta: f64,
    /// Seed of the policies' shuffles.
    pub seed: u64,
    /// Where the batch comes from, for the notes.
    pub label: String,
}

/// What a row's slowdown is computed from (set by each strategy).
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Shape {
    /// Stages one after another, each a list of its modules' (dp, time in ms).
    Staged(Vec<Vec<(u32, f64)>>),
    /// DistTrain's pipeline: per-microbatch group times, microbatches, largest module dp.
    Pipeline {
        /// Each group's time per microbatch, ms.
        group_ms: Vec<f64>,
        /// Microbatches per global batch.
        microbatches: u32,
        /// Data-parallel ranks the batch is balanced over.
        dp: u32,
    },
    /// FlowTrain's pools: producers' and consumers' time per global batch, consumers' dp.
    Decoupled {
        /// Producers' time per global batch, ms.
        producer_ms: f64,
        /// Consumers' time per global batch, ms.
        consumer_ms: f64,
        /// The consumers' largest module dp.
        dp: u32,
    },
    /// Nothing to scale.
    #[default]
    None,
}

impl DataBatch {
    /// The sequence length whose cost is the batch's mean cost: the uniform reference.
    fn uniform_size(&self) -> u32 {
        let n = self.sizes.len().max(1) as f64;
        let mean_len = self.sizes.iter().map(|&s| f64::from(s)).sum::<f64>() / n;
        if self.alpha <= 0.0 {
            return mean_len.round().max(1.0) as u32;
        }
        let mean_cost = self
            .sizes
            .iter()
            .map(|&s| self.alpha * f64::from(s).powi(2) + self.beta * f64::from(s))
            .sum::<f64>()
            / n;
        // α l² + β l = c ⇒ l = (−β + √(β² + 4αc)) / 2α.
        let l = (-self.beta + (self.beta.powi(2) + 4.0 * self.alpha * mean_cost).sqrt())
            / (2.0 * self.alpha);
        l.round().clamp(1.0, f64::from(u32::MAX)) as u32
    }

    /// `policy`'s time on this batch over its time on uniform samples, for `layout` with
    /// stages weighted by `weights`.
    pub fn slowdown(
        &self,
        policy: Policy,
        layout: Layout,
        weights: &[f64],
    ) -> Result<f64, DataError> {
        let params = Params {
            alpha: self.alpha,
            beta: self.beta,
            seed: self.seed,
            ..Params::default()
        };
        let real = evaluate_weighted(policy, &self.sizes, layout, &params, weights)?;
        let uniform = vec![self.uniform_size(); self.sizes.len()];
        let base = evaluate_weighted(policy, &uniform, layout, &params, weights)?;
        Ok(if base.iteration_ms > 0.0 {
            real.iteration_ms / base.iteration_ms
        } else {
            1.0
        })
    }

    /// The random policy's slowdown of a module on `dp` replicas.
    fn random(&self, dp: u32) -> Result<f64, DataError> {
        let layout = Layout {
            dp: dp.max(1) as usize,
            pp: 1,
            microbatches: 1,
            vpp: 1,
        };
        self.slowdown(Policy::Random, layout, &[1.0])
    }

    /// The slowdown of a row of `shape`, and what it assumed.
    pub fn row_slowdown(&self, shape: &Shape) -> Result<(f64, String), DataError> {
        Ok(match shape {
            Shape::Staged(stages) => {
                let mut memo: Vec<(u32, f64)> = Vec::new();
                let (mut base, mut real) = (0.0, 0.0);
                for stage in stages {
                    let mut slowest: f64 = 0.0;
                    for &(dp, t) in stage {
                        let f = match memo.iter().find(|(d, _)| *d == dp) {
                            Some(&(_, f)) => f,
                            None => {
                                let f = self.random(dp)?;
                                memo.push((dp, f));
                                f
                            }
                        };
                        slowest = slowest.max(t * f);
                    }
                    base += stage.iter().map(|&(_, t)| t).fold(0.0, f64::max);
                    real += slowest;
                }
                let f = if base > 0.0 { real / base } else { 1.0 };
                (f, "shuffled equal shares per module replica".into())
            }
            Shape::Pipeline {
                group_ms,
                microbatches,
                dp,
            } => {
                let layout = Layout {
                    dp: (*dp).max(1) as usize,
                    pp: group_ms.len().max(1),
                    microbatches: (*microbatches).max(1) as usize,
                    vpp: 1,
                };
                let weights = if group_ms.is_empty() {
                    vec![1.0]
                } else {
                    group_ms.clone()
                };
                let f = self.slowdown(Policy::DistTrain, layout, &weights)?;
                (f, format!("DistTrain's reordering over {dp} DP ranks"))
            }
            Shape::Decoupled {
                producer_ms,
                consumer_ms,
                dp,
            } => {
                let dp = (*dp).max(1) as usize;
                let tokens: u64 = self.sizes.iter().map(|&s| u64::from(s)).sum();
                let needed = tokens.div_ceil(dp as u64 * FLOWTRAIN_CAPACITY);
                let layout = Layout {
                    dp,
                    pp: 1,
                    microbatches: usize::try_from(needed)
                        .unwrap_or(usize::MAX)
                        .max(FLOWTRAIN_MICROBATCHES),
                    vpp: 1,
                };
                let f = self.slowdown(Policy::FlowTrain, layout, &[1.0])?;
                let base = producer_ms.max(*consumer_ms);
                let real = producer_ms.max(consumer_ms * f);
                let f = if base > 0.0 { real / base } else { 1.0 };
                (
                    f,
                    format!("FlowTrain's packing and zig-zag over {dp} consumer ranks"),
                )
            }
            Shape::None => (1.0, "nothing to scale".into()),
        })
    }
}

/// Scales every row of `rows` by its slowdown on `batch` (times longer, utilisation lower by
/// the same factor: the work is the same) and says so in its note.
pub fn with_data(
    rows: &mut [crate::StrategyResult],
    batch: &DataBatch,
) -> Result<(), CompareError> {
    for row in rows {
        let (f, how) = batch
            .row_slowdown(&row.shape)
            .map_err(|e| CompareError::NoFit {
                strategy: row.strategy.name(),
                reason: format!("cannot simulate the data batch: {e}"),
            })?;
        row.iteration_ms = crate::common::round_ms(row.iteration_ms * f);
        row.mean_util /= f;
        row.min_util /= f;
        for u in &mut row.gpu_util {
            *u /= f;
        }
        let note = format!("data heterogeneity ×{f:.3} ({how})");
        row.note = Some(match row.note.take() {
            Some(n) => format!("{n}; {note}"),
            None => note,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(sizes: Vec<u32>) -> DataBatch {
        DataBatch {
            sizes,
            alpha: 1e-6,
            beta: 1e-3,
            seed: 1,
            label: "test".into(),
        }
    }

    #[test]
    fn uniform_samples_slow_nothing_down() {
        let b = batch(vec![500; 64]);
        let staged = Shape::Staged(vec![vec![(4, 10.0), (2, 8.0)], vec![(8, 5.0)]]);
        assert!((b.row_slowdown(&staged).unwrap().0 - 1.0).abs() < 1e-9);
        let pipe = Shape::Pipeline {
            group_ms: vec![1.0, 3.0],
            microbatches: 4,
            dp: 2,
        };
        assert!((b.row_slowdown(&pipe).unwrap().0 - 1.0).abs() < 1e-9);
    }

    #[test]
    fn skewed_samples_slow_random_shares_down_more_on_more_replicas() {
        let sizes = mosaic_data::generate(mosaic_data::Distribution::TEXT, 512, 3);
        let b = batch(sizes);
        let f1 = b.random(1).unwrap();
        let f8 = b.random(8).unwrap();
        assert!(
            (f1 - 1.0).abs() < 0.02,
            "one replica sees the whole batch: {f1}"
        );
        assert!(f8 > f1, "{f8} vs {f1}");
    }

    #[test]
    fn the_uniform_size_has_the_mean_cost() {
        let b = batch(vec![100, 900]);
        let l = f64::from(b.uniform_size());
        let cost = |l: f64| 1e-6 * l * l + 1e-3 * l;
        let mean = (cost(100.0) + cost(900.0)) / 2.0;
        assert!((cost(l) - mean).abs() / mean < 0.01);
    }
}
