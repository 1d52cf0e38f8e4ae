//! The temporal-spatial mapping solver of Mosaic (§3.1, §3.4), and an exact search beyond it.
//!
//! A plan splits a model's modules into stages that run one after another on the whole GPU
//! pool; inside a stage each module gets a data-parallel degree and an SM quota on each of its
//! GPUs. [`stage_eval`] solves one stage exactly, [`gahc()`] is the paper's Alg. 1, and
//! [`exact()`] finds the optimal stage sequence by A* over the DAG's down-sets. [`solve`] runs
//! them as `--search gahc|exact|auto` asks and returns a [`Plan`], the `mosaic-plan/1` file.
//! [`load_plan`] reads such a file back and [`Plan::resolve`] checks it against a model: the one
//! plan loader the simulator and the engine use.
//!
//! ```
//! use mosaic_profile::{parse, PerfModel};
//! use mosaic_plan::{solve, Search, SolveOptions};
//! let sample = |sm: f64, t: f64| format!(
//!     r#"{{"dp": 1, "sm": {sm}, "time_ms": {t}, "mem_gib": 1.0, "sm_util": 0.5, "bw_util": 0.2}}"#);
//! // Two encoders that stop scaling at half a GPU, and a head after both.
//! let module = |name: &str, after: &str| format!(
//!     r#"{{"name": "{name}", "after": [{after}], "samples": [{}, {}]}}"#,
//!     sample(0.5, 100.0), sample(1.0, 100.0));
//! let text = format!(
//!     r#"{{"format": "mosaic-profiles/1",
//!         "device": {{"name": "gpu", "sm_count": 100, "memory_gib": 80.0}},
//!         "modules": [{}, {}, {}],
//!         "interference": {{"e1": 0.0, "e2": 0.0, "e3": 0.0}}}}"#,
//!     module("a", ""), module("b", ""), module("head", r#""a", "b""#));
//! let model = PerfModel::new(&parse(&text, "x.json").unwrap(), 0.1, "x.json").unwrap();
//! let plan = solve(&model, 1, &SolveOptions { search: Search::Exact, ..Default::default() }).unwrap();
//! // a and b share the GPU at half a quota each, then the head runs alone.
//! assert_eq!(plan.stages.len(), 2);
//! assert_eq!(plan.iteration_ms, 200.0);
//! ```

mod cache;
mod candidates;
mod error;
pub mod exact;
pub mod gahc;
pub mod order;
mod plan;
mod read;
pub mod stage_eval;
pub mod synthetic;

use std::time::{Duration, Instant};

use mosaic_profile::{ModuleSet, PerfModel};

pub use cache::{EvalStats, StageCache};
pub use candidates::{Candidate, Candidates};
pub use error::{PlanError, PlanFileError};
pub use exact::exact;
pub use gahc::gahc;
pub use plan::{Plan, PlanModule, PlanStage, PLAN_FORMAT};
pub use read::{load_plan, parse_plan, Assignment, ModuleGraph};
pub use stage_eval::{stage_eval, Placement, StageAlloc};

/// The least SM quota a plan may give a module: 0.1 % of a GPU, below one SM of any GPU (an
/// H100's SM is 0.76 %), so that no quota is a denormal the simulator cannot run.
pub const MIN_QUOTA: f64 = 1e-3;

pub use mosaic_profile::MAX_GPUS;

/// A model's modules and their candidates on a pool of identical GPUs.
pub struct Problem<'m> {
    /// The performance model.
    pub model: &'m PerfModel,
    /// GPUs in the pool.
    pub gpus: u32,
    /// Per module (by index), its undominated candidates on this pool.
    pub cands: Vec<Candidates>,
}

