//! Property tests of the anytime planner at cluster scale (issue 13):
//! - under any budget, on up to 32 modules × 1,024 GPUs, `solve` returns a valid plan by the
//!   deadline (plus a slack for a loaded CI machine), with a lower bound no higher than it;
//! - the searches beyond GAHC never return a slower plan than GAHC's;
//! - a capped StageEval returns a valid allocation no faster than the optimum, and says it is
//!   not proven only when a cap cut it short; the lower bound never exceeds a proven optimum.

use std::time::{Duration, Instant};

use mosaic_plan::synthetic::{random_profiles, zoo_shaped_profiles};
use mosaic_plan::{solve, stage_eval, stage_eval_within, Limits, Problem, Search, SolveOptions};
use mosaic_profile::{Interference, ModuleSet, PerfModel, ProfileFile};
use proptest::prelude::*;

mod common;
use common::config;

/// What a CI machine running other tests may add to a deadline. `plan` itself stops within a
/// few milliseconds of it (README, `mosaic bench`); the slack only absorbs scheduling noise.
const SLACK: Duration = Duration::from_millis(300);

/// A model of either generator, with the interference or none.
fn model(zoo: bool, seed: u64, modules: usize, gpus: u32, interference: bool) -> PerfModel {
    let mut file: ProfileFile = if zoo {
        zoo_shaped_profiles(seed, modules, gpus)
    } else {
        random_profiles(seed, modules, gpus)
    };
    file.interference = if interference {
        Interference {
            e1: 0.02,
            e2: 0.05,
            e3: 0.3,
        }
    } else {
        Interference::default()
    };
    PerfModel::new(&file, 0.1, "anytime").expect("generated profiles are valid")
}

proptest! {
    #![proptest_config(config(24))]

    /// Every search meets its deadline with a valid plan and a bound below it.
    #[test]
    fn plans_meet_the_deadline_at_scale(
        zoo in any::<bool>(),
        seed in any::<u64>(),
        modules in 8usize..=32,
        gpus in prop_oneof![Just(8u32), Just(32), Just(128), Just(1024)],
        interference in any::<bool>(),
        budget_ms in 0u64..=80,
        search in prop_oneof![Just(Search::Gahc), Just(Search::Auto), Just(Search::Exact)],
    ) {
        let model = model(zoo, seed, modules, gpus, interference);
        let budget = Duration::from_millis(budget_ms);
        let start = Instant::now();
        let plan = solve(&model, gpus, &SolveOptions { search, budget }).unwrap();
        let took = start.elapsed();
        prop_assert!(took <= budget + SLACK, "{took:?} for a budget of {budget:?}");
        plan.check(&model).map_err(TestCaseError::fail)?;
        let bound = plan.lower_bound_ms.expect("solve states a bound");
        prop_assert!(bound <= plan.iteration_ms, "bound {bound} > plan {}", plan.iteration_ms);
        prop_assert!(bound > 0.0);
        if plan.optimal {
            prop_assert_eq!(bound, plan.iteration_ms);
        }
    }
}

proptest! {
    #![proptest_config(config(32))]

    /// Local moves and re-cut orders only ever improve on GAHC, and a proven optimum is never
    /// below the lower bound.
    #[test]
    fn searches_beyond_gahc_never_lose(
        zoo in any::<bool>(),
        seed in any::<u64>(),
        modules in 4usize..=14,
        gpus in prop_oneof![Just(4u32), Just(8), Just(16)],
        interference in any::<bool>(),
    ) {
        let model = model(zoo, seed, modules, gpus, interference);
        let opts = |search| SolveOptions { search, budget: Duration::from_secs(1) };
        let greedy = solve(&model, gpus, &opts(Search::Gahc)).unwrap();
        let auto = solve(&model, gpus, &opts(Search::Auto)).unwrap();
        let slack = 1e-3 * greedy.stages.len().max(auto.stages.len()) as f64;
        prop_assert!(auto.iteration_ms <= greedy.iteration_ms + slack,
            "auto {} > GAHC {}", auto.iteration_ms, greedy.iteration_ms);
        auto.check(&model).map_err(TestCaseError::fail)?;
        let problem = Problem::new(&model, gpus).unwrap();
        let bound = problem.plan_lower_bound();
        prop_assert!(bound <= auto.iteration_ms + slack);
        prop_assert!(bound <= greedy.iteration_ms + slack);
    }

    /// A capped StageEval's allocation is valid, never faster than the optimum, and a search
    /// that a cap did not cut short is the exact one.
    #[test]
    fn capped_stage_eval_is_sound(
        seed in any::<u64>(),
        modules in 2usize..=6,
        gpus in prop_oneof![Just(4u32), Just(8)],
        nodes in 1u64..=300,
        splits in 0u64..=8,
    ) {
        let model = model(true, seed, modules, gpus, true);
        let problem = Problem::new(&model, gpus).unwrap();
        let set = ModuleSet::all(modules);
        let limits = Limits { deadline: None, nodes, splits };
        let capped = stage_eval_within(&problem, set, f64::INFINITY, &limits);
        let exact = stage_eval(&problem, set, f64::INFINITY);
        match (&capped.alloc, &exact) {
            (Some(c), Some(e)) => {
                prop_assert!(c.time_ms >= e.time_ms * (1.0 - 1e-12));
                if capped.proven {
                    prop_assert!((c.time_ms - e.time_ms).abs() <= 1e-9 * e.time_ms);
                }
                let mut used = vec![0u32; gpus as usize];
                for p in &c.placements {
                    prop_assert_eq!(p.gpus.len(), p.choice.dp as usize);
                    prop_assert!(p.gpus.windows(2).all(|w| w[0] < w[1]));
                    for &g in &p.gpus {
                        used[g as usize] += p.choice.units;
                    }
                }
                prop_assert!(used.iter().all(|&u| u <= model.units_per_gpu));
            }
            (None, Some(_)) => prop_assert!(!capped.proven, "a proven None with an allocation"),
            (Some(_), None) => prop_assert!(false, "an allocation the exact search cannot find"),
            (None, None) => {}
        }
    }
}
