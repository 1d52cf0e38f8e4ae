//! Lower bounds on the iteration time of every plan, by Lagrangian relaxation and a relaxed
//! stage sequence.
//!
//! Take any plan: stages of times T_s, each module m at some *run* (`options.rs`: a candidate
//! shared with others at the least slowdown of Eq. 8, or alone on its GPUs) with time t_m (its
//! rectified time is no less) and quota area a_m (dp × quota units, all of its GPUs' units
//! when it runs alone), on a pool of capacity K quota units. Two facts hold:
//! - **critical path**: the modules of a dependency chain P sit in distinct stages, so
//!   Σ_s T_s ≥ Σ_{m∈P} t_m;
//! - **area**: a stage holds at most K units for T_s ≥ t_m, so K·Σ_s T_s ≥ Σ_m a_m·t_m.
//!
//! For any λ ∈ [0, 1] the plan's time is at least λ times the first plus 1 − λ times the
//! second over K. Relaxing the choice of runs, each module independently, gives
//!
//! L(λ) = (1 − λ)·Σ_m min(a·t)/K + max_P Σ_{m∈P} [min_c (λ·t_c + (1 − λ)·a_c·t_c/K) − (1 − λ)·min(a·t)/K],
//!
//! a longest path with non-negative node weights. λ = 1 is the plain critical path at the
//! fastest times and λ = 0 the plain area bound; between them the bound charges a chain module
//! for the capacity its fast candidates take from everything else, which neither does alone.
//! The bound is the best L(λ) over a grid of λ, for the modules not yet done (the exact
//! search's heuristic, admissible because it is a lower bound on what remains).
//!
//! Modules that are each an ancestor or a descendant of the other never share a stage. So the
//! modules left split into *groups*, the connected components of the graph joining every two
//! modules that are neither (which could share a stage): two modules of different groups are
//! always ordered, every stage holds modules of one group only, and the plan's time is the sum
//! of the groups' stage times. The bound is therefore the sum over the groups of each one's
//! best L(λ), its own area and its own longest path (no path between two modules of a group
//! leaves it: a module ordered against every module of a connected group lies wholly before or
//! after it). A lone backbone is a group of its own, charged its fastest time: the area term
//! alone counts only the quota it uses, not the pool it leaves idle; and the encoders before it
//! and the decoders after it each get their own λ. A group's bound is also at least its
//! stage-sequence relaxation (`stages.rs`: every module at its fastest, no SM capacity), which
//! sees that modules at different depths add stages where one critical path does not.
//!
//! A group's bound is also at least the sum of its modules' stage-packing weights
//! (`packing.rs`): weights such that no stage a plan can form holds more weight than it lasts,
//! which sees that a module holds its quota for its whole stage, so modules that cannot fit
//! beside each other at their fast runs need stages of their own.
//!
//! For a whole plan it tightens further (`plan.rs`, [`plan_bound`]): no module of a plan of
//! time C runs longer than C minus the fastest chains before and after it, so the least C with
//! C ≥ B(C) bounds every plan.

mod options;
mod packing;
mod plan;
mod simplex;
mod stages;

use std::collections::HashMap;
use std::time::Instant;

use mosaic_profile::{ModuleSet, PerfModel};

use crate::Problem;
pub(crate) use plan::plan_bound;

use options::Run;
use stages::Stages;

/// The λ grid: 0, 1/16, …, 1.
const STEPS: usize = 16;

/// The Lagrangian lower bound of a problem, over any set of modules still to plan.
pub(crate) struct LowerBound<'m> {
    pub(crate) model: &'m PerfModel,
    /// Every module.
    pub(crate) all: ModuleSet,
    /// Per module, its fastest time.
    pub(crate) min_time: Vec<f64>,
    /// Per module, its least quota-area × time over the capacity.
    area: Vec<f64>,
    /// Per λ step and module, the longest-path node weight of the module docs.
    weight: Vec<Vec<f64>>,
    /// Per module, the modules consuming its output.
    children: Vec<Vec<usize>>,
    /// Per module, its ancestors and descendants.
    comparable: Vec<ModuleSet>,
    /// The stage-sequence relaxation at the fastest times (`stages.rs`).
    stages: Stages,
    /// Per module, its stage-packing weight (`packing.rs`): a set of modules takes at least
    /// the sum of theirs.
    packed: Vec<f64>,
    /// The bound of each down-set asked for so far.
    memo: HashMap<u64, f64>,
}

impl<'m> LowerBound<'m> {
    /// The bound of `problem` from its `inputs`.
    pub(crate) fn new(problem: &Problem<'m>, inputs: &Inputs) -> Self {
        let window = vec![0.0; problem.cands.len()];
        Self::capped(problem, inputs, f64::INFINITY, &window)
    }

