//! Large-neighbourhood search over one stage's allocation, where a capped search stopped.
//!
//! The depth-first search's anytime quality depends wildly on its cutoff: on a 14-encoder
//! stage of `zoo_shaped_profiles(1, 24, 32)` with interference, a million nodes below 101 ms
//! found nothing, while below 99 ms the same search found 97.9 ms after 9 s. So once a capped
//! search has an allocation, this improves it as packing solvers do (Shaw's large-neighbourhood
//! search): free the modules that set the stage time and a few of those beside them, keep every
//! other placement as it is, and search the freed ones exhaustively (within a node share) for
//! a strictly faster stage; repeat from each improvement. The slowest modules are always
//! freed, since nothing else can shorten the stage except taking their partners away, and
//! the rest are drawn from the modules sharing their GPUs, then from all, so that successive
//! rounds free different neighbourhoods.

use std::time::Instant;

use mosaic_profile::ModuleSet;

use super::{Limits, Search, StageAlloc};
use crate::Problem;

/// How many modules a round frees beyond the slowest.
const FREED: usize = 3;

/// Search nodes per round: the freed modules' placements are few.
const ROUND_NODES: u64 = 512;

/// Rounds in a row without a faster stage, per module of the stage, after which the search
/// stops.
const PATIENCE: usize = 2;

/// What a round's allocation must beat, relative to the best one: a leaf's stage time, summed
/// over its GPUs' classes, may differ from the same allocation's in the last bits.
const FASTER: f64 = 1.0 - 1e-9;

/// The fastest allocation of `start`'s stage found from `start` (itself if none is faster),
/// with modules in `order` (bottleneck first), within `limits.nodes` nodes and
/// `limits.deadline`.
pub(super) fn improve(
    problem: &Problem,
    order: &[usize],
    start: StageAlloc,
    limits: &Limits,
) -> StageAlloc {
    let n = order.len();
    let mut best = start;
    let mut rng = Rng(best.set.0 | 1);
    let mut picks = candidate_indices(problem, &best);
    let (mut spent, mut fails) = (0u64, 0);
    let late = || limits.deadline.is_some_and(|d| Instant::now() >= d);
    while spent < limits.nodes && fails < PATIENCE * n && !late() {
        let free = neighbourhood(&best, problem.gpus, &mut rng);
        let fixed: Vec<usize> = order
            .iter()
            .copied()
            .filter(|&m| !free.contains(m))
            .collect();
        let freed = order.iter().copied().filter(|&m| free.contains(m));
        let round = Limits {
            nodes: ROUND_NODES.min(limits.nodes - spent),
            ..*limits
        };
        let mut search = Search::new(
            problem,
            fixed.iter().copied().chain(freed).collect(),
            best.time_ms * FASTER,
            round,
        );
        let placed = fixed.iter().map(|&m| {
            let (at, idx) = picks[m];
            (idx, best.placements[at].gpus.as_slice())
        });
        let floor = search.replay(placed.collect());
        if floor < search.best {
            search.dfs(fixed.len(), floor);
        }
        spent += search.nodes.max(1);
        match search.best_sol.take() {
            Some(sol) => {
                best = search.finish(best.set, &sol);
                picks = candidate_indices(problem, &best);
                fails = 0;
            }
            None => fails += 1,
        }
    }
    best
}

/// Per module of the model, where `alloc` places it: the index of its placement and of its
/// candidate (`usize::MAX` for modules outside the stage).
fn candidate_indices(problem: &Problem, alloc: &StageAlloc) -> Vec<(usize, usize)> {
    let mut picks = vec![(usize::MAX, usize::MAX); problem.cands.len()];
    for (at, p) in alloc.placements.iter().enumerate() {
        let list = &problem.cands[p.module].list;
        let idx = list.iter().position(|c| *c == p.choice);
        picks[p.module] = (at, idx.expect("a placement's choice is a candidate"));
    }
    picks
}

/// The modules a round frees from `alloc`: every slowest one, then up to [`FREED`] more drawn
/// by `rng`, from the modules sharing a GPU with a slowest one while there are any.
fn neighbourhood(alloc: &StageAlloc, gpus: u32, rng: &mut Rng) -> ModuleSet {
    let slowest = |t: f64| t >= alloc.time_ms * (1.0 - 1e-12);
    let mut free = ModuleSet::EMPTY;
    let mut busy = vec![false; gpus as usize];
    for p in alloc.placements.iter().filter(|p| slowest(p.time_ms)) {
        free = free.union(ModuleSet::single(p.module));
        for &g in &p.gpus {
            busy[g as usize] = true;
        }
    }
    let beside = |p: &&super::Placement| p.gpus.iter().any(|&g| busy[g as usize]);
    let mut mates: Vec<usize> = alloc
        .placements
        .iter()
        .filter(beside)
        .map(|p| p.module)
        .collect();
    mates.retain(|&m| !free.contains(m));
    let mut others: Vec<usize> = alloc
        .set
        .minus(free)
        .iter()
        .filter(|m| !mates.contains(m))
        .collect();
    for _ in 0..FREED {
        let pool = if mates.is_empty() {
            &mut others
        } else {
            &mut mates
        };
        if pool.is_empty() {
            break;
        }
        let m = pool.swap_remove(rng.below(pool.len()));
        free = free.union(ModuleSet::single(m));
    }
    free
}

/// Xorshift64: the draws of [`neighbourhood`], reproducible per stage.
struct Rng(u64);

