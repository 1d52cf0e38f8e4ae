//! Three policies that turn one global batch of samples into per-DP-rank microbatches, and a
//! DP × PP evaluation of the result on the [`crate::pipeline`] simulator (1F1B, or
//! interleaved 1F1B when the layout has virtual pipeline stages).
//!
//! - [`Policy::Random`]: shuffle, then deal round robin into `d × m` equal-count microbatches.
//! - [`Policy::DistTrain`]: DistTrain §6: intra-microbatch reordering (§6.1) balances each
//!   microbatch slot over the DP ranks, inter-microbatch reordering (§6.2, Algorithm 3, see
//!   [`inter_reorder`], [`inter_reorder_vpp`] under VPP) orders each rank's microbatches
//!   against 1F1B bubbles. Each slot's
//!   groups are handed heaviest first to the ranks carrying the least so far (greedy
//!   partitioning alone would give rank 0 every slot's largest sample); the paper balances
//!   one microbatch at a time and does not say how groups map to ranks.
//!   [`Policy::DistTrainIntra`] skips Algorithm 3.
//! - [`Policy::FlowTrain`]: FlowTrain §3.4: best-fit packing ([`crate::pack`]) and bucketed
//!   zig-zag dispatch ([`crate::zigzag_buckets`], [`Params::buckets`] cost buckets) over the
//!   DP ranks.

use crate::packing::{cost, pack, zigzag_buckets, PackError};
use crate::partition::{greedy_partition, loads};
use crate::pipeline::{backward_op, check, interleaved, warmup, PipelineError, Schedule};
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
    /// FlowTrain's best-fit packing and zig-zag dispatch (§3.4), on plain 1F1B only (its
    /// ranks' microbatch counts are uneven; `vpp > 1` is [`DataError::FlowTrainInterleaved`]).
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
    /// [`Policy::FlowTrain`]'s cost buckets ([`crate::buckets`]; at least 1, 1 = a single
    /// zig-zag over all microbatches); [`Params::new`] sets [`DEFAULT_BUCKETS`].
    pub buckets: usize,
}

/// FlowTrain's default number of cost buckets. The paper gives no count; four bins split the
/// narrow cost range of packed microbatches into quarters, enough to group similar costs
/// while keeping each bucket at several microbatches per rank for zig-zag to pair.
pub const DEFAULT_BUCKETS: usize = 4;

impl Params {
    /// The cost coefficients and seed, with automatic capacity and [`DEFAULT_BUCKETS`].
    pub fn new(alpha: f64, beta: f64, seed: u64) -> Self {
        Params {
            alpha,
            beta,
            seed,
            capacity: None,
            buckets: DEFAULT_BUCKETS,
        }
    }
}

impl Default for Params {
    /// `alpha = 0`, `beta = 1` (a microbatch costs its token count), seed 0, automatic
    /// capacity, [`DEFAULT_BUCKETS`]: override the cost coefficients for real timings.
    fn default() -> Self {
        Params::new(0.0, 1.0, 0)
    }
}

/// The largest `dp × microbatches` [`assign`] accepts (it allocates per slot).
pub const MAX_SLOTS: usize = 1 << 20;
/// The largest `pp × vpp` (virtual stages per rank) [`evaluate`] accepts.
pub const MAX_VIRTUAL_STAGES: usize = 1 << 12;
/// The most pipeline operations one evaluation simulates, `dp × microbatches × pp × vpp`
/// (well under a second of simulation; DistTrain's Algorithm 3 re-simulates a rank's pipeline per
/// placed microbatch, so for it the count is multiplied by the microbatches per rank).
pub const MAX_OPERATIONS: usize = 1 << 22;

