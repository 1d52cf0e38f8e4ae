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
//! and the decoders after it each get their own λ.
//!
//! The longest path can give way to the group's *stage sequence* over the same weights
//! (`stages.rs`: a stage costs its heaviest module, with no SM capacity), which sees that
//! modules at different depths add stages where one path does not. It holds because each
//! stage s lasts T_s ≥ t_m for its modules and K·T_s ≥ Σ_{m∈s} a_m·t_m, so
//! T_s ≥ λ·max_{m∈s} t_m + (1 − λ)·Σ_{m∈s} a_m·t_m/K; and, writing a_m·t_m/K as its least
//! value plus an excess e_m ≥ 0, λ·max t + (1 − λ)·Σ e ≥ max_{m∈s} (λ·t_m + (1 − λ)·e_m) ≥
//! max_{m∈s} w_m, the module's weight. At λ = 1 it is the sequence at the fastest times; in
//! between it charges the frugal runs the area term wants the stage time they cost
//! (107.5 ms where each alone gives 100 in this module's test). A sequence per λ step costs
//! a dynamic programme each, so the exact search's heuristic, asked of many down-sets, solves
//! it at λ = 1 alone, and a whole plan's bound at every step.
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
    /// Per λ step, the stage-sequence relaxation over that step's weights (`stages.rs`),
    /// where this bound solves it.
    stages: Vec<Option<Stages>>,
    /// Per module, its stage-packing weight (`packing.rs`): a set of modules takes at least
    /// the sum of theirs.
    packed: Vec<f64>,
    /// The bound of each down-set asked for so far.
    memo: HashMap<u64, f64>,
}

impl<'m> LowerBound<'m> {
    /// The bound of `problem` from its `inputs`, with the stage sequence at the fastest
    /// times only (λ = 1): the search's heuristic, asked of many down-sets, where a sequence
    /// per λ step costs 4–7× the exact search's time.
    pub(crate) fn new(problem: &Problem<'m>, inputs: &Inputs) -> Self {
        let window = vec![0.0; problem.cands.len()];
        Self::capped(problem, inputs, f64::INFINITY, &window, false)
    }

    /// The bound of `problem` from its `inputs`, over the plans of time at most `cap` ms:
    /// each module keeps the runs no slower than `cap` − its `window` slack; modules without
    /// one make every bound infinite. The stage sequence is solved at `every_step` of λ, or
    /// at λ = 1 alone.
    fn capped(
        problem: &Problem<'m>,
        inputs: &Inputs,
        cap: f64,
        window: &[f64],
        every_step: bool,
    ) -> Self {
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
        let weight: Vec<Vec<f64>> = (0..=STEPS)
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
        let stages = weight
            .iter()
            .enumerate()
            .map(|(k, w)| (every_step || k == STEPS).then(|| Stages::new(model, w.clone())))
            .collect();
        LowerBound {
            model,
            all: ModuleSet::all(n),
            stages,
            min_time: problem.cands.iter().map(|c| c.min_time()).collect(),
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

    /// The stage-packing weights of `set`: no stage holding it lasts less.
    pub(crate) fn packed(&self, set: ModuleSet) -> f64 {
        set.iter().map(|m| self.packed[m]).sum()
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
        let mut members = vec![ModuleSet::EMPTY; groups];
        for m in rest.iter() {
            members[group[m]] = members[group[m]].union(ModuleSet::single(m));
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
                // The stage sequence over the same weights is never below the longest path.
                let sequence = self.stages[k].as_mut().and_then(|s| s.least(members[g]));
                let sequence = sequence.unwrap_or(0.0);
                best[g] = best[g].max((1.0 - lambda) * area[g] + longest[g].max(sequence));
            }
        }
        best.iter()
            .zip(members)
            .map(|(&lagrangian, set)| (set, lagrangian.max(self.packed(set))))
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

/// Small models for the crate's tests.
#[cfg(test)]
pub(crate) mod fixture {
    use mosaic_profile::{parse, PerfModel};

    /// A module: its name, its producers (quoted names, comma-separated) and its samples at
    /// dp 1 as (SM share, ms).
    pub(crate) type Module<'a> = (&'a str, &'a str, &'a [(f64, f64)]);

    /// A model of a 100-SM device without interference.
    pub(crate) fn model(modules: &[Module], granularity: f64) -> PerfModel {
        let list: Vec<String> = modules
            .iter()
            .map(|(name, after, samples)| {
                let samples: Vec<String> = samples
                    .iter()
                    .map(|(sm, t)| {
                        format!(
                            r#"{{"dp": 1, "sm": {sm}, "time_ms": {t}, "mem_gib": 1.0,
                            "sm_util": 0.5, "bw_util": 0.2}}"#
                        )
                    })
                    .collect();
                format!(
                    r#"{{"name": "{name}", "after": [{after}], "samples": [{}]}}"#,
                    samples.join(", ")
                )
            })
            .collect();
        let text = format!(
            r#"{{"format": "mosaic-profiles/1",
                "device": {{"name": "gpu", "sm_count": 100, "memory_gib": 80.0}},
                "modules": [{}],
                "interference": {{"e1": 0.0, "e2": 0.0, "e3": 0.0}}}}"#,
            list.join(", ")
        );
        PerfModel::new(&parse(&text, "x.json").unwrap(), granularity, "x.json").unwrap()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::fixture::model;
    use super::*;
    use crate::{solve, Search, SolveOptions};

    #[test]
    fn a_stage_sequence_per_lambda_sees_area_and_depth_together() {
        // A text encoder beside a two-module chain, each fast on the whole GPU or frugal on
        // half of it. At the fastest times the sequence is 20 + 80 ms; the area alone is
        // 50 + 15 + 20 ms; between them, the frugal runs the area wants cost the sequence
        // time, which one bound per term never charges. The optimum: d0 alone on the whole
        // GPU, then text and d1 on a half each, 20 + 100 ms.
        let m = model(
            &[
                ("text", "", &[(0.5, 100.0), (1.0, 80.0)]),
                ("d0", "", &[(0.5, 30.0), (1.0, 20.0)]),
                ("d1", r#""d0""#, &[(0.5, 40.0), (1.0, 27.0)]),
            ],
            0.5,
        );
        let problem = Problem::new(&m, 1).unwrap();
        let mut inputs = Inputs::new(&problem, None);
        // Without the stage-packing weights, which see this small case whole.
        inputs.packed = vec![0.0; 3];
        let window = vec![0.0; 3];
        let fastest_only = LowerBound::new(&problem, &inputs).of(ModuleSet::EMPTY);
        let every_step = LowerBound::capped(&problem, &inputs, f64::INFINITY, &window, true)
            .of(ModuleSet::EMPTY);
        let options = SolveOptions {
            search: Search::Exact,
            budget: Duration::from_secs(10),
        };
        let optimum = solve(&m, 1, &options).unwrap();
        assert!(optimum.optimal);
        // λ = 5/8: text's weight 61.25 ms, d0's 14.375, d1's 19.5; the sequence puts text
        // with d1 (14.375 + 61.25), and 3/8 of the area (85 ms) adds 31.875.
        assert!((fastest_only - 100.0).abs() < 1e-6, "{fastest_only}");
        assert!((every_step - 107.5).abs() < 1e-6, "{every_step}");
        assert!((optimum.iteration_ms - 120.0).abs() < 1e-3, "{optimum:?}");
    }
}
