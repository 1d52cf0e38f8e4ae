//! The simulator: executes a `mosaic-plan/1` plan on a cluster, event by event, with its own
//! ground-truth contention model rather than the planner's `T·(1 + Δ)` (Mosaic §5.2 validates
//! its planner the same way), and draws what happened: [`simulate`] returns a [`SimReport`],
//! [`chrome_trace`] turns it into a Perfetto timeline and [`svg`] into a picture like the
//! paper's Figs. 3–4. [`colocate`] runs modules side by side on one GPU, the measurement the
//! interference fit needs.
//!
//! # The ground-truth model
//! **Work.** Each module replica is a job on one GPU; its work per iteration is taken from the
//! zoo's analytical device model ([`mosaic_zoo::Calibration::estimate`] at the plan's dp and
//! quota): matmul/attention FLOPs `F` with the HBM bytes of their operands `B_g`, run at the
//! quota's compute rate `R(a)` (peak × matmul efficiency × `a`); memory-bound bytes `B_m`
//! (norms, activations, logits, gradient buffer, AdamW); the host's floor `L`, the device
//! model's step alone (the smooth maximum of its GPU and host launch times); and, for a
//! trainable module with `d > 1` replicas, `2 × params` bytes of bf16 gradients to all-reduce.
//! The step is cut into `n = 2 × layers` chunks (a forward and a backward per layer), each a
//! matmul segment then a memory segment, as kernels follow each other on a stream. Alone on
//! its quota a replica takes exactly the device model's time, `L`; slowed by its neighbours,
//! the larger of its slowed GPU work and `L` (the device model's smooth maximum of the slowed
//! GPU time and the launch time would differ only where the two are close).
//!
//! **Execution** is fluid and event-driven: between two events every running segment
//! progresses at a constant rate, and at every event (a segment or replica ending, a launch
//! release, an all-reduce ending its latency or its transfer) the shares are recomputed.
//! - *HBM*: the segments running on one GPU share its bandwidth `BW = peak × hbm_efficiency`
//!   by max-min fairness (water filling). A segment asks for what it needs to run at its
//!   compute rate, at most `BW × min(1, a / a_sat)`, what its quota's SMs can reach; a memory
//!   segment asks for that cap. It then progresses at the roofline of its compute rate and its
//!   share. SMs are not shared: green contexts partition them.
//! - *Compute contention*: what green contexts do not partition — clocks, L2 — slows
//!   replicas computing side by side: a matmul segment runs at its compute rate over
//!   `1 + κ·A`, `A` the SM quotas of the other replicas running matmul segments on its GPU at
//!   the time, κ = [`COMPUTE_CONTENTION`] (calibrated on two GEMM loops measured on an H100:
//!   +27 % at half a GPU each; `SimOptions::compute_contention`).
//! - *Host floor*: the host releases chunk `k` of `n` at `start + k·L/n` and the replica ends
//!   no earlier than `start + L`; a replica that outruns its host waits, idle.
//! - *All-reduce*: when every replica of a module has finished its step, a ring all-reduce: a
//!   latency of `2(d−1)` hops (NVLink or InfiniBand hop time of the calibration), then
//!   `2(d−1)/d × bytes` at the bus bandwidth it gets. Rings share each GPU's NVLink
//!   (`nvlink / 2 × link_efficiency`: the datasheet counts both directions) and, when their
//!   GPUs span nodes (node = GPU index / GPUs per node), each crossed node's InfiniBand
//!   (`ib × GPUs per node × link_efficiency`: NCCL runs one ring per NIC) by max-min fairness;
//!   a ring spanning nodes reaches at most `ib × link_efficiency × k`, `k` its fewest GPUs on
//!   one node (the NICs it can drive there). The planner charges a placement that spans nodes
//!   by the same rule (`mosaic_plan::nodes::cross_node_ms`, from the profile's `nodes`), so
//!   the simulator, which reads GPU numbers and not the plan's times, needs nothing more.
//! - *Stages*: a stage ends when its slowest module's all-reduce ends; the next stage starts
//!   then on the whole pool (a barrier).
//!
//! **Simplifications**, on purpose: on-GPU sharing is HBM bandwidth and one compute-contention
//! factor, linear in the neighbours' SMs (no model of L2 capacity or of clocks by power); an
//! all-reduce uses no SMs or HBM bandwidth and starts only after the whole step, so none of it
//! hides behind the backward pass (the device model hides `comm_overlap` = half of it, so the
//! simulator is slower there by design); the optimizer step is part of the step, before the
//! reduction; no PCIe, data-loading or host contention (each GPU's host thread is
//! independent); identical replicas co-located start in lockstep and collide in every memory
//! segment (the worst case). [`SimReport`] defines the measures.
//!
//! ```
//! let model = mosaic_zoo::model("clip")?;
//! let cluster = mosaic_zoo::cluster("h100x8")?;
//! let plan = mosaic_plan::parse_plan(r#"{
//!     "format": "mosaic-plan/1", "iteration_ms": 30.0, "search": "hand", "solve_ms": 0.0,
//!     "gpus": 8, "device": "H100-SXM5-80GB", "granularity": 0.1,
//!     "stages": [
//!       {"time_ms": 27.0, "gpu_quota": [], "modules": [
//!         {"name": "vision", "dp": 8, "sm": 0.7, "gpus": [0,1,2,3,4,5,6,7],
//!          "time_ms": 25.0, "base_ms": 24.0, "mem_gib": 4.0},
//!         {"name": "text", "dp": 8, "sm": 0.3, "gpus": [0,1,2,3,4,5,6,7],
//!          "time_ms": 27.0, "base_ms": 26.0, "mem_gib": 2.0}]},
//!       {"time_ms": 3.0, "gpu_quota": [], "modules": [
//!         {"name": "align", "dp": 1, "sm": 0.1, "gpus": [0],
//!          "time_ms": 3.0, "base_ms": 3.0, "mem_gib": 0.5}]}]
//! }"#, "hand.json")?;
//! let report = mosaic_sim::simulate(&plan, "hand.json", &model, &cluster)?;
//! assert_eq!(report.stages.len(), 2);
//! assert!(report.iteration_ms > 0.0 && report.mean_utilisation <= 1.0);
//! // A Chrome trace for Perfetto and an SVG picture of the plan.
//! let trace = mosaic_sim::chrome_trace(&report);
//! assert!(trace["traceEvents"].as_array().unwrap().len() > 10);
//! assert!(mosaic_sim::svg(&report).starts_with("<svg"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

