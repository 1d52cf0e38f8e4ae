//! The bound on a whole plan's time: a fixed point over that time.
//!
//! No module of an optimal plan of time C* runs longer than C*, so C* ≥ B(C*) where B(C) is
//! the bound of the module docs over only the runs no slower than C. B falls as C grows, so
//! the least C with C ≥ B(C), found by a binary search over the runs' times, bounds C* from
//! below. This charges the area term for the fast runs a short plan forces, where the plain
//! area bound takes every module at its most frugal (and often slowest) run. The cap is per
//! module: the modules of a path through m sit in distinct stages, each at least its fastest
//! time, so a plan of time C runs m no longer than C − head(m) − tail(m), the longest chains
//! of fastest times before and after it. An encoder before a long backbone chain must then
//! finish in what the chain leaves, at a fast (area-hungry) run, which a uniform cap of C
//! never forces.

use std::time::Instant;

use mosaic_profile::ModuleSet;

use super::{Inputs, LowerBound};
use crate::Problem;

/// The fixed-point lower bound on every plan's iteration time (module docs): the least C with
/// C ≥ B(C), B(C) the bound over the runs a plan of time C can use. Stopped at `deadline`,
/// the search returns the least C it has not yet ruled out.
pub(crate) fn plan_bound(problem: &Problem, inputs: &Inputs, deadline: Option<Instant>) -> f64 {
    let window = windows(problem);
    let runs = &inputs.runs;
    // B changes only where C crosses some run's time plus its module's window.
    let mut times: Vec<f64> = runs
        .iter()
        .zip(&window)
        .flat_map(|(r, w)| r.iter().map(move |o| o.time_ms + w))
        .collect();
    times.sort_by(f64::total_cmp);
    times.dedup();
    if times.is_empty() {
        return 0.0;
    }
    let b = |k: usize| LowerBound::capped(problem, inputs, times[k], &window).of(ModuleSet::EMPTY);
    // Between consecutive times B is constant, so the interval [t_k, t_k+1) holds a C ≥ B(C)
    // iff B(t_k) < t_k+1; that holds from some k on (B falls, t rises): find the first.
    let next = |k: usize| times.get(k + 1).copied().unwrap_or(f64::INFINITY);
    let (mut lo, mut hi) = (0, times.len() - 1);
    let unbounded = LowerBound::capped(problem, inputs, f64::INFINITY, &vec![0.0; runs.len()])
        .of(ModuleSet::EMPTY);
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