/// Why a policy or its evaluation refused its input.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DataError {
    /// FlowTrain's packing refused the sizes or the capacity.
    #[error(transparent)]
    Pack(#[from] PackError),
    /// The pipeline simulator or Algorithm 3 refused the stage times.
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    /// A layout count or [`Params::buckets`] is 0.
    #[error("{what} must be at least 1")]
    Zero {
        /// The count that is 0, by name (`"dp"`, `"params.buckets"`, …).
        what: &'static str,
    },
    /// A layout product above its documented limit.
    #[error("{what} is {value}, above the supported maximum {limit}")]
    TooLarge {
        /// The product, written as a formula of the layout counts (`"pp × vpp"`, …).
        what: &'static str,
        /// Its value (`usize::MAX` when it overflows).
        value: usize,
        /// The most it may be.
        limit: usize,
    },
    /// Interleaved 1F1B needs each rank's microbatch count to be a multiple of `pp`.
    #[error(
        "interleaved 1F1B (vpp {vpp}) needs every rank's microbatch count to be a multiple \
         of pp {pp}; each rank has {microbatches}"
    )]
    NotMultiple {
        /// The microbatches per rank.
        microbatches: usize,
        /// The pipeline stages per rank.
        pp: usize,
        /// The model chunks per stage.
        vpp: usize,
    },
    /// FlowTrain with virtual pipeline stages: its packing and bucketed zig-zag give ranks
    /// uneven microbatch counts, known only after packing, which interleaved 1F1B cannot run
    /// (it needs a multiple of `pp` on every rank), so FlowTrain runs on plain 1F1B only,
    /// whatever the batch.
    #[error(
        "FlowTrain runs on plain 1F1B only (vpp 1), not interleaved 1F1B (vpp {vpp}): its \
         packing gives the ranks uneven microbatch counts, and interleaved 1F1B needs every \
         rank's count to be a multiple of pp"
    )]
    FlowTrainInterleaved {
        /// The model chunks per stage asked for (more than 1).
        vpp: usize,
    },
    /// `alpha` or `beta` is negative or not finite.
    #[error("params.{name} is {value}; it must be finite and non-negative")]
    BadParam {
        /// The parameter: `"alpha"` or `"beta"`.
        name: &'static str,
        /// Its value.
        value: f64,
    },
    /// The stage weights do not list one weight per pipeline stage.
    #[error("{got} stage weights for {pp} pipeline stages")]
    WeightCount {
        /// The stage weights given.
        got: usize,
        /// The pipeline stages per rank.
        pp: usize,
    },
    /// A stage weight is negative or not finite.
    #[error("stage weight {stage} is {value}; weights must be finite and non-negative")]
    BadWeight {
        /// The stage, 0-based.
        stage: usize,
        /// Its weight.
        value: f64,
    },
    /// Every stage weight is 0.
    #[error("the stage weights sum to 0; at least one must be positive")]
    ZeroWeights,
    /// The stage weights are finite but their sum overflows.
    #[error("the stage weights sum to {sum}; the sum must be finite")]
    WeightSum {
        /// The sum, which overflowed to infinity.
        sum: f64,
    },
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

/// Per-stage forward and backward times of microbatches of `costs` on stages of `weights`:
/// stage `s` takes `cost · w_s / Σ w` forward and twice that backward (equal weights: `cost /
/// pp`, layers split equally).
fn stage_times(costs: &[f64], weights: &[f64]) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
    let total: f64 = weights.iter().sum();
    let fwd: Vec<Vec<f64>> = weights
        .iter()
        .map(|w| costs.iter().map(|c| c * w / total).collect())
        .collect();
    let bwd = fwd
        .iter()
        .map(|row| row.iter().map(|f| 2.0 * f).collect())
        .collect();
    (fwd, bwd)
}

/// DistTrain's inter-microbatch reordering (§6.2, Algorithm 3) of microbatches with stage
/// times `fwd[s][k]`/`bwd[s][k]` for non-interleaved 1F1B; returns the new order (a
/// permutation of `0..m`): [`inter_reorder_vpp`] with one chunk.
///
/// # Panics
/// If the shapes differ or a time is not finite and non-negative (see
/// [`inter_reorder_vpp`], which returns those as errors).
pub fn inter_reorder(fwd: &[Vec<f64>], bwd: &[Vec<f64>]) -> Vec<usize> {
    match inter_reorder_vpp(fwd, bwd, 1) {
        Ok(order) => order,
        Err(e) => panic!("inter_reorder: {e}"),
    }
}

