//! The exact stage search, beyond the paper: the optimal ordered partition into stages.
//!
//! A valid stage sequence executes the modules in an order where each stage's producers ran
//! in earlier stages, so the modules done after any prefix of stages form a *down-set* of the
//! DAG (closed under ancestors). The plan is a path ∅ → D₁ → … → M in the graph of down-sets,
//! where a step D → D ∪ S is allowed iff every module of S has all its producers in D, and
//! costs StageEval(S). The optimal plan is a shortest path, found with A*:
//! - **Heuristic** h(D) (admissible): the Lagrangian lower bound of `bound.rs` on the modules
//!   outside D, which combines their critical path and their quota area × time over the pool's
//!   SM capacity.
//! - **Pruning**: a step is solved only below the cutoff that could still improve its target
//!   and beat the incumbent, via the cached StageEval with a cutoff.
//! - **Deadline**: the search stops at a deadline, anywhere, StageEval included. A stopped
//!   search still proves something: every plan faster than the incumbent passes through an
//!   open down-set, so the least f = g + h among them (and the one being expanded) bounds the
//!   optimum from below — provided every StageEval answer it used was proven.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::rc::Rc;
use std::time::Instant;

use mosaic_profile::{ModuleSet, PerfModel};

use crate::bound::LowerBound;
use crate::cache::StageCache;
use crate::stage_eval::StageAlloc;

/// Best known cost to each down-set, with the down-set and the stage that reached it.
type Best = HashMap<u64, (f64, u64, Option<Rc<StageAlloc>>)>;

/// What the exact search found and proved.
#[derive(Debug, Clone)]
pub struct Exact {
    /// A plan strictly faster than the incumbent, when one was found (optimal if `finished`).
    pub better: Option<Vec<Rc<StageAlloc>>>,
    /// Whether the search ran to the end on proven StageEval answers: then the better plan,
    /// or the incumbent when there is none, is optimal.
    pub finished: bool,
    /// A proven lower bound on the optimal iteration time, in ms (`0` when nothing was proven).
    pub lower_ms: f64,
}

/// Searches for an optimal stage sequence strictly faster than `upper` (the incumbent's time),
/// until `deadline`. Uses the cache's limits for StageEval: give it [`Limits`] without caps
/// (a deadline only) for its answers to be proofs.
///
/// [`Limits`]: crate::stage_eval::Limits
pub fn exact(cache: &mut StageCache, upper: f64, deadline: Instant) -> Exact {
    let unproven_before = cache.stats.unproven;
    let mut search = Search::new(cache, upper, deadline);
    let mut better = None;
    let mut finished = true;
    let mut lower = upper;
    // Unproven answers met before the last expansion began; the last one's are covered by
    // its own f, which the bound includes.
    let mut unproven = 0;
    while let Some(Open(f, done_bits)) = search.open.pop() {
        let done = ModuleSet(done_bits);
        let g = search.best[&done_bits].0;
        if f - search.h.of(done) > g + 1e-9 * g.max(1.0) {
            continue; // stale heap entry
        }
        if done == search.h.all {
            better = Some(path(&search.best, done_bits));
            lower = f;
            break;
        }
        unproven = search.cache.stats.unproven - unproven_before;
        if Instant::now() >= deadline || !search.expand(done, g) {
            finished = false;
            // Every faster plan passes through an open down-set or the one being expanded.
            lower = search.open.iter().map(|o| o.0).fold(f, f64::min).min(upper);
            break;
        }
    }
    if finished {
        unproven = search.cache.stats.unproven - unproven_before;
    }
    let proven = unproven == 0;
    Exact {
        better,
        finished: finished && proven,
        lower_ms: if proven { lower } else { 0.0 },
    }
}

/// An open-list entry: (f = g + h, down-set).
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

/// The A* search's state over the down-sets.
struct Search<'c, 'p> {
    cache: &'c mut StageCache<'p>,
    h: LowerBound<'p>,
    upper: f64,
    deadline: Instant,
    best: Best,
    open: BinaryHeap<Open>,
    /// Stages tried, to check the deadline every 64.
    ticks: u32,
}

impl<'c, 'p> Search<'c, 'p> {
    /// A search from the empty down-set, the only open entry.
    fn new(cache: &'c mut StageCache<'p>, upper: f64, deadline: Instant) -> Self {
        let inputs = cache.bound_inputs(Some(deadline));
        let mut h = LowerBound::new(cache.problem(), &inputs);
        let mut best = Best::new();
        best.insert(0, (0.0, 0, None));
        let h0 = h.of(ModuleSet::EMPTY);
        let mut open = BinaryHeap::new();
        open.push(Open(h0, 0));
        Search {
            cache,
            h,
            upper,
            deadline,
            best,
            open,
            ticks: 0,
        }
    }

    /// Tries every next stage from down-set `done`, reached at cost `g`; false when the
    /// deadline stopped it.
    fn expand(&mut self, done: ModuleSet, g: f64) -> bool {
        let model = self.h.model;
        let avail = ModuleSet(
            self.h
                .all
                .minus(done)
                .iter()
                .filter(|&m| model.modules[m].parents.is_subset(done))
                .fold(0, |acc, m| acc | 1 << m),
        );
        // Every non-empty subset of the available modules is a possible next stage.
        let mut sub = avail.0;
        while sub != 0 {
            let stage = ModuleSet(sub);
            sub = (sub - 1) & avail.0;
            self.ticks += 1;
            if self.ticks.is_multiple_of(64) && Instant::now() >= self.deadline {
                return false;
            }
            self.step(done, g, stage);
        }
        Instant::now() < self.deadline
    }

    /// Solves the step `done` → `done ∪ stage` below the cutoff that could still improve its
    /// target and beat `upper`; records and opens the target if it does.
    fn step(&mut self, done: ModuleSet, g: f64, stage: ModuleSet) {
        let next = done.union(stage);
        let h = self.h.of(next);
        let known = self.best.get(&next.0).map_or(f64::INFINITY, |b| b.0);
        let cutoff = known.min(self.upper - h) - g;
        let floor = stage.iter().map(|m| self.h.min_time[m]).fold(0.0, f64::max);
        if floor >= cutoff {
            return;
        }
        if let Some(alloc) = self.cache.eval_below(stage, cutoff) {
            let cost = g + alloc.time_ms;
            self.best.insert(next.0, (cost, done.0, Some(alloc)));
            self.open.push(Open(cost + h, next.0));
        }
    }
}

/// The stages along the recorded path to `to`.
fn path(best: &Best, mut to: u64) -> Vec<Rc<StageAlloc>> {
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

/// The number of A* steps (a down-set and a next stage out of it) of `model`'s down-set graph,
/// counted until it exceeds `cap` (then some number above `cap`).
pub fn steps(model: &PerfModel, cap: u64) -> u64 {
    let n = model.modules.len();
    let mut seen: std::collections::HashSet<u64> = std::collections::HashSet::new();
    let mut todo = vec![0u64];
    seen.insert(0);
    let mut count = 0u64;
    while let Some(done) = todo.pop() {
        let avail: Vec<usize> = (0..n)
            .filter(|&m| done >> m & 1 == 0 && model.modules[m].parents.0 & !done == 0)
            .collect();
        count = count.saturating_add((1u64 << avail.len().min(63)) - 1);
        if count > cap {
            return count;
        }
        for m in avail {
            let next = done | 1 << m;
            if seen.insert(next) {
                todo.push(next);
            }
        }
    }
    count
}
