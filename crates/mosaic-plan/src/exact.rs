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

use mosaic_profile::{ModuleSet, PerfModel};

use crate::cache::StageCache;
use crate::stage_eval::StageAlloc;
use crate::Problem;

/// The search ran out of time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeout;

/// Best known cost to each down-set, with the down-set and the stage that reached it.
type Best = HashMap<u64, (f64, u64, Option<Rc<StageAlloc>>)>;

/// Finds an optimal stage sequence, or `Ok(None)` when none is strictly faster than `upper`
/// (so a plan of time `upper` is optimal). Gives up with [`Timeout`] at `deadline`.
pub fn exact(
    cache: &mut StageCache,
    upper: f64,
    deadline: Instant,
) -> Result<Option<Vec<Rc<StageAlloc>>>, Timeout> {
    let mut search = Search::new(cache, upper, deadline);
    while let Some(Open(f, done_bits)) = search.open.pop() {
        if Instant::now() >= deadline {
            return Err(Timeout);
        }
        let done = ModuleSet(done_bits);
        let g = search.best[&done_bits].0;
        if f - search.h_cache[&done_bits] > g + 1e-9 * g.max(1.0) {
            continue; // stale heap entry
        }
        if done == search.h.all {
            return Ok(Some(path(&search.best, done_bits)));
        }
        search.expand(done, g)?;
    }
    Ok(None)
}

/// The admissible heuristic h(D) of the module docs, with the per-module data it needs.
struct Heuristic<'m> {
    model: &'m PerfModel,
    all: ModuleSet,
    /// Per module, its fastest time.
    min_time: Vec<f64>,
    /// Per module, its least quota-area × time.
    area_time: Vec<f64>,
    /// The pool's SM capacity, in quota units.
    capacity: f64,
}

impl<'m> Heuristic<'m> {
    /// The heuristic of `problem`.
    fn new(problem: &Problem<'m>) -> Self {
        let model = problem.model;
        Heuristic {
            model,
            all: ModuleSet::all(model.modules.len()),
            min_time: problem.cands.iter().map(|c| c.min_time()).collect(),
            area_time: problem.cands.iter().map(|c| c.min_area_time).collect(),
            capacity: (model.units_per_gpu * problem.gpus) as f64,
        }
    }

    /// h(`done`): the larger of the longest remaining chain and the remaining area / capacity.
    fn of(&self, done: ModuleSet) -> f64 {
        let area: f64 = self.all.minus(done).iter().map(|m| self.area_time[m]).sum();
        self.longest_chain(done).max(area / self.capacity)
    }

    /// The longest dependency chain of the modules not in `done`, each at its fastest time.
    fn longest_chain(&self, done: ModuleSet) -> f64 {
        let model = self.model;
        let n = model.modules.len();
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
            chain[m] = self.min_time[m] + after;
            longest = longest.max(chain[m]);
        }
        longest
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
    h: Heuristic<'p>,
    upper: f64,
    deadline: Instant,
    best: Best,
    /// h of each down-set seen.
    h_cache: HashMap<u64, f64>,
    open: BinaryHeap<Open>,
    /// Stages tried, to check the deadline every 1024.
    ticks: u32,
}

impl<'c, 'p> Search<'c, 'p> {
    /// A search from the empty down-set, the only open entry.
    fn new(cache: &'c mut StageCache<'p>, upper: f64, deadline: Instant) -> Self {
        let h = Heuristic::new(cache.problem());
        let mut best = Best::new();
        let mut h_cache = HashMap::new();
        best.insert(0, (0.0, 0, None));
        let h0 = h.of(ModuleSet::EMPTY);
        h_cache.insert(0, h0);
        let mut open = BinaryHeap::new();
        open.push(Open(h0, 0));
        Search {
            cache,
            h,
            upper,
            deadline,
            best,
            h_cache,
            open,
            ticks: 0,
        }
    }

    /// Tries every next stage from down-set `done`, reached at cost `g`.
    fn expand(&mut self, done: ModuleSet, g: f64) -> Result<(), Timeout> {
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
            if self.ticks.is_multiple_of(1024) && Instant::now() >= self.deadline {
                return Err(Timeout);
            }
            self.step(done, g, stage);
        }
        Ok(())
    }

    /// Solves the step `done` → `done ∪ stage` below the cutoff that could still improve its
    /// target and beat `upper`; records and opens the target if it does.
    fn step(&mut self, done: ModuleSet, g: f64, stage: ModuleSet) {
        let next = done.union(stage);
        let h = *self
            .h_cache
            .entry(next.0)
            .or_insert_with(|| self.h.of(next));
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
