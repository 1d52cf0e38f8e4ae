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
//! - **Lazy steps**: expanding a down-set solves no StageEval. Each step out of it enters the
//!   open list at f = g + (a proven lower bound on its stage: what the cache knows of it, and
//!   its modules' stage-packing weights together) + h, and its stage is solved
//!   when that entry comes first, below the cutoff that could still improve its target and
//!   beat the incumbent; the down-set it reaches then enters at its real cost. A step whose
//!   bound already misses the cutoff never enters. Wide fan-ins have thousands of possible
//!   next stages per down-set, and solving each of them at once, as before, spent the budget
//!   on stages no better plan uses.
//! - **Deadline**: the search stops at a deadline, anywhere, StageEval included. A stopped
//!   search still proves something: every plan faster than the incumbent passes through an
//!   open entry, so the least f among them (and the one being processed) bounds the optimum
//!   from below — provided every StageEval answer it used was proven. So does a search whose
//!   open list outgrows `MAX_OPEN` entries.

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
    // Unproven answers met before the last entry was processed; the last one's are covered
    // by its own f, which the bound includes.
    let mut unproven = 0;
    while let Some(open) = search.open.pop() {
        let g = open.g;
        if search.best[&open.from].0 < g - 1e-9 * g.max(1.0) {
            continue; // stale: a cheaper way to its down-set was opened since
        }
        unproven = search.cache.stats.unproven - unproven_before;
        let went_on = if open.from != open.target {
            search.solve(&open);
            true
        } else {
            let done = ModuleSet(open.target);
            if done == search.h.all {
                better = Some(path(&search.best, open.target));
                lower = open.f;
                break;
            }
            search.expand(done, g)
        };
        if !went_on || Instant::now() >= deadline {
            finished = false;
            // Every faster plan passes through an open entry or the one just processed.
            lower = search
                .open
                .iter()
                .map(|o| o.f)
                .fold(open.f, f64::min)
                .min(upper);
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

/// An open-list entry, least f first: down-set `target`, reached at cost `g` (f = g + h;
/// `from` is `target`), or a step to it from down-set `from`, reached at cost `g`, whose stage
/// (`target` less `from`) is only bounded so far (f = g + bound + h).
struct Open {
    f: f64,
    g: f64,
    from: u64,
    target: u64,
}

impl PartialEq for Open {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Open {}
impl PartialOrd for Open {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Open {
    // Min-heap on f, then the larger down-set (deeper first), then down-sets before steps.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .f
            .total_cmp(&self.f)
            .then(self.target.count_ones().cmp(&other.target.count_ones()))
            .then((self.from == self.target).cmp(&(other.from == other.target)))
    }
}

/// The most entries the open list holds (32 bytes each): past it the search stops, with
/// the bound its open entries prove.
const MAX_OPEN: usize = 1 << 21;

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
        open.push(Open {
            f: h0,
            g: 0.0,
            from: 0,
            target: 0,
        });
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

    /// Opens every step out of down-set `done`, reached at cost `g`, at the bound of its stage;
    /// false when the deadline or the open list's size stopped it.
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
            let next = done.union(stage);
            let h = self.h.of(next);
            let cutoff = self.cutoff(next, h) - g;
            let floor = stage.iter().map(|m| self.h.min_time[m]).fold(0.0, f64::max);
            if floor >= cutoff {
                continue;
            }
            // At least `floor` too: the cache's bound at first sight is.
            let bound = self.cache.at_least(stage).max(self.h.packed(stage));
            if bound < cutoff {
                self.open.push(Open {
                    f: g + bound + h,
                    g,
                    from: done.0,
                    target: next.0,
                });
            }
        }
        self.open.len() <= MAX_OPEN && Instant::now() < self.deadline
    }

    /// The cost below which a path to down-set `next` (whose heuristic is `h`) improves on
    /// the best known way there and can beat the incumbent.
    fn cutoff(&self, next: ModuleSet, h: f64) -> f64 {
        let known = self.best.get(&next.0).map_or(f64::INFINITY, |b| b.0);
        known.min(self.upper - h)
    }

    /// Solves the stage of `step` below the cutoff that could still improve its target and
    /// beat `upper`; records and opens the target if it does.
    fn solve(&mut self, step: &Open) {
        let next = ModuleSet(step.target);
        let stage = next.minus(ModuleSet(step.from));
        let h = self.h.of(next);
        let cutoff = self.cutoff(next, h) - step.g;
        if let Some(alloc) = self.cache.eval_below(stage, cutoff) {
            let cost = step.g + alloc.time_ms;
            self.best.insert(next.0, (cost, step.from, Some(alloc)));
            self.open.push(Open {
                f: cost + h,
                g: cost,
                from: next.0,
                target: next.0,
            });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bound::fixture::{model, Module};
    use crate::Problem;

    /// Six independent modules on one GPU, each 10 ms on all of it and 10 / q ms on a quota q
    /// (perfect scaling, no interference): stages of 1, 2 or 5 modules split the GPU exactly,
    /// so every plan of such stages takes 60 ms, which the bound sees. The search proves it
    /// solving a few stages; solving every step out of the empty down-set at once, as the
    /// search did before its steps were lazy, solved all 63 subsets first.
    #[test]
    fn steps_are_solved_only_when_they_come_first() {
        let scaling: Vec<(f64, f64)> = (1..=10)
            .map(|k| (f64::from(k) / 10.0, 100.0 / f64::from(k)))
            .collect();
        let names = ["m0", "m1", "m2", "m3", "m4", "m5"];
        let modules: Vec<Module> = names.iter().map(|m| (*m, "", &scaling[..])).collect();
        let model = model(&modules, 0.1);
        let problem = Problem::new(&model, 1).unwrap();
        let mut cache = StageCache::new(&problem);
        let far = Instant::now() + std::time::Duration::from_secs(60);
        let found = exact(&mut cache, f64::INFINITY, far);
        assert!(found.finished);
        let plan = found.better.unwrap();
        let total: f64 = plan.iter().map(|s| s.time_ms).sum();
        assert!((total - 60.0).abs() < 1e-9, "{total}");
        assert!(cache.stats.solved <= 6, "{:?}", cache.stats);
    }
}
