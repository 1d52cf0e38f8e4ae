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

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Instant;

use mosaic_profile::ModuleSet;

use super::{Inputs, LowerBound};
use crate::Problem;

/// The fixed-point lower bound on every plan's iteration time (module docs): the least C with
/// C ≥ B(C), B(C) the bound over the runs a plan of time C can use. Stopped at `deadline`,
/// the search returns the least C it has not yet ruled out.
///
/// B's stage sequence per λ step costs a dynamic programme each, so the least C is found
/// first with the sequence at λ = 1 alone (a lower B, so no later C), then from there, where
/// `every_step`, with the sequence at every step, which usually ends within a few probes.
pub(crate) fn plan_bound(
    problem: &Problem,
    inputs: &Inputs,
    deadline: Option<Instant>,
    every_step: bool,
) -> f64 {
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
    // Each bound once per time: the answer's probe is asked again, and without `every_step`
    // both searches ask the same.
    let seen = RefCell::new(HashMap::new());
    let at = |k: usize, dear: bool| {
        *seen.borrow_mut().entry((k, dear)).or_insert_with(|| {
            LowerBound::capped(problem, inputs, times[k], &window, dear).of(ModuleSet::EMPTY)
        })
    };
    let weak = |k: usize| at(k, false);
    let full = |k: usize| at(k, every_step);
    let first = |from: usize, b: &dyn Fn(usize) -> f64| least_fixed(&times, from, b, deadline);
    match first(0, &weak).and_then(|k| first(k, &full)) {
        // B(t_k) ≥ B(C) ≥ B(∞) for the C ≥ t_k of the answer.
        Ok(k) => times[k].max(full(k)),
        // No C below times[k] satisfies C ≥ B(C), nor does any below B(∞).
        Err(k) => {
            let zero = vec![0.0; runs.len()];
            let mut unbounded = LowerBound::capped(problem, inputs, f64::INFINITY, &zero, true);
            times[k].max(unbounded.of(ModuleSet::EMPTY))
        }
    }
}

/// The least index k ≥ `from` whose interval [t_k, t_k+1) of `times` holds a C ≥ B(C), given
/// that none before `from` does: B is constant on an interval, so that is B(t_k) < t_k+1,
/// which holds from some k on (B falls, t rises). Probes `from`, then steps doubling away from
/// it, then halves the last step. `Err` with the least index not yet ruled out once
/// `deadline` passes.
fn least_fixed(
    times: &[f64],
    from: usize,
    b: &dyn Fn(usize) -> f64,
    deadline: Option<Instant>,
) -> Result<usize, usize> {
    let next = |k: usize| times.get(k + 1).copied().unwrap_or(f64::INFINITY);
    let holds = |k: usize| b(k) < next(k);
    let last = times.len() - 1;
    let late = || deadline.is_some_and(|d| Instant::now() >= d);
    // The answer lies in [lo, hi].
    let (mut lo, mut hi) = (from, last);
    let mut step = 1;
    while lo < hi {
        if late() {
            return Err(lo);
        }
        let probe = (lo + step - 1).min(hi);
        if holds(probe) {
            hi = probe;
            break;
        }
        lo = probe + 1;
        step *= 2;
    }
    while lo < hi {
        if late() {
            return Err(lo);
        }
        let mid = (lo + hi) / 2;
        if holds(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Ok(lo)
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// The doubling probes find what a scan of every interval finds, from any start
        /// before the answer.
        #[test]
        fn least_fixed_finds_the_first_interval(
            gaps in prop::collection::vec(0.1f64..10.0, 1..40),
            drops in prop::collection::vec(0.0f64..10.0, 40),
            top in 0.0f64..400.0,
            start in 0usize..40,
        ) {
            let times: Vec<f64> = gaps
                .iter()
                .scan(0.0, |t, g| {
                    *t += g;
                    Some(*t)
                })
                .collect();
            // A non-increasing B over the intervals.
            let b: Vec<f64> = drops
                .iter()
                .scan(top, |v, d| {
                    *v -= d;
                    Some(*v)
                })
                .collect();
            let next = |k: usize| times.get(k + 1).copied().unwrap_or(f64::INFINITY);
            let first = (0..times.len()).find(|&k| b[k] < next(k)).expect("the last holds");
            let from = start.min(first);
            let found = least_fixed(&times, from, &|k| b[k], None);
            prop_assert_eq!(found, Ok(first));
        }
    }
}
