//! A microbatch-level simulator of the non-interleaved 1F1B pipeline schedule (PipeDream-Flush,
//! Megatron-LM's default; the schedule of DistTrain §6.2, Fig. 12).
//!
//! The model: `p` stages, `m` microbatches, `fwd[s][k]`/`bwd[s][k]` the forward/backward time
//! of microbatch `k` on stage `s`. Stage `s` runs a fixed operation order: `w = min(p − s − 1,
//! m)` warm-up forwards, then alternates one forward and one backward (`F(w), B(0), F(w+1),
//! B(1), …`), then the remaining `w` cool-down backwards. An operation starts when its stage
//! has finished the previous operation in that order and its inputs exist: `F(s, k)` after
//! `F(s − 1, k)`, `B(s, k)` after `B(s + 1, k)` and `F(s, k)`. Communication is free, stages
//! never overlap their own operations, and there is no memory limit beyond what the order
//! implies. Interleaved 1F1B (virtual pipeline stages) is not modelled.

/// The simulated timeline of one 1F1B iteration: operation start and end times per
/// `[stage][microbatch]`, the makespan and the idle share.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// Start time of `F(s, k)`.
    pub fwd_start: Vec<Vec<f64>>,
    /// End time of `F(s, k)`.
    pub fwd_end: Vec<Vec<f64>>,
    /// Start time of `B(s, k)`.
    pub bwd_start: Vec<Vec<f64>>,
    /// End time of `B(s, k)`.
    pub bwd_end: Vec<Vec<f64>>,
    /// Iteration time: the end of the last operation on any stage (0 when there is none).
    pub makespan: f64,
    /// `1 − Σ busy / (p × makespan)`: the share of stage time spent idle (0 when the
    /// makespan is 0).
    pub bubble_fraction: f64,
}

#[derive(Clone, Copy)]
enum Op {
    F(usize),
    B(usize),
}

/// The operation order of stage `s` of `p` under non-interleaved 1F1B with `m` microbatches.
fn stage_order(s: usize, p: usize, m: usize) -> Vec<Op> {
    let warm = (p - s - 1).min(m);
    let mut ops: Vec<Op> = (0..warm).map(Op::F).collect();
    for k in 0..m - warm {
        ops.push(Op::F(warm + k));
        ops.push(Op::B(k));
    }
    ops.extend((m - warm..m).map(Op::B));
    ops
}

/// Simulates one iteration of non-interleaved 1F1B (see the module docs) with forward times
/// `fwd[s][k]` and backward times `bwd[s][k]` of microbatch `k` on stage `s`.
///
/// # Panics
/// If `fwd` and `bwd` differ in shape or their rows differ in length.
pub fn one_f_one_b(fwd: &[Vec<f64>], bwd: &[Vec<f64>]) -> Schedule {
    let p = fwd.len();
    assert_eq!(p, bwd.len(), "fwd and bwd have different stage counts");
    let m = fwd.first().map_or(0, Vec::len);
    assert!(
        fwd.iter().chain(bwd).all(|row| row.len() == m),
        "every stage needs the same number of microbatches"
    );
    let nan = vec![vec![f64::NAN; m]; p];
    let (mut fwd_start, mut fwd_end) = (nan.clone(), nan.clone());
    let (mut bwd_start, mut bwd_end) = (nan.clone(), nan);
    let orders: Vec<Vec<Op>> = (0..p).map(|s| stage_order(s, p, m)).collect();
    let mut next = vec![0usize; p];
    let mut free = vec![0.0_f64; p];
    let mut remaining = 2 * p * m;
    while remaining > 0 {
        let before = remaining;
        for s in 0..p {
            // Run stage s as far as its inputs allow.
            while let Some(&op) = orders[s].get(next[s]) {
                let ready = match op {
                    Op::F(_) if s == 0 => Some(0.0),
                    Op::F(k) => Some(fwd_end[s - 1][k]).filter(|t: &f64| !t.is_nan()),
                    Op::B(k) if s + 1 == p => Some(fwd_end[s][k]),
                    Op::B(k) => Some(bwd_end[s + 1][k]).filter(|t: &f64| !t.is_nan()),
                };
                let Some(ready) = ready else { break };
                let start = ready.max(free[s]);
                free[s] = match op {
                    Op::F(k) => {
                        fwd_start[s][k] = start;
                        fwd_end[s][k] = start + fwd[s][k];
                        fwd_end[s][k]
                    }
                    Op::B(k) => {
                        // F(s, k) precedes B(s, k) in every stage's order, so it is done.
                        bwd_start[s][k] = start.max(fwd_end[s][k]);
                        bwd_end[s][k] = bwd_start[s][k] + bwd[s][k];
                        bwd_end[s][k]
                    }
                };
                next[s] += 1;
                remaining -= 1;
            }
        }
        assert!(remaining < before, "1F1B order deadlocked"); // cannot happen: see tests
    }
    let makespan = free.iter().copied().fold(0.0, f64::max);
    let busy: f64 = fwd.iter().chain(bwd).flatten().sum();
    let bubble_fraction = if makespan > 0.0 {
        (1.0 - busy / (p as f64 * makespan)).max(0.0) // rounding can dip below 0
    } else {
        0.0
    };
    Schedule {
        fwd_start,
        fwd_end,
        bwd_start,
        bwd_end,
        makespan,
        bubble_fraction,
    }
}
