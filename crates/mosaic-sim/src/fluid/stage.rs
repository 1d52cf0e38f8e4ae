//! One stage's execution: its replicas stepping through their segments under the launch
//! floor, its gradient all-reduces, and the advance from one event to the next.

use super::sharing::max_min;
use mosaic_plan::Assignment;

use super::{ModuleOutcome, Outcome, Pool, StageOutcome, StageSpec, Step};
use crate::report::{Phase, Slice};
use crate::work::{Segment, Work};

/// Times below this (s) are the same instant.
const EPS: f64 = 1e-12;

#[derive(Debug, Clone, Copy, PartialEq)]
enum RepState {
    /// Running segment `seg`, with `left` of it to do.
    Run,
    /// Waiting for the host until `until`; `last`: the launch floor after the last segment.
    Wait { until: f64, last: bool },
    /// Finished.
    Done,
}

/// One replica of a placement, on one GPU.
#[derive(Debug, Clone)]
struct Rep {
    /// Its placement in the stage.
    p: usize,
    gpu: u32,
    /// Its slot among the modules of the stage on its GPU.
    lane: usize,
    /// Sum of the quotas before it on its GPU.
    offset: f64,
    /// When the stage started, s.
    start: f64,
    /// The segment it runs or waits for.
    seg: usize,
    /// Fraction of the segment left.
    left: f64,
    state: RepState,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum RedState {
    Latency { until: f64 },
    Transfer,
    Done,
}

/// The gradient all-reduce of one placement.
#[derive(Debug, Clone)]
struct Reduce {
    p: usize,
    state: RedState,
    bytes_left: f64,
    cap: f64,
    /// Network resources the ring crosses (NVLink of its GPUs, IB of its nodes).
    uses: Vec<usize>,
}

/// The flows between two events: the running segments (replica indices) with their times at
/// their HBM shares and compute slowdowns ([`StageRun::compute_slowdowns`]), and the transferring all-reduces (indices) with
/// their rates.
struct Flows {
    running: Vec<usize>,
    seg_time: Vec<f64>,
    moving: Vec<usize>,
    rates: Vec<f64>,
}

/// Whether an event `remaining` seconds away happens within a step of `dt`.
fn due(remaining: f64, dt: f64) -> bool {
    remaining - dt <= EPS + 1e-9 * remaining
}

/// Bytes the ring all-reduce of `pl` moves per GPU: `2(d−1)/d` of the gradients.
fn allreduce_bytes(pl: &Assignment, work: &Work) -> f64 {
    let d = pl.dp as f64;
    2.0 * (d - 1.0) / d * work.grad_bytes
}

/// `Wait { until, last }` while `until` is still ahead of `t`, else `otherwise`.
fn wait_or(until: f64, last: bool, t: f64, otherwise: RepState) -> RepState {
    if until - t > EPS {
        RepState::Wait { until, last }
    } else {
        otherwise
    }
}

/// Moves a replica to its next non-empty segment (or its end) at time `t`.
fn settle(w: &Work, s: &[Segment], rep: &mut Rep, t: f64) {
    while rep.seg < s.len() && s[rep.seg].flops <= 0.0 && s[rep.seg].bytes <= 0.0 {
        rep.seg += 1;
    }
    if rep.seg >= s.len() {
        // The host's floor: no earlier than `start + L`.
        rep.state = wait_or(rep.start + w.floor_s, true, t, RepState::Done);
        return;
    }
    // The host releases chunk k of n at `start + k·L/n`.
    let release = rep.start + (rep.seg / 2) as f64 * w.floor_s / w.chunks as f64;
    rep.left = 1.0;
    rep.state = wait_or(release, false, t, RepState::Run);
}

/// One replica per GPU of every placement, stacked on each GPU in plan order.
fn place_replicas(stage: &StageSpec, gpus: usize, start: f64) -> Vec<Rep> {
    let mut lanes = vec![0usize; gpus];
    let mut offsets = vec![0.0; gpus];
    let mut reps = Vec::new();
    for (p, pl) in stage.iter().enumerate() {
        for &gpu in &pl.gpus {
            let x = gpu as usize;
            reps.push(Rep {
                p,
                gpu,
                lane: lanes[x],
                offset: offsets[x],
                start,
                seg: 0,
                left: 1.0,
                state: RepState::Run,
            });
            lanes[x] += 1;
            offsets[x] += pl.sm;
        }
    }
    reps
}

/// A stage being executed.
pub(super) struct StageRun<'a> {
    pool: &'a Pool<'a>,
    stage: &'a StageSpec,
    /// Index of the stage in the plan.
    si: usize,
    /// Start, s.
    start: f64,
    /// Per placement: its work and that work's segments.
    works: Vec<Work>,
    segs: Vec<Vec<Segment>>,
    reps: Vec<Rep>,
    /// Per placement: replicas still computing.
    reps_left: Vec<usize>,
    /// Per placement: when its last replica finished computing.
    compute_end: Vec<f64>,
    /// Per placement: when its all-reduce ended (or its compute, without one).
    done: Vec<Option<f64>>,
    reduces: Vec<Reduce>,
    /// Per placement: its ring all-reduce alone on idle links, s.
    ring_alone: Vec<f64>,
}

