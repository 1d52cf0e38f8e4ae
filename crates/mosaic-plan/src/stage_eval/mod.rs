//! StageEval: the intra-stage allocation of Mosaic §3.1 (Eq. 4–6) with the interference
//! rectification of §3.3, exact when it may run to the end and anytime when it may not.
//!
//! Given the modules of one stage, choose one candidate (dp, quota) per module and place its dp
//! replicas on dp distinct GPUs with the same quota on each (Eq. 6), so that every GPU's quotas
//! sum to at most 1 and its memory to at most the device's, minimising the stage time
//! `max_m T_m(d_m, a_m) · (1 + max_{g ∈ G_m} Δ_g)`.
//!
//! The paper binary-searches a target latency and asks CP-SAT for feasibility. We solve the
//! min–max directly by depth-first branch and bound:
//! - **GPUs are counted, not enumerated.** A GPU's state (free quota, free memory, Δ) follows
//!   from the set of modules it hosts, so the pool is a list of *classes*: a hosted set and how
//!   many GPUs host exactly it. Placing a module chooses how many replicas go to each class; a
//!   class splits in two, and the bit of the new module keeps every class's set distinct. A
//!   node of the search costs O(classes), never O(GPUs): the initial pool of 1,024 GPUs is one
//!   class. GPU numbers appear only when the final allocation is written out.
//! - **Incumbent**: a greedy threshold packing gives the first upper bound `best`.
//! - **Branching**: modules in order of decreasing fastest time; for each, candidates faster
//!   than `best` (a prefix of its time-sorted list, so it shrinks as `best` improves); for each
//!   candidate, every split of its replicas over the classes with room. Candidates no slower
//!   than the bound of the placements so far go first, slowest (most frugal) first: they
//!   cannot lengthen the stage and leave the most room; the faster ones follow, fastest
//!   first. A node whose bound `best` has met is left at once. A capped search so spends its
//!   nodes on allocations that fit, where fastest-first filled the pool with its first
//!   modules and backtracked at the bottom.
//! - **Bounds**: (1) capacity: the quota units and memory the remaining modules need at least,
//!   using only candidates faster than `best`, must fit in what is left; (2) interference: a
//!   GPU's Δ ends either as Eq. 8 gives it now, if no later module joins it, or at least
//!   e1 + e2·(ΣB + B_min), B_min the least bandwidth of any later candidate (sums only grow and
//!   the product term is never negative), and a later module joins only where that keeps the
//!   GPU's slowest module below `best`. Not Eq. 8 as it is in both cases: Eq. 8's product term
//!   falls when a module joins (ΠB shrinks).
//! - **Placements the bound would cut off are never made.** A replica goes only to GPUs where
//!   every module it would join, and itself, still run below `best` by that bound. Where a
//!   GPU's modules already run at `best` or slower by it once the module is placed, the module
//!   must join every such GPU: only joining can lower Δ there. A node is left when a module
//!   after it has no candidate left with `dp` GPUs to go to: GPUs only fill and `best` only
//!   falls, so it never will.
//! - **Nor placements that strand a later module.** GPUs whose modules the bound times at
//!   `best` or slower must be joined by the next module, and where none of its candidates
//!   faster than `best` fits there, the node has no completion. Nor has it where the next
//!   module cannot join GPUs that the module after it would have to join and could not, and so
//!   on, up to `LOOKAHEAD` modules ahead (`Search::lost`). So a replica never goes to a GPU
//!   it would leave lost, and GPUs that are lost as they are must all take one. Found on
//!   `zoo_shaped_profiles(3, 12, 32)`: its 9-encoder stages spent millions of nodes placing the
//!   eighth module, and then the seventh, each time to find that the ninth, which needs 30 GiB
//!   wherever it goes, fitted on none of the GPUs it had to join.
//! - **Leaves** evaluate Eq. 8 exactly; a leaf replaces `best` only when strictly better.
//!
//! Invariant: with [`Limits::EXACT`] the search visits, up to GPU relabelling, every allocation
//! whose stage time is below the incumbent, so the result is optimal. [`Limits`] may cap the
//! search: a deadline, a number of nodes, and a number of replica splits per placement beyond
//! which only two (emptiest GPUs first, fullest first) are tried. A capped search that found an
//! allocation improves it by a large-neighbourhood search with as many nodes again
//! (`neighbourhood.rs`: the slowest modules and a few beside them re-placed, the rest kept),
//! returns the best allocation it found and says it is not proven ([`Outcome::proven`]).

mod neighbourhood;

use std::time::Instant;

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

