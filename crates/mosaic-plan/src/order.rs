//! Dependencies between stages: which stage feeds which, and a valid execution order.
//!
//! A stage is a set of modules; stage `a` feeds stage `b` when a module of `b` consumes the
//! output of a module of `a`. Both functions take any stage type with a way to get its set.

use mosaic_profile::{ModuleSet, PerfModel};

/// For stages in a valid order, the bitmask of stages reachable from each through the stage
/// graph. Two stages may merge iff neither reaches the other.
pub fn reachability<T>(
    model: &PerfModel,
    stages: &[T],
    set_of: impl Fn(&T) -> ModuleSet,
) -> Vec<u64> {
    let n = stages.len();
    let mut reach = vec![0u64; n];
    for i in (0..n).rev() {
        let from = set_of(&stages[i]);
        for j in i + 1..n {
            let feeds = set_of(&stages[j])
                .iter()
                .any(|m| !model.modules[m].parents.intersect(from).is_empty());
            if feeds {
                reach[i] |= 1 << j | reach[j];
            }
        }
    }
    reach
}

/// The stages re-sorted so that every module's producers run in an earlier stage, keeping
/// the current order among stages that are ready together.
///
/// # Panics
/// If the stage graph has a cycle, which legal merges never create.
pub fn topological<T>(
    model: &PerfModel,
    stages: Vec<T>,
    set_of: impl Fn(&T) -> ModuleSet,
) -> Vec<T> {
    let mut done = ModuleSet::EMPTY;
    let mut left: Vec<Option<T>> = stages.into_iter().map(Some).collect();
    let mut out = Vec::with_capacity(left.len());
    while out.len() < left.len() {
        let next = left
            .iter()
            .position(|s| {
                s.as_ref().is_some_and(|s| {
                    set_of(s)
                        .iter()
                        .all(|m| model.modules[m].parents.is_subset(done))
                })
            })
            .expect("legal merges keep the stage graph acyclic");
        let s = left[next].take().expect("taken once");
        done = done.union(set_of(&s));
        out.push(s);
    }
    out
}
