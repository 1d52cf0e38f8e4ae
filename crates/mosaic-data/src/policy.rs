//! Three policies that turn one global batch of samples into per-DP-rank microbatches, and a
//! DP × PP evaluation of the result on the [`crate::pipeline`] 1F1B simulator.
//!
//! - [`Policy::Random`]: shuffle, then deal round robin into `d × m` equal-count microbatches.
//! - [`Policy::DistTrain`]: DistTrain §6: intra-microbatch reordering (§6.1) balances each
//!   microbatch slot over the DP ranks, inter-microbatch reordering (§6.2, Algorithm 3, see
//!   [`inter_reorder`]) orders each rank's microbatches against 1F1B bubbles. Each slot's
//!   groups are handed heaviest first to the ranks carrying the least so far (greedy
//!   partitioning alone would give rank 0 every slot's largest sample); the paper balances
//!   one microbatch at a time and does not say how groups map to ranks.
//!   [`Policy::DistTrainIntra`] skips Algorithm 3.
//! - [`Policy::FlowTrain`]: FlowTrain §3.4: best-fit packing ([`crate::pack`]) and zig-zag
//!   dispatch ([`crate::zigzag`]) over the DP ranks (one cost bucket).

use crate::packing::{cost, pack, zigzag, PackError};
use crate::partition::{greedy_partition, loads};
use crate::pipeline::one_f_one_b;
use mosaic_kit::rng::SplitMix64;

/// A way of forming and placing microbatches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Shuffled samples dealt round robin into `d × m` equal-count microbatches, `m` per rank.
    Random,
    /// DistTrain's intra- (§6.1) and inter-microbatch (§6.2) reordering.
    DistTrain,
    /// DistTrain's intra-microbatch reordering alone (§6.1), microbatches in slot order: the
    /// ablation that shows what Algorithm 3 adds.
    DistTrainIntra,
    /// FlowTrain's best-fit packing and zig-zag dispatch (§3.4).
    FlowTrain,
}

/// The cost model and knobs shared by the policies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// Quadratic (attention) coefficient of [`cost`], in ms per token².
    pub alpha: f64,
    /// Linear (MLP) coefficient of [`cost`], in ms per token.
    pub beta: f64,
    /// Shuffle seed of [`Policy::Random`] and of [`Policy::DistTrain`]'s slot split.
    pub seed: u64,
    /// Token capacity of [`Policy::FlowTrain`]'s microbatches; `None` picks the smallest
    /// capacity at which packing yields at most `d × m` microbatches (see [`auto_capacity`]).
    pub capacity: Option<u32>,
}

/// How one policy fared on one global batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Report {
    /// Iteration time: the slowest DP rank's 1F1B makespan (same unit as the costs).
    pub iteration_ms: f64,
    /// Mean over DP ranks of each rank's own 1F1B bubble fraction (pipeline idleness only;
    /// waiting for slower DP ranks is in `dp_imbalance`).
    pub bubble_fraction: f64,
    /// `max rank time / mean rank time − 1` over the DP ranks' makespans.
    pub dp_imbalance: f64,
}

/// The smallest capacity (≥ the longest sample) at which [`pack`] yields at most `target`
/// microbatches, by bisection between `max(longest, ⌈S/target⌉)` and `max(longest,
/// ⌈2S/target⌉)` for `S` total tokens: best fit never leaves two microbatches at most half
/// full, so it needs at most `⌈2S/C⌉` microbatches (see the packing property test) and the
/// upper end always fits. Best-fit counts are not strictly monotone in the capacity, so this
/// is the smallest found by bisection, not necessarily the smallest overall; it always meets
/// the target.
///
/// # Errors
/// If that capacity exceeds [`crate::packing::MAX_CAPACITY`].
pub fn auto_capacity(sizes: &[u32], target: usize) -> Result<u32, PackError> {
    let target = target.max(1) as u64;
    let total: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
    let longest = u64::from(sizes.iter().copied().max().unwrap_or(1).max(1));
    let lo = total.div_ceil(target).max(longest);
    let hi = (2 * total).div_ceil(target).max(longest);
    let max_cap = crate::packing::MAX_CAPACITY;
    let too_large = |c: u64| PackError::CapacityTooLarge {
        capacity: u32::try_from(c).unwrap_or(u32::MAX),
    };
    if hi > u64::from(max_cap) {
        return Err(too_large(hi));
    }
    let (mut lo, mut hi) = (lo as u32, hi as u32);
    let fits = |c: u32| pack(sizes, c).map(|b| b.len() as u64 <= target);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if fits(mid)? {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Ok(hi)
}

/// The cost of each microbatch of sample indices.
fn microbatch_costs(sizes: &[u32], microbatches: &[Vec<usize>], params: &Params) -> Vec<f64> {
    microbatches
        .iter()
        .map(|mb| cost(mb.iter().map(|&i| sizes[i]), params.alpha, params.beta))
        .collect()
}

/// Per-stage forward and backward times of microbatches of `costs` on `pp` stages: layers split
/// equally, so each stage takes `cost / pp` forward and twice that backward.
fn stage_times(costs: &[f64], pp: usize) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
    let fwd: Vec<f64> = costs.iter().map(|c| c / pp as f64).collect();
    let bwd: Vec<f64> = fwd.iter().map(|f| 2.0 * f).collect();
    (vec![fwd; pp], vec![bwd; pp])
}

