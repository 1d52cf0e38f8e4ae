//! Re-cutting adjacent stages into two, beyond GAHC: the best split of the modules of two or
//! three adjacent stages into two stages, found by trying every split.
//!
//! The modules of adjacent stages i..j of a valid plan may be cut into any stages that keep
//! the dependencies among them: their other producers ran before stage i and their other
//! consumers run after stage j, whatever the cut. Into two stages: a module with a producer
//! among them goes second and that producer first (a chain of three has no such cut); every
//! other module may go either way. A local move (`local.rs`) shifts one module or swaps two;
//! a re-cut moves any number at once, as when the shallow encoders of a wide fan-in should
//! trade places with the deep ones, or three stages of encoders fit in two.
//!
//! Windows are tried in order, each with a share of the time left, while a pass gains. The
//! splits of a window are searched depth first, slowest free module first, and a branch ends
//! as soon as the bounds of its two stages (`Problem::lower_bound`, which only grows as a
//! stage gains modules) add up to the best time so far; the stages of a whole split are
//! solved through the cache with cutoffs. Windows of four stages gained nothing over three on
//! the zoo-shaped models of 24 and 32 modules (README, "Measured").

use std::rc::Rc;
use std::time::Instant;

use mosaic_profile::ModuleSet;

use crate::cache::StageCache;
use crate::stage_eval::StageAlloc;

/// Improves `stages` (a valid plan in execution order) by re-cutting runs of two to
/// [`WIDEST`] adjacent stages into two, until none gains or `deadline` passes; returns a valid
/// plan no slower than the given one.
pub fn improve(
    cache: &mut StageCache,
    mut stages: Vec<Rc<StageAlloc>>,
    deadline: Instant,
) -> Vec<Rc<StageAlloc>> {
    let mut gained = true;
    while gained {
        gained = false;
        let mut i = 0;
        while i + 1 < stages.len() {
            for width in 2..=WIDEST.min(stages.len() - i) {
                let now = Instant::now();
                if now >= deadline {
                    return stages;
                }
                // Windows left in this pass, about: a share of the time for each.
                let left = ((stages.len() - 1 - i) * (WIDEST - 1)) as u32;
                let share = deadline.saturating_duration_since(now) / left.max(1);
                let window = &stages[i..i + width];
                let set = window
                    .iter()
                    .fold(ModuleSet::EMPTY, |acc, s| acc.union(s.set));
                // Strictly better by more than rounding, so that passes cannot cycle.
                let upper = window.iter().map(|s| s.time_ms).sum::<f64>() * (1.0 - 1e-9);
                if let Some((first, second)) = best_split(cache, set, upper, now + share) {
                    stages.splice(i..i + width, [first, second]);
                    gained = true;
                    break;
                }
            }
            i += 1;
        }
    }
    stages
}

/// The most adjacent stages re-cut into two at once.
pub const WIDEST: usize = 3;

/// The fastest cut of `set` into two non-empty stages, if one is faster than `upper`, found
/// by `deadline` (else the best found by then).
fn best_split(
    cache: &mut StageCache,
    set: ModuleSet,
    upper: f64,
    deadline: Instant,
) -> Option<(Rc<StageAlloc>, Rc<StageAlloc>)> {
    let model = cache.problem().model;
    let producers = |m: usize| model.modules[m].parents.intersect(set);
    let second = set
        .iter()
        .filter(|&m| !producers(m).is_empty())
        .fold(ModuleSet::EMPTY, |acc, m| acc.union(ModuleSet::single(m)));
    let first = second
        .iter()
        .fold(ModuleSet::EMPTY, |acc, m| acc.union(producers(m)));
    if !first.intersect(second).is_empty() {
        return None; // a chain of three modules: no two stages hold it
    }
    // The free modules, slowest first: they decide most, so bounds prune early.
    let mut free: Vec<usize> = set.minus(first).minus(second).iter().collect();
    let slowest = |m: usize| cache.problem().cands[m].min_time();
    free.sort_by(|&x, &y| slowest(y).total_cmp(&slowest(x)));
    let mut search = Splits {
        cache,
        free,
        upper,
        deadline,
        best: None,
        visits: 0,
    };
    let problem = search.cache.problem();
    let floors = (problem.lower_bound(first), problem.lower_bound(second));
    search.go(0, first, second, floors);
    search.best
}

