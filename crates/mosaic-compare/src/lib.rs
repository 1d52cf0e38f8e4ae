//! Mosaic against the systems it is measured against — Megatron-LM, DistMM and Spindle (Mosaic
//! §2.2, §5.1) — and two disaggregated peers, DistTrain and FlowTrain, on the same profiles and
//! the same pool of GPUs.
//!
//! [`compare`] evaluates every strategy on one [`PerfModel`] and pool, and returns one
//! [`StrategyResult`] per strategy: its time, the mean and minimum GPU utilisation, the plan in
//! one line and, where the strategy is a sequence of stages of (dp, quota, GPUs), a
//! [`mosaic_plan::Plan`] the simulator can execute.
//!
//! # Rules every strategy follows
//! - **Only profiled dp values** (the planner's rule): a module runs on `d` GPUs only if it was
//!   profiled at data-parallel degree `d`; dp values that were not profiled are not candidates,
//!   and are never interpolated or extrapolated. On a pool larger than the largest profiled
//!   dp, no module uses more GPUs than that dp.
//! - **Memory**: a module's replica needs the profiled memory of its (dp, quota) option, and
//!   the modules that run at the same time on a GPU must fit its capacity together (as
//!   [`Plan::check`] checks per stage).
//! - **Whole GPUs** for every strategy but Mosaic: SM quota 1.0 samples. Every module needs a
//!   quota-1.0 sample with a dp ≤ the pool that fits in memory ([`CompareError::NoWholeGpu`]).
//!
//! # The strategies
//! - [`megatron`]: every module on all GPUs (largest profiled dp ≤ G, quota 1.0), modules one
//!   after another in topological order.
//! - [`distmm`]: stages of parallel modules on disjoint whole GPUs, found by Mosaic's own stage
//!   search restricted to quota 1.0.
//! - [`spindle`]: DistMM's stages scheduled as waves — modules sliced across waves at a
//!   synchronisation cost per slice, and stages merged so that modules start as GPUs free up.
//! - [`disttrain`]: encoder, backbone and head groups ([`roles`]) on disjoint GPUs as a 1F1B
//!   pipeline over microbatches, with its orchestration search over splits, dp and
//!   microbatch counts.
//! - [`flowtrain`]: producer (encoder) and consumer (backbone and heads) pools decoupled
//!   through a memory pool, sized to maximise throughput, then to minimise imbalance.
//! - [`mosaic`]: [`mosaic_plan::solve`] with GAHC, and with the exact search where it finishes.
//!
//! # Disaggregated strategies (DistTrain, FlowTrain)
//! - **Groups** are [`crate::Roles`]: encoders, backbone, heads.
//! - **Inside a group** (DistTrain's "parallelism unit", §4.1; FlowTrain's actor pool, §3.1)
//!   the modules run one after another in topological order, each data-parallel over the
//!   fastest of its profiled dp ≤ the group's GPU count (quota 1.0, first GPUs of the group).
//!   Memory is checked as the planner does: per module on its GPUs (the profiled (dp, 1.0)
//!   sample fits), since modules of a group never run at the same time.
//! - **Parallelism**: data parallelism only. Tensor parallelism is left out because the
//!   profile format has no TP samples, and pipeline parallelism inside a group because it has
//!   no per-layer split; each group is one pipeline stage.
//! - **Search**: every split of the pool (each group at least one GPU, GPUs may stay idle);
//!   for each split of all but the last group the last gets the rest (times never grow with
//!   more GPUs), then every group shrinks to the fewest GPUs with the same time. Ties go to
//!   fewer GPUs, then fewer microbatches.
//! - When the pool has fewer GPUs than groups, or no split fits, adjacent groups merge
//!   (encoders+backbone or backbone+heads, the better; then one group).
//! - **Read with care on small pools**: each group needs GPUs of its own and a module only
//!   uses a profiled dp (powers of two in the zoo's profiles), so 8 GPUs split as 4 + 2 + 1
//!   leave GPUs idle and no module gets all 8. The real systems fill odd GPU counts with TP
//!   and PP, which the profiles cannot express; these rows are the paradigms under the same
//!   DP-only, profiled-dp rules as every other row.
//!
//! # Utilisation (the same definition for every strategy)
//! The SM-time a module's execution uses on each GPU holding one of its replicas is
//! `quota × time × sm_util`, where `time` is the module's profiled time at that (dp, quota)
//! without interference and `sm_util` its profiled achieved SM utilisation there (interpolated
//! like the time). A GPU's utilisation is its SM-time used over the iteration time (for
//! pipelined strategies: over the time per global batch); the mean and the minimum are over
//! every GPU of the pool, idle ones included. Only the module's profiled work counts: what a
//! strategy adds on top — interference slowdown, Spindle's slice synchronisation, DistTrain's
//! per-microbatch overheads — is time, not work. A module cut into slices (Spindle) counts each
//! slice's share `f × T(d) × sm_util` on that slice's GPUs.
//!
//! # The plan in one line
//! Stages are separated by ` | ` and the modules of a stage, which run at the same time, by
//! ` ∥ `; a module is `name dpD`, with `@quota` below a whole GPU (`text dp2@0.3`). Spindle
//! writes `name dp2→dp4` for a module whose later slice moved to 4 GPUs. Pipelines show their
//! groups as `[modules on N GPUs]`, DistTrain's joined by ` ⇒ ` with the microbatch count,
//! FlowTrain's as `producers […] ⇄ consumers […]`.
//!
//! # Mosaic contains Megatron-LM and DistMM
//! Mosaic's candidates include every whole-GPU option the baselines use: the planner drops a
//! quota-1.0 option only when a smaller quota at the same dp is no slower and needs no more
//! memory or bandwidth, and such a swap never slows a stage (interference grows with the
//! bandwidth). Megatron-LM's plan is one of Mosaic's (one module per stage) and DistMM's is
//! the optimum over a subset of Mosaic's candidates, so where the exact search finishes,
//! Mosaic (exact) is never slower than either (a tested property). GAHC carries no such
//! guarantee.
//!
//! ```
//! use mosaic_compare::{compare, CompareOptions, Strategy};
//! let file = mosaic_plan::synthetic::random_profiles(3, 5, 4);
//! let model = mosaic_profile::PerfModel::new(&file, 0.1, "synthetic").unwrap();
//! let rows = compare(&model, 4, &CompareOptions::default()).unwrap();
//! assert_eq!(rows.len(), Strategy::ALL.len());
//! let time = |s: Strategy| rows.iter().find(|r| r.strategy == s).unwrap().iteration_ms;
//! assert!(time(Strategy::MosaicExact) <= time(Strategy::MegatronLm) + 1e-3);
//! for r in &rows {
//!     assert!((0.0..=1.0).contains(&r.mean_util));
//!     if let Some(plan) = &r.plan {
//!         plan.check(&model).unwrap();
//!     }
//! }
//! ```

