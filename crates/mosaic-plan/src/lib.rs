//! The temporal-spatial mapping solver of Mosaic (§3.1, §3.4), and an exact search beyond it.
//!
//! A plan splits a model's modules into stages that run one after another on the whole GPU
//! pool; inside a stage each module gets a data-parallel degree and an SM quota on each of its
//! GPUs. [`stage_eval()`] solves one stage exactly, [`gahc()`] is the paper's Alg. 1, and
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

#![warn(missing_docs)]

mod bound;
mod cache;
mod candidates;
mod error;
pub mod exact;
pub mod gahc;
pub mod local;
pub mod nodes;
pub mod order;
mod plan;
mod read;
pub mod render;
pub mod sequence;
pub mod split;
pub mod stage_eval;
pub mod synthetic;

use std::rc::Rc;
use std::time::{Duration, Instant};

use mosaic_profile::{ModuleSet, PerfModel};

pub use cache::{EvalStats, StageCache};
pub use candidates::{Candidate, Candidates};
pub use error::{PlanError, PlanFileError};
pub use exact::{exact, Exact};
pub use gahc::gahc;
pub use plan::{Plan, PlanModule, PlanStage, PLAN_FORMAT};
pub use read::{load_plan, parse_plan, Assignment, ModuleGraph};
pub use stage_eval::{stage_eval, stage_eval_within, Limits, Outcome, Placement, StageAlloc};

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

    /// A lower bound on the iteration time of every plan (`bound/`): the Lagrangian relaxation
    /// of the critical path at the modules' fastest times and their quota area × time over the
    /// pool's SM capacity (a module sharing a GPU at Eq. 8's least slowdown, one alone charged
    /// its GPUs' whole quota), per group of modules that can share stages, with each group's relaxed
    /// stage sequence and stage-packing weights, tightened by the fact that no module of a plan
    /// runs longer than the plan.
    /// The tightening stops at `deadline` (if any) with a weaker bound, still valid.
    pub fn plan_lower_bound(&self, deadline: Option<Instant>) -> f64 {
        bound::plan_bound(self, &bound::Inputs::new(self, deadline), deadline, true)
    }

    /// Per module, its stage-packing weight (`bound/packing.rs`): no stage that holds a set of
    /// modules lasts less than the sum of their weights, so no plan is faster than the sum
    /// over all modules.
    pub fn packing_weights(&self) -> Vec<f64> {
        bound::Inputs::new(self, None).packed
    }
}

/// Which stage search to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Search {
    /// The paper's greedy merging (Alg. 1) alone.
    Gahc,
    /// GAHC, local moves and re-cuts, then the exact search until it proves the optimum or the
    /// budget ends.
    Exact,
    /// As `Exact`, but the exact search gets half of the budget left on problems small enough
    /// for it to finish, a quarter on others, and none once a plan meets the lower bound.
    #[default]
    Auto,
}