/// DistTrain's inter-microbatch reordering (§6.2, Algorithm 3) of microbatches with stage
/// times `fwd[s][k]`/`bwd[s][k]` for non-interleaved 1F1B; returns the new order (a
/// permutation of `0..m`). A microbatch's *size* is its total time `Σ_s fwd + bwd`.
///
/// As implemented (the printed pseudo-code runs its loop `l − p` times but fills `p − 1`
/// positions in its first pass, which would place `l + p − 2` microbatches; this follows the
/// text instead and fills until none is left):
/// 1. the smallest microbatch goes first, to start every stage early (line 3);
/// 2. the `p − 1` smallest of the rest are set aside for the end (lines 4, 12), appended
///    largest first so that the very last one is the smallest (the order is not specified);
/// 3. while microbatches remain (lines 5–11), interval `i` at stage 0 is computed by
///    simulating the placed prefix with the unplaced positions at zero time
///    ([`one_f_one_b`], the paper's dependency recursion, O(m·p) per call here rather than
///    its incremental O(p)): interval 1 is the gap between `F(0, 1)` and `B(0, 1)`, interval
///    `i > 1` the gap between `B(0, i − 1)` and `B(0, i)`. Interval 1 is filled by the
///    `min(p − 1, left)` microbatches whose stage-0 forwards sum closest to it, every later
///    interval by the one microbatch whose stage-0 forward is closest. *SELECTCLOSEST* with
///    several microbatches is a subset-sum problem the paper solves in O(l); this picks them
///    greedily, each the closest to the remaining gap divided by the picks left.
///
/// # Panics
/// If the shapes differ, as [`one_f_one_b`].
pub fn inter_reorder(fwd: &[Vec<f64>], bwd: &[Vec<f64>]) -> Vec<usize> {
    let p = fwd.len();
    let m = fwd.first().map_or(0, Vec::len);
    if m == 0 {
        return Vec::new();
    }
    let size = |k: usize| -> f64 { (0..p).map(|s| fwd[s][k] + bwd[s][k]).sum() };
    let by_size = |a: &usize, b: &usize| size(*a).total_cmp(&size(*b)).then(a.cmp(b));
    let mut pending: Vec<usize> = (0..m).collect();
    pending.sort_by(by_size);
    let mut order = vec![pending.remove(0)];
    let rear_len = p.saturating_sub(1).min(pending.len());
    let mut rear: Vec<usize> = pending.drain(..rear_len).collect();
    rear.reverse();

    let mut interval = 1;
    while !pending.is_empty() {
        // Stage times with the placed prefix in order, the rest of the positions at zero.
        let zeros = || vec![vec![0.0; m]; p];
        let (mut f, mut b) = (zeros(), zeros());
        for (pos, &k) in order.iter().enumerate() {
            for s in 0..p {
                f[s][pos] = fwd[s][k];
                b[s][pos] = bwd[s][k];
            }
        }
        let sched = one_f_one_b(&f, &b);
        let (picks, volume) = if interval == 1 {
            let gap = sched.bwd_start[0][0] - sched.fwd_end[0][0];
            (p.saturating_sub(1).max(1).min(pending.len()), gap)
        } else {
            let gap = sched.bwd_start[0][interval - 1] - sched.bwd_end[0][interval - 2];
            (1, gap)
        };
        let mut filled = 0.0;
        for left in (1..=picks).rev() {
            let want = (volume - filled) / left as f64;
            let j = (0..pending.len())
                .min_by(|&x, &y| {
                    let dx = (fwd[0][pending[x]] - want).abs();
                    let dy = (fwd[0][pending[y]] - want).abs();
                    dx.total_cmp(&dy).then(x.cmp(&y))
                })
                .expect("picks ≤ pending");
            let k = pending.remove(j);
            filled += fwd[0][k];
            order.push(k);
        }
        interval += 1;
    }
    order.extend(rear);
    order
}

/// The parallel layout a batch is scheduled on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Data-parallel ranks.
    pub dp: usize,
    /// Pipeline stages per rank.
    pub pp: usize,
    /// Microbatches per rank (FlowTrain: a target; packing decides).
    pub microbatches: usize,
}

