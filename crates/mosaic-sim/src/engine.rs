//! The event-driven fluid execution of stages: the HBM, launch, all-reduce and stage rules of
//! the crate documentation's "ground-truth model", and the max-min fair sharing they use.

use mosaic_zoo::{Calibration, ClusterSpec, ModelSpec};

use crate::report::{Phase, Slice};
use crate::work::{hbm_bandwidth, Segment, Work};

/// One module's placement in a stage, resolved against the model.
#[derive(Debug, Clone)]
pub(crate) struct Placement {
    /// Index into the model's modules.
    pub module: usize,
    /// Data-parallel degree.
    pub dp: u32,
    /// SM quota per GPU.
    pub sm: f64,
    /// Its GPUs.
    pub gpus: Vec<u32>,
}

/// A stage: placements that start together.
#[derive(Debug, Clone)]
pub(crate) struct StageSpec {
    /// The stage's modules.
    pub placements: Vec<Placement>,
}

/// What happened to one module of a stage.
#[derive(Debug, Clone)]
pub(crate) struct ModuleOutcome {
    /// Its work (and the device model's estimate).
    pub work: Work,
    /// When its last replica finished computing, s.
    pub compute_end: f64,
    /// When its all-reduce finished (= `compute_end` without one), s.
    pub done: f64,
    /// The ring all-reduce alone on idle links, s.
    pub ring_alone: f64,
}

/// What happened in one stage.
#[derive(Debug, Clone)]
pub(crate) struct StageOutcome {
    /// Start, s.
    pub start: f64,
    /// End (the barrier), s.
    pub end: f64,
    /// Per placement, in plan order.
    pub modules: Vec<ModuleOutcome>,
}

/// A constant piece of the pool's activity: mean SM occupancy and compute utilisation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Step {
    pub t0: f64,
    pub t1: f64,
    pub occupancy: f64,
    pub utilisation: f64,
}

/// The whole run.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    pub stages: Vec<StageOutcome>,
    /// Every slice, in stage order.
    pub slices: Vec<Slice>,
    /// Per GPU, SM-seconds with a kernel resident (quota × running time).
    pub busy: Vec<f64>,
    /// Per GPU, SM-seconds at the quota's full compute rate (quota × FLOPs / R(a)).
    pub compute: Vec<f64>,
    /// The pool's activity over time.
    pub steps: Vec<Step>,
    /// End of the last stage, s.
    pub end: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum RepState {
    /// Running segment `seg`, with `left` of it to do.
    Run,
    /// Waiting for the host until `until`; `last`: the launch floor after the last segment.
    Wait { until: f64, last: bool },
    /// Finished at `at`.
    Done,
}

