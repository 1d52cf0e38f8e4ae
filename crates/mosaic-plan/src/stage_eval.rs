//! StageEval: the exact intra-stage allocation of Mosaic §3.1 (Eq. 4–6) with the interference
//! rectification of §3.3.
//!
//! Given the modules of one stage, choose one candidate (dp, quota) per module and place its dp
//! replicas on dp distinct GPUs with the same quota on each (Eq. 6), so that every GPU's quotas
//! sum to at most 1 and its memory to at most the device's, minimising the stage time
//! `max_m T_m(d_m, a_m) · (1 + max_{g ∈ G_m} Δ_g)`.
//!
//! The paper binary-searches a target latency and asks CP-SAT for feasibility. We solve the
//! min–max directly by depth-first branch and bound, which is exact and, on this problem,
//! three to five orders of magnitude faster than a CP-SAT or MIP model (see README):
//! - **Incumbent**: a greedy threshold packing gives the first upper bound `best`.
//! - **Branching**: modules in order of decreasing fastest time; for each, candidates faster
//!   than `best` (a prefix of its time-sorted list, so it shrinks as `best` improves); for each
//!   candidate, every way to place its replicas *up to GPU symmetry*: GPUs hosting the same set
//!   of modules are interchangeable, so we choose how many replicas go to each such class and
//!   take the class's first GPUs.
//! - **Bounds**: (1) capacity: the quota units and memory the remaining modules need at least,
//!   using only candidates faster than `best`, must fit in what is left; (2) interference: a
//!   placed module's time is at least `T · (1 + e1 + e2 · ΣB)` on any GPU it already shares,
//!   because later modules only add to ΣB and the product term is non-negative, and exactly
//!   Eq. 8 on a GPU no later module can still fit on.
//! - **Leaves** evaluate Eq. 8 exactly; a leaf replaces `best` only when strictly better.
//!
//! Invariant: the search visits, up to GPU relabelling, every allocation whose stage time is
//! below the incumbent, so the returned allocation is optimal.

use mosaic_profile::{Interference, ModuleSet};

use crate::candidates::Candidate;
use crate::Problem;

/// One module's allocation inside a stage.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    /// Module index in the model.
    pub module: usize,
    /// The chosen candidate.
    pub choice: Candidate,
    /// The distinct GPUs holding its replicas, ascending.
    pub gpus: Vec<u32>,
    /// Predicted time including interference, in ms.
    pub time_ms: f64,
}

/// The optimal allocation of one stage.
#[derive(Debug, Clone, PartialEq)]
pub struct StageAlloc {
    /// The modules of the stage.
    pub set: ModuleSet,
    /// Stage time: the slowest module's rectified time, in ms.
    pub time_ms: f64,
    /// One placement per module, by module index.
    pub placements: Vec<Placement>,
}

/// Solves one stage exactly. Returns the optimal allocation when its time is strictly below
/// `cutoff`, and `None` when no allocation is (including when the modules cannot be placed at
/// all).
pub fn stage_eval(problem: &Problem, set: ModuleSet, cutoff: f64) -> Option<StageAlloc> {
    let mut order: Vec<usize> = set.iter().collect();
    if order.iter().any(|&m| problem.cands[m].is_empty()) {
        return None;
    }
    // Bottleneck modules first: they raise the lower bound earliest.
    order.sort_by(|&a, &b| {
        problem.cands[b]
            .min_time()
            .total_cmp(&problem.cands[a].min_time())
            .then(a.cmp(&b))
    });
    let mut search = Search::new(problem, order, cutoff);
    search.room_after = (0..search.order.len())
        .map(|p| {
            search.order[p + 1..]
                .iter()
                .fold((u32::MAX, f64::INFINITY), |(u, m), &x| {
                    let list = &problem.cands[x].list;
                    (
                        list.iter().map(|c| c.units).fold(u, u32::min),
                        list.iter().map(|c| c.mem_gib).fold(m, f64::min),
                    )
                })
        })
        .collect();
    if let Some((t, sol)) = search.greedy() {
        search.best = t;
        search.best_sol = Some(sol);
    }
    search.dfs(0);
    let sol = search.best_sol.take()?;
    Some(search.finish(set, sol))
}