/// An allocation of one stage.
#[derive(Debug, Clone, PartialEq)]
pub struct StageAlloc {
    /// The modules of the stage.
    pub set: ModuleSet,
    /// Stage time: the slowest module's rectified time, in ms.
    pub time_ms: f64,
    /// One placement per module, by module index.
    pub placements: Vec<Placement>,
}

/// How far one StageEval call may search.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Stop at this instant.
    pub deadline: Option<Instant>,
    /// Stop after this many search nodes.
    pub nodes: u64,
    /// Try every split of a module's replicas over the GPU classes only when there are at most
    /// this many; otherwise try two.
    pub splits: u64,
}

impl Limits {
    /// No limit: the search runs to the end and its answer is optimal.
    pub const EXACT: Limits = Limits {
        deadline: None,
        nodes: u64::MAX,
        splits: u64::MAX,
    };
}

/// What one StageEval call found.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The best allocation found strictly below the cutoff, if any.
    pub alloc: Option<StageAlloc>,
    /// Whether the search was complete: then `alloc` is optimal, and `None` proves that no
    /// allocation is below the cutoff.
    pub proven: bool,
}

/// Solves one stage exactly. Returns the optimal allocation when its time is strictly below
/// `cutoff`, and `None` when no allocation is (including when the modules cannot be placed at
/// all).
pub fn stage_eval(problem: &Problem, set: ModuleSet, cutoff: f64) -> Option<StageAlloc> {
    stage_eval_within(problem, set, cutoff, &Limits::EXACT).alloc
}

/// Solves one stage within `limits`: the best allocation found strictly below `cutoff`, and
/// whether the search was complete. Where a capped search stops with an allocation, a
/// large-neighbourhood search (`neighbourhood.rs`) improves it with as many nodes again.
pub fn stage_eval_within(
    problem: &Problem,
    set: ModuleSet,
    cutoff: f64,
    limits: &Limits,
) -> Outcome {
    if set.is_empty() || set.iter().any(|m| problem.cands[m].is_empty()) {
        return Outcome {
            alloc: None,
            proven: true,
        };
    }
    let mut search = Search::new(problem, bottlenecks_first(problem, set), cutoff, *limits);
    if let Some((t, sol)) = search.greedy() {
        search.best = t;
        search.best_sol = Some(sol);
    }
    search.dfs(0, 0.0);
    let proven = search.complete;
    let found = search.best_sol.take().map(|sol| search.finish(set, &sol));
    let alloc = match found {
        Some(found) if !proven => Some(neighbourhood::improve(
            problem,
            &search.order,
            found,
            limits,
        )),
        found => found,
    };
    Outcome { alloc, proven }
}

/// The modules of `set` in decreasing order of their fastest times: they raise the lower bound
/// earliest.
fn bottlenecks_first(problem: &Problem, set: ModuleSet) -> Vec<usize> {
    let mut order: Vec<usize> = set.iter().collect();
    order.sort_by(|&a, &b| {
        problem.cands[b]
            .min_time()
            .total_cmp(&problem.cands[a].min_time())
            .then(a.cmp(&b))
    });
    order
}

/// GPUs that host exactly the same search positions, hence are in the same state.
#[derive(Debug, Clone, Copy)]
struct Class {
    /// The search positions hosted, as a bitmask.
    mask: u64,
    /// GPUs in the class.
    count: u32,
    /// Free quota units on each.
    free_units: u32,
    /// Free memory on each, GiB.
    free_mem: f64,
    /// Sum and product of the hosted modules' bandwidth utilisations.
    bw_sum: f64,
    bw_prod: f64,
    /// The slowest hosted candidate's time before interference, ms (0 when none).
    slowest_ms: f64,
}

impl Class {
    /// The class its GPUs become when they also host position `pos` at candidate `c`.
    fn hosting(&self, pos: usize, c: &Candidate, count: u32) -> Class {
        Class {
            mask: self.mask | 1 << pos,
            count,
            free_units: self.free_units - c.units,
            free_mem: self.free_mem - c.mem_gib,
            bw_sum: self.bw_sum + c.bw_util,
            bw_prod: self.bw_prod * c.bw_util,
            slowest_ms: self.slowest_ms.max(c.time_ms),
        }
    }

    /// Eq. 8's Δ on these GPUs, exactly.
    fn delta(&self, inter: &Interference) -> f64 {
        match self.mask.count_ones() {
            0 | 1 => 0.0,
            _ => inter.e1 + inter.e2 * self.bw_sum + inter.e3 * self.bw_prod,
        }
    }