#![warn(missing_docs)]

mod common;
mod data;
mod pipeline;
mod roles;
mod spindle;
mod staged;

use std::time::Duration;

use mosaic_plan::{Plan, PlanError, Search};
use mosaic_profile::PerfModel;
use serde::Serialize;

pub use common::whole_gpu_lower_bound;
pub use data::{with_data, DataBatch, Shape, FLOWTRAIN_CAPACITY, FLOWTRAIN_MICROBATCHES};
pub use pipeline::{disttrain, flowtrain, DEFAULT_MAX_MICROBATCHES};
pub use roles::{roles, Roles};
pub use spindle::spindle;
pub use staged::{distmm, megatron, mosaic};

/// The strategies, in the order [`compare`] reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Strategy {
    /// Every module data-parallel over the whole pool, one after another.
    #[serde(rename = "megatron-lm")]
    MegatronLm,
    /// Parallel modules on disjoint whole GPUs, stage by stage.
    #[serde(rename = "distmm")]
    DistMm,
    /// DistMM's stages with modules sliced across waves.
    #[serde(rename = "spindle")]
    Spindle,
    /// Encoder, backbone and head groups as a 1F1B pipeline.
    #[serde(rename = "disttrain")]
    DistTrain,
    /// Decoupled producer and consumer pools.
    #[serde(rename = "flowtrain")]
    FlowTrain,
    /// Mosaic's GAHC (Alg. 1).
    #[serde(rename = "mosaic-gahc")]
    MosaicGahc,
    /// Mosaic's exact stage search (GAHC if it does not finish within the budget).
    #[serde(rename = "mosaic-exact")]
    MosaicExact,
}