/// DistTrain's inter-microbatch reordering (§6.2, Algorithm 3) for (interleaved) 1F1B with
/// `chunks` model chunks per stage ([`crate::interleaved`]); returns the new order of the
/// microbatches with stage times `fwd[s][k]`/`bwd[s][k]` (a permutation of `0..m`). A
/// microbatch's *size* is its total time `Σ_s fwd + bwd`.
///
/// Algorithm 3 with one chunk (the printed pseudo-code runs its loop `l − p` times but fills
/// `p − 1` positions in its first pass, which would place `l + p − 2` microbatches; this
/// follows the text instead and fills until none is left):
/// 1. the smallest microbatch goes first, to start every stage early (line 3);
/// 2. the `p − 1` smallest of the rest are set aside for the end (lines 4, 12), appended
///    largest first so that the very last one is the smallest (the order is not specified);
/// 3. the other positions are filled in order (lines 5–11). Interval 1 at stage 0 is the gap
///    between `F(0, 1)` and `B(0, 1)`, interval `i > 1` the gap between `B(0, i − 1)` and
///    `B(0, i)` (1-based), computed by simulating the placed prefix with the unplaced
///    positions at zero time ([`crate::interleaved`], the paper's dependency recursion, O(m·p)
///    per call here rather than its incremental O(p)). Interval 1 is filled by the
///    `min(p − 1, left)` microbatches whose stage-0 forwards sum closest to it, every later
///    interval by the one microbatch whose stage-0 forward is closest. *SELECTCLOSEST* with
///    several microbatches is a subset-sum problem the paper solves in O(l); this picks them
///    greedily, each the closest to the remaining gap divided by the picks left.
///
/// The VPP retrofit (DistTrain §6.2, last paragraph: "computing multiple (i.e., VPP size)
/// intervals and filling them with the corresponding number of forward passes from a single
/// microbatch"), as implemented: under Megatron-LM's interleaved order stage 0 runs each
/// microbatch's forward as `chunks` passes of `fwd[0][k] / chunks` (forward operations
/// `⌊j/p⌋·p·chunks + c·p + j mod p` for position `j`, chunk `c`). Interval 1 is the gap from
/// the first forward pass to the first backward pass at stage 0 (holding the warm-up
/// forwards), interval `t > 1` the gap between backward passes `t − 2` and `t − 1`, which the
/// steady state fills with one forward pass each. Each position, in order, computes the
/// `chunks` intervals its forward passes land in and takes the pending microbatch whose pass
/// time `fwd[0][k] / chunks` misses them least in sum (`Σ |pass − target|`), a pass in
/// interval 1 aiming at the interval's unfilled rest divided by its passes not yet placed
/// (the first microbatch's own passes there count as placed, the set-aside rear's are
/// ignored, as the one-chunk loop never sees them). Steps 1 and 2 are unchanged (the paper
/// does not change them). With one chunk this is exactly the algorithm above; with a single
/// stage (where no order changes the makespan) the first forward after `F(0)` counts toward
/// interval 1, as the one-chunk code always did.
///
/// # Errors
/// As [`crate::interleaved`]: shapes that differ, bad times, `chunks = 0`, or `chunks > 1`
/// with `m` not a multiple of `p`.
pub fn inter_reorder_vpp(
    fwd: &[Vec<f64>],
    bwd: &[Vec<f64>],
    chunks: usize,
) -> Result<Vec<usize>, PipelineError> {
    let (p, m) = check(fwd, bwd, chunks)?;
    if m == 0 {
        return Ok(Vec::new());
    }
    let size = |k: usize| -> f64 { (0..p).map(|s| fwd[s][k] + bwd[s][k]).sum() };
    let by_size = |a: &usize, b: &usize| size(*a).total_cmp(&size(*b)).then(a.cmp(b));
    let mut pending: Vec<usize> = (0..m).collect();
    pending.sort_by(by_size);
    let mut order = vec![pending.remove(0)];
    let rear_len = p.saturating_sub(1).min(pending.len());
    let mut rear: Vec<usize> = pending.drain(..rear_len).collect();
    rear.reverse();
    let fill_end = m - rear.len();

    // Stage times with the placed prefix in order, the rest of the positions at zero.
    let simulate = |order: &[usize]| -> Result<Schedule, PipelineError> {
        let zeros = || vec![vec![0.0; m]; p];
        let (mut f, mut b) = (zeros(), zeros());
        for (pos, &k) in order.iter().enumerate() {
            for s in 0..p {
                f[s][pos] = fwd[s][k];
                b[s][pos] = bwd[s][k];
            }
        }
        interleaved(&f, &b, chunks)
    };
    let share = chunks as f64;
    // Stage 0's forward operations of position j, and the (virtual stage, position) of its
    // backward operation t.
    let ops_of = |j: usize| (0..chunks).map(move |c| (j / p) * p * chunks + c * p + j % p);
    let back = |t: usize| {
        let (c, k) = backward_op(t, p, chunks);
        (c * p, k)
    };
    let warm = warmup(0, p, m, chunks).max(1);
    let in_first = |i: usize| (1..=warm).contains(&i);

    let sched = simulate(&order)?;
    let (v0, k0) = back(0);
    let gap1 = sched.bwd_start[v0][k0] - sched.fwd_end[0][0];
    let mut left1: usize = (1..fill_end)
        .map(|j| ops_of(j).filter(|&i| in_first(i)).count())
        .sum();
    let own = ops_of(0).filter(|&i| in_first(i)).count();
    let mut filled1 = own as f64 * (fwd[0][order[0]] / share);
    for j in 1..fill_end {
        let ops: Vec<usize> = ops_of(j).collect();
        let n1 = ops.iter().filter(|&&i| in_first(i)).count();
        let mut targets = vec![(gap1 - filled1) / left1.max(1) as f64; n1];
        let later: Vec<usize> = ops.into_iter().filter(|&i| i > warm).collect();
        if !later.is_empty() {
            let sched = simulate(&order)?;
            for i in later {
                // Forward operation i sits in interval t = i − warm + 1, between backward
                // operations t − 2 and t − 1.
                let t = i - warm + 1;
                let ((va, ka), (vb, kb)) = (back(t - 2), back(t - 1));
                targets.push(sched.bwd_start[vb][kb] - sched.bwd_end[va][ka]);
            }
        }
        let miss =
            |k: usize| -> f64 { targets.iter().map(|t| (fwd[0][k] / share - t).abs()).sum() };
        let Some(pick) = (0..pending.len()).min_by(|&x, &y| {
            miss(pending[x])
                .total_cmp(&miss(pending[y]))
                .then(x.cmp(&y))
        }) else {
            break; // cannot happen: fill_end − j microbatches are pending
        };
        let k = pending.remove(pick);
        filled1 += n1 as f64 * (fwd[0][k] / share);
        left1 = left1.saturating_sub(n1);
        order.push(k);
    }
    order.extend(pending); // empty, unless the loop stopped early
    order.extend(rear);
    Ok(order)
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
    /// Model chunks per pipeline stage (virtual pipeline stages): 1 runs non-interleaved
    /// 1F1B, more runs Megatron-LM's interleaved 1F1B ([`crate::interleaved`]), which needs
    /// each rank's microbatch count to be a multiple of `pp` ([`Policy::FlowTrain`]: 1 only).
    pub vpp: usize,
}