impl<'m> Problem<'m> {
    /// The problem of planning `model` on `gpus` GPUs; fails if a module cannot be placed.
    pub fn new(model: &'m PerfModel, gpus: u32) -> Result<Self, PlanError> {
        if gpus == 0 {
            return Err(PlanError::NoGpus);
        }
        if gpus > MAX_GPUS {
            return Err(PlanError::TooManyGpus { gpus });
        }
        let cands: Vec<Candidates> = model
            .modules
            .iter()
            .map(|m| Candidates::new(&m.options, gpus))
            .collect();
        let problem = Problem { model, gpus, cands };
        if let Some(m) = problem.cands.iter().position(|c| c.is_empty()) {
            return Err(problem.unplaceable(m));
        }
        Ok(problem)
    }

    pub(crate) fn unplaceable(&self, m: usize) -> PlanError {
        PlanError::Unplaceable {
            module: self.model.modules[m].name.clone(),
            gpus: self.gpus,
            memory_gib: self.model.device.memory_gib,
        }
    }

    /// A lower bound on the optimal time of a stage holding `set`: the smallest target τ at
    /// which every module has a candidate no slower than τ and the least quota areas of those
    /// candidates fit the pool's SM capacity (infinite when none fits).
    pub fn lower_bound(&self, set: ModuleSet) -> f64 {
        let floor = set
            .iter()
            .map(|m| self.cands[m].min_time())
            .fold(0.0, f64::max);
        let capacity = self.model.units_per_gpu * self.gpus;
        let fits = |tau: f64| {
            set.iter()
                .map(|m| self.cands[m].min_area_at_most(tau).unwrap_or(capacity + 1))
                .try_fold(0u32, |acc, a| acc.checked_add(a).filter(|&s| s <= capacity))
                .is_some()
        };
        if fits(floor) {
            return floor;
        }
        let mut taus: Vec<f64> = set
            .iter()
            .flat_map(|m| self.cands[m].list.iter().map(|c| c.time_ms))
            .filter(|&t| t > floor)
            .collect();
        taus.sort_by(f64::total_cmp);
        let k = taus.partition_point(|&t| !fits(t));
        taus.get(k).copied().unwrap_or(f64::INFINITY)
    }
}

/// Which stage search to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Search {
    /// The paper's greedy merging (Alg. 1).
    Gahc,
    /// The optimal stage sequence (fails if it does not finish within the budget).
    Exact,
    /// Exact when it finishes within the budget, else GAHC.
    #[default]
    Auto,
}

/// How [`solve`] searches.
#[derive(Debug, Clone, Copy)]
pub struct SolveOptions {
    /// The stage search.
    pub search: Search,
    /// Time the exact search may take.
    pub budget: Duration,
}

impl Default for SolveOptions {
    fn default() -> Self {
        SolveOptions {
            search: Search::Auto,
            budget: Duration::from_millis(2000),
        }
    }
}

/// Plans `model` on `gpus` GPUs. GAHC always runs first: it is the answer for `gahc`, the
/// incumbent that prunes the exact search, and the fallback of `auto`.
pub fn solve(model: &PerfModel, gpus: u32, opts: &SolveOptions) -> Result<Plan, PlanError> {
    let start = Instant::now();
    let problem = Problem::new(model, gpus)?;
    let mut cache = StageCache::new(&problem);
    let greedy = gahc(&mut cache)?;
    let (stages, search) = match opts.search {
        Search::Gahc => (greedy, "gahc"),
        Search::Exact | Search::Auto => {
            let upper: f64 = greedy.iter().map(|s| s.time_ms).sum();
            match exact(&mut cache, upper, start + opts.budget) {
                Ok(Some(better)) => (better, "exact"),
                Ok(None) => (greedy, "exact"), // proven: nothing beats GAHC's plan
                Err(exact::Timeout) if opts.search == Search::Auto => (greedy, "gahc"),
                Err(exact::Timeout) => {
                    return Err(PlanError::ExactTimeout {
                        budget_ms: opts.budget.as_millis() as u64,
                        modules: model.modules.len(),
                    })
                }
            }
        }
    };
    let solve_ms = start.elapsed().as_secs_f64() * 1e3;
    Ok(Plan::new(model, gpus, &stages, search, solve_ms))
}
