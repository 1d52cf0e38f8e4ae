//! A microbatch-level simulator of 1F1B pipeline schedules: the non-interleaved one
//! (PipeDream-Flush, Megatron-LM's default; the schedule of DistTrain §6.2, Fig. 12) in
//! [`one_f_one_b`], and Megatron-LM's interleaved 1F1B with virtual pipeline stages (VPP) in
//! [`interleaved`].
//!
//! The model: `p` stages, `m` microbatches, `fwd[s][k]`/`bwd[s][k]` the forward/backward time
//! of microbatch `k` on stage `s`. Stage `s` runs a fixed operation order: `w = min(p − s − 1,
//! m)` warm-up forwards, then alternates one forward and one backward (`F(w), B(0), F(w+1),
//! B(1), …`), then the remaining `w` cool-down backwards. An operation starts when its stage
//! has finished the previous operation in that order and its inputs exist: `F(s, k)` after
//! `F(s − 1, k)`, `B(s, k)` after `B(s + 1, k)` and `F(s, k)`. Communication is free, stages
//! never overlap their own operations, and there is no memory limit beyond what the order
//! implies. [`interleaved`] generalises this to `chunks` model chunks per stage (see there).

/// The simulated timeline of one 1F1B iteration: operation start and end times per
/// `[virtual stage][microbatch]` (virtual stage `c·p + s` is model chunk `c` of stage `s`;
/// without interleaving, one chunk, it is the stage), the makespan and the idle share.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// Start time of `F(v, k)`.
    pub fwd_start: Vec<Vec<f64>>,
    /// End time of `F(v, k)`.
    pub fwd_end: Vec<Vec<f64>>,
    /// Start time of `B(v, k)`.
    pub bwd_start: Vec<Vec<f64>>,
    /// End time of `B(v, k)`.
    pub bwd_end: Vec<Vec<f64>>,
    /// Iteration time: the end of the last operation on any stage (0 when there is none).
    pub makespan: f64,
    /// `1 − Σ busy / (p × makespan)`: the share of stage time spent idle (0 when the
    /// makespan is 0).
    pub bubble_fraction: f64,
}

/// Simulates one iteration of non-interleaved 1F1B (see the module docs) with forward times
/// `fwd[s][k]` and backward times `bwd[s][k]` of microbatch `k` on stage `s`.
///
/// [`interleaved`] with one chunk, which returns its input errors instead of panicking.
///
/// # Panics
/// If `fwd` and `bwd` differ in shape or their rows differ in length, or a time is NaN.
pub fn one_f_one_b(fwd: &[Vec<f64>], bwd: &[Vec<f64>]) -> Schedule {
    interleaved(fwd, bwd, 1).unwrap_or_else(|e| panic!("one_f_one_b: {e}"))
}

/// Why [`interleaved`] (or [`crate::policy::inter_reorder_vpp`]) refused its input.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PipelineError {
    /// `fwd` and `bwd` list different numbers of stages.
    #[error("forward times have {fwd} stages but backward times have {bwd}")]
    StageCount {
        /// The stages in the forward times.
        fwd: usize,
        /// The stages in the backward times.
        bwd: usize,
    },
    /// A stage's row of times is not as long as stage 0's forward row.
    #[error("stage {stage} has {got} {pass} times, expected {expected} (one per microbatch)")]
    Ragged {
        /// The times the row holds: `"forward"` or `"backward"`.
        pass: &'static str,
        /// The stage, 0-based.
        stage: usize,
        /// The times in its row.
        got: usize,
        /// The times in stage 0's forward row: the number of microbatches.
        expected: usize,
    },
    /// Every stage holds at least one model chunk.
    #[error("the number of model chunks per stage must be at least 1")]
    ZeroChunks,
    /// Megatron-LM's interleaved schedule needs `m` to be a multiple of `p`.
    #[error(
        "interleaved 1F1B with {chunks} chunks needs the number of microbatches to be a \
         multiple of the {stages} pipeline stages (Megatron-LM's rule), got {microbatches}"
    )]
    NotMultiple {
        /// The number of microbatches, `m`.
        microbatches: usize,
        /// The number of pipeline stages, `p`.
        stages: usize,
        /// The model chunks per stage.
        chunks: usize,
    },
    /// A time is NaN, infinite or negative.
    #[error(
        "{pass} time of microbatch {microbatch} on stage {stage} is {value}; times must be \
         finite and non-negative"
    )]
    BadTime {
        /// The pass the time belongs to: `"forward"` or `"backward"`.
        pass: &'static str,
        /// The stage, 0-based.
        stage: usize,
        /// The microbatch, 0-based.
        microbatch: usize,
        /// The time given (NaN, infinite or negative).
        value: f64,
    },
    /// The operation orders waited on each other (never expected: a bug if seen).
    #[error("the interleaved 1F1B operation order deadlocked (a bug in the schedule)")]
    Deadlock,
}