    /// The least Δ these GPUs can end a stage at where every module stays below `best`, when
    /// the modules still to place join them only as `after` allows: Eq. 8 as it is, if none
    /// joins; else at least e1 + e2·(ΣB + B_min) (sums only grow, the product term is never
    /// negative), which a module joins under only if it keeps the slowest below `best`. Not
    /// Eq. 8 as it is in that case too: a module that joins shrinks ΠB.
    fn delta_bound(&self, inter: &Interference, after: &Room, best: f64) -> f64 {
        let alone = self.delta(inter);
        let joined = inter.e1 + inter.e2 * (self.bw_sum + after.bw);
        let may_join = self.free_units >= after.units
            && self.free_mem + MEM_EPS >= after.mem
            && self.slowest_ms * (1.0 + joined) < best;
        if may_join {
            alone.min(joined)
        } else {
            alone
        }
    }
}

/// What the modules still to place need at least on a GPU to join it: the fewest quota units,
/// the least memory and the least bandwidth utilisation of any of their candidates.
#[derive(Debug, Clone, Copy)]
struct Room {
    units: u32,
    mem: f64,
    bw: f64,
}

/// How many positions ahead [`Search::lost`] looks for GPUs that a later module must join but
/// cannot.
const LOOKAHEAD: usize = 3;

/// The room of no module: nothing can join.
const NOTHING_AFTER: Room = Room {
    units: u32::MAX,
    mem: f64::INFINITY,
    bw: f64::INFINITY,
};

/// The room of a module that fits anywhere and adds no bandwidth: Δ's least value,
/// e1 + e2·ΣB where two modules share.
const ANYTHING_AFTER: Room = Room {
    units: 0,
    mem: f64::NEG_INFINITY,
    bw: 0.0,
};

/// A full (or, while searching, partial) allocation, in the order its picks were made.
#[derive(Debug, Clone, Default)]
struct Solution {
    /// Per pick: the module's search position, its candidate index, and the range of `parts`
    /// that says where its replicas went.
    picks: Vec<(usize, usize, std::ops::Range<usize>)>,
    /// How many replicas went to the GPUs hosting each set of earlier positions, all picks'
    /// in one list.
    parts: Vec<(u64, u32)>,
}

impl Solution {
    /// Adds the pick of candidate `idx` for position `pos`, placed as `split` says on
    /// `classes` (which it updates).
    fn push(
        &mut self,
        classes: &mut Vec<Class>,
        split: &[(usize, u32)],
        pos: usize,
        idx: usize,
        c: &Candidate,
    ) {
        let start = self.parts.len();
        apply(classes, split, pos, c, &mut self.parts);
        self.picks.push((pos, idx, start..self.parts.len()));
    }

    /// Removes the last pick (the classes are restored by the caller).
    fn pop(&mut self) {
        if let Some((_, _, range)) = self.picks.pop() {
            self.parts.truncate(range.start);
        }
    }
}

/// Classes with room (indices), their GPU counts, and a split (class, replicas).
type Buffers = (Vec<usize>, Vec<u32>, Vec<(usize, u32)>);

struct Search<'p> {
    problem: &'p Problem<'p>,
    /// Module index at each search position.
    order: Vec<usize>,
    inter: Interference,
    classes: Vec<Class>,
    /// Per position, reusable buffers for the classes with room, their sizes and a split.
    buffers: Vec<Buffers>,
    /// Per position, the classes that are lost as they are once it is placed
    /// ([`Search::lost_after`]), found once per node.
    lost_as_is: Vec<Vec<usize>>,
    /// Per position, the candidate [`Search::still_placeable`] found placeable last.
    placeable: Vec<usize>,
    /// Per position, [`Search::need_after`] it, for the `best` of `need_best`.
    need: Vec<Option<(u64, f64)>>,
    need_best: f64,
    /// Classes as they were before the placements being tried, to restore them.
    undo: Vec<(usize, Class)>,
    free_units_total: u64,
    free_mem_total: f64,
    /// Current partial assignment, by position.
    chosen: Solution,
    /// `room_after[p]`: what the modules after position `p` need to join a GPU.
    room_after: Vec<Room>,
    best: f64,
    best_sol: Option<Solution>,
    limits: Limits,
    nodes: u64,
    /// False once a limit cut the search short.
    complete: bool,
    /// True once the deadline or the node limit stopped the search.
    stopped: bool,
}

const MEM_EPS: f64 = 1e-9;

/// How many nodes pass between two looks at the clock.
const CLOCK_EVERY: u64 = 64;

