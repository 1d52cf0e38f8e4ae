//! The strategies whose result is a staged plan: Megatron-LM, DistMM and Mosaic itself.

use std::rc::Rc;
use std::time::{Duration, Instant};

use mosaic_plan::{solve, Candidate, Placement, Plan, Search, SolveOptions, StageAlloc};
use mosaic_profile::{ModuleSet, PerfModel};

use crate::common::{plan_line, plan_shape, plan_util, whole_gpu_all};
use crate::{CompareError, Strategy, StrategyResult};

/// The result row of a staged plan.
fn staged_result(
    strategy: Strategy,
    model: &PerfModel,
    plan: Plan,
    note: Option<String>,
) -> StrategyResult {
    let util = plan_util(model, &plan);
    StrategyResult {
        strategy,
        name: strategy.name().to_string(),
        iteration_ms: plan.iteration_ms,
        pipelined: false,
        mean_util: util.mean,
        min_util: util.min,
        gpu_util: util.per_gpu,
        description: plan_line(&plan),
        note,
        shape: plan_shape(&plan),
        plan: Some(plan),
    }
}

/// **Megatron-LM** (Shoeybi et al. 2019; Mosaic §2.2, Fig. 3a): every module data-parallel over
/// the whole pool — the largest profiled dp ≤ `gpus` whose whole-GPU sample fits in memory, SM
/// quota 1.0 — and the modules one after another in topological order (one stage each).
pub fn megatron(model: &PerfModel, gpus: u32) -> Result<StrategyResult, CompareError> {
    let start = Instant::now();
    let whole = whole_gpu_all(model, gpus)?;
    let stages: Vec<Rc<StageAlloc>> = model
        .topo_order
        .iter()
        .map(|&m| {
            let o = *whole[m].last().expect("whole_gpu_all: non-empty");
            Rc::new(StageAlloc {
                set: ModuleSet::single(m),
                time_ms: o.time_ms,
                placements: vec![Placement {
                    module: m,
                    choice: Candidate::from(&o),
                    gpus: (0..o.dp).collect(),
                    time_ms: o.time_ms,
                }],
            })
        })
        .collect();
    let solve_ms = start.elapsed().as_secs_f64() * 1e3;
    let plan = Plan::new(model, gpus, &stages, "megatron-lm", solve_ms);
    Ok(staged_result(Strategy::MegatronLm, model, plan, None))
}

/// `model` with only its whole-GPU options (SM quota 1.0).
pub(crate) fn whole_gpu_model(model: &PerfModel, gpus: u32) -> Result<PerfModel, CompareError> {
    whole_gpu_all(model, gpus)?; // names the module without any
    let mut whole = model.clone();
    let units = whole.units_per_gpu;
    for m in &mut whole.modules {
        m.options.retain(|o| o.units == units);
    }
    Ok(whole)
}

/// **DistMM** (Huang et al., NSDI'24; Mosaic §2.2, Fig. 3b): stages of parallel modules, each
/// module data-parallel over its own set of whole GPUs, balanced to minimise each stage's time.
///
/// This is Mosaic's own solver ([`mosaic_plan::solve`], the anytime search within `budget`)
/// on the same profiles restricted to SM quota 1.0: with quota 1.0 the
/// per-GPU quota constraint (Σ quota ≤ 1) already makes the modules' GPU sets disjoint, and no
/// GPU is shared, so the interference term is zero.
pub fn distmm(
    model: &PerfModel,
    gpus: u32,
    budget: Duration,
) -> Result<StrategyResult, CompareError> {
    let whole = whole_gpu_model(model, gpus)?;
    let opts = SolveOptions {
        search: Search::Auto,
        budget,
    };
    let plan = solve(&whole, gpus, &opts).map_err(|source| CompareError::Plan {
        strategy: Strategy::DistMm.name(),
        source,
    })?;
    let note = proof_note(&plan);
    Ok(staged_result(Strategy::DistMm, model, plan, note))
}

/// **Mosaic** ([`mosaic_plan::solve`]): the paper's GAHC ([`Search::Gahc`]), or the full
/// anytime search within `budget` ([`Search::Auto`]: GAHC, local moves, the exact search where
/// it may finish; the row notes a plan not proven optimal and its gap to the lower bound). Any
/// other `search` is run as asked and reported as the exact row.
pub fn mosaic(
    model: &PerfModel,
    gpus: u32,
    search: Search,
    budget: Duration,
) -> Result<StrategyResult, CompareError> {
    let strategy = if search == Search::Gahc {
        Strategy::MosaicGahc
    } else {
        Strategy::MosaicExact
    };
    if gpus == 0 {
        return Err(CompareError::NoGpus);
    }
    let plan = solve(model, gpus, &SolveOptions { search, budget }).map_err(|source| {
        CompareError::Plan {
            strategy: strategy.name(),
            source,
        }
    })?;
    let note = if strategy == Strategy::MosaicExact {
        proof_note(&plan)
    } else {
        None
    };
    Ok(staged_result(strategy, model, plan, note))
}