/// One operation of a stage's interleaved order: `(chunk, microbatch)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum VOp {
    F(usize, usize),
    B(usize, usize),
}

/// Warm-up forwards of stage `s` of `p` with `chunks` chunks and `m` microbatches: the
/// non-interleaved `min(p − s − 1, m)` for one chunk, Megatron-LM's `min(2(p − s − 1) +
/// (chunks − 1)·p, chunks·m)` otherwise.
pub(crate) fn warmup(s: usize, p: usize, m: usize, chunks: usize) -> usize {
    if chunks == 1 {
        (p - s - 1).min(m)
    } else {
        (2 * (p - s - 1) + (chunks - 1) * p).min(chunks * m)
    }
}

/// The microbatch and chunk of a stage's forward operation `i` (Megatron-LM's
/// `get_model_chunk_id` and microbatch id): microbatches go through the chunks in groups of
/// `p`.
pub(crate) fn forward_op(i: usize, p: usize, chunks: usize) -> (usize, usize) {
    ((i / p) % chunks, (i / (p * chunks)) * p + i % p)
}

/// The chunk and microbatch of a stage's backward operation `i`: the chunks in reverse.
pub(crate) fn backward_op(i: usize, p: usize, chunks: usize) -> (usize, usize) {
    let (c, k) = forward_op(i, p, chunks);
    (chunks - 1 - c, k)
}

/// The operation order of stage `s`: warm-up forwards, one forward and one backward in
/// turn, then the cool-down backwards.
fn interleaved_order(s: usize, p: usize, m: usize, chunks: usize) -> Vec<VOp> {
    let total = chunks * m;
    let warm = warmup(s, p, m, chunks);
    let f = |i| {
        let (c, k) = forward_op(i, p, chunks);
        VOp::F(c, k)
    };
    let b = |i| {
        let (c, k) = backward_op(i, p, chunks);
        VOp::B(c, k)
    };
    let mut ops: Vec<VOp> = (0..warm).map(f).collect();
    for t in 0..total - warm {
        ops.push(f(warm + t));
        ops.push(b(t));
    }
    ops.extend((total - warm..total).map(b));
    ops
}

/// Checks the shapes and times of `fwd`/`bwd` and `chunks`; returns `(p, m)`.
pub(crate) fn check(
    fwd: &[Vec<f64>],
    bwd: &[Vec<f64>],
    chunks: usize,
) -> Result<(usize, usize), PipelineError> {
    let p = fwd.len();
    if p != bwd.len() {
        return Err(PipelineError::StageCount {
            fwd: p,
            bwd: bwd.len(),
        });
    }
    if chunks == 0 {
        return Err(PipelineError::ZeroChunks);
    }
    let m = fwd.first().map_or(0, Vec::len);
    for (pass, grid) in [("forward", fwd), ("backward", bwd)] {
        for (stage, row) in grid.iter().enumerate() {
            if row.len() != m {
                return Err(PipelineError::Ragged {
                    pass,
                    stage,
                    got: row.len(),
                    expected: m,
                });
            }
            if let Some((microbatch, &value)) = row
                .iter()
                .enumerate()
                .find(|(_, t)| !(t.is_finite() && **t >= 0.0))
            {
                return Err(PipelineError::BadTime {
                    pass,
                    stage,
                    microbatch,
                    value,
                });
            }
        }
    }
    if chunks > 1 && p > 0 && !m.is_multiple_of(p) {
        return Err(PipelineError::NotMultiple {
            microbatches: m,
            stages: p,
            chunks,
        });
    }
    Ok((p, m))
}