impl Rng {
    /// A draw in 0..n (n > 0).
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

impl Search<'_> {
    /// Places the first positions as `placed` says, (candidate index, GPUs) each, and returns
    /// the bound on every completion of them (0 with none).
    fn replay(&mut self, placed: Vec<(usize, &[u32])>) -> f64 {
        let mut hosted = vec![0u64; self.problem.gpus as usize];
        for (pos, &(idx, gpus)) in placed.iter().enumerate() {
            let c = *self.cand(pos, idx);
            // Replicas per hosted set, then per class (the class hosting that set).
            let mut per_set: Vec<(u64, u32)> = Vec::new();
            for &g in gpus {
                let mask = hosted[g as usize];
                match per_set.iter_mut().find(|(set, _)| *set == mask) {
                    Some((_, n)) => *n += 1,
                    None => per_set.push((mask, 1)),
                }
                hosted[g as usize] |= 1 << pos;
            }
            let split: Vec<(usize, u32)> = per_set
                .into_iter()
                .map(|(mask, n)| {
                    let k = self.classes.iter().position(|class| class.mask == mask);
                    (k.expect("every hosted set is a class"), n)
                })
                .collect();
            self.place(pos, idx, &c, &split);
        }
        match placed.len() {
            0 => 0.0,
            len => self.bound(len - 1),
        }
    }
}

#[cfg(test)]
mod tests {
    use mosaic_profile::{Interference, PerfModel};

    use super::*;
    use crate::stage_eval::stage_eval_within;
    use crate::synthetic::zoo_shaped_profiles;

    /// `zoo_shaped_profiles(1, 24, 32)` with issue 13's interference.
    fn zoo_model() -> PerfModel {
        let mut file = zoo_shaped_profiles(1, 24, 32);
        file.interference = Interference {
            e1: 0.02,
            e2: 0.05,
            e3: 0.3,
        };
        PerfModel::new(&file, 0.1, "zoo").expect("valid")
    }

    /// The modules of `model` with these names.
    fn named(model: &PerfModel, names: &[&str]) -> ModuleSet {
        names.iter().fold(ModuleSet::EMPTY, |set, name| {
            let m = model.modules.iter().position(|m| m.name == *name);
            set.union(ModuleSet::single(m.expect("a module of the model")))
        })
    }

    /// The widest stage of that model's 2-second plan: 14 encoders on 32 GPUs. With 4,096
    /// nodes the depth-first search alone stops at 127.3 ms; re-placing neighbourhoods gets
    /// it to 104.6 ms (a search of 20 s from scratch finds nothing below 127.3; 97.9 ms exists).
    #[test]
    fn re_placing_the_slowest_modules_speeds_a_wide_stage_up() {
        let model = zoo_model();
        let problem = Problem::new(&model, 32).unwrap();
        let set = named(
            &model,
            &[
                "enc8_vision_1",
                "enc11_depth_0",
                "enc0_vision_0",
                "enc4_imu_0",
                "enc10_audio_1",
                "enc3_depth_1",
                "enc1_text_1",
                "enc13_video_0",
                "enc12_imu_1",
                "enc9_text_0",
                "enc5_video_0",
                "enc14_thermal_0",
                "enc2_audio_1",
                "enc7_points_1",
            ],
        );
        let limits = Limits {
            deadline: None,
            nodes: 4096,
            splits: 64,
        };
        let outcome = stage_eval_within(&problem, set, f64::INFINITY, &limits);
        let with = outcome.alloc.expect("placeable").time_ms;
        // The same search without the neighbourhoods.
        let order = crate::stage_eval::bottlenecks_first(&problem, set);
        let mut search = Search::new(&problem, order, f64::INFINITY, limits);
        if let Some((t, sol)) = search.greedy() {
            search.best = t;
            search.best_sol = Some(sol);
        }
        search.dfs(0, 0.0);
        let without = search.best;
        assert!(!outcome.proven);
        assert!(with < 0.9 * without, "{with} against {without}");
    }

    /// Replaying every placement of an allocation rebuilds it: the bound after the last one
    /// is its time, and a search below that time from there finds nothing.
    #[test]
    fn replaying_an_allocation_gives_back_its_time() {
        let model = zoo_model();
        let problem = Problem::new(&model, 32).unwrap();
        let n = model.modules.len();
        let limits = Limits {
            deadline: None,
            nodes: 256,
            splits: 64,
        };
        let mut rng = Rng(7);
        for _ in 0..40 {
            let set = (0..6).fold(ModuleSet::EMPTY, |s, _| {
                s.union(ModuleSet::single(rng.below(n)))
            });
            let outcome = stage_eval_within(&problem, set, f64::INFINITY, &limits);
            let Some(alloc) = outcome.alloc else { continue };
            let order: Vec<usize> = set.iter().collect();
            let mut search = Search::new(&problem, order.clone(), alloc.time_ms * FASTER, limits);
            let placed = order.iter().map(|&m| {
                let p = alloc.placements.iter().find(|p| p.module == m).unwrap();
                let idx = problem.cands[m].list.iter().position(|c| *c == p.choice);
                (idx.unwrap(), p.gpus.as_slice())
            });
            let bound = search.replay(placed.collect());
            assert!(
                (bound - alloc.time_ms).abs() <= 1e-9 * alloc.time_ms,
                "{bound} against {alloc:?}"
            );
            search.dfs(order.len(), bound);
            assert!(search.best_sol.is_none());
        }
    }
}
