//! The StageEval result cache of Mosaic §3.4, keyed by the module set (a bitmask, as §4 says),
//! and the cheap lower bounds used to skip StageEval calls altogether (early pruning).

use std::collections::HashMap;
use std::rc::Rc;

use mosaic_profile::ModuleSet;

use crate::stage_eval::{stage_eval, StageAlloc};
use crate::Problem;

/// What is known of one module set's optimal stage.
#[derive(Debug, Clone)]
enum Entry {
    /// Solved: the optimum, or `None` when the set cannot be placed at all.
    Exact(Option<Rc<StageAlloc>>),
    /// Solved with a cutoff that nothing beat: the optimum is at least this.
    AtLeast(f64),
}

/// Counters that show how much work the cache and the bounds saved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EvalStats {
    /// StageEval runs (cache misses).
    pub solved: u64,
    /// Requests answered from the cache.
    pub hits: u64,
    /// Requests answered by a lower bound without looking at the cache or solving.
    pub pruned: u64,
}

/// StageEval behind a cache keyed by module set.
pub struct StageCache<'p> {
    problem: &'p Problem<'p>,
    map: HashMap<ModuleSet, Entry>,
    /// Work counters.
    pub stats: EvalStats,
}

impl<'p> StageCache<'p> {
    /// An empty cache over `problem`.
    pub fn new(problem: &'p Problem<'p>) -> Self {
        StageCache {
            problem,
            map: HashMap::new(),
            stats: EvalStats::default(),
        }
    }

    /// The problem the cache solves stages of.
    pub fn problem(&self) -> &'p Problem<'p> {
        self.problem
    }

    /// The optimal allocation of `set`, or `None` if it cannot be placed.
    pub fn eval(&mut self, set: ModuleSet) -> Option<Rc<StageAlloc>> {
        self.eval_below(set, f64::INFINITY)
    }

    /// The optimal allocation of `set` if its time is strictly below `cutoff`, else `None`.
    pub fn eval_below(&mut self, set: ModuleSet, cutoff: f64) -> Option<Rc<StageAlloc>> {
        match self.map.get(&set) {
            Some(Entry::Exact(a)) => {
                self.stats.hits += 1;
                return a.clone().filter(|a| a.time_ms < cutoff);
            }
            Some(Entry::AtLeast(bound)) if cutoff <= *bound => {
                self.stats.hits += 1;
                return None;
            }
            _ => {}
        }
        if self.problem.lower_bound(set) >= cutoff {
            self.stats.pruned += 1;
            return None;
        }
        self.stats.solved += 1;
        let result = stage_eval(self.problem, set, cutoff).map(Rc::new);
        let entry = match (&result, cutoff.is_finite()) {
            (Some(_), _) | (None, false) => Entry::Exact(result.clone()),
            (None, true) => Entry::AtLeast(cutoff),
        };
        self.map.insert(set, entry);
        result
    }
}