impl<'p> Search<'p> {
    fn new(problem: &'p Problem<'p>, order: Vec<usize>, cutoff: f64, limits: Limits) -> Self {
        let units = problem.model.units_per_gpu;
        let mem = problem.model.device.memory_gib;
        let room_after: Vec<Room> = (0..order.len())
            .map(|p| {
                let cands = order[p + 1..].iter().flat_map(|&x| &problem.cands[x].list);
                cands.fold(NOTHING_AFTER, |r, c| Room {
                    units: r.units.min(c.units),
                    mem: r.mem.min(c.mem_gib),
                    bw: r.bw.min(c.bw_util),
                })
            })
            .collect();
        Search {
            problem,
            placeable: vec![0; order.len()],
            order,
            inter: problem.model.interference,
            classes: vec![Self::empty_class(problem)],
            undo: Vec::new(),
            need: vec![None; room_after.len()],
            buffers: vec![Buffers::default(); room_after.len()],
            lost_as_is: vec![Vec::new(); room_after.len()],
            need_best: f64::NAN,
            free_units_total: units as u64 * problem.gpus as u64,
            free_mem_total: mem * problem.gpus as f64,
            chosen: Solution::default(),
            room_after,
            best: cutoff,
            best_sol: None,
            limits,
            nodes: 0,
            complete: true,
            stopped: false,
        }
    }

    /// The whole pool, hosting nothing.
    fn empty_class(problem: &Problem) -> Class {
        Class {
            mask: 0,
            count: problem.gpus,
            free_units: problem.model.units_per_gpu,
            free_mem: problem.model.device.memory_gib,
            bw_sum: 0.0,
            bw_prod: 1.0,
            slowest_ms: 0.0,
        }
    }

