//! Properties of the comparison on random synthetic models: every staged plan is valid,
//! utilisations are fractions, no whole-GPU strategy beats the trivial bound, Spindle never
//! loses to DistMM, and Mosaic (exact) never loses to Megatron-LM or DistMM.

use std::time::Duration;

use mosaic_compare::{compare, whole_gpu_lower_bound, CompareError, CompareOptions, Strategy};
use mosaic_plan::synthetic::random_profiles;
use mosaic_plan::PlanError;
use mosaic_profile::PerfModel;
use proptest::prelude::*;

/// `default` cases, or `PROPTEST_CASES` when set; failures write no regression file.
fn config(default: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Slack for times rounded to µs per stage.
const SLACK_MS: f64 = 1e-2;

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn strategies_are_valid_and_mosaic_exact_is_never_slower(
        seed in any::<u64>(),
        modules in 2usize..=8,
        max_dp in prop_oneof![Just(1u32), Just(2), Just(4), Just(8)],
        gpus in 1u32..=16,
        granularity in prop_oneof![Just(0.1), Just(0.25), Just(0.5), Just(0.0)],
        global_batch in prop_oneof![Just(None), Just(Some(16u32)), Just(Some(32))],
    ) {
        let mut file = random_profiles(seed, modules, max_dp);
        if granularity == 0.0 {
            // SM partitions: 100 SMs (the deciles are whole SMs) in partitions of 8, so quotas
            // are 16, 24, …, 96 SMs shared and all 100 alone.
            file.device.sm_count = 100;
            file.device.partition = Some(mosaic_profile::SmGranularity { min_sms: 8, step_sms: 8 });
        }
        let model = PerfModel::new(&file, granularity, "synthetic").unwrap();
        let opts = CompareOptions {
            budget: Duration::from_secs(60),
            global_batch,
            ..CompareOptions::default()
        };
        let rows = match compare(&model, gpus, &opts) {
            Ok(rows) => rows,
            Err(e) => {
                // Only when some module cannot run on this pool at all.
                let stuck = model.modules.iter().any(|m| {
                    !m.options.iter().any(|o| o.dp <= gpus && o.units == model.units_per_gpu)
                });
                prop_assert!(stuck, "unexpected error: {e}");
                prop_assert!(matches!(
                    e,
                    CompareError::NoWholeGpu { .. }
                        | CompareError::Plan { source: PlanError::Unplaceable { .. }, .. }
                ), "{e}");
                return Ok(());
            }
        };
        let order: Vec<Strategy> = rows.iter().map(|r| r.strategy).collect();
        prop_assert_eq!(order, Strategy::ALL.to_vec());

        let bound = whole_gpu_lower_bound(&model, gpus);
        for r in &rows {
            prop_assert!(r.iteration_ms.is_finite() && r.iteration_ms > 0.0, "{}: {}", r.name, r.iteration_ms);
            prop_assert_eq!(r.gpu_util.len(), gpus as usize);
            prop_assert!(r.gpu_util.iter().all(|u| (0.0..=1.0).contains(u)), "{}: {:?}", r.name, r.gpu_util);
            prop_assert!((0.0..=1.0).contains(&r.mean_util) && (0.0..=1.0).contains(&r.min_util));
            prop_assert!(r.min_util <= r.mean_util + 1e-12);
            let mean = r.gpu_util.iter().sum::<f64>() / gpus as f64;
            prop_assert!((mean - r.mean_util).abs() < 1e-9);
            if let Some(plan) = &r.plan {
                plan.check(&model).map_err(|e| TestCaseError::fail(format!("{}: {e}", r.name)))?;
                prop_assert_eq!(plan.gpus, gpus);
                prop_assert!((plan.iteration_ms - r.iteration_ms).abs() <= SLACK_MS);
            }
            let whole_gpus = !matches!(r.strategy, Strategy::MosaicGahc | Strategy::MosaicExact);
            if whole_gpus {
                prop_assert!(r.iteration_ms >= bound * (1.0 - 1e-9) - SLACK_MS,
                    "{} {} beats the lower bound {bound}", r.name, r.iteration_ms);
            }
        }
        let time = |s: Strategy| rows.iter().find(|r| r.strategy == s).unwrap().iteration_ms;
        let row = |s: Strategy| rows.iter().find(|r| r.strategy == s).unwrap();
        prop_assert!(row(Strategy::MegatronLm).plan.is_some() && row(Strategy::DistMm).plan.is_some());
        prop_assert!(time(Strategy::Spindle) <= time(Strategy::DistMm) + SLACK_MS,
            "Spindle {} > DistMM {}", time(Strategy::Spindle), time(Strategy::DistMm));
        let exact = row(Strategy::MosaicExact);
        prop_assert!(exact.plan.as_ref().unwrap().optimal, "the generous budget suffices");
        for s in [Strategy::MegatronLm, Strategy::DistMm, Strategy::MosaicGahc] {
            prop_assert!(exact.iteration_ms <= time(s) + SLACK_MS,
                "Mosaic (exact) {} > {} {}", exact.iteration_ms, s.name(), time(s));
        }
    }
}

/// JSON of a row carries the strategy id, the numbers and the plan.
#[test]
fn rows_serialise() {
    let file = random_profiles(11, 4, 4);
    let model = PerfModel::new(&file, 0.1, "synthetic").unwrap();
    let rows = compare(&model, 4, &CompareOptions::default()).unwrap();
    let v = serde_json::to_value(&rows).unwrap();
    assert_eq!(v[0]["strategy"], "megatron-lm");
    assert_eq!(v[6]["strategy"], "mosaic-exact");
    assert_eq!(v[3]["pipelined"], true);
    assert!(v[3]["plan"].is_null());
    assert_eq!(v[0]["plan"]["format"], "mosaic-plan/1");
    assert!(v[1]["iteration_ms"].as_f64().unwrap() > 0.0);
}
