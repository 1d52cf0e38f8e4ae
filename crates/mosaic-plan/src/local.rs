//! Local search over stage sequences, beyond GAHC: from a valid plan, apply the best of these
//! moves while one gains and the deadline allows:
//! - **move** a module to another stage, or out to a stage of its own, wherever its producers
//!   stay in earlier stages and its consumers in later ones;
//! - **swap** two modules of different stages, under the same rule for both;
//! - **merge** two stages that no dependency path joins (GAHC's move, which a move or swap can
//!   make gainful again).
//!
//! Every move keeps the stage order a valid topological order, so every intermediate plan is
//! valid and the search can stop anywhere. StageEval answers come from the shared cache, with
//! cutoffs: a move is only solved below the time that would make it beat the best move so far.

use std::rc::Rc;
use std::time::Instant;

use mosaic_profile::{ModuleSet, PerfModel};

use crate::cache::StageCache;
use crate::order;
use crate::stage_eval::StageAlloc;

/// A change of the stage list and the time it saves.
#[derive(Debug)]
enum Change {
    /// Stage `from` loses a module, stage `to` gains it (`to == None`: a new stage right after
    /// `from`); the new allocations are given.
    Shift {
        from: usize,
        to: Option<usize>,
        rest: Option<Rc<StageAlloc>>,
        target: Rc<StageAlloc>,
    },
    /// Stages `a` and `b` become the two given allocations.
    Swap {
        a: usize,
        b: usize,
        new_a: Rc<StageAlloc>,
        new_b: Rc<StageAlloc>,
    },
    /// Stages `a` and `b` become one.
    Merge {
        a: usize,
        b: usize,
        merged: Rc<StageAlloc>,
    },
}

/// Improves `stages` (a valid plan in execution order) by local moves until none gains or
/// `deadline` passes; returns a valid plan no slower than the given one.
pub fn improve(
    cache: &mut StageCache,
    mut stages: Vec<Rc<StageAlloc>>,
    deadline: Instant,
) -> Vec<Rc<StageAlloc>> {
    let model = cache.problem().model;
    while Instant::now() < deadline {
        let Some((gain, mv)) = best_move(cache, &stages, deadline) else {
            break;
        };
        if gain <= 1e-9 * total(&stages).max(1.0) {
            break;
        }
        stages = apply(stages, mv);
        stages = order::topological(model, stages, |s| s.set);
    }
    stages
}

fn total(stages: &[Rc<StageAlloc>]) -> f64 {
    stages.iter().map(|s| s.time_ms).sum()
}

/// The stages `lo..=hi` module `m` may sit in, given where its producers and consumers are.
fn window(model: &PerfModel, stage_of: &[usize], stages: usize, m: usize) -> (usize, usize) {
    let lo = model.modules[m]
        .parents
        .iter()
        .map(|p| stage_of[p] + 1)
        .max()
        .unwrap_or(0);
    let hi = (0..model.modules.len())
        .filter(|&c| model.modules[c].parents.contains(m))
        .map(|c| stage_of[c])
        .min()
        .map_or(stages - 1, |s| s - 1);
    (lo, hi)
}

/// The time of `set` as a stage: 0 when empty, `None` when no allocation is known.
fn time_of(cache: &mut StageCache, set: ModuleSet) -> Option<(f64, Option<Rc<StageAlloc>>)> {
    if set.is_empty() {
        return Some((0.0, None));
    }
    cache.eval(set).map(|a| (a.time_ms, Some(a)))
}

