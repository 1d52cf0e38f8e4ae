//! Lower bounds on the iteration time of every plan, by Lagrangian relaxation.
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
//! For a whole plan it tightens further ([`plan_bound`]): no module of an optimal plan of time
//! C* runs longer than C*, so C* ≥ B(C*) where B(C) is the bound above over only the
//! candidates no slower than C. B falls as C grows, so the least C with C ≥ B(C), found by a
//! binary search over the candidates' times, bounds C* from below. This charges the area
//! term for the fast candidates a short plan forces, where the plain area bound takes every
//! module at its most frugal (and often slowest) candidate.

use std::collections::HashMap;

use mosaic_profile::{ModuleSet, PerfModel};

use crate::Problem;

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
    /// The bound of each down-set asked for so far.
    memo: HashMap<u64, f64>,
}

impl<'m> LowerBound<'m> {
    /// The bound of `problem`.
    pub(crate) fn new(problem: &Problem<'m>) -> Self {
        Self::capped(problem, f64::INFINITY)
    }

    /// The bound of `problem` over the candidates no slower than `cap` ms; modules without
    /// one make every bound infinite.
    fn capped(problem: &Problem<'m>, cap: f64) -> Self {
        let model = problem.model;
        let n = model.modules.len();
        let capacity = model.units_per_gpu as f64 * problem.gpus as f64;
        let within = |m: usize| {
            problem.cands[m]
                .list
                .iter()
                .filter(move |c| c.time_ms <= cap)
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
        LowerBound {
            model,
            all: ModuleSet::all(n),
            min_time: problem.cands.iter().map(|c| c.min_time()).collect(),
            area,
            weight,
            children,
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
    fn compute(&self, done: ModuleSet) -> f64 {
        let rest = self.all.minus(done);
        let area: f64 = rest.iter().map(|m| self.area[m]).sum();
        let mut chain = vec![0.0f64; self.model.modules.len()];
        let mut best: f64 = 0.0;
        for (k, weight) in self.weight.iter().enumerate() {
            let lambda = k as f64 / STEPS as f64;
            let mut longest: f64 = 0.0;
            for &m in self.model.topo_order.iter().rev() {
                if done.contains(m) {
                    continue;
                }
                let after = self.children[m]
                    .iter()
                    .map(|&c| chain[c])
                    .fold(0.0, f64::max);
                chain[m] = weight[m] + after;
                longest = longest.max(chain[m]);
            }
            best = best.max((1.0 - lambda) * area + longest);
        }
        best
    }
}

/// The fixed-point lower bound on every plan's iteration time (module docs): the least C with
/// C ≥ B(C).
pub(crate) fn plan_bound(problem: &Problem) -> f64 {
    let mut times: Vec<f64> = problem
        .cands
        .iter()
        .flat_map(|c| c.list.iter().map(|o| o.time_ms))
        .collect();
    times.sort_by(f64::total_cmp);
    times.dedup();
    let b = |k: usize| LowerBound::capped(problem, times[k]).of(ModuleSet::EMPTY);
    // Between consecutive times B is constant, so the interval [t_k, t_k+1) holds a C ≥ B(C)
    // iff B(t_k) < t_k+1; that holds from some k on (B falls, t rises): find the first.
    let next = |k: usize| times.get(k + 1).copied().unwrap_or(f64::INFINITY);
    let (mut lo, mut hi) = (0, times.len().saturating_sub(1));
    if times.is_empty() {
        return 0.0;
    }
    while lo < hi {
        let mid = (lo + hi) / 2;
        if b(mid) < next(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    times[lo]
        .max(b(lo))
        .max(LowerBound::new(problem).of(ModuleSet::EMPTY))
}
