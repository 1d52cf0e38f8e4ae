//! Lower bounds on the iteration time of every plan, by Lagrangian relaxation and a relaxed
//! stage sequence.
//!
//! Take any plan: stages of times T_s, each module m at some candidate with time t_m (its
//! rectified time is no less) and quota area a_m (dp × quota units), on a pool of capacity K
//! quota units. Two facts hold:
//! - **critical path**: the modules of a dependency chain P sit in distinct stages, so
//!   Σ_s T_s ≥ Σ_{m∈P} t_m;
//! - **area**: a stage holds at most K units for T_s ≥ t_m, so K·Σ_s T_s ≥ Σ_m a_m·t_m.
//!
//! For any λ ∈ [0, 1] the plan's time is at least λ times the first plus 1 − λ times the
//! second over K. Relaxing the choice of candidates, each module independently, gives
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
//! For a whole plan it tightens further ([`plan_bound`]): no module of an optimal plan of time
//! C* runs longer than C*, so C* ≥ B(C*) where B(C) is the bound above over only the
//! candidates no slower than C. B falls as C grows, so the least C with C ≥ B(C), found by a
//! binary search over the candidates' times, bounds C* from below. This charges the area
//! term for the fast candidates a short plan forces, where the plain area bound takes every
//! module at its most frugal (and often slowest) candidate. The cap is per module: the modules
//! of a path through m sit in distinct stages, each at least its fastest time, so a plan of
//! time C runs m no longer than C − head(m) − tail(m), the longest chains of fastest times
//! before and after it. An encoder before a long backbone chain must then finish in what the
//! chain leaves, at a fast (area-hungry) candidate, which a uniform cap of C never forces.

mod stages;

use std::collections::HashMap;
use std::time::Instant;

use mosaic_profile::{ModuleSet, PerfModel};

use crate::Problem;
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
    /// The bound of each down-set asked for so far.
    memo: HashMap<u64, f64>,
}

impl<'m> LowerBound<'m> {
    /// The bound of `problem`.
    pub(crate) fn new(problem: &Problem<'m>) -> Self {
        Self::capped(problem, f64::INFINITY, &vec![0.0; problem.cands.len()])
    }

    /// The bound of `problem` over the plans of time at most `cap` ms: each module keeps the
    /// candidates no slower than `cap` − its `window` slack; modules without one make every
    /// bound infinite.
    fn capped(problem: &Problem<'m>, cap: f64, window: &[f64]) -> Self {
        let model = problem.model;
        let n = model.modules.len();
        let capacity = model.units_per_gpu as f64 * problem.gpus as f64;
        // The same sum as `plan_bound`'s breakpoints, so that a breakpoint keeps its candidate.
        let within = |m: usize| {
            let window = window[m];
            problem.cands[m]
                .list
                .iter()
                .filter(move |c| c.time_ms + window <= cap)
        };
        let area: Vec<f64> = (0..n)
            .map(|m| {
                within(m)
                    .map(|c| c.area as f64 * c.time_ms / capacity)
                    .fold(f64::INFINITY, f64::min)
            })
            .collect();
        let weight = (0..=STEPS)
            .map(|k| {
                let lambda = k as f64 / STEPS as f64;
                (0..n)
                    .map(|m| {
                        let best = within(m)
                            .map(|c| {
                                lambda * c.time_ms
                                    + (1.0 - lambda) * c.area as f64 * c.time_ms / capacity
                            })
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
        let comparable = (0..n)
            .map(|m| {
                let descendants = (0..n).filter(|&d| model.modules[d].ancestors.contains(m));
                descendants.fold(model.modules[m].ancestors, |set, d| {
                    set.union(ModuleSet::single(d))
                })
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
            comparable,
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
        let rest = self.all.minus(done);
        let (group, groups) = self.groups(rest);
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
            .map(|(&lagrangian, set)| lagrangian.max(self.stages.least(set).unwrap_or(0.0)))
            .sum()
    }

    /// The groups of `rest` (module docs): per module its group's number, and how many.
    fn groups(&self, rest: ModuleSet) -> (Vec<usize>, usize) {
        let mut group = vec![usize::MAX; self.model.modules.len()];
        let mut groups = 0;
        for seed in rest.iter() {
            if group[seed] != usize::MAX {
                continue;
            }
            let mut todo = vec![seed];
            group[seed] = groups;
            while let Some(m) = todo.pop() {
                let unordered = rest.minus(self.comparable[m]).minus(ModuleSet::single(m));
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
}

/// Per module m, head(m) + tail(m): the longest chains of fastest times that end just before m
/// and start just after it (module docs). A plan of time C runs m no longer than C minus this.
fn windows(problem: &Problem) -> Vec<f64> {
    let model = problem.model;
    let n = model.modules.len();
    let fastest: Vec<f64> = problem.cands.iter().map(|c| c.min_time()).collect();
    let (mut head, mut tail) = (vec![0.0f64; n], vec![0.0f64; n]);
    for &m in &model.topo_order {
        head[m] = model.modules[m]
            .parents
            .iter()
            .map(|p| head[p] + fastest[p])
            .fold(0.0, f64::max);
    }
    for &m in model.topo_order.iter().rev() {
        for p in model.modules[m].parents.iter() {
            tail[p] = tail[p].max(fastest[m] + tail[m]);
        }
    }
    (0..n).map(|m| head[m] + tail[m]).collect()
}

/// The fixed-point lower bound on every plan's iteration time (module docs): the least C with
/// C ≥ B(C), B(C) the bound over the candidates a plan of time C can use. Stopped at
/// `deadline`, the search returns the least C it has not yet ruled out.
pub(crate) fn plan_bound(problem: &Problem, deadline: Option<Instant>) -> f64 {
    let window = windows(problem);
    // B changes only where C crosses some candidate's time plus its module's window.
    let mut times: Vec<f64> = problem
        .cands
        .iter()
        .zip(&window)
        .flat_map(|(c, w)| c.list.iter().map(move |o| o.time_ms + w))
        .collect();
    times.sort_by(f64::total_cmp);
    times.dedup();
    let b = |k: usize| LowerBound::capped(problem, times[k], &window).of(ModuleSet::EMPTY);
    // Between consecutive times B is constant, so the interval [t_k, t_k+1) holds a C ≥ B(C)
    // iff B(t_k) < t_k+1; that holds from some k on (B falls, t rises): find the first.
    let next = |k: usize| times.get(k + 1).copied().unwrap_or(f64::INFINITY);
    let (mut lo, mut hi) = (0, times.len().saturating_sub(1));
    if times.is_empty() {
        return 0.0;
    }
    let unbounded = LowerBound::new(problem).of(ModuleSet::EMPTY);
    while lo < hi {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            // No C below times[lo] satisfies C ≥ B(C).
            return times[lo].max(unbounded);
        }
        let mid = (lo + hi) / 2;
        if b(mid) < next(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    times[lo].max(b(lo)).max(unbounded)
}
