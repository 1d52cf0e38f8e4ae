//! The StageEval result cache of Mosaic §3.4, keyed by the module set (a bitmask, as §4 says),
//! and the cheap lower bounds used to skip StageEval calls altogether (early pruning).
//!
//! StageEval runs within the cache's [`Limits`]. An answer is *proven* when it is the
//! optimum, or when no allocation below the asked cutoff exists; a capped search gives answers
//! that are only the best it found, and the cache counts them ([`EvalStats::unproven`]) so that
//! a search built on it knows whether its own result is a proof.

use std::collections::HashMap;
use std::rc::Rc;
use std::time::Instant;

use mosaic_profile::ModuleSet;

use crate::bound::Inputs;
use crate::stage_eval::{stage_eval_within, Limits, StageAlloc};
use crate::Problem;

/// What is known of one module set's optimal stage.
#[derive(Debug, Clone)]
struct Entry {
    /// The best allocation found so far; its time bounds the optimum from above.
    best: Option<Rc<StageAlloc>>,
    /// Proven: the optimum is at least this (infinite when the set cannot be placed).
    at_least: f64,
    /// The largest cutoff a capped search has run below without finding better than `best`,
    /// and that search's node limit.
    tried: f64,
    tried_nodes: u64,
}

impl Entry {
    /// Whether `best` is proven optimal.
    fn exact(&self) -> bool {
        self.best
            .as_ref()
            .is_some_and(|b| b.time_ms <= self.at_least)
    }
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
    /// Answers that are not proven (the search behind them was capped).
    pub unproven: u64,
}

/// StageEval behind a cache keyed by module set.
pub struct StageCache<'p> {
    problem: &'p Problem<'p>,
    map: HashMap<ModuleSet, Entry>,
    limits: Limits,
    /// What the lower bounds derive from, once computed.
    bound: Option<Rc<Inputs>>,
    /// Work counters.
    pub stats: EvalStats,
}

impl<'p> StageCache<'p> {
    /// An empty cache over `problem` whose StageEval runs to the end.
    pub fn new(problem: &'p Problem<'p>) -> Self {
        Self::with_limits(problem, Limits::EXACT)
    }

    /// An empty cache over `problem` whose StageEval runs within `limits`.
    pub fn with_limits(problem: &'p Problem<'p>, limits: Limits) -> Self {
        StageCache {
            problem,
            map: HashMap::new(),
            limits,
            bound: None,
            stats: EvalStats::default(),
        }
    }

    /// What the problem's lower bounds derive from (`bound/`), computed at the first call
    /// (whose `deadline` stops the packing weights improving) and kept.
    pub(crate) fn bound_inputs(&mut self, deadline: Option<Instant>) -> Rc<Inputs> {
        let problem = self.problem;
        self.bound
            .get_or_insert_with(|| Rc::new(Inputs::new(problem, deadline)))
            .clone()
    }

    /// Changes the limits of later StageEval runs.
    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
    }

    /// The problem the cache solves stages of.
    pub fn problem(&self) -> &'p Problem<'p> {
        self.problem
    }

    /// Whether later answers must be proofs: no cap but the deadline.
    fn wants_proof(&self) -> bool {
        self.limits.nodes == u64::MAX && self.limits.splits == u64::MAX
    }

    /// A proven lower bound on the time of `set` as a stage: what searches proved of it, and at
    /// first sight [`Problem::lower_bound`] (infinite when it cannot be placed).
    pub fn at_least(&mut self, set: ModuleSet) -> f64 {
        let problem = self.problem;
        self.map
            .entry(set)
            .or_insert_with(|| Entry {
                best: None,
                at_least: problem.lower_bound(set),
                tried: f64::NEG_INFINITY,
                tried_nodes: 0,
            })
            .at_least
    }

    /// The best allocation of `set`, or `None` if it cannot be placed (or none was found).
    pub fn eval(&mut self, set: ModuleSet) -> Option<Rc<StageAlloc>> {
        self.eval_below(set, f64::INFINITY)
    }

    /// The best allocation of `set` whose time is strictly below `cutoff`: the optimal one
    /// when the answer is proven, else the best the capped search found (`None` when it found
    /// none, which then proves nothing).
    pub fn eval_below(&mut self, set: ModuleSet, cutoff: f64) -> Option<Rc<StageAlloc>> {
        let proof = self.wants_proof();
        if let Some(e) = self.map.get(&set) {
            if e.at_least >= cutoff {
                self.stats.hits += 1;
                return None;
            }
            let below = e.best.clone().filter(|b| b.time_ms < cutoff);
            if e.exact() {
                self.stats.hits += 1;
                return below;
            }
            let deep_enough = e.tried_nodes >= self.limits.nodes;
            if !proof && deep_enough && (below.is_some() || e.tried >= cutoff) {
                self.stats.hits += 1;
                self.stats.unproven += 1;
                return below;
            }
        }
        if self.at_least(set) >= cutoff {
            self.stats.pruned += 1;
            return None;
        }
        // Below a known allocation, a search that finds nothing proves that allocation optimal.
        let known = self.map.get(&set).and_then(|e| e.best.clone());
        let limit = known.as_ref().map_or(cutoff, |b| b.time_ms.min(cutoff));
        self.stats.solved += 1;
        let outcome = stage_eval_within(self.problem, set, limit, &self.limits);
        let entry = self.map.get_mut(&set).expect("inserted above");
        if let Some(found) = outcome.alloc {
            entry.best = Some(Rc::new(found));
        }
        if outcome.proven {
            entry.at_least = match &entry.best {
                Some(b) if b.time_ms <= limit => b.time_ms,
                _ => entry.at_least.max(limit),
            };
        } else {
            if self.limits.nodes > entry.tried_nodes {
                entry.tried = limit;
                entry.tried_nodes = self.limits.nodes;
            } else {
                entry.tried = entry.tried.max(limit);
            }
            self.stats.unproven += 1;
        }
        entry.best.clone().filter(|b| b.time_ms < cutoff)
    }
}