impl Layout {
    /// `dp` ranks of `pp` stages with `microbatches` each, non-interleaved (`vpp = 1`).
    pub fn new(dp: usize, pp: usize, microbatches: usize) -> Self {
        Layout {
            dp,
            pp,
            microbatches,
            vpp: 1,
        }
    }
}

/// Checks the layout, the cost parameters and the stage weights against their limits.
fn validate(
    policy: Policy,
    layout: Layout,
    params: &Params,
    weights: &[f64],
) -> Result<(), DataError> {
    let Layout {
        dp,
        pp,
        microbatches,
        vpp,
    } = layout;
    for (what, n) in [
        ("dp", dp),
        ("pp", pp),
        ("microbatches", microbatches),
        ("vpp", vpp),
        ("params.buckets", params.buckets),
    ] {
        if n == 0 {
            return Err(DataError::Zero { what });
        }
    }
    let limit = |what, value: Option<usize>, limit| match value {
        Some(v) if v <= limit => Ok(()),
        _ => Err(DataError::TooLarge {
            what,
            value: value.unwrap_or(usize::MAX),
            limit,
        }),
    };
    limit("dp × microbatches", dp.checked_mul(microbatches), MAX_SLOTS)?;
    limit("pp × vpp", pp.checked_mul(vpp), MAX_VIRTUAL_STAGES)?;
    let operations = (dp * microbatches).checked_mul(pp * vpp);
    if policy == Policy::DistTrain {
        let reordering = operations.and_then(|o| o.checked_mul(microbatches));
        limit(
            "dp × microbatches² × pp × vpp (DistTrain's Algorithm 3)",
            reordering,
            MAX_OPERATIONS,
        )?;
    }
    limit("dp × microbatches × pp × vpp", operations, MAX_OPERATIONS)?;
    if vpp > 1 && policy == Policy::FlowTrain {
        return Err(DataError::FlowTrainInterleaved { vpp });
    }
    if vpp > 1 && !microbatches.is_multiple_of(pp) {
        return Err(DataError::NotMultiple {
            microbatches,
            pp,
            vpp,
        });
    }
    for (name, value) in [("alpha", params.alpha), ("beta", params.beta)] {
        if !(value.is_finite() && value >= 0.0) {
            return Err(DataError::BadParam { name, value });
        }
    }
    if weights.len() != pp {
        return Err(DataError::WeightCount {
            got: weights.len(),
            pp,
        });
    }
    if let Some((stage, &value)) = weights
        .iter()
        .enumerate()
        .find(|(_, w)| !(w.is_finite() && **w >= 0.0))
    {
        return Err(DataError::BadWeight { stage, value });
    }
    let total: f64 = weights.iter().sum();
    if !(total > 0.0 && total.is_finite()) {
        return Err(if total > 0.0 {
            DataError::WeightSum { sum: total }
        } else {
            DataError::ZeroWeights
        });
    }
    Ok(())
}