impl Strategy {
    /// Every strategy, in report order.
    pub const ALL: [Strategy; 7] = [
        Strategy::MegatronLm,
        Strategy::DistMm,
        Strategy::Spindle,
        Strategy::DistTrain,
        Strategy::FlowTrain,
        Strategy::MosaicGahc,
        Strategy::MosaicExact,
    ];

    /// Display name.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::MegatronLm => "Megatron-LM",
            Strategy::DistMm => "DistMM",
            Strategy::Spindle => "Spindle",
            Strategy::DistTrain => "DistTrain",
            Strategy::FlowTrain => "FlowTrain",
            Strategy::MosaicGahc => "Mosaic (GAHC)",
            Strategy::MosaicExact => "Mosaic (exact)",
        }
    }
}

/// Knobs of the comparison; every default is stated with its reason where it is used.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompareOptions {
    /// Time each exact stage search (Mosaic's, DistMM's) may take before GAHC's plan is used.
    pub budget: Duration,
    /// Spindle: synchronisation cost σ of each extra slice of a module, ms (see [`spindle`]).
    pub slice_sync_ms: f64,
    /// DistTrain: the fixed part of a module's step that every microbatch pays again, ms.
    pub step_overhead_ms: f64,
    /// The global batch the profiles were taken at, when known: bounds DistTrain's microbatch
    /// count so that every replica gets at least one sample per microbatch.
    pub global_batch: Option<u32>,
}

impl Default for CompareOptions {
    fn default() -> Self {
        CompareOptions {
            budget: Duration::from_millis(2000),
            // One step's fixed host-side cost in eager PyTorch, assumed: the device model's
            // per-step launch cost fitted to the H100 is 1.25 ms (`launch_step_ms`, mosaic-zoo),
            // and a slice or a step also switches streams and communicators.
            slice_sync_ms: 2.0,
            step_overhead_ms: 2.0,
            global_batch: None,
        }
    }
}

/// One strategy's result.
#[derive(Debug, Clone, Serialize)]
pub struct StrategyResult {
    /// Which strategy.
    pub strategy: Strategy,
    /// Display name, e.g. `Mosaic (exact)`.
    pub name: String,
    /// Iteration time in ms; for pipelined strategies, the time per global batch.
    pub iteration_ms: f64,
    /// Whether the strategy pipelines global batches (DistTrain, FlowTrain).
    pub pipelined: bool,
    /// Mean GPU utilisation over the pool, in [0, 1] (see the crate docs).
    pub mean_util: f64,
    /// Least utilised GPU of the pool, in [0, 1].
    pub min_util: f64,
    /// Utilisation of every GPU of the pool.
    pub gpu_util: Vec<f64>,
    /// The plan in one line (see the crate docs for the notation).
    pub description: String,
    /// What to know about this row (fallbacks, assumptions), if anything.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The staged plan, where the strategy is one (Megatron-LM, DistMM, Mosaic, and Spindle
    /// when it slices nothing).
    pub plan: Option<Plan>,
    /// What [`with_data`] scales this row by.
    #[serde(skip)]
    pub shape: Shape,
}