    fn cand(&self, pos: usize, idx: usize) -> &'p Candidate {
        &self.problem.cands[self.order[pos]].list[idx]
    }

    /// The slowest rectified time among the picks `sol` on the pool `classes`, with each
    /// class's Δ as `delta` gives it (0 with no picks).
    fn slowest(&self, classes: &[Class], sol: &Solution, delta: impl Fn(&Class) -> f64) -> f64 {
        // Positions are module indices of a `ModuleSet`, so fewer than 64.
        let mut worst = [0.0f64; 64];
        for c in classes {
            let d = delta(c);
            let mut bits = c.mask;
            while bits != 0 {
                let p = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                worst[p] = worst[p].max(d);
            }
        }
        sol.picks
            .iter()
            .map(|(pos, idx, _)| self.cand(*pos, *idx).time_ms * (1.0 + worst[*pos]))
            .fold(0.0, f64::max)
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
        let cap = self.free_units_total;
        // The first target whose smallest areas fit the pool; packing is tried from there.
        let first = taus.partition_point(|&tau| {
            cands
                .iter()
                .map(|c| c.min_area_at_most(tau).map_or(u64::MAX / 128, u64::from))
                .sum::<u64>()
                > cap
        });
        let mut best: Option<(f64, Solution)> = None;
        let mut tries = 0;
        for &tau in &taus[first..] {
            if best.as_ref().is_some_and(|(t, _)| tau >= *t) || tries >= 16 {
                break;
            }
            if let Some((classes, sol)) = self.pack(tau) {
                tries += 1;
                let t = self.slowest(&classes, &sol, |c| c.delta(&self.inter));
                if best.as_ref().is_none_or(|(b, _)| t < *b) {
                    best = Some((t, sol));
                }
            }
        }
        best.filter(|(t, _)| *t < self.best)
    }

    /// Packs every module's smallest-area candidate within `tau`, largest first, each replica
    /// on the least-loaded GPUs with room.
    fn pack(&self, tau: f64) -> Option<(Vec<Class>, Solution)> {
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
        let mut classes = vec![Self::empty_class(self.problem)];
        let mut sol = Solution::default();
        for (pos, idx) in picks {
            let c = self.cand(pos, idx);
            let fit = eligible(
                &classes,
                c,
                pos,
                &self.cutoff(f64::INFINITY, ANYTHING_AFTER),
            );
            let split = fill(&classes, &fit, c.dp)?;
            sol.push(&mut classes, &split, pos, idx, c);
        }
        Some((classes, sol))
    }

    /// Counts a node and reports whether a limit stops the search here.
    fn out_of_limits(&mut self) -> bool {
        if self.stopped {
            return true;
        }
        self.nodes += 1;
        // The first node too: a call made after the deadline stops after its greedy packing.
        let clock = (self.nodes == 1 || self.nodes.is_multiple_of(CLOCK_EVERY))
            && self.limits.deadline.is_some_and(|d| Instant::now() >= d);
        if self.nodes > self.limits.nodes || clock {
            self.stopped = true;
            self.complete = false;
        }
        self.stopped
    }

    /// Places position `pos` and on, the stage lasting at least `floor` (the bound of the
    /// placements so far). Candidates no slower than `floor` come first, the slowest (most
    /// frugal) of them first: they leave the most room for the modules after; then the faster
    /// ones, fastest first.
    fn dfs(&mut self, pos: usize, floor: f64) {
        if self.stopped {
            return;
        }
        if pos == self.order.len() {
            let t = self.slowest(&self.classes, &self.chosen, |c| c.delta(&self.inter));
            if t < self.best {
                self.best = t;
                self.best_sol = Some(self.chosen.clone());
            }
            return;
        }
        // What the modules after this one need at least, with candidates faster than `best`.
        let Some((need_units, need_mem)) = self.need_after(pos + 1) else {
            return;
        };
        if !(pos + 1..self.order.len()).all(|q| self.still_placeable(q)) {
            return;
        }
        // The classes lost as they are, for every candidate of this node: `best` only falls,
        // so those it would add later are only pruned less.
        let mut lost_as_is = std::mem::take(&mut self.lost_as_is[pos]);
        lost_as_is.clear();
        lost_as_is
            .extend((0..self.classes.len()).filter(|&k| self.lost_after(&self.classes[k], pos)));
        self.lost_as_is[pos] = lost_as_is;
        let cands = &self.problem.cands[self.order[pos]];
        let within = cands.count_below(floor);
        let mut idx = within;
        // `best` may fall while we iterate: the candidates below it then shrink to a prefix,
        // and once it meets `floor` nothing below this node can beat it.
        while idx > 0 && !self.stopped && self.best > floor {
            idx -= 1;
            self.try_candidate(pos, idx, need_units, need_mem);
        }
        let mut idx = within;
        let (mut below, mut count) = (self.best, cands.count_below(self.best));
        while !self.stopped && idx < count {
            self.try_candidate(pos, idx, need_units, need_mem);
            idx += 1;
            if self.best != below {
                below = self.best;
                count = cands.count_below(below);
            }
        }
    }

    /// Places candidate `idx` of position `pos` every way, where it leaves the modules after
    /// it the quota units and memory they need.
    fn try_candidate(&mut self, pos: usize, idx: usize, need_units: u64, need_mem: f64) {
        let c = *self.cand(pos, idx);
        if c.area as u64 + need_units <= self.free_units_total
            && c.dp as f64 * c.mem_gib + need_mem <= self.free_mem_total + MEM_EPS
        {
            self.place_all_ways(pos, idx, &c);
        }
    }

    /// The least quota units and memory the modules from position `from` on need together
    /// with candidates faster than `best`; `None` when one has none. Recomputed for every
    /// position only when `best` has changed.
    fn need_after(&mut self, from: usize) -> Option<(u64, f64)> {
        if self.need_best != self.best {
            self.need_best = self.best;
            let mut sum = Some((0u64, 0.0f64));
            for p in (0..self.order.len()).rev() {
                sum = sum.and_then(|(units, mem)| {
                    let (a, m) = self.problem.cands[self.order[p]].min_need_below(self.best)?;
                    Some((units + a as u64, mem + m))
                });
                self.need[p] = sum;
            }
        }
        self.need.get(from).copied().unwrap_or(Some((0, 0.0)))
    }

    /// Whether position `q` still has a candidate faster than `best` with room on `dp` GPUs
    /// where Δ's least value ([`Class::delta`] of an open class) keeps every module they would
    /// host faster than `best`. Placements only fill GPUs and `best` only falls, so a position
    /// with none never gets one.
    fn still_placeable(&mut self, q: usize) -> bool {
        let list = &self.problem.cands[self.order[q]].list;
        let below = list.partition_point(|c| c.time_ms < self.best);
        // The candidate that placed last time, first: it usually still does.
        let last = self.placeable[q];
        if last < below && self.has_room(q, &list[last]) {
            return true;
        }
        match (0..below).find(|&i| i != last && self.has_room(q, &list[i])) {
            Some(i) => {
                self.placeable[q] = i;
                true
            }
            None => false,
        }
    }

    /// Whether `c` (of position `q`) has room on `dp` GPUs where Δ's least value keeps every
    /// module they would host faster than `best`.
    fn has_room(&self, q: usize, c: &Candidate) -> bool {
        let cutoff = self.cutoff(self.best, ANYTHING_AFTER);
        let mut gpus = 0;
        self.classes.iter().any(|class| {
            if admits(class, c, q, &cutoff) {
                gpus += class.count;
            }
            gpus >= c.dp
        })
    }

    /// A placement's [`Cutoff`] at time `best`, with the least needs `room` after it.
    fn cutoff(&self, best: f64, room: Room) -> Cutoff<'_> {
        Cutoff {
            inter: &self.inter,
            best,
            room,
        }
    }

    /// Tries the splits of candidate `idx` of position `pos` over the classes with room: all
    /// of them when there are at most `limits.splits`, else emptiest-first and fullest-first.
    /// A class whose modules the bound already times at `best` or more once this position is
    /// placed ([`Search::doomed`]) must take a replica on each of its GPUs: left as it is, the
    /// bound cuts the placement off. So must a class that is lost as it is, and no replica goes
    /// where it would leave a class lost ([`Search::lost_after`]).
    fn place_all_ways(&mut self, pos: usize, idx: usize, c: &Candidate) {
        // This position's buffers: deeper positions use their own while these are out.
        let (mut fit, mut counts, mut split) = std::mem::take(&mut self.buffers[pos]);
        let cutoff = self.cutoff(self.best, self.room_after[pos]);
        eligible_into(&self.classes, c, pos, &cutoff, &mut fit);
        // No replica where it would leave its GPUs lost.
        fit.retain(|&k| !self.lost_after(&self.classes[k].hosting(pos, c, 0), pos));
        // The classes this position must join (doomed, or lost as they are) first; each must
        // be eligible, and all of them take at most dp.
        let doomed = (0..self.classes.len())
            .filter(|&k| self.doomed(&self.classes[k], pos) || self.lost_as_is[pos].contains(&k));
        let (mut forced, mut forced_gpus, mut placeable) = (0, 0u64, true);
        for k in doomed {
            match fit.iter().position(|&f| f == k) {
                Some(at) => {
                    fit[forced..=at].rotate_right(1);
                    forced += 1;
                    forced_gpus += u64::from(self.classes[k].count);
                }
                None => placeable = false,
            }
        }
        counts.clear();
        counts.extend(fit.iter().map(|&k| self.classes[k].count));
        let room: u64 = counts.iter().map(|&n| u64::from(n)).sum();
        if !placeable || room < u64::from(c.dp) || forced_gpus > u64::from(c.dp) {
            // Too few GPUs with room, or a doomed class out of reach.
        } else if self.limits.splits == u64::MAX
            || splits(
                &counts[forced..],
                c.dp - forced_gpus as u32,
                self.limits.splits,
            ) <= self.limits.splits
        {
            split.clear();
            self.compose(pos, idx, c, (&fit, forced), &mut split, c.dp);
        } else {
            self.complete = false;
            let emptiest = fill(&self.classes, &fit, c.dp);
            let mut tight = fit.clone();
            tight[forced..].sort_by_key(|&k| {
                (
                    self.classes[k].free_units,
                    std::cmp::Reverse(self.classes[k].mask.count_ones()),
                    self.classes[k].mask,
                )
            });
            let fullest =
                fill(&self.classes, &tight, c.dp).filter(|f| Some(f) != emptiest.as_ref());
            for split in [emptiest, fullest].into_iter().flatten() {
                self.descend(pos, idx, c, &split);
            }
        }
        self.buffers[pos] = (fit, counts, split);
    }

    /// Whether the modules of `class` already run at `best` or slower by the bound once
    /// position `pos` is placed ([`Class::delta_bound`] with the positions after it).
    fn doomed(&self, class: &Class, pos: usize) -> bool {
        let delta = class.delta_bound(&self.inter, &self.room_after[pos], self.best);
        class.slowest_ms * (1.0 + delta) >= self.best
    }

    /// Whether GPUs of `class`, as they are once position `pos` is placed, leave the positions
    /// after it no completion ([`Search::lost`]).
    fn lost_after(&self, class: &Class, pos: usize) -> bool {
        self.lost(class, pos + 1, LOOKAHEAD)
    }

    /// Whether GPUs of `class`, reaching position `p` as they are, are lost: position `p` must
    /// join them — the bound times their modules at `best` or slower unless it does
    /// ([`Search::doomed`]), or they are lost at the position after it as they are — and none
    /// of its candidates faster than `best` is admitted there. Looks `depth` positions ahead.
    fn lost(&self, class: &Class, p: usize, depth: usize) -> bool {
        if p == self.order.len() || depth == 0 {
            return false;
        }
        if !(self.doomed(class, p) || self.lost(class, p + 1, depth - 1)) {
            return false;
        }
        let cutoff = self.cutoff(self.best, self.room_after[p]);
        let cands = &self.problem.cands[self.order[p]];
        let below = cands.count_below(self.best);
        !cands.list[..below]
            .iter()
            .any(|c| admits(class, c, p, &cutoff))
    }

    /// Enumerates how many replicas go to each class of `fit[split.len()..]`, `left` still to
    /// place, then descends; each of the first `forced` classes of `fit` takes one on every
    /// GPU.
    fn compose(
        &mut self,
        pos: usize,
        idx: usize,
        c: &Candidate,
        (fit, forced): (&[usize], usize),
        split: &mut Vec<(usize, u32)>,
        left: u32,
    ) {
        if left == 0 {
            self.descend(pos, idx, c, split);
            return;
        }
        let k = split.len();
        if k == fit.len() || self.stopped {
            return;
        }
        let room_after: u64 = fit[k + 1..]
            .iter()
            .map(|&j| self.classes[j].count as u64)
            .sum();
        let count = self.classes[fit[k]].count;
        let hi = left.min(count);
        let lo = if k < forced {
            count
        } else {
            (left as u64).saturating_sub(room_after) as u32
        };
        for n in (lo..=hi).rev() {
            split.push((fit[k], n));
            self.compose(pos, idx, c, (fit, forced), split, left - n);
            split.pop();
        }
    }

    /// Places the replicas as `split` says (class index, replicas), bounds, recurses, undoes.
    fn descend(&mut self, pos: usize, idx: usize, c: &Candidate, split: &[(usize, u32)]) {
        if self.out_of_limits() {
            return;
        }
        // `apply` rewrites the classes of `split` and appends new ones: keep the old ones on
        // the undo stack, and the length, rather than copying the pool.
        let len = self.classes.len();
        let undo = self.undo.len();
        for &(k, n) in split {
            if n > 0 {
                self.undo.push((k, self.classes[k]));
            }
        }
        self.place(pos, idx, c, split);
        let floor = self.bound(pos);
        if floor < self.best {
            self.dfs(pos + 1, floor);
        }
        self.chosen.pop();
        self.free_units_total += c.area as u64;
        self.free_mem_total += c.dp as f64 * c.mem_gib;
        self.classes.truncate(len);
        for (k, old) in self.undo.drain(undo..) {
            self.classes[k] = old;
        }
    }

    /// Picks candidate `idx` (`c`) for position `pos`, its replicas placed as `split` says
    /// (class index, replicas), and takes what it uses from the pool's totals.
    fn place(&mut self, pos: usize, idx: usize, c: &Candidate, split: &[(usize, u32)]) {
        self.chosen.push(&mut self.classes, split, pos, idx, c);
        self.free_units_total -= c.area as u64;
        self.free_mem_total -= c.dp as f64 * c.mem_gib;
    }

    /// A lower bound on the stage time of any completion of the first `pos + 1` placements.
    ///
    /// Per GPU shared by two or more placed modules, Δ_g is at least e1 + e2·ΣB (later modules
    /// only add to ΣB; the product term is non-negative) and exactly Eq. 8 once the GPU is
    /// *closed*: no later module has a candidate small enough to join it.
    fn bound(&self, pos: usize) -> f64 {
        let after = &self.room_after[pos];
        self.slowest(&self.classes, &self.chosen, |c| {
            c.delta_bound(&self.inter, after, self.best)
        })
    }

    /// Writes a solution out on numbered GPUs: each pick takes the lowest-numbered GPUs of the
    /// classes it chose.
    fn finish(&self, set: ModuleSet, sol: &Solution) -> StageAlloc {
        let g = self.problem.gpus as usize;
        let mut hosted = vec![0u64; g];
        let mut placed: Vec<(usize, usize, Vec<u32>)> = Vec::with_capacity(sol.picks.len());
        for (pos, idx, range) in &sol.picks {
            let mut gpus = Vec::with_capacity(self.cand(*pos, *idx).dp as usize);
            for &(mask, n) in &sol.parts[range.clone()] {
                let before = gpus.len();
                for (x, h) in hosted.iter_mut().enumerate() {
                    if gpus.len() - before == n as usize {
                        break;
                    }
                    if *h == mask {
                        *h |= 1 << pos;
                        gpus.push(x as u32);
                    }
                }
            }
            gpus.sort_unstable();
            placed.push((*pos, *idx, gpus));
        }
        // Eq. 8 per GPU, from what it finally hosts.
        let mut bws: Vec<Vec<f64>> = vec![Vec::new(); g];
        for (pos, idx, gpus) in &placed {
            for &x in gpus {
                bws[x as usize].push(self.cand(*pos, *idx).bw_util);
            }
        }
        let delta: Vec<f64> = bws.into_iter().map(|b| self.inter.delta(b)).collect();
        let mut placements: Vec<Placement> = placed
            .into_iter()
            .map(|(pos, idx, gpus)| {
                let worst = gpus.iter().map(|&x| delta[x as usize]).fold(0.0, f64::max);
                let choice = *self.cand(pos, idx);
                Placement {
                    module: self.order[pos],
                    choice,
                    gpus,
                    time_ms: choice.time_ms * (1.0 + worst),
                }
            })
            .collect();
        placements.sort_by_key(|p| p.module);
        StageAlloc {
            set,
            time_ms: placements.iter().map(|p| p.time_ms).fold(0.0, f64::max),
            placements,
        }
    }
}

