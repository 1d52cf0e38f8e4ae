//! Helpers shared by the simulator's integration tests: zoo models, hand-made and planned
//! plans, and the invariants every report keeps.
// Every test binary compiles this module, and not every one uses every helper.
#![allow(dead_code)]

use std::collections::HashMap;

use mosaic_plan::{Plan, PlanModule, PlanStage, Search, SolveOptions};
use mosaic_sim::{Phase, SimReport, REPORT_FORMAT};
use mosaic_zoo::{Calibration, ClusterSpec, ModelSpec};

/// A zoo model and cluster by name.
pub fn zoo(model: &str, cluster: &str) -> (ModelSpec, ClusterSpec) {
    (
        mosaic_zoo::model(model).unwrap(),
        mosaic_zoo::cluster(cluster).unwrap(),
    )
}

/// The index of module `name` of `model`.
pub fn index(model: &ModelSpec, name: &str) -> usize {
    model.modules.iter().position(|m| m.name == name).unwrap()
}

/// One module of a hand-made plan: name, dp, quota, GPUs.
pub type Row<'a> = (&'a str, u32, f64, &'a [u32]);

/// A plan of `stages` of (module, dp, sm, GPUs), predicted with the device model alone.
pub fn hand_plan(model: &ModelSpec, cluster: &ClusterSpec, stages: &[&[Row]]) -> Plan {
    let cal = Calibration::default();
    let stages: Vec<PlanStage> = stages
        .iter()
        .map(|mods| {
            let modules: Vec<PlanModule> = mods
                .iter()
                .map(|&(name, dp, sm, gpus)| {
                    let e = cal.estimate(model, index(model, name), cluster, dp, sm);
                    PlanModule {
                        name: name.into(),
                        dp,
                        sm,
                        gpus: gpus.to_vec(),
                        nodes: Vec::new(),
                        time_ms: e.time_ms,
                        base_ms: e.time_ms,
                        mem_gib: e.mem_gib,
                    }
                })
                .collect();
            PlanStage {
                time_ms: modules.iter().map(|m| m.time_ms).fold(0.0, f64::max),
                modules,
                gpu_quota: Vec::new(),
            }
        })
        .collect();
    Plan {
        format: mosaic_plan::PLAN_FORMAT.into(),
        iteration_ms: stages.iter().map(|s| s.time_ms).sum(),
        search: "hand".into(),
        optimal: false,
        lower_bound_ms: None,
        solve_ms: 0.0,
        gpus: cluster.gpus(),
        device: cluster.device.name.clone(),
        granularity: 0.1,
        sm_count: None,
        model: Some(model.name.clone()),
        cluster: Some(cluster.name.clone()),
        stages,
    }
}

/// The planner's plan of a zoo model (exact search).
pub fn planned(model: &ModelSpec, cluster: &ClusterSpec) -> Plan {
    let file = mosaic_zoo::profile(model, cluster);
    let perf = mosaic_profile::PerfModel::new(&file, 0.1, "zoo").unwrap();
    let opts = SolveOptions {
        search: Search::Exact,
        budget: std::time::Duration::from_secs(600),
    };
    mosaic_plan::solve(&perf, cluster.gpus(), &opts).unwrap()
}

/// The profile of a zoo model on its cluster's SM partitions: the device with its partition
/// rule, every module sampled by the device model at every quota of the device's grid (8, 16,
/// …, 128 of 132 SMs and the whole GPU on an H100) and the zoo profile's dp values — what the
/// zoo writes once it profiles on the SM grid.
pub fn partitioned_profile(
    model: &ModelSpec,
    cluster: &ClusterSpec,
) -> mosaic_profile::ProfileFile {
    let cal = Calibration::default();
    let mut file = mosaic_zoo::profile(model, cluster);
    file.device = cluster.device.profile_device();
    for (i, m) in file.modules.iter_mut().enumerate() {
        let mut dps: Vec<u32> = m.samples.iter().map(|s| s.dp).collect();
        dps.dedup();
        m.samples = dps
            .iter()
            .flat_map(|&dp| {
                cluster
                    .device
                    .quota_grid()
                    .into_iter()
                    .map(move |sm| (dp, sm))
            })
            .map(|(dp, sm)| cal.estimate(model, i, cluster, dp, sm).sample())
            .collect();
    }
    file
}

pub const ALL8: &[u32] = &[0, 1, 2, 3, 4, 5, 6, 7];

/// CLIP on one node: both encoders on every GPU, then the head.
pub fn clip_plan() -> (Plan, ModelSpec, ClusterSpec) {
    let (m, c) = zoo("clip", "h100x8");
    let plan = hand_plan(
        &m,
        &c,
        &[
            &[("vision", 8, 0.7, ALL8), ("text", 8, 0.3, ALL8)],
            &[("align", 1, 0.1, &[0])],
        ],
    );
    (plan, m, c)
}

/// Checks the invariants every report keeps.
pub fn check_report(r: &SimReport) {
    assert_eq!(r.format, REPORT_FORMAT);
    let sum: f64 = r.stages.iter().map(|s| s.time_ms).sum();
    assert!((sum - r.iteration_ms).abs() < 1e-6 * r.iteration_ms.max(1.0));
    assert!(
        (r.prediction_error - (r.iteration_ms - r.predicted_ms) / r.predicted_ms).abs() < 1e-12
    );
    assert_eq!(r.gpu_utilisation.len(), r.gpus as usize);
    for g in &r.gpu_utilisation {
        assert!(g.utilisation >= 0.0 && g.utilisation <= g.occupancy + 1e-9);
        assert!(g.occupancy <= 1.0 + 1e-9, "{g:?}");
    }
    assert!(r.min_utilisation <= r.mean_utilisation + 1e-12);
    // The timeline averages to the mean utilisation.
    let mean: f64 = r
        .timeline
        .iter()
        .map(|p| p.utilisation * (p.end_ms - p.start_ms))
        .sum::<f64>()
        / r.iteration_ms;
    assert!(
        (mean - r.mean_utilisation).abs() < 1e-6,
        "{mean} vs {}",
        r.mean_utilisation
    );
    // Slices inside the iteration; one lane of one GPU never runs two at once.
    let mut lanes: HashMap<(u32, usize), Vec<(f64, f64)>> = HashMap::new();
    for s in &r.slices {
        assert!(s.start_ms >= -1e-9 && s.end_ms <= r.iteration_ms + 1e-9 && s.start_ms <= s.end_ms);
        assert!(s.offset + s.quota <= 1.0 + 1e-6);
        lanes
            .entry((s.gpu, s.lane))
            .or_default()
            .push((s.start_ms, s.end_ms));
    }
    for v in lanes.values_mut() {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        for w in v.windows(2) {
            assert!(w[0].1 <= w[1].0 + 1e-9, "overlap {w:?}");
        }
    }
    // Every replica has a compute slice; trainable multi-replica modules an all-reduce too.
    for st in &r.stages {
        for m in &st.modules {
            let n = |phase| {
                r.slices
                    .iter()
                    .filter(|s| s.module == m.name && s.phase == phase)
                    .count()
            };
            assert_eq!(n(Phase::Compute), m.dp as usize);
            assert!(n(Phase::Allreduce) == 0 || n(Phase::Allreduce) == m.dp as usize);
            assert!(m.time_ms >= m.alone_ms * (1.0 - 1e-6), "{m:?}");
        }
    }
}