/// Simulates one iteration of Megatron-LM's interleaved 1F1B schedule (virtual pipeline
/// stages; Narayanan et al., SC '21, §2.2) with forward times `fwd[s][k]` and backward times
/// `bwd[s][k]` of microbatch `k` on stage `s`, each of the `p` stages holding `chunks` model
/// chunks.
///
/// Model chunk `c` of stage `s` is virtual stage `v = c·p + s`; microbatch `k` takes
/// `fwd[s][k] / chunks` forward and `bwd[s][k] / chunks` backward on each of its stage's
/// virtual stages (layers split equally over chunks). Each stage runs Megatron-LM's order
/// (`forward_backward_pipelining_with_interleaving`): `min(2(p − s − 1) + (chunks − 1)·p,
/// chunks·m)` warm-up forwards, then one forward and one backward in turn, then the
/// cool-down backwards; its forward operation `i` runs chunk `(i / p) mod chunks` on
/// microbatch `⌊i / (p·chunks)⌋·p + i mod p` (microbatches go through the chunks in groups
/// of `p`), its backward operation `i` the same microbatch on chunk `chunks − 1 − (i / p) mod
/// chunks`. Dependencies: `F(v, k)` after `F(v − 1, k)` (for `s = 0`, `v − 1` is stage
/// `p − 1`'s previous chunk), `B(v, k)` after `B(v + 1, k)` and `F(v, k)`, the last virtual
/// stage's backward after its forward. Communication is free, as in [`one_f_one_b`].
///
/// With one chunk this is exactly [`one_f_one_b`] (Megatron-LM runs the non-interleaved
/// order, `min(p − s − 1, m)` warm-ups, then); the schedule's rows are virtual stages. This
/// follows the brief's Megatron order without the special case of some Megatron releases
/// that make every forward a warm-up when `m = p`. With uniform times `f`, `b` per stage
/// the makespan is `(m + (p − 1)/chunks)·(f + b)`: the bubble is Megatron's `(p − 1)/chunks`
/// microbatch times, `(p − 1)/(chunks·m)` of the ideal time (see the property tests).
///
/// # Errors
/// [`PipelineError`]: shapes that differ, `chunks = 0`, a time that is not finite and
/// non-negative, or `chunks > 1` with `m` not a multiple of `p` (Megatron-LM's rule).
pub fn interleaved(
    fwd: &[Vec<f64>],
    bwd: &[Vec<f64>],
    chunks: usize,
) -> Result<Schedule, PipelineError> {
    let (p, m) = check(fwd, bwd, chunks)?;
    let vs = p * chunks;
    let nan = vec![vec![f64::NAN; m]; vs];
    let (mut fwd_start, mut fwd_end) = (nan.clone(), nan.clone());
    let (mut bwd_start, mut bwd_end) = (nan.clone(), nan);
    let orders: Vec<Vec<VOp>> = (0..p).map(|s| interleaved_order(s, p, m, chunks)).collect();
    let share = chunks as f64;
    let done = |t: f64| Some(t).filter(|t| !t.is_nan());
    let mut next = vec![0usize; p];
    let mut free = vec![0.0_f64; p];
    let mut remaining = 2 * vs * m;
    while remaining > 0 {
        let before = remaining;
        for s in 0..p {
            while let Some(&op) = orders[s].get(next[s]) {
                let ready = match op {
                    VOp::F(c, k) => {
                        let v = c * p + s;
                        if v == 0 {
                            Some(0.0)
                        } else {
                            done(fwd_end[v - 1][k])
                        }
                    }
                    VOp::B(c, k) => {
                        let v = c * p + s;
                        let own = done(fwd_end[v][k]);
                        if v + 1 == vs {
                            own
                        } else {
                            own.and(done(bwd_end[v + 1][k]))
                        }
                    }
                };
                let Some(ready) = ready else { break };
                let start = ready.max(free[s]);
                free[s] = match op {
                    VOp::F(c, k) => {
                        let v = c * p + s;
                        fwd_start[v][k] = start;
                        fwd_end[v][k] = start + fwd[s][k] / share;
                        fwd_end[v][k]
                    }
                    VOp::B(c, k) => {
                        let v = c * p + s;
                        bwd_start[v][k] = start.max(fwd_end[v][k]);
                        bwd_end[v][k] = bwd_start[v][k] + bwd[s][k] / share;
                        bwd_end[v][k]
                    }
                };
                next[s] += 1;
                remaining -= 1;
            }
        }
        if remaining == before {
            return Err(PipelineError::Deadlock);
        }
    }
    let makespan = free.iter().copied().fold(0.0, f64::max);
    let busy: f64 = fwd.iter().chain(bwd).flatten().sum();
    let bubble_fraction = if makespan > 0.0 {
        (1.0 - busy / (p as f64 * makespan)).max(0.0) // rounding can dip below 0
    } else {
        0.0
    };
    Ok(Schedule {
        fwd_start,
        fwd_end,
        bwd_start,
        bwd_end,
        makespan,
        bubble_fraction,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn megatron_order_for_two_stages_two_chunks() {
        // p = 2, chunks = 2, m = 4: stage 0 warms up with 2·1 + 1·2 = 4 forwards.
        let order = interleaved_order(0, 2, 4, 2);
        use VOp::{B, F};
        assert_eq!(
            order,
            vec![
                F(0, 0),
                F(0, 1),
                F(1, 0),
                F(1, 1),
                F(0, 2),
                B(1, 0),
                F(0, 3),
                B(1, 1),
                F(1, 2),
                B(0, 0),
                F(1, 3),
                B(0, 1),
                B(1, 2),
                B(1, 3),
                B(0, 2),
                B(0, 3),
            ]
        );
        // The last stage warms up with (chunks − 1)·p = 2 forwards.
        assert_eq!(warmup(1, 2, 4, 2), 2);
        assert_eq!(warmup(0, 4, 2, 1), 2);
    }

    #[test]
    fn bad_shapes_are_errors() {
        let row = || vec![1.0; 3];
        assert_eq!(
            interleaved(&[row()], &[], 1),
            Err(PipelineError::StageCount { fwd: 1, bwd: 0 })
        );
        assert_eq!(
            interleaved(&[row()], &[row()], 0),
            Err(PipelineError::ZeroChunks)
        );
        assert!(matches!(
            interleaved(&[row(), row()], &[row(), vec![1.0]], 1),
            Err(PipelineError::Ragged {
                pass: "backward",
                stage: 1,
                ..
            })
        ));
        let err = interleaved(&[row(), row()], &[row(), row()], 2).unwrap_err();
        assert_eq!(
            err,
            PipelineError::NotMultiple {
                microbatches: 3,
                stages: 2,
                chunks: 2
            }
        );
        assert!(err
            .to_string()
            .contains("multiple of the 2 pipeline stages"));
        let bad = interleaved(&[vec![1.0, f64::NAN]], &[row()[..2].to_vec()], 1).unwrap_err();
        assert!(matches!(
            bad,
            PipelineError::BadTime {
                stage: 0,
                microbatch: 1,
                ..
            }
        ));
        let empty = interleaved(&[], &[], 3).unwrap();
        assert_eq!(empty.makespan, 0.0);
    }

    #[test]
    fn two_chunks_halve_the_bubble() {
        // p = 4, m = 8, f = 1, b = 2: 1F1B takes (8 + 3)·3 = 33, two chunks (8 + 1.5)·3.
        let (f, b) = (vec![vec![1.0; 8]; 4], vec![vec![2.0; 8]; 4]);
        assert_eq!(one_f_one_b(&f, &b).makespan, 33.0);
        assert_eq!(interleaved(&f, &b, 2).unwrap().makespan, 28.5);
    }
}