mod colocations;
mod error;
mod fluid;
mod report;
mod svg;
mod trace;
mod validate;
mod work;

use std::path::Path;

use mosaic_plan::{Assignment, Plan};
use mosaic_zoo::{Calibration, ClusterSpec, ModelSpec};

pub use colocations::{random_colocations, MAX_COLOCATED};
pub use error::SimError;
pub use report::{
    GpuReport, ModuleReport, Phase, SimReport, Slice, StageReport, TimelinePoint, REPORT_FORMAT,
};
pub use svg::svg;
pub use trace::chrome_trace;

use report::relative;

/// κ, the compute contention of replicas computing side by side on one GPU: a matmul segment
/// runs `1 + κ·A` times slower while replicas holding a fraction `A` of the GPU's SMs run
/// matmul segments beside it. Measured on a real H100 (`docs/reference.md`, "Measured on a
/// real H100"): two loops of 150 bf16 4096³ GEMMs, one per 64-SM green context, took 67 ms
/// together against 53 ms each alone — +26.4 % beside 64/132 of the SMs, from the clocks, L2
/// and HBM that green contexts do not partition (GEMMs that size barely touch HBM, so the
/// simulator's bandwidth sharing alone predicts no slowdown). κ = (67/53 − 1) / (64/132) ≈
/// 0.545; two compute-bound replicas at 0.5 + 0.5 slow by 27 %. A constant of the simulator's
/// ground truth, not of the zoo's [`Calibration`] (the planner's device model, which predicts
/// modules alone).
pub const COMPUTE_CONTENTION: f64 = (67.0 / 53.0 - 1.0) / (64.0 / 132.0);

/// Settings of a simulation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimOptions {
    /// The device model the ground truth takes its work and constants from.
    pub calibration: Calibration,
    /// κ of the compute contention between replicas on one GPU ([`COMPUTE_CONTENTION`] by
    /// default; 0 turns it off, leaving HBM bandwidth the only shared resource).
    pub compute_contention: f64,
    /// Bins of [`SimReport::timeline`].
    pub timeline_bins: usize,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            calibration: Calibration::default(),
            compute_contention: COMPUTE_CONTENTION,
            timeline_bins: 100,
        }
    }
}

/// Simulates `plan` (read from `file`, which errors name) of `model` on `cluster` with the
/// default [`SimOptions`].
pub fn simulate(
    plan: &Plan,
    file: impl AsRef<Path>,
    model: &ModelSpec,
    cluster: &ClusterSpec,
) -> Result<SimReport, SimError> {
    simulate_with(plan, file, model, cluster, &SimOptions::default())
}

