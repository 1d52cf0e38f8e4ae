//! The exact stage search, beyond the paper: the optimal ordered partition into stages.
//!
//! A valid stage sequence executes the modules in an order where each stage's producers ran
//! in earlier stages, so the modules done after any prefix of stages form a *down-set* of the
//! DAG (closed under ancestors). The plan is a path ∅ → D₁ → … → M in the graph of down-sets,
//! where a step D → D ∪ S is allowed iff every module of S has all its producers in D, and
//! costs StageEval(S). The optimal plan is a shortest path, found with A*:
//! - **Heuristic** h(D) (admissible): the larger of (a) the longest dependency chain of the
//!   remaining modules, each at its fastest time, and (b) the remaining modules' least
//!   quota-area × time divided by the pool's SM capacity.
//! - **Pruning**: a step is solved only below the cutoff that could still improve its target
//!   and beat the incumbent (GAHC's plan), via the cached StageEval with a cutoff.
//! - **Budget**: the search gives up at a deadline; a finished search is a proof of optimality.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::rc::Rc;
use std::time::Instant;

use mosaic_profile::ModuleSet;

use crate::cache::StageCache;
use crate::stage_eval::StageAlloc;

/// The search ran out of time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeout;

/// Finds an optimal stage sequence, or `Ok(None)` when none is strictly faster than `upper`
/// (so a plan of time `upper` is optimal). Gives up with [`Timeout`] at `deadline`.
pub fn exact(
    cache: &mut StageCache,
    upper: f64,
    deadline: Instant,
) -> Result<Option<Vec<Rc<StageAlloc>>>, Timeout> {
    let problem = cache.problem();
    let model = problem.model;
    let n = model.modules.len();
    let all = ModuleSet::all(n);
    let min_time: Vec<f64> = problem.cands.iter().map(|c| c.min_time()).collect();
    let area_time: Vec<f64> = problem.cands.iter().map(|c| c.min_area_time).collect();
    let capacity = (model.units_per_gpu * problem.gpus) as f64;
    let heuristic = |done: ModuleSet| -> f64 {
        // Longest chain over the remaining modules, in reverse topological order.
        let mut chain = vec![0.0f64; n];
        let mut longest: f64 = 0.0;
        for &m in model.topo_order.iter().rev() {
            if done.contains(m) {
                continue;
            }
            let after = (0..n)
                .filter(|&c| !done.contains(c) && model.modules[c].parents.contains(m))
                .map(|c| chain[c])
                .fold(0.0, f64::max);
            chain[m] = min_time[m] + after;
            longest = longest.max(chain[m]);
        }
        let area: f64 = all.minus(done).iter().map(|m| area_time[m]).sum();
        longest.max(area / capacity)
    };

    #[derive(PartialEq)]
    struct Open(f64, u64);
    impl Eq for Open {}
    impl PartialOrd for Open {
        fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
            Some(self.cmp(other))
        }
    }
    impl Ord for Open {
        // Min-heap on f, then on the larger down-set (deeper first).
        fn cmp(&self, other: &Self) -> Ordering {
            other
                .0
                .total_cmp(&self.0)
                .then(self.1.count_ones().cmp(&other.1.count_ones()))
        }
    }

    // Best known cost to each down-set, with the step that reached it.
    let mut best: HashMap<u64, (f64, u64, Option<Rc<StageAlloc>>)> = HashMap::new();
    let mut h_cache: HashMap<u64, f64> = HashMap::new();
    best.insert(0, (0.0, 0, None));
    let h0 = heuristic(ModuleSet::EMPTY);
    h_cache.insert(0, h0);
    let mut open = BinaryHeap::new();
    open.push(Open(h0, 0));
    let mut ticks = 0u32;
    while let Some(Open(f, done_bits)) = open.pop() {
        if Instant::now() >= deadline {
            return Err(Timeout);
        }
        let done = ModuleSet(done_bits);
        let g = best[&done_bits].0;
        if f - h_cache[&done_bits] > g + 1e-9 * g.max(1.0) {
            continue; // stale heap entry
        }
        if done == all {
            return Ok(Some(path(&best, done_bits)));
        }
        let avail = ModuleSet(
            all.minus(done)
                .iter()
                .filter(|&m| model.modules[m].parents.is_subset(done))
                .fold(0, |acc, m| acc | 1 << m),
        );
        // Every non-empty subset of the available modules is a possible next stage.
        let mut sub = avail.0;
        while sub != 0 {
            let stage = ModuleSet(sub);
            sub = (sub - 1) & avail.0;
            ticks += 1;
            if ticks.is_multiple_of(1024) && Instant::now() >= deadline {
                return Err(Timeout);
            }
            let next = done.union(stage);
            let h = *h_cache.entry(next.0).or_insert_with(|| heuristic(next));
            let known = best.get(&next.0).map_or(f64::INFINITY, |b| b.0);
            let cutoff = known.min(upper - h) - g;
            let floor = stage.iter().map(|m| min_time[m]).fold(0.0, f64::max);
            if floor >= cutoff {
                continue;
            }
            if let Some(alloc) = cache.eval_below(stage, cutoff) {
                let cost = g + alloc.time_ms;
                best.insert(next.0, (cost, done_bits, Some(alloc)));
                open.push(Open(cost + h, next.0));
            }
        }
    }
    Ok(None)
}

/// The stages along the recorded path to `to`.
fn path(
    best: &HashMap<u64, (f64, u64, Option<Rc<StageAlloc>>)>,
    mut to: u64,
) -> Vec<Rc<StageAlloc>> {
    let mut stages = Vec::new();
    while to != 0 {
        let (_, from, stage) = &best[&to];
        stages.push(
            stage
                .clone()
                .expect("every non-empty down-set was reached by a stage"),
        );
        to = *from;
    }
    stages.reverse();
    stages
}