/// Each DP rank's microbatches (lists of sample indices, in execution order) under `policy`
/// for a global batch of per-sample token counts `sizes`, `dp` ranks, `microbatches` per rank
/// (FlowTrain: as many as packing yields, dealt by bucketed zig-zag), `pp` pipeline stages and
/// `vpp` chunks per stage (used by DistTrain's Algorithm 3, [`inter_reorder_vpp`]), stages
/// splitting each microbatch's cost equally. Every sample appears exactly once.
///
/// # Errors
/// As [`assign_weighted`] with equal weights.
pub fn assign(
    policy: Policy,
    sizes: &[u32],
    layout: Layout,
    params: &Params,
) -> Result<Vec<Vec<Vec<usize>>>, DataError> {
    assign_weighted(policy, sizes, layout, params, &vec![1.0; layout.pp])
}

/// [`assign`] with stage `s` taking `stage_weights[s] / Σ weights` of each microbatch's cost
/// (what DistTrain's Algorithm 3 orders against).
///
/// # Errors
/// [`DataError`]: a zero `dp`, `pp`, `microbatches`, `vpp` or `params.buckets`; a layout
/// above [`MAX_SLOTS`] or [`MAX_VIRTUAL_STAGES`]; `vpp > 1` with `microbatches` no multiple
/// of `pp`, or with [`Policy::FlowTrain`] (whatever the batch: its per-rank counts are
/// uneven, known only after packing); a negative or
/// non-finite `alpha` or `beta`; stage weights of the wrong length, negative, non-finite or
/// all 0; FlowTrain's packing errors (a sample longer than the capacity, a bad capacity).
pub fn assign_weighted(
    policy: Policy,
    sizes: &[u32],
    layout: Layout,
    params: &Params,
    stage_weights: &[f64],
) -> Result<Vec<Vec<Vec<usize>>>, DataError> {
    validate(policy, layout, params, stage_weights)?;
    let Layout {
        dp,
        microbatches,
        vpp,
        ..
    } = layout;
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
                let costs = microbatch_costs(sizes, mbs, params);
                let (fwd, bwd) = stage_times(&costs, stage_weights);
                let order = inter_reorder_vpp(&fwd, &bwd, vpp)?;
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
            // Plain 1F1B only (`validate`), so any per-rank count runs.
            zigzag_buckets(&costs, dp, params.buckets)
                .into_iter()
                .map(|rank| rank.into_iter().map(|k| packed[k].clone()).collect())
                .collect()
        }
    })
}