/// What a placement must keep to be worth searching.
struct Cutoff<'a> {
    /// Eq. 8's coefficients.
    inter: &'a Interference,
    /// The time every module must stay strictly below.
    best: f64,
    /// What the positions still to place after it need to join a GPU.
    room: Room,
}

/// Whether a GPU of `class` has room for one replica of `c` (at search position `pos`) and
/// every module it would then host still runs faster than the cutoff, by Δ as the bound
/// counts it: a split onto a class that does not admit it is one the bound cuts off once
/// placed. The same sums, in the same order, as [`apply`] and [`Search::bound`].
fn admits(class: &Class, c: &Candidate, pos: usize, cutoff: &Cutoff) -> bool {
    let room = class.free_units >= c.units && class.free_mem + MEM_EPS >= c.mem_gib;
    room && {
        let new = class.hosting(pos, c, 0);
        let delta = new.delta_bound(cutoff.inter, &cutoff.room, cutoff.best);
        new.slowest_ms * (1.0 + delta) < cutoff.best
    }
}

/// The classes that admit a replica of `c` at position `pos` ([`admits`]), emptiest first
/// (fewest hosted modules, then most free quota): less interference, so good incumbents come
/// early.
fn eligible(classes: &[Class], c: &Candidate, pos: usize, cutoff: &Cutoff) -> Vec<usize> {
    let mut fit = Vec::new();
    eligible_into(classes, c, pos, cutoff, &mut fit);
    fit
}

