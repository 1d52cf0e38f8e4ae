//! `simulate`: stages, barriers and the consistency of reports of planner plans.

use mosaic_sim::{simulate, SimReport};

mod common;
use common::{check_report, clip_plan, partitioned_profile, planned, zoo};

#[test]
fn stages_are_barriers() {
    let (plan, m, c) = clip_plan();
    let r = simulate(&plan, "clip.json", &m, &c).unwrap();
    assert_eq!(r.stages.len(), 2);
    let s0 = &r.stages[0];
    let slowest = s0.modules.iter().map(|m| m.time_ms).fold(0.0, f64::max);
    assert!((s0.time_ms - slowest).abs() < 1e-9);
    assert!((r.stages[1].start_ms - s0.time_ms).abs() < 1e-9);
    assert!((r.iteration_ms - s0.time_ms - r.stages[1].time_ms).abs() < 1e-9);
    // The head starts when the slower encoder's all-reduce ends, not when its GPU is free.
    let head = r.slices.iter().find(|s| s.module == "align").unwrap();
    assert!((head.start_ms - s0.time_ms).abs() < 1e-9);
    let faster = s0
        .modules
        .iter()
        .map(|m| m.time_ms)
        .fold(f64::MAX, f64::min);
    assert!(faster < slowest);
    for s in r.slices.iter().filter(|s| s.stage == 0) {
        assert!(s.end_ms <= s0.time_ms + 1e-9);
    }
}

/// Plans on SM partitions (quotas k × 8 / 132, or 1.0 alone) simulate like any other: the
/// simulator takes the quotas as they are, and every GPU a stage shares holds at most the
/// 128 SMs a split hands out.
#[test]
fn plans_on_sm_partitions_simulate() {
    let mut shared = false;
    for (model, cluster) in [("ofasys", "h100x8"), ("clip", "h100x8")] {
        let (m, c) = zoo(model, cluster);
        let file = partitioned_profile(&m, &c);
        let perf = mosaic_profile::PerfModel::new(&file, 0.1, "partitioned").unwrap();
        let opts = mosaic_plan::SolveOptions {
            search: mosaic_plan::Search::Exact,
            budget: std::time::Duration::from_secs(600),
        };
        let mut plan = mosaic_plan::solve(&perf, c.gpus(), &opts).unwrap();
        plan.model = Some(m.name.clone());
        plan.cluster = Some(c.name.clone());
        assert_eq!(plan.granularity, 0.060606);
        for st in &plan.stages {
            let mut sms = vec![Vec::new(); c.gpus() as usize];
            for pm in &st.modules {
                let n = pm.sm * 132.0;
                assert!(
                    (n - n.round()).abs() < 1e-3,
                    "{model}: {} at {}",
                    pm.name,
                    pm.sm
                );
                for &g in &pm.gpus {
                    sms[g as usize].push(n.round() as u32);
                }
            }
            for on in sms.iter().filter(|on| on.len() >= 2) {
                shared = true;
                assert!(on.iter().all(|n| n % 8 == 0), "{model}: {on:?}");
                assert!(on.iter().sum::<u32>() <= 128, "{model}: {on:?}");
            }
        }
        let r = simulate(&plan, "plan.json", &m, &c).unwrap();
        check_report(&r);
        assert!(
            r.prediction_error.abs() < 0.5,
            "{model}: {}",
            r.prediction_error
        );
    }
    assert!(shared, "some plan shares a GPU");
}

#[test]
fn planner_plans_run_and_reports_are_consistent() {
    for (model, cluster) in [
        ("ofasys", "h100x8"),
        ("clip", "h100x8"),
        ("imagebind", "h100x16"),
    ] {
        let (m, c) = zoo(model, cluster);
        let plan = planned(&m, &c);
        let r = simulate(&plan, "plan.json", &m, &c).unwrap();
        check_report(&r);
        assert!(
            r.mean_utilisation > 0.1 && r.mean_utilisation < 1.0,
            "{model}"
        );
        // The ground truth differs from the planner's formula, but not wildly.
        assert!(
            r.prediction_error.abs() < 0.5,
            "{model}: {}",
            r.prediction_error
        );
        // The report survives JSON.
        let back: SimReport = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back.slices.len(), r.slices.len());
    }
}