    /// The bound of `problem` from its `inputs`, over the plans of time at most `cap` ms:
    /// each module keeps the runs no slower than `cap` − its `window` slack; modules without
    /// one make every bound infinite.
    fn capped(problem: &Problem<'m>, inputs: &Inputs, cap: f64, window: &[f64]) -> Self {
        let runs = &inputs.runs;
        let model = problem.model;
        let n = model.modules.len();
        let capacity = model.units_per_gpu as f64 * problem.gpus as f64;
        let within = |m: usize| {
            let window = window[m];
            runs[m].iter().filter(move |r| r.time_ms + window <= cap)
        };
        let area: Vec<f64> = (0..n)
            .map(|m| {
                within(m)
                    .map(|r| r.area_time / capacity)
                    .fold(f64::INFINITY, f64::min)
            })
            .collect();
        let weight = (0..=STEPS)
            .map(|k| {
                let lambda = k as f64 / STEPS as f64;
                (0..n)
                    .map(|m| {
                        let best = within(m)
                            .map(|r| lambda * r.time_ms + (1.0 - lambda) * r.area_time / capacity)
                            .fold(f64::INFINITY, f64::min);
                        if area[m].is_finite() {
                            (best - (1.0 - lambda) * area[m]).max(0.0)
                        } else {
                            f64::INFINITY
                        }
                    })
                    .collect()
            })
            .collect();
        let children = (0..n)
            .map(|m| {
                (0..n)
                    .filter(|&c| model.modules[c].parents.contains(m))
                    .collect()
            })
            .collect();
        let min_time: Vec<f64> = problem.cands.iter().map(|c| c.min_time()).collect();
        let fastest = (0..n)
            .map(|m| {
                if area[m].is_finite() {
                    min_time[m]
                } else {
                    f64::INFINITY
                }
            })
            .collect();
        LowerBound {
            model,
            all: ModuleSet::all(n),
            stages: Stages::new(model, fastest),
            min_time,
            area,
            weight,
            children,
            comparable: inputs.comparable.clone(),
            packed: inputs.packed.clone(),
            memo: HashMap::new(),
        }
    }

    /// A lower bound on the time the modules outside `done` (a down-set) still take,
    /// computed once per down-set.
    pub(crate) fn of(&mut self, done: ModuleSet) -> f64 {
        if let Some(&h) = self.memo.get(&done.0) {
            return h;
        }
        let h = self.compute(done);
        self.memo.insert(done.0, h);
        h
    }

    /// [`LowerBound::of`], computed.
    fn compute(&mut self, done: ModuleSet) -> f64 {
        self.per_group(done).iter().map(|g| g.1).sum()
    }

    /// Each group of the modules outside `done` with its bound.
    fn per_group(&mut self, done: ModuleSet) -> Vec<(ModuleSet, f64)> {
        let rest = self.all.minus(done);
        let (group, groups) = groups(rest, &self.comparable);
        let mut area = vec![0.0f64; groups];
        for m in rest.iter() {
            area[group[m]] += self.area[m];
        }
        let mut best = vec![0.0f64; groups];
        let mut chain = vec![0.0f64; self.model.modules.len()];
        for (k, weight) in self.weight.iter().enumerate() {
            let lambda = k as f64 / STEPS as f64;
            let mut longest = vec![0.0f64; groups];
            for &m in self.model.topo_order.iter().rev() {
                if done.contains(m) {
                    continue;
                }
                let after = self.children[m]
                    .iter()
                    .filter(|&&c| group[c] == group[m])
                    .map(|&c| chain[c])
                    .fold(0.0, f64::max);
                chain[m] = weight[m] + after;
                longest[group[m]] = longest[group[m]].max(chain[m]);
            }
            for g in 0..groups {
                best[g] = best[g].max((1.0 - lambda) * area[g] + longest[g]);
            }
        }
        let mut members = vec![ModuleSet::EMPTY; groups];
        for m in rest.iter() {
            members[group[m]] = members[group[m]].union(ModuleSet::single(m));
        }
        best.iter()
            .zip(members)
            .map(|(&lagrangian, set)| {
                let packed: f64 = set.iter().map(|m| self.packed[m]).sum();
                let stages = self.stages.least(set).unwrap_or(0.0);
                (set, lagrangian.max(stages).max(packed))
            })
            .collect()
    }
}

/// What every bound of one problem derives from, computed once.
pub(crate) struct Inputs {
    /// Per module, its ancestors and descendants.
    comparable: Vec<ModuleSet>,
    /// Per module, its runs no other beats in time and area (`options.rs`).
    runs: Vec<Vec<Run>>,
    /// Per module, its stage-packing weight (`packing.rs`).
    pub(crate) packed: Vec<f64>,
}

impl Inputs {
    /// The inputs of `problem`; the packing weights stop improving at `deadline`, and are
    /// left at 0 in each group where they cannot beat the group's other bounds.
    pub(crate) fn new(problem: &Problem, deadline: Option<Instant>) -> Self {
        let comparable = comparable(problem.model);
        let all_runs = options::options(problem, &comparable);
        let n = all_runs.len();
        let mut inputs = Inputs {
            comparable,
            runs: all_runs.iter().cloned().map(options::area_front).collect(),
            packed: vec![0.0; n],
        };
        let groups = LowerBound::new(problem, &inputs).per_group(ModuleSet::EMPTY);
        inputs.packed = packing::weights(problem, &all_runs, &groups, deadline);
        inputs
    }
}

/// The groups of `rest` (module docs) under `comparable`: per module its group's number
/// (`usize::MAX` outside `rest`), and how many.
fn groups(rest: ModuleSet, comparable: &[ModuleSet]) -> (Vec<usize>, usize) {
    let mut group = vec![usize::MAX; comparable.len()];
    let mut groups = 0;
    for seed in rest.iter() {
        if group[seed] != usize::MAX {
            continue;
        }
        let mut todo = vec![seed];
        group[seed] = groups;
        while let Some(m) = todo.pop() {
            let unordered = rest.minus(comparable[m]).minus(ModuleSet::single(m));
            for other in unordered.iter() {
                if group[other] == usize::MAX {
                    group[other] = groups;
                    todo.push(other);
                }
            }
        }
        groups += 1;
    }
    (group, groups)
}

/// Per module, its ancestors and descendants: the modules that never share a stage with it.
fn comparable(model: &PerfModel) -> Vec<ModuleSet> {
    let n = model.modules.len();
    (0..n)
        .map(|m| {
            let descendants = (0..n).filter(|&d| model.modules[d].ancestors.contains(m));
            descendants.fold(model.modules[m].ancestors, |set, d| {
                set.union(ModuleSet::single(d))
            })
        })
        .collect()
}