/// [`eligible`], written into `fit`.
fn eligible_into(
    classes: &[Class],
    c: &Candidate,
    pos: usize,
    cutoff: &Cutoff,
    fit: &mut Vec<usize>,
) {
    fit.clear();
    fit.extend((0..classes.len()).filter(|&k| admits(&classes[k], c, pos, cutoff)));
    fit.sort_by_key(|&k| {
        (
            classes[k].mask.count_ones(),
            std::cmp::Reverse(classes[k].free_units),
            classes[k].mask,
        )
    });
}

/// Takes `dp` replicas from the classes `order` in that order, as many as each holds; `None`
/// when they hold too few GPUs.
fn fill(classes: &[Class], order: &[usize], dp: u32) -> Option<Vec<(usize, u32)>> {
    let mut left = dp;
    let mut split = Vec::new();
    for &k in order {
        if left == 0 {
            break;
        }
        let n = left.min(classes[k].count);
        split.push((k, n));
        left -= n;
    }
    (left == 0).then_some(split)
}

/// Puts `n` replicas of `c` (position `pos`) on class `k` for each `(k, n)` of `split`: the
/// class gives up `n` GPUs to a new class that also hosts `pos`. Appends the split to `parts`
/// as (hosted set before, replicas), for [`Search::finish`].
fn apply(
    classes: &mut Vec<Class>,
    split: &[(usize, u32)],
    pos: usize,
    c: &Candidate,
    parts: &mut Vec<(u64, u32)>,
) {
    for &(k, n) in split {
        if n == 0 {
            continue;
        }
        let old = classes[k];
        parts.push((old.mask, n));
        let new = old.hosting(pos, c, n);
        if n == old.count {
            classes[k] = new;
        } else {
            classes[k].count -= n;
            classes.push(new);
        }
    }
}