/// How [`solve`] searches.
#[derive(Debug, Clone, Copy)]
pub struct SolveOptions {
    /// The stage search.
    pub search: Search,
    /// The deadline, from the call: `solve` returns the best plan found by then.
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

/// StageEval's caps while GAHC and the local search run, so that no single stage eats the
/// budget of the whole search (their answers are then the best allocation found, not proven
/// optimal; the exact search lifts the caps). 4,096 nodes: on 480 random stages of 2–14
/// modules of zoo-shaped models, 116 allocations came out faster than at 256 nodes (by up to
/// 38 %) and none slower, for a median call of 69 µs against 67 (30 ms at worst), and the
/// plans of 24–32 modules with them (README, "Measured"). A call that stops at the cap with an
/// allocation then spends as many nodes again re-placing its neighbourhoods
/// (`stage_eval/neighbourhood.rs`).
pub const HEURISTIC_LIMITS: Limits = Limits {
    deadline: None,
    nodes: 4096,
    splits: 64,
};

/// The local passes deepen StageEval 8× at a time until past this many search nodes.
const DEEPEST_NODES: u64 = 131_072;

/// Plans `model` on `gpus` GPUs within `opts.budget`, anytime: GAHC (§3.4) gives a first plan,
/// local moves and re-cuts of orders and of adjacent stages improve it, and the exact search,
/// when it runs, either proves a plan optimal or raises the lower bound. Every phase stops at the deadline with the best valid plan so far;
/// the plan says what was proven about it ([`Plan::optimal`], [`Plan::lower_bound_ms`]).
pub fn solve(model: &PerfModel, gpus: u32, opts: &SolveOptions) -> Result<Plan, PlanError> {
    let start = Instant::now();
    // A budget beyond a year is no deadline at all (and would overflow `Instant`).
    let deadline = start + opts.budget.min(Duration::from_secs(365 * 86_400));
    let problem = Problem::new(model, gpus)?;
    let limits = |nodes| Limits {
        deadline: Some(deadline),
        nodes,
        ..HEURISTIC_LIMITS
    };
    let mut cache = StageCache::with_limits(&problem, limits(HEURISTIC_LIMITS.nodes));
    let mut stages = gahc(&mut cache, deadline)?;
    let mut search = "gahc";
    let inputs = cache.bound_inputs(Some(deadline));
    // Where the exact search may finish, it proves more than the bound's dearer part would.
    let may_finish = exact_may_finish(&problem);
    let mut lower = bound::plan_bound(&problem, &inputs, Some(deadline), !may_finish);
    let mut optimal = false;
    if opts.search != Search::Gahc {
        // Local moves, then re-cut orders; again with StageEval searching 8× deeper while a
        // pass gains and time is left.
        // They stop at three quarters of the budget, so that the re-cuts below get time.
        let moves_deadline = start + deadline.saturating_duration_since(start) * 3 / 4;
        let mut nodes = HEURISTIC_LIMITS.nodes;
        loop {
            let before = total_ms(&stages);
            let moved = local::improve(&mut cache, stages.clone(), moves_deadline);
            let improved = sequence::improve(&mut cache, moved, moves_deadline);
            let gained = total_ms(&improved) < before * (1.0 - 1e-9);
            if gained {
                stages = improved;
                search = "local";
            }
            if !gained || nodes >= DEEPEST_NODES || Instant::now() >= moves_deadline {
                break;
            }
            nodes *= 8;
            cache.set_limits(limits(nodes));
        }
        // Re-cut two or three adjacent stages into two with what time is left, then solve the
        // chosen stages 8× deeper still: their allocations were the best a capped StageEval
        // found. The re-cuts try many stages, so they get the shallowest StageEval: at the
        // depth the moves reached they tried too few (`zoo_shaped_profiles(1, 32, 32)` with
        // interference planned at 330.2 ms in 2 s and at 298.8 ms in 1 s).
        cache.set_limits(limits(HEURISTIC_LIMITS.nodes));
        let recut = split::improve(&mut cache, stages.clone(), deadline);
        cache.set_limits(limits(DEEPEST_NODES * 8));
        let polished: Vec<Rc<StageAlloc>> = recut
            .into_iter()
            .map(|s| cache.eval_below(s.set, s.time_ms).unwrap_or(s))
            .collect();
        if total_ms(&polished) < total_ms(&stages) * (1.0 - 1e-9) {
            stages = polished;
            search = "local";
        }
        // Auto gives the exact search half of what is left where it may finish at all, and a
        // quarter wherever the plan is not yet proven: on long chains the bound is often tight
        // and the search, pruning with it, proves a far better plan in a few hundred ms
        // (random 64 modules × 1,024 GPUs, seed 1: 504.9 → 409.9 ms, proven, in 183 ms).
        let left = |share: u32| {
            let now = Instant::now();
            Some(now + deadline.saturating_duration_since(now) / share)
        };
        let gap = total_ms(&stages) / lower - 1.0;
        let proof_deadline = match opts.search {
            Search::Exact => Some(deadline),
            _ if may_finish => left(2),
            _ if gap > 1e-9 => left(4),
            _ => None,
        };
        if let Some(proof_deadline) = proof_deadline {
            cache.set_limits(Limits {
                deadline: Some(proof_deadline),
                ..Limits::EXACT
            });
            let found = exact(&mut cache, total_ms(&stages), proof_deadline);
            if let Some(better) = found.better {
                stages = better;
                search = "exact";
            }
            optimal = found.finished;
            lower = lower.max(found.lower_ms);
        }
    }
    // Number the GPUs so that modules keep to few nodes, charging cross-node all-reduces
    // where they must span more than their profiles assume. The search never charged them, so
    // a charged plan is no longer proven optimal (the bound still holds).
    let searched = total_ms(&stages);
    // A plan that meets the lower bound is optimal, whether or not the exact search ran.
    let optimal = optimal || searched <= lower * (1.0 + 1e-9);
    let stages: Vec<Rc<StageAlloc>> = stages
        .iter()
        .map(|s| Rc::new(nodes::embed(s, model, gpus)))
        .collect();
    let optimal = optimal && total_ms(&stages) <= searched;
    let solve_ms = start.elapsed().as_secs_f64() * 1e3;
    let mut plan = Plan::new(model, gpus, &stages, search, solve_ms);
    plan.optimal = optimal;
    plan.lower_bound_ms = Some(if optimal {
        plan.iteration_ms
    } else {
        plan::round(lower.min(plan.iteration_ms), 3)
    });
    Ok(plan)
}

/// The iteration time of a stage sequence, in ms.
fn total_ms(stages: &[Rc<StageAlloc>]) -> f64 {
    stages.iter().map(|s| s.time_ms).sum()
}

/// Whether the exact search has a chance to finish: few down-sets of the DAG, each with few
/// possible next stages.
fn exact_may_finish(problem: &Problem) -> bool {
    exact::steps(problem.model, EXACT_MAX_STEPS) <= EXACT_MAX_STEPS
}

/// The most A* steps (down-set, next stage) the auto search tries to prove optimal over.
const EXACT_MAX_STEPS: u64 = 50_000;