/// Why a comparison could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// The pool has no GPU.
    #[error("--gpus: expected at least one GPU")]
    NoGpus,
    /// A module has no whole-GPU option, which every baseline needs.
    #[error(
        "module \"{module}\" has no whole-GPU sample (sm = 1.0) with dp ≤ {gpus} that fits in \
         {memory_gib} GiB; Megatron-LM, DistMM, Spindle, DistTrain and FlowTrain all run modules \
         on whole GPUs, so profile it at sm = 1.0 with a dp of at most {gpus} that fits, or \
         compare on more GPUs"
    )]
    NoWholeGpu {
        /// Module name.
        module: String,
        /// Pool size.
        gpus: u32,
        /// Device memory.
        memory_gib: f64,
    },
    /// No deployment of a strategy fits the pool under the options (e.g. DistTrain when a small
    /// `--global-batch` leaves a replica no sample of a microbatch).
    #[error("{strategy}: {reason}")]
    NoFit {
        /// The strategy's display name.
        strategy: &'static str,
        /// Why nothing fits, and what to change.
        reason: String,
    },
    /// The stage search failed for a strategy.
    #[error("{strategy}: {source}")]
    Plan {
        /// The strategy's display name.
        strategy: &'static str,
        /// The planner's error.
        source: PlanError,
    },
}

/// Every strategy on `model` and `gpus` GPUs, in [`Strategy::ALL`] order.
///
/// Fails when the pool is empty, when a module has no whole-GPU option on it (every baseline
/// needs one), or when a stage search fails (a module that fits on no GPU of the pool). The
/// exact searches (DistMM's and Mosaic's) each take at most `opts.budget` before falling back
/// to GAHC, which the rows' notes say.
pub fn compare(
    model: &PerfModel,
    gpus: u32,
    opts: &CompareOptions,
) -> Result<Vec<StrategyResult>, CompareError> {
    common::whole_gpu_all(model, gpus)?; // one clear error before any search runs
    let dist = distmm(model, gpus, opts.budget)?;
    let spin = spindle::spindle_on(
        model,
        dist.plan.as_ref().expect("DistMM has a plan"),
        opts.slice_sync_ms,
    )?;
    Ok(vec![
        megatron(model, gpus)?,
        dist,
        spin,
        disttrain(model, gpus, opts)?,
        flowtrain(model, gpus)?,
        mosaic(model, gpus, Search::Gahc, opts.budget)?,
        mosaic(model, gpus, Search::Auto, opts.budget)?,
    ])
}

#[cfg(test)]
pub(crate) mod testutil {
    use mosaic_profile::{
        Device, Interference, ModuleProfile, PerfModel, ProfileFile, Sample, FORMAT,
    };

    /// A sample with 1 GiB, sm_util 0.5 and bandwidth growing with the quota.
    pub fn sample(dp: u32, sm: f64, time_ms: f64) -> Sample {
        Sample {
            dp,
            sm,
            time_ms,
            mem_gib: 1.0,
            sm_util: 0.5,
            bw_util: 0.4 * sm,
        }
    }

    /// A module with whole-GPU samples `(dp, time)`.
    pub fn module(name: &str, after: &[&str], whole: &[(u32, f64)]) -> ModuleProfile {
        ModuleProfile {
            name: name.to_string(),
            after: after.iter().map(|s| s.to_string()).collect(),
            samples: whole.iter().map(|&(d, t)| sample(d, 1.0, t)).collect(),
            grad_gib: None,
        }
    }

    /// The model of these modules at quota step 0.1, without interference.
    pub fn model(modules: Vec<ModuleProfile>, memory_gib: f64) -> PerfModel {
        let file = ProfileFile {
            format: FORMAT.to_string(),
            device: Device {
                name: "gpu".to_string(),
                sm_count: 100,
                memory_gib,
                partition: None,
            },
            nodes: None,
            modules,
            interference: Interference::default(),
            source: None,
        };
        // Through the validating parser, as a user's file would go.
        let text = serde_json::to_string(&file).expect("serialisable");
        let parsed = mosaic_profile::parse(&text, "test.json").expect("valid test profile");
        PerfModel::new(&parsed, 0.1, "test.json").expect("test model")
    }

    /// Equal up to the µs rounding of reported times.
    pub fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-3 * a.abs().max(b.abs()).max(1.0)
    }
}
