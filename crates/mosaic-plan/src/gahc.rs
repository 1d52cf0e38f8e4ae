//! GAHC: Mosaic's temporal-spatial mapping solver (§3.4, Alg. 1).
//!
//! Start from one stage per module in a topological order; in each round evaluate every pair
//! of stages whose merge keeps the stage order a valid topological order, and apply the merge
//! with the largest positive gain Δ = T_x + T_y − T_{x∪y} (Eq. 9); stop when no merge gains.
//!
//! - **Legality** (Alg. 1 line 9): stages x < y may merge iff no dependency path leads from x
//!   to y through the stage graph; this also forbids a module sharing a stage with one of its
//!   ancestors. The merged list is re-sorted topologically, so the order stays valid.
//! - **Early pruning** (line 11): a merge can beat Δ_best only if the merged stage can finish
//!   before `T_x + T_y − Δ_best`; the paper checks that every module still has a candidate that
//!   fast; we also check that the fastest-enough candidates fit the pool's SM capacity
//!   ([`Problem::lower_bound`](crate::Problem::lower_bound)). Pruned pairs never reach StageEval.
//! - **Result caching** (line 13): StageEval results are memoised by module set
//!   ([`StageCache`]).
//! - **Deadline**: at the deadline the merging stops and the current stages are returned; they
//!   are always a valid plan (one stage per module at worst).

use std::rc::Rc;
use std::time::Instant;

use mosaic_profile::ModuleSet;

use crate::cache::StageCache;
use crate::order;
use crate::stage_eval::StageAlloc;
use crate::PlanError;

/// Runs Alg. 1 until no merge gains or `deadline` passes, and returns the stages in execution
/// order.
pub fn gahc(cache: &mut StageCache, deadline: Instant) -> Result<Vec<Rc<StageAlloc>>, PlanError> {
    let problem = cache.problem();
    let model = problem.model;
    let mut stages: Vec<Rc<StageAlloc>> = Vec::with_capacity(model.modules.len());
    for &m in &model.topo_order {
        stages.push(
            cache
                .eval(ModuleSet::single(m))
                .ok_or_else(|| problem.unplaceable(m))?,
        );
    }
    while stages.len() > 1 && Instant::now() < deadline {
        let reach = order::reachability(model, &stages, |s| s.set);
        let mut best_gain = 0.0;
        let mut best: Option<(usize, usize, Rc<StageAlloc>)> = None;
        for x in 0..stages.len() {
            for y in x + 1..stages.len() {
                if reach[x] >> y & 1 == 1 {
                    continue; // merging would break the dependency order
                }
                if Instant::now() >= deadline {
                    break;
                }
                let limit = stages[x].time_ms + stages[y].time_ms - best_gain;
                let merged = stages[x].set.union(stages[y].set);
                if let Some(alloc) = cache.eval_below(merged, limit) {
                    best_gain = stages[x].time_ms + stages[y].time_ms - alloc.time_ms;
                    best = Some((x, y, alloc));
                }
            }
        }
        let Some((x, y, merged)) = best else { break };
        stages[x] = merged;
        stages.remove(y);
        stages = order::topological(model, stages, |s| s.set);
    }
    Ok(stages)
}