/// A full assignment: per search position, the candidate index and its GPUs.
type Solution = Vec<(usize, Vec<u32>)>;

struct Search<'p> {
    problem: &'p Problem<'p>,
    /// Module index at each search position.
    order: Vec<usize>,
    units_per_gpu: u32,
    mem_cap: f64,
    inter: Interference,
    free_units: Vec<u32>,
    free_mem: Vec<f64>,
    /// Search positions hosted on each GPU, as a bitmask.
    hosts: Vec<u64>,
    bw_sum: Vec<f64>,
    free_units_total: u32,
    free_mem_total: f64,
    /// Current partial assignment.
    chosen: Solution,
    /// `room_after[p]`: the fewest quota units and least memory any candidate of the modules
    /// after position `p` needs on one GPU.
    room_after: Vec<(u32, f64)>,
    best: f64,
    best_sol: Option<Solution>,
}

const MEM_EPS: f64 = 1e-9;

impl<'p> Search<'p> {
    fn new(problem: &'p Problem<'p>, order: Vec<usize>, cutoff: f64) -> Self {
        let g = problem.gpus as usize;
        let units = problem.model.units_per_gpu;
        let mem = problem.model.device.memory_gib;
        Search {
            problem,
            order,
            units_per_gpu: units,
            mem_cap: mem,
            inter: problem.model.interference,
            free_units: vec![units; g],
            free_mem: vec![mem; g],
            hosts: vec![0; g],
            bw_sum: vec![0.0; g],
            free_units_total: units * g as u32,
            free_mem_total: mem * g as f64,
            chosen: Vec::new(),
            room_after: Vec::new(),
            best: cutoff,
            best_sol: None,
        }
    }