/// Each DP rank's microbatches (lists of sample indices, in execution order) under `policy`
/// for a global batch of per-sample token counts `sizes`, `dp` ranks, `microbatches` per rank
/// (FlowTrain: as many as packing yields, dealt by zig-zag) and `pp` pipeline stages (used by
/// DistTrain's Algorithm 3). Every sample appears exactly once.
///
/// # Errors
/// FlowTrain's packing errors (a sample longer than the capacity, a bad capacity).
///
/// # Panics
/// If `dp`, `pp` or `microbatches` is 0.
pub fn assign(
    policy: Policy,
    sizes: &[u32],
    layout: Layout,
    params: &Params,
) -> Result<Vec<Vec<Vec<usize>>>, PackError> {
    let Layout {
        dp,
        pp,
        microbatches,
    } = layout;
    assert!(
        dp > 0 && pp > 0 && microbatches > 0,
        "dp, pp and microbatches must be positive"
    );
    let sample_costs: Vec<f64> = sizes
        .iter()
        .map(|&s| cost([s], params.alpha, params.beta))
        .collect();
    let shuffled = || {
        let mut order: Vec<usize> = (0..sizes.len()).collect();
        SplitMix64::new(params.seed).shuffle(&mut order);
        order
    };
    Ok(match policy {
        Policy::Random => {
            let slots = dp * microbatches;
            let mut mbs = vec![Vec::new(); slots];
            for (pos, i) in shuffled().into_iter().enumerate() {
                mbs[pos % slots].push(i);
            }
            // Microbatch j goes to rank j mod dp, so every rank gets `microbatches` of them.
            let mut ranks = vec![Vec::new(); dp];
            for (j, mb) in mbs.into_iter().enumerate() {
                ranks[j % dp].push(mb);
            }
            ranks
        }
        Policy::DistTrain | Policy::DistTrainIntra => {
            // §6.1: split the batch into `microbatches` slots of equal count, then balance each
            // slot's samples over the DP ranks by greedy number partitioning.
            let mut slots = vec![Vec::new(); microbatches];
            for (pos, i) in shuffled().into_iter().enumerate() {
                slots[pos % microbatches].push(i);
            }
            // Greedy partitioning puts the largest sample of every slot in group 0, so the
            // slot's groups go heaviest first to the ranks with the least load so far.
            let mut ranks = vec![Vec::new(); dp];
            let mut load = vec![0.0_f64; dp];
            for slot in slots {
                let costs: Vec<f64> = slot.iter().map(|&i| sample_costs[i]).collect();
                let groups = greedy_partition(&costs, dp);
                let group_cost = loads(&costs, &groups);
                let mut by_cost: Vec<usize> = (0..dp).collect();
                by_cost.sort_by(|&a, &b| group_cost[b].total_cmp(&group_cost[a]).then(a.cmp(&b)));
                let mut by_load: Vec<usize> = (0..dp).collect();
                by_load.sort_by(|&a, &b| load[a].total_cmp(&load[b]).then(a.cmp(&b)));
                for (g, r) in by_cost.into_iter().zip(by_load) {
                    load[r] += group_cost[g];
                    ranks[r].push(groups[g].iter().map(|&i| slot[i]).collect::<Vec<_>>());
                }
            }
            if policy == Policy::DistTrainIntra {
                return Ok(ranks);
            }
            // §6.2: reorder each rank's microbatches against 1F1B bubbles.
            for mbs in &mut ranks {
                let (fwd, bwd) = stage_times(&microbatch_costs(sizes, mbs, params), pp);
                let order = inter_reorder(&fwd, &bwd);
                *mbs = order
                    .into_iter()
                    .map(|k| std::mem::take(&mut mbs[k]))
                    .collect();
            }
            ranks
        }
        Policy::FlowTrain => {
            let capacity = match params.capacity {
                Some(c) => c,
                None => auto_capacity(sizes, dp * microbatches)?,
            };
            let packed = pack(sizes, capacity)?;
            let costs = microbatch_costs(sizes, &packed, params);
            zigzag(&costs, dp)
                .into_iter()
                .map(|rank| rank.into_iter().map(|k| packed[k].clone()).collect())
                .collect()
        }
    })
}

/// Simulates one training iteration of `policy` on the global batch `sizes`: every DP rank
/// runs its microbatches through [`one_f_one_b`] on `pp` stages, stage times `cost / pp`
/// forward and `2 · cost / pp` backward ([`cost`] with `params.alpha`, `params.beta`; layers
/// split equally over stages, backward twice forward), ranks independent (no gradient
/// synchronisation time). The iteration ends with the slowest rank.
///
/// # Errors
/// As [`assign`].
///
/// # Panics
/// As [`assign`].
pub fn evaluate(
    policy: Policy,
    sizes: &[u32],
    layout: Layout,
    params: &Params,
) -> Result<Report, PackError> {
    let Layout { dp, pp, .. } = layout;
    let ranks = assign(policy, sizes, layout, params)?;
    let schedules: Vec<_> = ranks
        .iter()
        .map(|mbs| {
            let (fwd, bwd) = stage_times(&microbatch_costs(sizes, mbs, params), pp);
            one_f_one_b(&fwd, &bwd)
        })
        .collect();
    let times: Vec<f64> = schedules.iter().map(|s| s.makespan).collect();
    let iteration_ms = times.iter().copied().fold(0.0, f64::max);
    let mean = times.iter().sum::<f64>() / dp as f64;
    let dp_imbalance = if mean > 0.0 {
        iteration_ms / mean - 1.0
    } else {
        0.0
    };
    let bubble_fraction = schedules.iter().map(|s| s.bubble_fraction).sum::<f64>() / dp as f64;
    Ok(Report {
        iteration_ms,
        bubble_fraction,
        dp_imbalance,
    })
}