/// A depth-first branch and bound over the free modules, each put first or second.
struct Splits<'c, 'p> {
    cache: &'c mut StageCache<'p>,
    free: Vec<usize>,
    /// The time to beat: the pair's, then the best split's.
    upper: f64,
    deadline: Instant,
    best: Option<(Rc<StageAlloc>, Rc<StageAlloc>)>,
    /// Search nodes, to check the deadline every 64 (and at every split solved).
    visits: u64,
}

impl Splits<'_, '_> {
    /// Places free modules `k..` beside `first` and `second`, whose bounds
    /// (`Problem::lower_bound`, which only grows as a stage gains modules) are `floors`; false
    /// once the deadline passed.
    fn go(&mut self, k: usize, first: ModuleSet, second: ModuleSet, floors: (f64, f64)) -> bool {
        self.visits += 1;
        if self.visits.is_multiple_of(64) && Instant::now() >= self.deadline {
            return false;
        }
        if floors.0 + floors.1 >= self.upper {
            return true;
        }
        let Some(&m) = self.free.get(k) else {
            if first.is_empty() || second.is_empty() {
                return true;
            }
            // A split costs two StageEvals: none after the deadline.
            if Instant::now() >= self.deadline {
                return false;
            }
            if let Some(a) = self.cache.eval_below(first, self.upper - floors.1) {
                if let Some(b) = self.cache.eval_below(second, self.upper - a.time_ms) {
                    self.upper = a.time_ms + b.time_ms;
                    self.best = Some((a, b));
                }
            }
            return true;
        };
        // Each branch changes one stage: only its bound is new.
        let problem = self.cache.problem();
        let one = ModuleSet::single(m);
        let (more_first, more_second) = (first.union(one), second.union(one));
        self.go(
            k + 1,
            more_first,
            second,
            (problem.lower_bound(more_first), floors.1),
        ) && self.go(
            k + 1,
            first,
            more_second,
            (floors.0, problem.lower_bound(more_second)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Problem;
    use mosaic_profile::{parse, PerfModel};

    /// One GPU; `a` and `b` have no producers, `c` consumes `a`. Each takes 10/40/40 ms at
    /// half the GPU and 8/30/30 ms on all of it, so `b` beside `c` (8 + 40) beats `b` beside
    /// `a` (40 + 30).
    #[test]
    fn a_pair_is_recut_at_its_best_split() {
        let module = |name: &str, after: &str, half: f64, whole: f64| {
            let sample = |sm: f64, t: f64| {
                format!(
                    r#"{{"dp": 1, "sm": {sm}, "time_ms": {t}, "mem_gib": 1.0, "sm_util": 0.5, "bw_util": 0.2}}"#
                )
            };
            format!(
                r#"{{"name": "{name}", "after": [{after}], "samples": [{}, {}]}}"#,
                sample(0.5, half),
                sample(1.0, whole)
            )
        };
        let text = format!(
            r#"{{"format": "mosaic-profiles/1",
                "device": {{"name": "gpu", "sm_count": 100, "memory_gib": 80.0}},
                "modules": [{}, {}, {}],
                "interference": {{"e1": 0.0, "e2": 0.0, "e3": 0.0}}}}"#,
            module("a", "", 10.0, 8.0),
            module("b", "", 40.0, 30.0),
            module("c", r#""a""#, 40.0, 30.0),
        );
        let model = PerfModel::new(&parse(&text, "x.json").unwrap(), 0.5, "x.json").unwrap();
        let problem = Problem::new(&model, 1).unwrap();
        let mut cache = StageCache::new(&problem);
        let set = |names: &[&str]| {
            names.iter().fold(ModuleSet::EMPTY, |acc, n| {
                acc.union(ModuleSet::single(model.index_of(n).unwrap()))
            })
        };
        let given = vec![
            cache.eval(set(&["a", "b"])).unwrap(),
            cache.eval(set(&["c"])).unwrap(),
        ];
        assert_eq!(given[0].time_ms + given[1].time_ms, 70.0);
        let far = Instant::now() + std::time::Duration::from_secs(60);
        let recut = improve(&mut cache, given, far);
        assert_eq!(recut[0].set, set(&["a"]));
        assert_eq!(recut[1].set, set(&["b", "c"]));
        assert_eq!(recut[0].time_ms + recut[1].time_ms, 48.0);
    }
}