impl<'a> StageRun<'a> {
    /// Starts stage `si` at `start`: its replicas released, those with nothing to do finished
    /// (their slices go to `slices`).
    pub(super) fn start(
        pool: &'a Pool<'a>,
        (si, stage): (usize, &'a StageSpec),
        start: f64,
        slices: &mut Vec<Slice>,
    ) -> Self {
        let works: Vec<Work> = stage
            .iter()
            .map(|p| Work::new(pool.cal, pool.model, p.module, pool.cluster, p.dp, p.sm))
            .collect();
        Self::start_with(pool, (si, stage), works, start, slices)
    }

    /// [`StageRun::start`] with the placements' work given.
    fn start_with(
        pool: &'a Pool<'a>,
        (si, stage): (usize, &'a StageSpec),
        works: Vec<Work>,
        start: f64,
        slices: &mut Vec<Slice>,
    ) -> Self {
        let n = stage.len();
        let mut run = StageRun {
            pool,
            stage,
            si,
            start,
            segs: works.iter().map(Work::segments).collect(),
            reps: place_replicas(stage, pool.gpus, start),
            reps_left: stage.iter().map(|p| p.gpus.len()).collect(),
            compute_end: vec![start; n],
            done: vec![None; n],
            reduces: Vec::new(),
            ring_alone: vec![0.0; n],
            works,
        };
        run.time_rings_alone();
        for rep in run.reps.iter_mut() {
            settle(&run.works[rep.p], &run.segs[rep.p], rep, start);
        }
        for i in 0..run.reps.len() {
            if run.reps[i].state == RepState::Done {
                run.finish_replica(i, start, slices);
            }
        }
        run
    }

    /// Fills `ring_alone`: each placement's all-reduce alone on idle links.
    fn time_rings_alone(&mut self) {
        for (p, pl) in self.stage.iter().enumerate() {
            let (cap, _, latency) = self.pool.ring(pl);
            let bytes = allreduce_bytes(pl, &self.works[p]);
            if bytes > 0.0 {
                self.ring_alone[p] = latency + bytes / cap;
            }
        }
    }

    /// Whether some placement has not finished its all-reduce yet.
    pub(super) fn pending(&self) -> bool {
        self.done.iter().any(Option::is_none)
    }

    /// Advances from `t` to the next event, records the activity in between in `out`, handles
    /// every event due then and returns its time.
    pub(super) fn advance(&mut self, t: f64, out: &mut Outcome) -> f64 {
        let flows = self.flows();
        let dt = self.next_event(t, &flows);
        if dt > 0.0 {
            self.record_activity(t, dt, &flows, out);
        }
        let now = t + dt;
        let finished = self.advance_replicas(t, dt, &flows);
        self.advance_reduces(t, dt, &flows, &mut out.slices);
        for i in finished {
            self.finish_replica(i, now, &mut out.slices);
        }
        now
    }

    /// The current flows: HBM shares of the running segments, network shares of the
    /// transferring all-reduces.
    fn flows(&self) -> Flows {
        let (reps, works, segs) = (&self.reps, &self.works, &self.segs);
        let running: Vec<usize> = (0..reps.len())
            .filter(|&i| reps[i].state == RepState::Run)
            .collect();
        let slow = self.compute_slowdowns(&running);
        let caps: Vec<f64> = running
            .iter()
            .zip(&slow)
            .map(|(&i, &x)| works[reps[i].p].demand(&segs[reps[i].p][reps[i].seg], x))
            .collect();
        let gpu_of: Vec<[usize; 1]> = running.iter().map(|&i| [reps[i].gpu as usize]).collect();
        let uses: Vec<&[usize]> = gpu_of.iter().map(|u| &u[..]).collect();
        let shares = max_min(&caps, &uses, &vec![self.pool.hbm; self.pool.gpus]);
        let seg_time: Vec<f64> = running
            .iter()
            .zip(shares.iter().zip(&slow))
            .map(|(&i, (&s, &x))| {
                let r = &reps[i];
                works[r.p].segment_time(&segs[r.p][r.seg], s, x)
            })
            .collect();
        let reduces = &self.reduces;
        let moving: Vec<usize> = (0..reduces.len())
            .filter(|&i| reduces[i].state == RedState::Transfer)
            .collect();
        let rates = max_min(
            &moving.iter().map(|&i| reduces[i].cap).collect::<Vec<_>>(),
            &moving
                .iter()
                .map(|&i| &reduces[i].uses[..])
                .collect::<Vec<_>>(),
            &self.pool.net_capacity,
        );
        Flows {
            running,
            seg_time,
            moving,
            rates,
        }
    }

    /// The compute slowdown of each of the `running` replicas: a matmul segment runs
    /// `1 + κ · A` times slower, `A` the SM quotas of the other replicas running matmul
    /// segments on its GPU at the time and κ the pool's compute contention (shared clocks, L2
    /// and HBM, which green contexts do not partition); 1 for memory segments and alone.
    fn compute_slowdowns(&self, running: &[usize]) -> Vec<f64> {
        let kappa = self.pool.compute_contention;
        let computing = |i: usize| {
            let r = &self.reps[i];
            self.segs[r.p][r.seg].flops > 0.0
        };
        let mut busy = vec![0.0; self.pool.gpus];
        for &i in running.iter().filter(|&&i| computing(i)) {
            busy[self.reps[i].gpu as usize] += self.stage[self.reps[i].p].sm;
        }
        running
            .iter()
            .map(|&i| {
                let r = &self.reps[i];
                if kappa > 0.0 && computing(i) {
                    1.0 + kappa * (busy[r.gpu as usize] - self.stage[r.p].sm).max(0.0)
                } else {
                    1.0
                }
            })
            .collect()
    }

    /// Time from `t` to the next event: a segment or transfer ending, a release, a latency
    /// over.
    fn next_event(&self, t: f64, f: &Flows) -> f64 {
        let mut dt = f64::INFINITY;
        for (k, &i) in f.running.iter().enumerate() {
            dt = dt.min(self.reps[i].left * f.seg_time[k]);
        }
        for r in &self.reps {
            if let RepState::Wait { until, .. } = r.state {
                dt = dt.min(until - t);
            }
        }
        for (k, &i) in f.moving.iter().enumerate() {
            dt = dt.min(self.reduces[i].bytes_left / f.rates[k]);
        }
        for r in &self.reduces {
            if let RedState::Latency { until } = r.state {
                dt = dt.min(until - t);
            }
        }
        assert!(
            dt.is_finite(),
            "simulation stalled at {t} s: a flow has no bandwidth"
        );
        dt.max(0.0)
    }

    /// Adds the activity over [t, t + dt] to the GPUs' busy and compute time and to the pool's
    /// steps.
    fn record_activity(&self, t: f64, dt: f64, f: &Flows, out: &mut Outcome) {
        let (mut occ, mut util) = (0.0, 0.0);
        for (k, &i) in f.running.iter().enumerate() {
            let r = &self.reps[i];
            let w = &self.works[r.p];
            let sm = self.stage[r.p].sm;
            let seg = &self.segs[r.p][r.seg];
            let full = if seg.flops > 0.0 {
                (seg.flops / w.compute_rate / f.seg_time[k]).min(1.0)
            } else {
                0.0
            };
            out.busy[r.gpu as usize] += sm * dt;
            out.compute[r.gpu as usize] += sm * full * dt;
            occ += sm;
            util += sm * full;
        }
        let g = self.pool.gpus as f64;
        out.steps.push(Step {
            t0: t,
            t1: t + dt,
            occupancy: occ / g,
            utilisation: util / g,
        });
    }

    /// Moves the replicas from `t` to `t + dt`: running segments progress or end (the replica
    /// settling on its next one), waits end; returns the replicas that finished.
    fn advance_replicas(&mut self, t: f64, dt: f64, f: &Flows) -> Vec<usize> {
        let now = t + dt;
        let mut finished = Vec::new();
        for (k, &i) in f.running.iter().enumerate() {
            let rep = &mut self.reps[i];
            if due(rep.left * f.seg_time[k], dt) {
                rep.seg += 1;
                settle(&self.works[rep.p], &self.segs[rep.p], rep, now);
                if rep.state == RepState::Done {
                    finished.push(i);
                }
            } else {
                rep.left -= dt / f.seg_time[k];
            }
        }
        for (i, rep) in self.reps.iter_mut().enumerate() {
            if f.running.contains(&i) {
                continue;
            }
            if let RepState::Wait { until, last } = rep.state {
                if due(until - t, dt) {
                    if last {
                        rep.state = RepState::Done;
                        finished.push(i);
                    } else {
                        rep.state = RepState::Run;
                    }
                }
            }
        }
        finished
    }

    /// Moves the all-reduces from `t` to `t + dt`: transfers progress or end (their slices go
    /// to `slices`), latencies end.
    fn advance_reduces(&mut self, t: f64, dt: f64, f: &Flows, slices: &mut Vec<Slice>) {
        let now = t + dt;
        for (k, &i) in f.moving.iter().enumerate() {
            let remaining = self.reduces[i].bytes_left / f.rates[k];
            if due(remaining, dt) {
                self.reduces[i].state = RedState::Done;
                let p = self.reduces[i].p;
                self.done[p] = Some(now);
                for rep in self.reps.iter().filter(|r| r.p == p) {
                    slices.push(self.slice(rep, self.compute_end[p], now, Phase::Allreduce));
                }
            } else {
                self.reduces[i].bytes_left -= f.rates[k] * dt;
            }
        }
        for r in self.reduces.iter_mut() {
            if let RedState::Latency { until } = r.state {
                if due(until - t, dt) {
                    r.state = RedState::Transfer;
                }
            }
        }
    }

    /// Replica `i` has finished computing at `t`: its compute slice, and when it is its
    /// placement's last, the placement's all-reduce (or its end, without one).
    fn finish_replica(&mut self, i: usize, t: f64, slices: &mut Vec<Slice>) {
        self.reps[i].state = RepState::Done;
        let rep = &self.reps[i];
        slices.push(self.slice(rep, rep.start, t, Phase::Compute));
        let p = rep.p;
        self.reps_left[p] -= 1;
        if self.reps_left[p] > 0 {
            return;
        }
        self.compute_end[p] = t;
        let pl = &self.stage[p];
        let bytes = allreduce_bytes(pl, &self.works[p]);
        if bytes > 0.0 {
            let (cap, uses, latency) = self.pool.ring(pl);
            self.reduces.push(Reduce {
                p,
                state: if latency > 0.0 {
                    RedState::Latency { until: t + latency }
                } else {
                    RedState::Transfer
                },
                bytes_left: bytes,
                cap,
                uses,
            });
        } else {
            self.done[p] = Some(t);
        }
    }

    /// The slice of `rep` from `start` to `end` (s).
    fn slice(&self, rep: &Rep, start: f64, end: f64, phase: Phase) -> Slice {
        let pl = &self.stage[rep.p];
        Slice {
            gpu: rep.gpu,
            node: rep.gpu / self.pool.gpn,
            module: self.pool.model.modules[pl.module].name.clone(),
            stage: self.si,
            start_ms: start * 1e3,
            end_ms: end * 1e3,
            quota: pl.sm,
            lane: rep.lane,
            offset: rep.offset,
            phase,
        }
    }

    /// The stage's outcome; it ends when its last all-reduce does.
    pub(super) fn finish(self) -> StageOutcome {
        let end = self
            .done
            .iter()
            .flatten()
            .fold(self.start, |a, &b| a.max(b));
        StageOutcome {
            start: self.start,
            end,
            modules: self
                .works
                .into_iter()
                .enumerate()
                .map(|(p, work)| ModuleOutcome {
                    work,
                    compute_end: self.compute_end[p],
                    done: self.done[p].unwrap_or(self.compute_end[p]),
                    ring_alone: self.ring_alone[p],
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SimOptions;

    /// A loop of 150 bf16 4096³ GEMMs on one replica at quota `sm` that takes `alone_ms` alone:
    /// all compute, no HBM traffic, no launch floor (`docs/reference.md`, "Measured on a real
    /// H100"). The work of CLIP's first module, stripped down to that.
    fn gemm_loop(pool: &Pool, sm: f64, alone_ms: f64) -> Work {
        let mut w = Work::new(pool.cal, pool.model, 0, pool.cluster, 1, sm);
        w.flops = 150.0 * 2.0 * 4096f64.powi(3);
        w.compute_rate = w.flops / (alone_ms * 1e-3);
        (w.gemm_bytes, w.memory_bytes, w.floor_s, w.grad_bytes) = (0.0, 0.0, 0.0, 0.0);
        w.chunks = 150;
        w
    }

    /// The compute times (ms) of GEMM loops side by side on GPU 0, one per `(quota, alone ms)`.
    fn side_by_side(opts: &SimOptions, loops: &[(f64, f64)]) -> Vec<f64> {
        let model = mosaic_zoo::model("clip").unwrap();
        let cluster = mosaic_zoo::cluster("h100x8").unwrap();
        let pool = Pool::new(opts, &model, &cluster, 1);
        let stage: Vec<Assignment> = loops
            .iter()
            .map(|&(sm, _)| Assignment {
                module: 0,
                dp: 1,
                sm,
                gpus: vec![0],
            })
            .collect();
        let works = loops
            .iter()
            .map(|&(sm, ms)| gemm_loop(&pool, sm, ms))
            .collect();
        let mut out = Outcome {
            stages: Vec::new(),
            slices: Vec::new(),
            busy: vec![0.0],
            compute: vec![0.0],
            steps: Vec::new(),
            end: 0.0,
        };
        let mut run = StageRun::start_with(&pool, (0, &stage), works, 0.0, &mut out.slices);
        let mut t = 0.0;
        while run.pending() {
            t = run.advance(t, &mut out);
        }
        let done = run.finish();
        done.modules.iter().map(|m| m.compute_end * 1e3).collect()
    }

    /// The measurement κ is calibrated on: two GEMM loops, one per 64-SM green context of an
    /// H100, 53 ms each alone, took 67 ms together (+27 %); without the contention term the
    /// simulator would have them overlap perfectly (53 ms), as GEMMs that size need no HBM.
    #[test]
    fn two_compute_bound_replicas_slow_each_other_as_measured_on_an_h100() {
        let half = 64.0 / 132.0;
        let alone = side_by_side(&SimOptions::default(), &[(half, 53.0)]);
        assert!((alone[0] - 53.0).abs() < 1e-6, "{alone:?}");
        let together = side_by_side(&SimOptions::default(), &[(half, 53.0), (half, 53.0)]);
        for t in &together {
            assert!((t - 67.0).abs() < 1e-6, "{together:?}");
        }
        // At 0.5 + 0.5 (the planner's quotas before SM partitions): +27 %.
        let halves = side_by_side(&SimOptions::default(), &[(0.5, 53.0), (0.5, 53.0)]);
        let slowdown = halves[0] / 53.0 - 1.0;
        assert!(
            (slowdown - 0.27).abs() < 0.005,
            "+{:.1} %",
            100.0 * slowdown
        );
        let off = SimOptions {
            compute_contention: 0.0,
            ..SimOptions::default()
        };
        let free = side_by_side(&off, &[(half, 53.0), (half, 53.0)]);
        assert!(free.iter().all(|t| (t - 53.0).abs() < 1e-6), "{free:?}");
    }

    /// The slowdown lasts only while both compute: a loop beside one half as long slows by
    /// +26.4 % for the 53 ms the short one needs (then 67 / 2 ms of its own work is left at
    /// full speed), and the short one by the full +26.4 %; a small replica beside a large one
    /// slows more than the large one.
    #[test]
    fn contention_lasts_while_both_compute_and_grows_with_the_neighbours_sms() {
        let half = 64.0 / 132.0;
        let k = 1.0 + crate::COMPUTE_CONTENTION * half;
        let t = side_by_side(&SimOptions::default(), &[(half, 53.0), (half, 106.0)]);
        let short = 53.0 * k;
        // The long loop did short / (106 k) of its work by then; the rest runs alone.
        let long = short + 106.0 * (1.0 - short / (106.0 * k));
        assert!(
            (t[0] - short).abs() < 1e-6 && (t[1] - long).abs() < 1e-6,
            "{t:?}"
        );
        let t = side_by_side(
            &SimOptions::default(),
            &[(16.0 / 132.0, 50.0), (112.0 / 132.0, 50.0)],
        );
        assert!(t[0] / 50.0 > 1.3 && t[1] / 50.0 < 1.07, "{t:?}");
    }
}