/// The move that saves the most time, if any saves some.
fn best_move(
    cache: &mut StageCache,
    stages: &[Rc<StageAlloc>],
    deadline: Instant,
) -> Option<(f64, Change)> {
    let model = cache.problem().model;
    let n = model.modules.len();
    let mut stage_of = vec![0usize; n];
    for (i, s) in stages.iter().enumerate() {
        for m in s.set.iter() {
            stage_of[m] = i;
        }
    }
    let windows: Vec<(usize, usize)> = (0..n)
        .map(|m| window(model, &stage_of, stages.len(), m))
        .collect();
    let mut best: Option<(f64, Change)> = None;
    let gain_so_far = |best: &Option<(f64, Change)>| best.as_ref().map_or(0.0, |b| b.0);
    // Moves of one module.
    for m in 0..n {
        if Instant::now() >= deadline {
            return best;
        }
        let from = stage_of[m];
        let single = ModuleSet::single(m);
        let Some((t_rest, rest)) = time_of(cache, stages[from].set.minus(single)) else {
            continue;
        };
        let (lo, hi) = windows[m];
        let old_from = stages[from].time_ms;
        if rest.is_some() {
            // Out to a stage of its own.
            let cutoff = old_from - t_rest - gain_so_far(&best);
            if let Some(alone) = cache.eval_below(single, cutoff) {
                let gain = old_from - t_rest - alone.time_ms;
                best = Some((
                    gain,
                    Change::Shift {
                        from,
                        to: None,
                        rest: rest.clone(),
                        target: alone,
                    },
                ));
            }
        }
        for (to, stage) in stages.iter().enumerate().take(hi + 1).skip(lo) {
            if to == from {
                continue;
            }
            let old = old_from + stage.time_ms;
            let cutoff = old - t_rest - gain_so_far(&best);
            if let Some(target) = cache.eval_below(stage.set.union(single), cutoff) {
                let gain = old - t_rest - target.time_ms;
                best = Some((
                    gain,
                    Change::Shift {
                        from,
                        to: Some(to),
                        rest: rest.clone(),
                        target,
                    },
                ));
            }
        }
    }
    // Merges of two stages no dependency path joins.
    let reach = order::reachability(model, stages, |s| s.set);
    for a in 0..stages.len() {
        for b in a + 1..stages.len() {
            if reach[a] >> b & 1 == 1 || Instant::now() >= deadline {
                continue;
            }
            let old = stages[a].time_ms + stages[b].time_ms;
            let cutoff = old - gain_so_far(&best);
            if let Some(merged) = cache.eval_below(stages[a].set.union(stages[b].set), cutoff) {
                best = Some((old - merged.time_ms, Change::Merge { a, b, merged }));
            }
        }
    }
    if best.is_some() {
        return best;
    }
    // Swaps, tried only when nothing cheaper gains.
    for x in 0..n {
        for y in 0..n {
            let (a, b) = (stage_of[x], stage_of[y]);
            if a >= b || Instant::now() >= deadline {
                continue;
            }
            let ((lo_x, hi_x), (lo_y, hi_y)) = (windows[x], windows[y]);
            if !(lo_x..=hi_x).contains(&b) || !(lo_y..=hi_y).contains(&a) {
                continue;
            }
            let (sx, sy) = (ModuleSet::single(x), ModuleSet::single(y));
            let set_a = stages[a].set.minus(sx).union(sy);
            let set_b = stages[b].set.minus(sy).union(sx);
            let old = stages[a].time_ms + stages[b].time_ms;
            let Some(new_a) = cache.eval_below(set_a, old - gain_so_far(&best)) else {
                continue;
            };
            let cutoff = old - new_a.time_ms - gain_so_far(&best);
            if let Some(new_b) = cache.eval_below(set_b, cutoff) {
                let gain = old - new_a.time_ms - new_b.time_ms;
                best = Some((gain, Change::Swap { a, b, new_a, new_b }));
            }
        }
    }
    best
}

/// The stage list after `mv`, in the old order (empty stages dropped, a new stage right after
/// the one it left).
fn apply(mut stages: Vec<Rc<StageAlloc>>, mv: Change) -> Vec<Rc<StageAlloc>> {
    match mv {
        Change::Shift {
            from,
            to,
            rest,
            target,
        } => {
            match to {
                Some(to) => stages[to] = target,
                None => stages.insert(from + 1, target),
            }
            match rest {
                Some(rest) => stages[from] = rest,
                None => {
                    stages.remove(from);
                }
            }
        }
        Change::Swap { a, b, new_a, new_b } => {
            stages[a] = new_a;
            stages[b] = new_b;
        }
        Change::Merge { a, b, merged } => {
            stages[a] = merged;
            stages.remove(b);
        }
    }
    stages
}
