//! Search over module sequences, beyond GAHC: every plan is a topological order of the modules
//! cut into consecutive stages, so a plan can be improved by
//! - **cutting an order optimally**: given an order, the best cut into stages is a shortest
//!   path over its prefixes (dynamic programming over O(n · w) intervals, w the widest stage
//!   the order allows), each interval's time a cached StageEval below the cutoff that could
//!   still improve the best cut; prefixes whose cost plus the admissible bound of the rest
//!   (`bound.rs`) cannot beat the incumbent are skipped;
//! - **moving one module along the order**, anywhere between its last producer and its first
//!   consumer, and cutting the new order again. Sweeps over every module and position repeat
//!   while one gains (first improvement), so the search stops by itself at a local optimum, or
//!   at the deadline with the best plan so far.
//!
//! The plan it starts from is one cut of its own order, so the result is never worse.

use std::rc::Rc;
use std::time::Instant;

use mosaic_profile::{ModuleSet, PerfModel};

use crate::bound::LowerBound;
use crate::cache::StageCache;
use crate::stage_eval::StageAlloc;

/// Improves `stages` (a valid plan in execution order) by re-cutting its module order and
/// moving modules along it, until no move gains or `deadline` passes. The result is a valid
/// plan no slower than the given one.
pub fn improve(
    cache: &mut StageCache,
    stages: Vec<Rc<StageAlloc>>,
    deadline: Instant,
) -> Vec<Rc<StageAlloc>> {
    let problem = cache.problem();
    let model = problem.model;
    let mut cutter = Cutter {
        model,
        h: LowerBound::new(problem, &cache.bound_inputs(Some(deadline))),
        deadline,
    };
    let mut best_total: f64 = stages.iter().map(|s| s.time_ms).sum();
    let mut best = stages;
    let mut order: Vec<usize> = best.iter().flat_map(|s| s.set.iter()).collect();
    if let Some((t, cut)) = cutter.cut(cache, &order, best_total) {
        best_total = t;
        best = cut;
    }
    let n = order.len();
    loop {
        let mut improved = false;
        for m in 0..n {
            if Instant::now() >= deadline {
                return best;
            }
            let p = order
                .iter()
                .position(|&x| x == m)
                .expect("every module is in the order");
            let (lo, hi) = window(model, &order, p);
            for q in lo..=hi {
                if q == p {
                    continue;
                }
                let mut moved = order.clone();
                let x = moved.remove(p);
                moved.insert(q, x);
                let slack = 1e-9 * best_total.max(1.0);
                if let Some((t, cut)) = cutter.cut(cache, &moved, best_total - slack) {
                    best_total = t;
                    best = cut;
                    order = moved;
                    improved = true;
                    break;
                }
            }
        }
        if !improved {
            return best;
        }
    }
}

/// The positions module `order[p]` may move to: after its last producer and before its first
/// consumer (positions in the order with it removed and reinserted).
fn window(model: &PerfModel, order: &[usize], p: usize) -> (usize, usize) {
    let m = order[p];
    let parents = model.modules[m].parents;
    let lo = (0..p)
        .rev()
        .find(|&i| parents.contains(order[i]))
        .map_or(0, |i| i + 1);
    let hi = (p + 1..order.len())
        .find(|&i| model.modules[order[i]].parents.contains(m))
        .map_or(order.len() - 1, |i| i - 1);
    (lo, hi)
}

/// Cuts orders into stages optimally.
struct Cutter<'m> {
    model: &'m PerfModel,
    /// The admissible bound on what the modules outside a prefix add.
    h: LowerBound<'m>,
    deadline: Instant,
}

impl Cutter<'_> {
    /// The best cut of `order` into stages of consecutive modules with no dependency inside a
    /// stage, if it is strictly faster than `upper`: its time and its stages.
    fn cut(
        &mut self,
        cache: &mut StageCache,
        order: &[usize],
        upper: f64,
    ) -> Option<(f64, Vec<Rc<StageAlloc>>)> {
        let n = order.len();
        // cost[j]: best time of the first j modules; from[j]: where its last stage starts.
        let mut cost = vec![f64::INFINITY; n + 1];
        let mut last: Vec<Option<(usize, Rc<StageAlloc>)>> = vec![None; n + 1];
        cost[0] = 0.0;
        let mut prefix = ModuleSet::EMPTY;
        let mut start = 0; // the first position a stage ending at j may start at
        for j in 1..=n {
            if Instant::now() >= self.deadline {
                return None;
            }
            let m = order[j - 1];
            let parents = self.model.modules[m].parents;
            if let Some(i) = (start..j - 1).rev().find(|&i| parents.contains(order[i])) {
                start = i + 1;
            }
            prefix = prefix.union(ModuleSet::single(m));
            let rest = self.h.of(prefix);
            let mut stage = ModuleSet::EMPTY;
            for i in (start..j).rev() {
                stage = stage.union(ModuleSet::single(order[i]));
                if !cost[i].is_finite() {
                    continue;
                }
                let cutoff = cost[j].min(upper - rest) - cost[i];
                if cutoff <= 0.0 {
                    continue;
                }
                if let Some(alloc) = cache.eval_below(stage, cutoff) {
                    cost[j] = cost[i] + alloc.time_ms;
                    last[j] = Some((i, alloc));
                }
            }
        }
        if cost[n] >= upper {
            return None;
        }
        let mut stages = Vec::new();
        let mut j = n;
        while j > 0 {
            let (i, alloc) = last[j].clone().expect("a finite prefix has a last stage");
            stages.push(alloc);
            j = i;
        }
        stages.reverse();
        Some((cost[n], stages))
    }
}