/// Simulates one training iteration of `policy` on the global batch `sizes`: every DP rank
/// runs its microbatches through [`crate::interleaved`] on `pp` stages of `vpp` chunks each
/// (`vpp = 1`: [`crate::one_f_one_b`]), stage times `cost / pp` forward and `2 · cost / pp`
/// backward ([`cost`] with `params.alpha`, `params.beta`; layers split equally over stages,
/// backward twice forward), ranks independent (no gradient synchronisation time). The
/// iteration ends with the slowest rank. This is [`evaluate_weighted`] with equal weights.
///
/// # Errors
/// As [`assign_weighted`].
pub fn evaluate(
    policy: Policy,
    sizes: &[u32],
    layout: Layout,
    params: &Params,
) -> Result<Report, DataError> {
    evaluate_weighted(policy, sizes, layout, params, &vec![1.0; layout.pp])
}

/// [`evaluate`] with heterogeneous stages: stage `s` takes `stage_weights[s] / Σ weights` of
/// each microbatch's cost, forward and backward (e.g. an encoder stage lighter than the
/// backbone's). The weights also drive DistTrain's Algorithm 3.
///
/// # Errors
/// As [`assign_weighted`]: among them stage weights of the wrong length, negative,
/// non-finite or all 0.
pub fn evaluate_weighted(
    policy: Policy,
    sizes: &[u32],
    layout: Layout,
    params: &Params,
    stage_weights: &[f64],
) -> Result<Report, DataError> {
    let ranks = assign_weighted(policy, sizes, layout, params, stage_weights)?;
    let schedules = ranks
        .iter()
        .map(|mbs| {
            let costs = microbatch_costs(sizes, mbs, params);
            let (fwd, bwd) = stage_times(&costs, stage_weights);
            interleaved(&fwd, &bwd, layout.vpp)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let dp = layout.dp;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> Params {
        Params::new(1e-6, 1e-3, 1)
    }

    #[test]
    fn default_params_cost_tokens() {
        let d = Params::default();
        assert_eq!((d.alpha, d.beta, d.capacity), (0.0, 1.0, None));
        assert_eq!(d.buckets, DEFAULT_BUCKETS);
    }

    #[test]
    fn bad_layouts_are_errors() {
        let sizes = [10, 20, 30, 40];
        let run = |layout: Layout, p: &Params| evaluate(Policy::DistTrain, &sizes, layout, p);
        assert_eq!(
            run(Layout::new(0, 1, 1), &params()),
            Err(DataError::Zero { what: "dp" })
        );
        let vpp0 = Layout {
            vpp: 0,
            ..Layout::new(1, 2, 2)
        };
        assert_eq!(run(vpp0, &params()), Err(DataError::Zero { what: "vpp" }));
        let odd = Layout {
            vpp: 2,
            ..Layout::new(1, 2, 3)
        };
        assert!(matches!(
            run(odd, &params()),
            Err(DataError::NotMultiple {
                microbatches: 3,
                pp: 2,
                ..
            })
        ));
        assert!(matches!(
            run(Layout::new(usize::MAX, 1, 2), &params()),
            Err(DataError::TooLarge { .. })
        ));
        let nan = Params {
            alpha: f64::NAN,
            ..params()
        };
        assert!(matches!(
            run(Layout::new(1, 1, 1), &nan),
            Err(DataError::BadParam { name: "alpha", .. })
        ));
        let no_buckets = Params {
            buckets: 0,
            ..params()
        };
        assert_eq!(
            run(Layout::new(1, 1, 1), &no_buckets),
            Err(DataError::Zero {
                what: "params.buckets"
            })
        );
    }

    /// FlowTrain under VPP is refused whatever the batch, also where packing happens to give
    /// every rank a multiple of `pp` (one stage: always), so the answer never hangs on a seed.
    #[test]
    fn flowtrain_runs_on_plain_1f1b_only() {
        let sizes: Vec<u32> = (1..=64).map(|i| 37 * i % 500 + 1).collect();
        for (dp, pp, m) in [(1, 1, 4), (2, 1, 3), (2, 2, 4), (8, 4, 8)] {
            let layout = Layout {
                vpp: 2,
                ..Layout::new(dp, pp, m)
            };
            for result in [
                evaluate(Policy::FlowTrain, &sizes, layout, &params()).map(|_| ()),
                assign(Policy::FlowTrain, &sizes, layout, &params()).map(|_| ()),
            ] {
                assert_eq!(result, Err(DataError::FlowTrainInterleaved { vpp: 2 }));
            }
            let plain = Layout::new(dp, pp, m);
            assert!(evaluate(Policy::FlowTrain, &sizes, plain, &params()).is_ok());
        }
        let msg = DataError::FlowTrainInterleaved { vpp: 2 }.to_string();
        assert!(
            msg.contains("plain 1F1B only") && msg.contains("vpp 2"),
            "{msg}"
        );
    }

    #[test]
    fn bad_weights_are_errors() {
        let sizes = [10, 20, 30, 40];
        let layout = Layout::new(2, 2, 2);
        let run = |w: &[f64]| evaluate_weighted(Policy::Random, &sizes, layout, &params(), w);
        assert_eq!(run(&[1.0]), Err(DataError::WeightCount { got: 1, pp: 2 }));
        assert!(matches!(
            run(&[1.0, -1.0]),
            Err(DataError::BadWeight { stage: 1, .. })
        ));
        assert!(matches!(
            run(&[f64::INFINITY, 1.0]),
            Err(DataError::BadWeight { stage: 0, .. })
        ));
        assert_eq!(run(&[0.0, 0.0]), Err(DataError::ZeroWeights));
        assert!(matches!(
            run(&[f64::MAX, f64::MAX]),
            Err(DataError::WeightSum { .. })
        ));
        // Equal weights of any scale are `evaluate`.
        let even = evaluate(Policy::Random, &sizes, layout, &params()).unwrap();
        assert_eq!(run(&[3.0, 3.0]).unwrap(), even);
    }

    #[test]
    fn a_light_stage_shortens_the_iteration() {
        // Two stages, the first (an encoder) a ninth of the second, equal microbatches.
        let sizes = vec![100; 8];
        let layout = Layout::new(1, 2, 4);
        let p = Params::new(0.0, 1.0, 1);
        let r = evaluate_weighted(Policy::Random, &sizes, layout, &p, &[1.0, 9.0]).unwrap();
        // Each microbatch costs 200: stage 0 takes 20 + 40, stage 1 180 + 360. The heavy stage
        // runs back to back after stage 0's first forward and before its last backward:
        // 20 + 4 · 540 + 40.
        assert!(
            (r.iteration_ms - (20.0 + 4.0 * 540.0 + 40.0)).abs() < 1e-9,
            "{r:?}"
        );
    }

    #[test]
    fn vpp_reorder_with_one_chunk_is_algorithm_3() {
        let fwd = vec![vec![3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]; 4];
        let bwd: Vec<Vec<f64>> = fwd
            .iter()
            .map(|r| r.iter().map(|f| 2.0 * f).collect())
            .collect();
        let order = inter_reorder_vpp(&fwd, &bwd, 1).unwrap();
        assert_eq!(order, inter_reorder(&fwd, &bwd));
        // The smallest first, the p − 1 next smallest last, smallest at the very end.
        assert_eq!(order[0], 1);
        assert_eq!(&order[5..], &[0, 6, 3]);
        let mut two = inter_reorder_vpp(&fwd, &bwd, 2).unwrap();
        assert_eq!(two[0], 1);
        two.sort_unstable();
        assert_eq!(two, (0..8).collect::<Vec<_>>());
    }
}