    fn cand(&self, pos: usize, idx: usize) -> &'p Candidate {
        &self.problem.cands[self.order[pos]].list[idx]
    }

    /// Rectified times of a full assignment under Eq. 8.
    fn rectified(&self, sol: &Solution) -> Vec<f64> {
        let g = self.problem.gpus as usize;
        let mut bws: Vec<Vec<f64>> = vec![Vec::new(); g];
        for (pos, (idx, gpus)) in sol.iter().enumerate() {
            for &gpu in gpus {
                bws[gpu as usize].push(self.cand(pos, *idx).bw_util);
            }
        }
        let delta: Vec<f64> = bws.into_iter().map(|b| self.inter.delta(b)).collect();
        sol.iter()
            .enumerate()
            .map(|(pos, (idx, gpus))| {
                let worst = gpus.iter().map(|&g| delta[g as usize]).fold(0.0, f64::max);
                self.cand(pos, *idx).time_ms * (1.0 + worst)
            })
            .collect()
    }

    /// Threshold packing: for increasing target times, give each module its smallest-area
    /// candidate within the target and pack replicas onto the least-loaded GPUs.
    fn greedy(&self) -> Option<(f64, Solution)> {
        let cands: Vec<_> = self.order.iter().map(|&m| &self.problem.cands[m]).collect();
        let floor = cands.iter().map(|c| c.min_time()).fold(0.0, f64::max);
        let mut taus: Vec<f64> = cands
            .iter()
            .flat_map(|c| c.list.iter().map(|o| o.time_ms))
            .filter(|&t| t >= floor)
            .collect();
        taus.sort_by(f64::total_cmp);
        taus.dedup();
        let cap = self.units_per_gpu * self.problem.gpus;
        // The first target whose smallest areas fit the pool; packing is tried from there.
        let first = taus.partition_point(|&tau| {
            cands
                .iter()
                .map(|c| c.min_area_at_most(tau).unwrap_or(u32::MAX / 64))
                .sum::<u32>()
                > cap
        });
        let mut best: Option<(f64, Solution)> = None;
        let mut tries = 0;
        for &tau in &taus[first..] {
            if best.as_ref().is_some_and(|(t, _)| tau >= *t) || tries >= 16 {
                break;
            }
            if let Some(sol) = self.pack(tau) {
                tries += 1;
                let t = self.rectified(&sol).into_iter().fold(0.0, f64::max);
                if best.as_ref().is_none_or(|(b, _)| t < *b) {
                    best = Some((t, sol));
                }
            }
        }
        best.filter(|(t, _)| *t < self.best)
    }

    fn pack(&self, tau: f64) -> Option<Solution> {
        let g = self.problem.gpus as usize;
        let mut picks: Vec<(usize, usize)> = Vec::new(); // (pos, candidate index)
        for (pos, &m) in self.order.iter().enumerate() {
            let list = &self.problem.cands[m].list;
            let idx = (0..list.len())
                .filter(|&i| list[i].time_ms <= tau)
                .min_by(|&a, &b| {
                    (list[a].area, list[a].dp as f64 * list[a].mem_gib)
                        .partial_cmp(&(list[b].area, list[b].dp as f64 * list[b].mem_gib))
                        .unwrap_or(std::cmp::Ordering::Equal)
                })?;
            picks.push((pos, idx));
        }
        picks.sort_by_key(|&(pos, idx)| std::cmp::Reverse(self.cand(pos, idx).area));
        let mut units = vec![self.units_per_gpu; g];
        let mut mem = vec![self.mem_cap; g];
        let mut load = vec![0u32; g];
        let mut sol: Solution = vec![(0, Vec::new()); self.order.len()];
        for (pos, idx) in picks {
            let c = self.cand(pos, idx);
            let mut fit: Vec<usize> = (0..g)
                .filter(|&x| units[x] >= c.units && mem[x] + MEM_EPS >= c.mem_gib)
                .collect();
            if fit.len() < c.dp as usize {
                return None;
            }
            fit.sort_by_key(|&x| (load[x], std::cmp::Reverse(units[x]), x));
            let mut gpus: Vec<u32> = fit[..c.dp as usize].iter().map(|&x| x as u32).collect();
            gpus.sort_unstable();
            for &x in &gpus {
                units[x as usize] -= c.units;
                mem[x as usize] -= c.mem_gib;
                load[x as usize] += 1;
            }
            sol[pos] = (idx, gpus);
        }
        Some(sol)
    }

    fn dfs(&mut self, pos: usize) {
        if pos == self.order.len() {
            let t = self.rectified(&self.chosen).into_iter().fold(0.0, f64::max);
            if t < self.best {
                self.best = t;
                self.best_sol = Some(self.chosen.clone());
            }
            return;
        }
        // What the modules after this one need at least, with candidates faster than `best`.
        let (mut need_units, mut need_mem) = (0u32, 0.0);
        for &m in &self.order[pos + 1..] {
            match self.problem.cands[m].min_need_below(self.best) {
                Some((a, mem)) => {
                    need_units += a;
                    need_mem += mem;
                }
                None => return,
            }
        }
        let module = self.order[pos];
        let mut idx = 0;
        // `best` may fall while we iterate: re-check the prefix bound each time.
        while idx < self.problem.cands[module].count_below(self.best) {
            let c = *self.cand(pos, idx);
            if c.area + need_units <= self.free_units_total
                && c.dp as f64 * c.mem_gib + need_mem <= self.free_mem_total + MEM_EPS
            {
                self.place_all_ways(pos, idx, &c);
            }
            idx += 1;
        }
    }

    /// Tries every placement of candidate `idx` of position `pos`, up to GPU symmetry.
    fn place_all_ways(&mut self, pos: usize, idx: usize, c: &Candidate) {
        // Classes of interchangeable GPUs that have room: same hosted set, same free state.
        let mut classes: Vec<(u64, Vec<u32>)> = Vec::new();
        for g in 0..self.free_units.len() {
            if self.free_units[g] < c.units || self.free_mem[g] + MEM_EPS < c.mem_gib {
                continue;
            }
            match classes.iter_mut().find(|(h, _)| *h == self.hosts[g]) {
                Some((_, v)) => v.push(g as u32),
                None => classes.push((self.hosts[g], vec![g as u32])),
            }
        }
        if classes.iter().map(|(_, v)| v.len()).sum::<usize>() < c.dp as usize {
            return;
        }
        // Emptier GPUs first: less interference, so good incumbents come early.
        classes.sort_by_key(|(h, v)| (h.count_ones(), v[0]));
        let mut counts = vec![0usize; classes.len()];
        self.compose(pos, idx, c, &classes, &mut counts, 0, c.dp as usize);
    }

    /// Enumerates how many replicas go to each class (classes `k..`), `left` still to place.
    #[allow(clippy::too_many_arguments)]
    fn compose(
        &mut self,
        pos: usize,
        idx: usize,
        c: &Candidate,
        classes: &[(u64, Vec<u32>)],
        counts: &mut Vec<usize>,
        k: usize,
        left: usize,
    ) {
        if left == 0 {
            let gpus: Vec<u32> = classes
                .iter()
                .zip(counts.iter())
                .flat_map(|((_, v), &n)| v[..n].iter().copied())
                .collect();
            self.descend(pos, idx, c, gpus);
            return;
        }
        if k == classes.len() {
            return;
        }
        let room_after: usize = classes[k + 1..].iter().map(|(_, v)| v.len()).sum();
        let hi = left.min(classes[k].1.len());
        let lo = left.saturating_sub(room_after);
        for n in (lo..=hi).rev() {
            counts[k] = n;
            self.compose(pos, idx, c, classes, counts, k + 1, left - n);
            counts[k] = 0;
        }
    }

    /// Places the replicas on `gpus`, bounds, recurses, and undoes.
    fn descend(&mut self, pos: usize, idx: usize, c: &Candidate, mut gpus: Vec<u32>) {
        gpus.sort_unstable();
        let bit = 1u64 << pos;
        for &g in &gpus {
            let g = g as usize;
            self.free_units[g] -= c.units;
            self.free_mem[g] -= c.mem_gib;
            self.hosts[g] |= bit;
            self.bw_sum[g] += c.bw_util;
        }
        self.free_units_total -= c.area;
        self.free_mem_total -= c.dp as f64 * c.mem_gib;
        self.chosen.push((idx, gpus.clone()));
        if self.bound(pos) < self.best {
            self.dfs(pos + 1);
        }
        self.chosen.pop();
        self.free_units_total += c.area;
        self.free_mem_total += c.dp as f64 * c.mem_gib;
        for &g in &gpus {
            let g = g as usize;
            self.free_units[g] += c.units;
            self.free_mem[g] += c.mem_gib;
            self.hosts[g] &= !bit;
            self.bw_sum[g] -= c.bw_util;
        }
    }

    /// A lower bound on the stage time of any completion of the first `pos + 1` placements.
    ///
    /// Per GPU shared by two or more placed modules, Δ_g is at least e1 + e2·ΣB (later modules
    /// only add to ΣB; the product term is non-negative) and exactly Eq. 8 once the GPU is
    /// *closed*: no later module has a candidate small enough to join it.
    fn bound(&self, pos: usize) -> f64 {
        let (min_units, min_mem) = self.room_after[pos];
        let delta: Vec<f64> = (0..self.hosts.len())
            .map(|g| {
                let h = self.hosts[g];
                if h.count_ones() < 2 {
                    0.0
                } else if self.free_units[g] < min_units || self.free_mem[g] + MEM_EPS < min_mem {
                    let mut prod = 1.0;
                    let mut bits = h;
                    while bits != 0 {
                        let p = bits.trailing_zeros() as usize;
                        bits &= bits - 1;
                        prod *= self.cand(p, self.chosen[p].0).bw_util;
                    }
                    self.inter.e1 + self.inter.e2 * self.bw_sum[g] + self.inter.e3 * prod
                } else {
                    self.inter.e1 + self.inter.e2 * self.bw_sum[g]
                }
            })
            .collect();
        self.chosen
            .iter()
            .enumerate()
            .map(|(p, (idx, gpus))| {
                let worst = gpus.iter().map(|&g| delta[g as usize]).fold(0.0, f64::max);
                self.cand(p, *idx).time_ms * (1.0 + worst)
            })
            .fold(0.0, f64::max)
    }

    fn finish(&self, set: ModuleSet, sol: Solution) -> StageAlloc {
        let times = self.rectified(&sol);
        let mut placements: Vec<Placement> = sol
            .into_iter()
            .enumerate()
            .map(|(pos, (idx, gpus))| Placement {
                module: self.order[pos],
                choice: *self.cand(pos, idx),
                gpus,
                time_ms: times[pos],
            })
            .collect();
        placements.sort_by_key(|p| p.module);
        StageAlloc {
            set,
            time_ms: times.iter().copied().fold(0.0, f64::max),
            placements,
        }
    }
}