/// What a plan that is not proven optimal is known to be: within some percent of a lower bound.
fn proof_note(plan: &mosaic_plan::Plan) -> Option<String> {
    (!plan.optimal).then(|| match plan.lower_bound_ms {
        Some(b) if b > 0.0 => format!(
            "not proven optimal within the time budget: at most {:.1} % above the optimum",
            100.0 * (plan.iteration_ms / b - 1.0)
        ),
        _ => "not proven optimal within the time budget".to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{close, model, module, sample};

    #[test]
    fn megatron_runs_every_module_on_the_largest_profiled_dp() {
        // a → b. dp 4 is profiled but exceeds 3 GPUs; dp 3 is not profiled: dp 2 it is.
        let m = model(
            vec![
                module("a", &[], &[(1, 100.0), (2, 60.0), (4, 40.0)]),
                module("b", &["a"], &[(1, 50.0), (2, 30.0)]),
            ],
            80.0,
        );
        let r = megatron(&m, 3).unwrap();
        assert!(close(r.iteration_ms, 90.0));
        assert_eq!(r.description, "a dp2 | b dp2");
        // sm_util 0.5: GPUs 0 and 1 do (60 + 30) × 0.5 = 45 ms of work in 90 ms; GPU 2 none.
        assert!(close(r.mean_util, 2.0 * 45.0 / (3.0 * 90.0)));
        assert_eq!(r.min_util, 0.0);
        r.plan.unwrap().check(&m).unwrap();

        let r = megatron(&m, 2).unwrap();
        assert!(close(r.mean_util, 0.5) && close(r.min_util, 0.5));
    }

    #[test]
    fn distmm_balances_parallel_modules_on_whole_gpus() {
        // a ∥ b → c on 3 GPUs: {a dp2, b dp1} then c dp2 = 50 + 10 is best (a and b in
        // separate stages: 50 + 16 + 10; b on 2 GPUs with a: a dp1 = 100).
        let m = model(
            vec![
                module("a", &[], &[(1, 100.0), (2, 50.0)]),
                module("b", &[], &[(1, 30.0), (2, 16.0)]),
                module("c", &["a", "b"], &[(1, 20.0), (2, 10.0)]),
            ],
            80.0,
        );
        let r = distmm(&m, 3, Duration::from_secs(10)).unwrap();
        assert!(close(r.iteration_ms, 60.0), "{}", r.iteration_ms);
        assert_eq!(r.description, "a dp2 ∥ b dp1 | c dp2");
        let plan = r.plan.unwrap();
        plan.check(&m).unwrap();
        // Disjoint whole GPUs in the first stage.
        assert!(plan.stages[0].gpu_quota.iter().all(|&q| q == 1.0));
    }

    #[test]
    fn mosaic_colocates_where_distmm_cannot() {
        // Two encoders that stop scaling at half a GPU and a head: Mosaic shares the one GPU.
        let half = |name: &str, after: &[&str]| {
            let mut p = module(name, after, &[(1, 100.0)]);
            p.samples.push(sample(1, 0.5, 100.0));
            p
        };
        let m = model(
            vec![half("a", &[]), half("b", &[]), half("head", &["a", "b"])],
            80.0,
        );
        let budget = Duration::from_secs(10);
        let exact = mosaic(&m, 1, Search::Exact, budget).unwrap();
        let greedy = mosaic(&m, 1, Search::Gahc, budget).unwrap();
        let dist = distmm(&m, 1, budget).unwrap();
        let meg = megatron(&m, 1).unwrap();
        assert!(close(exact.iteration_ms, 200.0) && close(greedy.iteration_ms, 200.0));
        assert!(close(dist.iteration_ms, 300.0) && close(meg.iteration_ms, 300.0));
        assert_eq!(exact.description, "a dp1@0.5 ∥ b dp1@0.5 | head dp1@0.5");
        assert_eq!(exact.name, "Mosaic (exact)");
        assert_eq!(greedy.name, "Mosaic (GAHC)");
        // Work: 3 × 0.5 × 100 × 0.5 = 75 ms of SM-time in 200 ms (Mosaic) or 300 ms.
        assert!(close(exact.mean_util, 75.0 / 200.0));
        assert!(close(dist.mean_util, 3.0 * 100.0 * 0.5 / 300.0));
    }

    #[test]
    fn a_module_without_a_whole_gpu_sample_is_named() {
        let mut p = module("a", &[], &[]);
        p.samples.push(sample(1, 0.5, 10.0));
        let m = model(vec![p], 80.0);
        let e = megatron(&m, 1).unwrap_err();
        assert!(e.to_string().contains("\"a\""), "{e}");
        assert!(matches!(e, CompareError::NoWholeGpu { .. }));
    }
}