#[derive(Debug, Clone)]
struct Rep {
    p: usize,
    gpu: u32,
    lane: usize,
    offset: f64,
    start: f64,
    seg: usize,
    left: f64,
    state: RepState,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum RedState {
    Latency { until: f64 },
    Transfer,
    Done,
}

#[derive(Debug, Clone)]
struct Reduce {
    p: usize,
    state: RedState,
    bytes_left: f64,
    cap: f64,
    /// Network resources the ring crosses (NVLink of its GPUs, IB of its nodes).
    uses: Vec<usize>,
}

/// Times below this (s) are the same instant.
const EPS: f64 = 1e-12;

/// Max-min fair allocation (progressive filling): flow `i` gets at most `caps[i]`, the flows
/// using resource `r` together at most `capacity[r]`, and no flow can grow without shrinking
/// a flow that has no more.
pub(crate) fn max_min(caps: &[f64], uses: &[&[usize]], capacity: &[f64]) -> Vec<f64> {
    let mut alloc = vec![0.0; caps.len()];
    let mut frozen: Vec<bool> = caps.iter().map(|&c| c <= 0.0).collect();
    let mut left = capacity.to_vec();
    loop {
        let mut users = vec![0usize; capacity.len()];
        for (i, u) in uses.iter().enumerate() {
            if !frozen[i] {
                for &r in u.iter() {
                    users[r] += 1;
                }
            }
        }
        let mut delta = f64::INFINITY;
        for (i, &c) in caps.iter().enumerate() {
            if !frozen[i] {
                delta = delta.min(c - alloc[i]);
            }
        }
        if delta == f64::INFINITY && frozen.iter().all(|&f| f) {
            return alloc;
        }
        for (r, &n) in users.iter().enumerate() {
            if n > 0 {
                delta = delta.min(left[r] / n as f64);
            }
        }
        let delta = delta.max(0.0);
        for (i, u) in uses.iter().enumerate() {
            if !frozen[i] {
                alloc[i] += delta;
                for &r in u.iter() {
                    left[r] -= delta;
                }
            }
        }
        let full: Vec<bool> = left
            .iter()
            .zip(capacity)
            .map(|(&l, &c)| l <= 1e-12 * c)
            .collect();
        let mut any = false;
        for (i, u) in uses.iter().enumerate() {
            if !frozen[i] && (caps[i] - alloc[i] <= 1e-12 * caps[i] || u.iter().any(|&r| full[r])) {
                frozen[i] = true;
                any = true;
            }
        }
        if !any || frozen.iter().all(|&f| f) {
            return alloc;
        }
    }
}

/// Runs `stages` one after another on the first `pool` GPUs of `cluster`.
pub(crate) fn run(
    cal: &Calibration,
    model: &ModelSpec,
    cluster: &ClusterSpec,
    stages: &[StageSpec],
    pool: u32,
) -> Outcome {
    let g = pool as usize;
    let gpn = cluster.gpus_per_node.max(1);
    let nodes = pool.div_ceil(gpn) as usize;
    let hbm = hbm_bandwidth(cal, cluster);
    let nvlink_bus = cluster.nvlink_gbps / 2.0 * 1e9 * cal.link_efficiency;
    let ib_nic = cluster.ib_gbps * 1e9 * cal.link_efficiency;
    // Network resources: NVLink of GPU i at i, InfiniBand of node n at g + n.
    let mut net_capacity = vec![nvlink_bus; g];
    net_capacity.extend(vec![ib_nic * gpn as f64; nodes]);

    let mut out = Outcome {
        stages: Vec::new(),
        slices: Vec::new(),
        busy: vec![0.0; g],
        compute: vec![0.0; g],
        steps: Vec::new(),
        end: 0.0,
    };
    let mut t = 0.0;
    for (si, stage) in stages.iter().enumerate() {
        let start = t;
        let works: Vec<Work> = stage
            .placements
            .iter()
            .map(|p| Work::new(cal, model, p.module, cluster, p.dp, p.sm))
            .collect();
        let segs: Vec<Vec<Segment>> = works.iter().map(Work::segments).collect();
        let mut lanes = vec![0usize; g];
        let mut offsets = vec![0.0; g];
        let mut reps = Vec::new();
        for (p, pl) in stage.placements.iter().enumerate() {
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
        let n = stage.placements.len();
        let mut reps_left: Vec<usize> = stage.placements.iter().map(|p| p.gpus.len()).collect();
        let mut compute_end = vec![start; n];
        let mut done: Vec<Option<f64>> = vec![None; n];
        let mut reduces: Vec<Reduce> = Vec::new();
        let mut ring_alone = vec![0.0; n];
        for (p, pl) in stage.placements.iter().enumerate() {
            let (cap, _, latency) = ring(pl, cal, gpn, g, nvlink_bus, ib_nic);
            let d = pl.dp as f64;
            let bytes = 2.0 * (d - 1.0) / d * works[p].grad_bytes;
            if bytes > 0.0 {
                ring_alone[p] = latency + bytes / cap;
            }
        }

        let finish_rep = |rep: &mut Rep,
                          t: f64,
                          reps_left: &mut [usize],
                          compute_end: &mut [f64],
                          done: &mut [Option<f64>],
                          reduces: &mut Vec<Reduce>,
                          slices: &mut Vec<Slice>| {
            rep.state = RepState::Done;
            let pl = &stage.placements[rep.p];
            slices.push(Slice {
                gpu: rep.gpu,
                node: rep.gpu / gpn,
                module: model.modules[pl.module].name.clone(),
                stage: si,
                start_ms: rep.start * 1e3,
                end_ms: t * 1e3,
                quota: pl.sm,
                lane: rep.lane,
                offset: rep.offset,
                phase: Phase::Compute,
            });
            reps_left[rep.p] -= 1;
            if reps_left[rep.p] == 0 {
                compute_end[rep.p] = t;
                let d = pl.dp as f64;
                let bytes = 2.0 * (d - 1.0) / d * works[rep.p].grad_bytes;
                if bytes > 0.0 {
                    let (cap, uses, latency) = ring(pl, cal, gpn, g, nvlink_bus, ib_nic);
                    reduces.push(Reduce {
                        p: rep.p,
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
                    done[rep.p] = Some(t);
                }
            }
        };

        // Moves a replica to its next non-empty segment (or its end) at time `t`.
        let settle = |rep: &mut Rep, t: f64| {
            let w = &works[rep.p];
            let s = &segs[rep.p];
            while rep.seg < s.len() && s[rep.seg].flops <= 0.0 && s[rep.seg].bytes <= 0.0 {
                rep.seg += 1;
            }
            if rep.seg >= s.len() {
                let floor = rep.start + w.launch_s;
                rep.state = if floor - t > EPS {
                    RepState::Wait {
                        until: floor,
                        last: true,
                    }
                } else {
                    RepState::Done
                };
                return;
            }
            let release = rep.start + (rep.seg / 2) as f64 * w.launch_s / w.chunks as f64;
            rep.left = 1.0;
            rep.state = if release - t > EPS {
                RepState::Wait {
                    until: release,
                    last: false,
                }
            } else {
                RepState::Run
            };
        };

        for rep in reps.iter_mut() {
            settle(rep, t);
        }
        for rep in reps.iter_mut().filter(|r| r.state == RepState::Done) {
            finish_rep(
                rep,
                t,
                &mut reps_left,
                &mut compute_end,
                &mut done,
                &mut reduces,
                &mut out.slices,
            );
        }

        while done.iter().any(Option::is_none) {
            // HBM shares of the running segments.
            let running: Vec<usize> = (0..reps.len())
                .filter(|&i| reps[i].state == RepState::Run)
                .collect();
            let caps: Vec<f64> = running
                .iter()
                .map(|&i| works[reps[i].p].demand(&segs[reps[i].p][reps[i].seg]))
                .collect();
            let gpu_of: Vec<[usize; 1]> = running.iter().map(|&i| [reps[i].gpu as usize]).collect();
            let uses: Vec<&[usize]> = gpu_of.iter().map(|u| &u[..]).collect();
            let shares = max_min(&caps, &uses, &vec![hbm; g]);
            let seg_time: Vec<f64> = running
                .iter()
                .zip(&shares)
                .map(|(&i, &s)| {
                    let r = &reps[i];
                    works[r.p].segment_time(&segs[r.p][r.seg], s)
                })
                .collect();
            // Network shares of the transferring all-reduces.
            let moving: Vec<usize> = (0..reduces.len())
                .filter(|&i| reduces[i].state == RedState::Transfer)
                .collect();
            let rates = max_min(
                &moving.iter().map(|&i| reduces[i].cap).collect::<Vec<_>>(),
                &moving
                    .iter()
                    .map(|&i| &reduces[i].uses[..])
                    .collect::<Vec<_>>(),
                &net_capacity,
            );

            // Time to the next event.
            let mut dt = f64::INFINITY;
            for (k, &i) in running.iter().enumerate() {
                dt = dt.min(reps[i].left * seg_time[k]);
            }
            for r in &reps {
                if let RepState::Wait { until, .. } = r.state {
                    dt = dt.min(until - t);
                }
            }
            for (k, &i) in moving.iter().enumerate() {
                dt = dt.min(reduces[i].bytes_left / rates[k]);
            }
            for r in &reduces {
                if let RedState::Latency { until } = r.state {
                    dt = dt.min(until - t);
                }
            }
            assert!(
                dt.is_finite(),
                "simulation stalled at {t} s: a flow has no bandwidth"
            );
            let dt = dt.max(0.0);

            // Activity over [t, t + dt].
            if dt > 0.0 {
                let (mut occ, mut util) = (0.0, 0.0);
                for (k, &i) in running.iter().enumerate() {
                    let r = &reps[i];
                    let w = &works[r.p];
                    let sm = stage.placements[r.p].sm;
                    let seg = &segs[r.p][r.seg];
                    let full = if seg.flops > 0.0 {
                        (seg.flops / w.compute_rate / seg_time[k]).min(1.0)
                    } else {
                        0.0
                    };
                    out.busy[r.gpu as usize] += sm * dt;
                    out.compute[r.gpu as usize] += sm * full * dt;
                    occ += sm;
                    util += sm * full;
                }
                out.steps.push(Step {
                    t0: t,
                    t1: t + dt,
                    occupancy: occ / g as f64,
                    utilisation: util / g as f64,
                });
            }

            // Advance, then handle every event due now.
            let now = t + dt;
            let due = |remaining: f64| remaining - dt <= EPS + 1e-9 * remaining;
            let mut finished = Vec::new();
            for (k, &i) in running.iter().enumerate() {
                let remaining = reps[i].left * seg_time[k];
                if due(remaining) {
                    reps[i].seg += 1;
                    settle(&mut reps[i], now);
                    if reps[i].state == RepState::Done {
                        finished.push(i);
                    }
                } else {
                    reps[i].left -= dt / seg_time[k];
                }
            }
            for (i, rep) in reps.iter_mut().enumerate() {
                if running.contains(&i) {
                    continue;
                }
                if let RepState::Wait { until, last } = rep.state {
                    if due(until - t) {
                        if last {
                            rep.state = RepState::Done;
                            finished.push(i);
                        } else {
                            rep.state = RepState::Run;
                        }
                    }
                }
            }
            for (k, &i) in moving.iter().enumerate() {
                let remaining = reduces[i].bytes_left / rates[k];
                if due(remaining) {
                    reduces[i].state = RedState::Done;
                    let p = reduces[i].p;
                    done[p] = Some(now);
                    let pl = &stage.placements[p];
                    for (j, &gpu) in pl.gpus.iter().enumerate() {
                        let rep = reps
                            .iter()
                            .filter(|r| r.p == p)
                            .nth(j)
                            .expect("one replica per GPU");
                        out.slices.push(Slice {
                            gpu,
                            node: gpu / gpn,
                            module: model.modules[pl.module].name.clone(),
                            stage: si,
                            start_ms: compute_end[p] * 1e3,
                            end_ms: now * 1e3,
                            quota: pl.sm,
                            lane: rep.lane,
                            offset: rep.offset,
                            phase: Phase::Allreduce,
                        });
                    }
                } else {
                    reduces[i].bytes_left -= rates[k] * dt;
                }
            }
            for r in reduces.iter_mut() {
                if let RedState::Latency { until } = r.state {
                    if due(until - t) {
                        r.state = RedState::Transfer;
                    }
                }
            }
            t = now;
            for i in finished {
                finish_rep(
                    &mut reps[i],
                    t,
                    &mut reps_left,
                    &mut compute_end,
                    &mut done,
                    &mut reduces,
                    &mut out.slices,
                );
            }
        }
        let end = done.iter().flatten().fold(start, |a, &b| a.max(b));
        t = end;
        out.stages.push(StageOutcome {
            start,
            end,
            modules: works
                .into_iter()
                .enumerate()
                .map(|(p, work)| ModuleOutcome {
                    work,
                    compute_end: compute_end[p],
                    done: done[p].unwrap_or(compute_end[p]),
                    ring_alone: ring_alone[p],
                })
                .collect(),
        });
    }
    out.end = t;
    out
}

/// The ring of `pl`'s all-reduce: its bandwidth cap (bytes/s), the network resources it
/// crosses and its latency (s).
fn ring(
    pl: &Placement,
    cal: &Calibration,
    gpn: u32,
    g: usize,
    nvlink_bus: f64,
    ib_nic: f64,
) -> (f64, Vec<usize>, f64) {
    let mut per_node: Vec<(u32, u32)> = Vec::new();
    for &gpu in &pl.gpus {
        let node = gpu / gpn;
        match per_node.iter_mut().find(|(n, _)| *n == node) {
            Some((_, k)) => *k += 1,
            None => per_node.push((node, 1)),
        }
    }
    let mut uses: Vec<usize> = pl.gpus.iter().map(|&x| x as usize).collect();
    let hops = 2.0 * (pl.dp as f64 - 1.0);
    if per_node.len() > 1 {
        uses.extend(per_node.iter().map(|&(n, _)| g + n as usize));
        let sparsest = per_node.iter().map(|&(_, k)| k).min().unwrap_or(1) as f64;
        (
            nvlink_bus.min(ib_nic * sparsest),
            uses,
            hops * cal.ib_hop_us * 1e-6,
        )
    } else {
        (nvlink_bus, uses, hops * cal.nvlink_hop_us * 1e-6)
    }
}

#[cfg(test)]
mod tests {
    use super::max_min;

    #[test]
    fn max_min_is_water_filling() {
        // One resource of 10: demands 2, 5, 8 -> 2, 4, 4.
        let one: &[usize] = &[0];
        let a = max_min(&[2.0, 5.0, 8.0], &[one, one, one], &[10.0]);
        assert!(
            (a[0] - 2.0).abs() < 1e-9 && (a[1] - 4.0).abs() < 1e-9 && (a[2] - 4.0).abs() < 1e-9
        );
        // Enough for everyone: each gets its demand.
        let a = max_min(&[2.0, 3.0], &[one, one], &[10.0]);
        assert_eq!(a, vec![2.0, 3.0]);
        // Two resources: flow 0 uses both, flows 1 and 2 one each.
        let a = max_min(&[100.0, 100.0, 100.0], &[&[0, 1], &[0], &[1]], &[10.0, 4.0]);
        assert!(
            (a[0] - 2.0).abs() < 1e-9 && (a[2] - 2.0).abs() < 1e-9 && (a[1] - 8.0).abs() < 1e-9,
            "{a:?}"
        );
        // No demand, no share.
        assert_eq!(max_min(&[0.0, 1.0], &[one, one], &[10.0]), vec![0.0, 1.0]);
        assert!(max_min(&[], &[], &[1.0]).is_empty());
    }
}
