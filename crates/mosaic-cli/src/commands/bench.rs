//! `mosaic bench`: planning speed and GAHC's quality against the exact search.
//!
//! Each case is solved `--repeats` times per search; the table reports medians, which are
//! stable on a shared 2-core machine where means are not.

use std::time::{Duration, Instant};

use anyhow::Result;
use mosaic_plan::{solve, synthetic::random_profiles, Search, SolveOptions};
use mosaic_profile::PerfModel;

/// Arguments of `mosaic bench`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Solves per case and search; the median is reported.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    repeats: u64,
    /// Random models per synthetic size.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    seeds: u64,
    /// Milliseconds the exact search may take per solve.
    #[arg(long, default_value_t = 10_000)]
    time_budget: u64,
    /// Print the rows as JSON.
    #[arg(long)]
    json: bool,
}

/// One benchmark row.
#[derive(serde::Serialize)]
struct Row {
    case: String,
    modules: usize,
    gpus: u32,
    gahc_median_ms: f64,
    exact_median_ms: Option<f64>,
    /// Median over the case's models of GAHC's iteration time over the exact one.
    gahc_over_exact: Option<f64>,
    /// Worst such ratio.
    gahc_over_exact_max: Option<f64>,
}

/// The median of timings that clap's `--repeats 1..` and `--seeds 1..` keep non-empty.
fn median(xs: Vec<f64>) -> f64 {
    mosaic_kit::stats::median(&xs).expect("at least one repeat and one model")
}

/// Solves every model `repeats` times with each search and summarises.
fn measure(case: String, models: &[PerfModel], gpus: u32, args: &Args) -> Row {
    let budget = Duration::from_millis(args.time_budget);
    let mut gahc_ms = Vec::new();
    let mut exact_ms = Vec::new();
    let mut ratios = Vec::new();
    let mut exact_done = true;
    for model in models {
        let mut gahc_it = f64::NAN;
        for _ in 0..args.repeats {
            let t = Instant::now();
            let plan = solve(
                model,
                gpus,
                &SolveOptions {
                    search: Search::Gahc,
                    budget,
                },
            )
            .expect("benchmark models are placeable");
            gahc_ms.push(t.elapsed().as_secs_f64() * 1e3);
            gahc_it = plan.iteration_ms;
        }
        for _ in 0..args.repeats {
            let t = Instant::now();
            match solve(
                model,
                gpus,
                &SolveOptions {
                    search: Search::Exact,
                    budget,
                },
            ) {
                Ok(plan) => {
                    exact_ms.push(t.elapsed().as_secs_f64() * 1e3);
                    ratios.push(gahc_it / plan.iteration_ms);
                }
                Err(_) => {
                    exact_done = false;
                    break;
                }
            }
        }
    }
    let done = exact_done && !exact_ms.is_empty();
    Row {
        case,
        modules: models[0].modules.len(),
        gpus,
        gahc_median_ms: median(gahc_ms),
        exact_median_ms: done.then(|| median(exact_ms)),
        gahc_over_exact: done.then(|| median(ratios.clone())),
        gahc_over_exact_max: done.then(|| ratios.iter().copied().fold(1.0, f64::max)),
    }
}