/// Simulates `plan` of `model` on the first `plan.gpus` GPUs of `cluster`. The plan is
/// refused, with the field at fault, when it does not match the model or the cluster.
pub fn simulate_with(
    plan: &Plan,
    file: impl AsRef<Path>,
    model: &ModelSpec,
    cluster: &ClusterSpec,
    opts: &SimOptions,
) -> Result<SimReport, SimError> {
    let file = file.as_ref();
    let cal = &opts.calibration;
    let stages = validate::resolve(plan, file, model, cluster, cal)?;
    let out = fluid::run(opts, model, cluster, &stages, plan.gpus);

    let stage_reports = stage_reports(&out, plan);
    let gpus = out.gpu_reports(cluster.gpus_per_node);
    let n = gpus.len().max(1) as f64;
    let iteration_ms = out.end * 1e3;
    Ok(SimReport {
        format: REPORT_FORMAT.to_string(),
        plan: file.display().to_string(),
        model: model.name.clone(),
        cluster: cluster.name.clone(),
        device: cluster.device.name.clone(),
        gpus: plan.gpus,
        gpus_per_node: cluster.gpus_per_node,
        sm_count: cluster.device.sm_count,
        iteration_ms,
        predicted_ms: plan.iteration_ms,
        prediction_error: relative(iteration_ms, plan.iteration_ms),
        stages: stage_reports,
        mean_utilisation: gpus.iter().map(|g| g.utilisation).sum::<f64>() / n,
        min_utilisation: gpus
            .iter()
            .map(|g| g.utilisation)
            .reduce(f64::min)
            .unwrap_or(0.0),
        mean_occupancy: gpus.iter().map(|g| g.occupancy).sum::<f64>() / n,
        gpu_utilisation: gpus,
        timeline: out.timeline(opts.timeline_bins),
        slices: out.slices,
    })
}

/// The report of every stage of `out`, against the plan's predictions.
fn stage_reports(out: &fluid::Outcome, plan: &Plan) -> Vec<StageReport> {
    out.stages
        .iter()
        .zip(&plan.stages)
        .enumerate()
        .map(|(index, (o, p))| {
            let time_ms = (o.end - o.start) * 1e3;
            StageReport {
                index,
                start_ms: o.start * 1e3,
                time_ms,
                predicted_ms: p.time_ms,
                error: relative(time_ms, p.time_ms),
                modules: o
                    .modules
                    .iter()
                    .zip(&p.modules)
                    .map(|(m, pm)| {
                        let alone_ms = (m.work.alone_s() + m.ring_alone) * 1e3;
                        let time_ms = (m.done - o.start) * 1e3;
                        ModuleReport {
                            name: pm.name.clone(),
                            dp: pm.dp,
                            sm: pm.sm,
                            gpus: pm.gpus.clone(),
                            predicted_ms: pm.time_ms,
                            base_ms: pm.base_ms,
                            estimate_ms: m.work.estimate.time_ms,
                            alone_ms,
                            compute_ms: (m.compute_end - o.start) * 1e3,
                            allreduce_ms: (m.done - m.compute_end) * 1e3,
                            time_ms,
                            slowdown: relative(time_ms, alone_ms),
                        }
                    })
                    .collect(),
            }
        })
        .collect()
}

/// The simulated times (ms) of modules co-located on one GPU: `placements[i] = (module index,
/// dp, sm)` puts the replicas of module `i` on GPUs `0..dp`, so GPU 0 holds one replica of
/// every module and each module's time runs from the common start to the end of its gradient
/// all-reduce (which waits for its replica on GPU 0, the most crowded). This is the
/// measurement the interference fit needs: `Δ_i = colocate(all)[i] / colocate(&[p_i])[0] − 1`
/// compares like with like (the simulator's all-reduce is not overlapped with the backward
/// pass, unlike the device model's estimate).
///
/// # Panics
/// If a module index is out of range, a dp is 0 or larger than the cluster, a quota is
/// outside (0, 1] or the quotas add up to more than 1.
pub fn colocate(
    model: &ModelSpec,
    cluster: &ClusterSpec,
    placements: &[(usize, u32, f64)],
) -> Vec<f64> {
    let opts = SimOptions::default();
    validate::check_cluster(cluster).expect("a cluster with positive bandwidths");
    let total: f64 = placements.iter().map(|p| p.2).sum();
    assert!(total <= 1.0 + 1e-6, "quotas add up to {total} > 1 on GPU 0");
    let stage: Vec<Assignment> = placements
        .iter()
        .map(|&(module, dp, sm)| {
            assert!(module < model.modules.len(), "module {module} out of range");
            assert!(
                dp >= 1 && dp <= cluster.gpus(),
                "dp {dp} outside 1..={}",
                cluster.gpus()
            );
            assert!(sm > 0.0 && sm <= 1.0, "quota {sm} outside (0, 1]");
            Assignment {
                module,
                dp,
                sm,
                gpus: (0..dp).collect(),
            }
        })
        .collect();
    let pool = placements.iter().map(|p| p.1).max().unwrap_or(1);
    let out = fluid::run(&opts, model, cluster, &[stage], pool);
    out.stages[0]
        .modules
        .iter()
        .map(|m| (m.done - out.stages[0].start) * 1e3)
        .collect()
}