/// The number of ways to put `dp` replicas on classes of the given sizes (at most one per
/// GPU), or `cap + 1` once it exceeds `cap`.
fn splits(counts: &[u32], dp: u32, cap: u64) -> u64 {
    if counts.len() <= 1 {
        return 1;
    }
    let dp = dp as usize;
    // ways[s]: splits of s replicas over the classes seen so far (saturating at cap + 1).
    let limit = cap.saturating_add(1);
    let mut ways = vec![0u64; dp + 1];
    ways[0] = 1;
    let mut prefix = vec![0u64; dp + 2];
    for &n in counts {
        let n = n as usize;
        for s in 0..=dp {
            prefix[s + 1] = prefix[s].saturating_add(ways[s]);
        }
        for s in 0..=dp {
            let lo = s.saturating_sub(n);
            ways[s] = (prefix[s + 1] - prefix[lo]).min(limit);
        }
        if ways[dp] >= limit {
            return limit;
        }
    }
    ways[dp]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_counts_bounded_compositions() {
        // Two classes of 3 GPUs, 4 replicas: (1,3), (2,2), (3,1).
        assert_eq!(splits(&[3, 3], 4, 100), 3);
        // Three classes of 2, 2 replicas: C(2+2, 2) minus the three with 3+ in a class... = 6.
        assert_eq!(splits(&[2, 2, 2], 2, 100), 6);
        assert_eq!(splits(&[1000, 1000, 1000], 500, 64), 65);
        assert_eq!(splits(&[7], 3, 0), 1);
    }
}