/// Runs `mosaic bench`.
pub fn run(args: Args) -> Result<()> {
    let mut rows = Vec::new();
    for partitioned in [false, true] {
        for (modules, gpus) in [(10usize, 8u32), (20, 32)] {
            let models: Vec<PerfModel> = (0..args.seeds)
                .map(|seed| {
                    let mut file = random_profiles(seed, modules, gpus);
                    if partitioned {
                        sm_partitioned(&mut file);
                    }
                    PerfModel::new(&file, 0.1, "synthetic").expect("synthetic profiles are valid")
                })
                .collect();
            let case = match partitioned {
                false => format!("random DAGs ×{}", args.seeds),
                true => "… on SM partitions".to_string(),
            };
            rows.push(measure(case, &models, gpus, &args));
        }
    }
    for spec in mosaic_zoo::models() {
        for cluster in ["h100x8", "h100x32"] {
            let cluster = mosaic_zoo::cluster(cluster)?;
            let file = mosaic_zoo::profile(&spec, &cluster);
            let model = PerfModel::new(&file, 0.1, &spec.name)?;
            rows.push(measure(spec.name.clone(), &[model], cluster.gpus(), &args));
        }
    }
    let stage_rows = stage_eval_rows(&args)?;
    if args.json {
        let all = serde_json::json!({"plans": rows, "stage_eval": stage_rows});
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(());
    }
    println!(
        "{:<20} {:>7} {:>4} {:>13} {:>14} {:>12} {:>12}",
        "case", "modules", "gpus", "gahc med ms", "exact med ms", "gahc/exact", "worst"
    );
    let opt = |x: Option<f64>, p: usize| x.map_or("timeout".to_string(), |v| format!("{v:.p$}"));
    for r in rows {
        println!(
            "{:<20} {:>7} {:>4} {:>13.2} {:>14} {:>12} {:>12}",
            r.case,
            r.modules,
            r.gpus,
            r.gahc_median_ms,
            opt(r.exact_median_ms, 2),
            opt(r.gahc_over_exact, 4),
            opt(r.gahc_over_exact_max, 4)
        );
    }
    println!(
        "\n{:<34} {:>7} {:>4} {:>14}",
        "StageEval of one stage", "modules", "gpus", "median ms"
    );
    for r in stage_rows {
        println!(
            "{:<34} {:>7} {:>4} {:>14.3}",
            r.case, r.modules, r.gpus, r.median_ms
        );
    }
    Ok(())
}

/// Puts a synthetic profile on a device with SM partitions, to time the planner in SM units:
/// 100 SMs (the synthetic deciles are whole SM counts) in partitions of 8 as on Hopper, so the
/// quotas are 16, 24, …, 96 SMs shared and 100 alone instead of the 10 deciles.
fn sm_partitioned(file: &mut mosaic_profile::ProfileFile) {
    file.device.sm_count = 100;
    file.device.partition = Some(mosaic_profile::SmGranularity {
        min_sms: 8,
        step_sms: 8,
    });
}

/// One StageEval timing.
#[derive(serde::Serialize)]
struct StageRow {
    case: String,
    modules: usize,
    gpus: u32,
    median_ms: f64,
}

/// Times StageEval alone on the widest stage of the zoo: all of a model's source modules
/// (those with no producer) sharing the pool, solved from scratch each time.
fn stage_eval_rows(args: &Args) -> Result<Vec<StageRow>> {
    let mut rows = Vec::new();
    for name in ["imagebind", "ofasys"] {
        let spec = mosaic_zoo::model(name)?;
        for cluster in ["h100x8", "h100x32"] {
            let cluster = mosaic_zoo::cluster(cluster)?;
            let model = PerfModel::new(&mosaic_zoo::profile(&spec, &cluster), 0.1, name)?;
            let problem = mosaic_plan::Problem::new(&model, cluster.gpus())?;
            let sources = model
                .modules
                .iter()
                .enumerate()
                .filter(|(_, m)| m.parents.is_empty())
                .fold(mosaic_profile::ModuleSet::EMPTY, |s, (i, _)| {
                    s.union(mosaic_profile::ModuleSet::single(i))
                });
            let times: Vec<f64> = (0..args.repeats)
                .map(|_| {
                    let t = Instant::now();
                    let alloc = mosaic_plan::stage_eval(&problem, sources, f64::INFINITY);
                    let ms = t.elapsed().as_secs_f64() * 1e3;
                    assert!(alloc.is_some(), "the sources of a zoo model fit their pool");
                    ms
                })
                .collect();
            rows.push(StageRow {
                case: format!("{name}: its {} source modules", sources.len()),
                modules: sources.len(),
                gpus: cluster.gpus(),
                median_ms: median(times),
            });
        }
    }
    Ok(rows)
}
