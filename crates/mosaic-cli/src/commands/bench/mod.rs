//! `mosaic bench`: planning speed and plan quality over a grid of problem sizes.
//!
//! Each cell of the grid (generator × modules × GPUs × interference on/off) plans `--seeds`
//! random models with the default search under `--time-budget`, each `--repeats` times (the
//! median solve time counts: it is stable on a shared 2-core machine where means are not), and
//! reports the solve time, the gap to the plan's proven lower bound, how many plans were
//! proven optimal, and, with `--reference-budget`, the ratio to the optimum where a long exact
//! search proves one. The zoo's models on 8 and 32 H100s follow, then StageEval alone on the
//! zoo's widest stages.

use std::time::{Duration, Instant};

use anyhow::Result;
use mosaic_plan::synthetic::{random_profiles, zoo_shaped_profiles};
use mosaic_plan::{solve, Plan, Search, SolveOptions};
use mosaic_profile::{Interference, ModuleModel, ModuleSet, PerfModel, ProfileFile};

#[cfg(feature = "engine")]
mod block;
mod data;
#[cfg(feature = "engine")]
mod engine;

/// Arguments of `mosaic bench`: the planner's grid, or a verb.
/// (`main.rs` keeps the grid's flags and the verbs apart.)
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    verb: Option<Verb>,
    #[command(flatten)]
    plan: PlanArgs,
}

/// What `mosaic bench` measures besides the planner.
#[derive(clap::Subcommand, Debug)]
enum Verb {
    /// The data side: FlowTrain packing per global batch at 2K–32K tokens, DistTrain
    /// reordering of 10⁴ samples.
    Data(data::Args),
    /// The engine's gain, measured: a zoo-built model trained by the Mosaic plan for one GPU
    /// against every module alone on the whole device one after another, at each per-GPU
    /// batch, with the planner's prediction error (needs the engine feature; a GPU with the
    /// GPU build, or --device cpu).
    #[cfg(feature = "engine")]
    Engine(engine::Args),
    /// Where a transformer block's step goes: one block of a zoo encoder, each piece (norm,
    /// projections, attention fused and composed, MLP) timed forward and backward on the
    /// device, with its products' throughput (needs the engine feature; a GPU with the GPU
    /// build, or --device cpu).
    #[cfg(feature = "engine")]
    Block(block::Args),
}

/// Runs `mosaic bench`.
pub fn run(args: Args) -> Result<()> {
    match args.verb {
        Some(Verb::Data(a)) => data::run(&a),
        #[cfg(feature = "engine")]
        Some(Verb::Engine(a)) => engine::run(&a),
        #[cfg(feature = "engine")]
        Some(Verb::Block(a)) => block::run(&a),
        None => run_plans(args.plan),
    }
}

/// The most solves per model (`--repeats`): as `bench data --repeats`, far past where a
/// median settles, and short of a run that never ends.
const MAX_REPEATS: u64 = 10_000;
/// The most random models per cell (`--seeds`).
const MAX_SEEDS: u64 = 10_000;

/// Arguments of the planner's grid.
#[derive(clap::Args, Debug)]
struct PlanArgs {
    /// Solves per model; the median time is reported (at most 10,000).
    #[arg(long, default_value_t = 3,
          value_parser = clap::value_parser!(u64).range(1..=MAX_REPEATS))]
    repeats: u64,
    /// Random models per cell (at most 10,000).
    #[arg(long, default_value_t = 5,
          value_parser = clap::value_parser!(u64).range(1..=MAX_SEEDS))]
    seeds: u64,
    /// Module counts of the grid.
    #[arg(long, value_delimiter = ',', default_values_t = [8usize, 16, 32],
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    modules: Vec<usize>,
    /// GPU counts of the grid.
    #[arg(long, value_delimiter = ',', default_values_t = [8u32, 32, 128, 1024],
          value_parser = clap::value_parser!(u32).range(1..=mosaic_plan::MAX_GPUS as i64))]
    gpus: Vec<u32>,
    /// Milliseconds each plan may take (as `mosaic plan --time-budget`).
    #[arg(long, default_value_t = 2000)]
    time_budget: u64,
    /// Milliseconds of exact search per model to find the optimum to compare with (cells up
    /// to 16 modules and 32 GPUs; 0: no comparison).
    #[arg(long, default_value_t = 0)]
    reference_budget: u64,
    /// Print the rows as JSON.
    #[arg(long)]
    json: bool,
}

/// One cell of the grid.
#[derive(serde::Serialize)]
struct Row {
    generator: String,
    modules: usize,
    gpus: u32,
    interference: bool,
    models: usize,
    solve_median_ms: f64,
    solve_max_ms: f64,
    /// Plan over its lower bound, minus 1 (median, worst).
    gap_median: f64,
    gap_max: f64,
    /// Plans proven optimal.
    optimal: usize,
    /// Models whose optimum the reference search proved.
    optimum_known: usize,
    /// Plan over the proven optimum (median, worst), where known.
    over_optimum_median: Option<f64>,
    over_optimum_max: Option<f64>,
}

/// The median of a list clap's `1..` ranges keep non-empty.
fn median(xs: &[f64]) -> f64 {
    mosaic_kit::stats::median(xs).expect("at least one repeat and one model")
}

fn max(xs: &[f64]) -> f64 {
    xs.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

/// Plans every model and summarises.
fn measure(generator: &str, models: &[PerfModel], gpus: u32, args: &PlanArgs) -> Result<Row> {
    let opts = SolveOptions {
        search: Search::Auto,
        budget: Duration::from_millis(args.time_budget),
    };
    let (mut times, mut gaps, mut over) = (Vec::new(), Vec::new(), Vec::new());
    let mut optimal = 0;
    for model in models {
        let mut runs = Vec::new();
        let mut plan: Option<Plan> = None;
        for _ in 0..args.repeats {
            let t = Instant::now();
            plan = Some(solve(model, gpus, &opts)?);
            runs.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let plan = plan.expect("at least one repeat");
        times.push(median(&runs));
        let bound = plan.lower_bound_ms.unwrap_or(0.0);
        gaps.push(if bound > 0.0 {
            plan.iteration_ms / bound - 1.0
        } else {
            f64::INFINITY
        });
        optimal += usize::from(plan.optimal);
        if args.reference_budget > 0 && model.modules.len() <= 16 && gpus <= 32 {
            let reference = solve(
                model,
                gpus,
                &SolveOptions {
                    search: Search::Exact,
                    budget: Duration::from_millis(args.reference_budget),
                },
            )?;
            if reference.optimal {
                over.push(plan.iteration_ms / reference.iteration_ms);
            }
        }
    }
    Ok(Row {
        generator: generator.to_string(),
        modules: models[0].modules.len(),
        gpus,
        interference: models[0].interference != Interference::default(),
        models: models.len(),
        solve_median_ms: median(&times),
        solve_max_ms: max(&times),
        gap_median: median(&gaps),
        gap_max: max(&gaps),
        optimal,
        optimum_known: over.len(),
        over_optimum_median: (!over.is_empty()).then(|| median(&over)),
        over_optimum_max: (!over.is_empty()).then(|| max(&over)),
    })
}

/// The grid's generators: the planner's own random DAGs and the zoo-shaped ones.
type Generator = fn(u64, usize, u32) -> ProfileFile;
const GENERATORS: [(&str, Generator); 2] = [
    ("random", random_profiles),
    ("zoo-shaped", zoo_shaped_profiles),
];

/// Issue 13's interference coefficients, the same for both generators.
const ISSUE_13_INTERFERENCE: Interference = Interference {
    e1: 0.02,
    e2: 0.05,
    e3: 0.3,
};

/// The planner's grid, then the zoo's models, then StageEval alone.
fn run_plans(args: PlanArgs) -> Result<()> {
    let mut rows = Vec::new();
    for (name, generate) in GENERATORS {
        for &modules in &args.modules {
            for &gpus in &args.gpus {
                for interference in [true, false] {
                    let models = (0..args.seeds)
                        .map(|seed| {
                            let mut file = generate(seed, modules, gpus);
                            file.interference = if interference {
                                ISSUE_13_INTERFERENCE
                            } else {
                                Interference::default()
                            };
                            PerfModel::new(&file, 0.1, name)
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    rows.push(measure(name, &models, gpus, &args)?);
                }
            }
        }
    }
    for spec in mosaic_zoo::models() {
        for cluster in ["h100x8", "h100x32"] {
            let cluster = mosaic_zoo::cluster(cluster)?;
            let model = PerfModel::new(&mosaic_zoo::profile(&spec, &cluster), 0.1, &spec.name)?;
            rows.push(measure(&spec.name, &[model], cluster.gpus(), &args)?);
        }
    }
    let stage_rows = stage_eval_rows(&args)?;
    if args.json {
        let all = serde_json::json!({"plans": rows, "stage_eval": stage_rows});
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(());
    }
    println!(
        "{:<12} {:>7} {:>5} {:>6} {:>16} {:>17} {:>8} {:>18}",
        "generator",
        "modules",
        "gpus",
        "interf",
        "solve ms med/max",
        "gap % med/max",
        "optimal",
        "/optimum med/max"
    );
    for r in &rows {
        let over = match (r.over_optimum_median, r.over_optimum_max) {
            (Some(m), Some(x)) => format!("{m:.3}/{x:.3} ({})", r.optimum_known),
            _ => "-".to_string(),
        };
        println!(
            "{:<12} {:>7} {:>5} {:>6} {:>16} {:>17} {:>8} {:>18}",
            r.generator,
            r.modules,
            r.gpus,
            if r.interference { "on" } else { "off" },
            format!("{:.1}/{:.1}", r.solve_median_ms, r.solve_max_ms),
            format!("{:.1}/{:.1}", 100.0 * r.gap_median, 100.0 * r.gap_max),
            format!("{}/{}", r.optimal, r.models),
            over
        );
    }
    println!(
        "\n{:<38} {:>7} {:>4} {:>14}",
        "StageEval of one stage", "modules", "gpus", "median ms"
    );
    for r in stage_rows {
        println!(
            "{:<38} {:>7} {:>4} {:>14.3}",
            r.case, r.modules, r.gpus, r.median_ms
        );
    }
    Ok(())
}

/// One StageEval timing.
#[derive(serde::Serialize)]
struct StageRow {
    case: String,
    modules: usize,
    gpus: u32,
    median_ms: f64,
}

/// Times StageEval alone on the widest stage of the zoo, all of a model's source modules (those
/// with no producer) sharing the pool, and on a hard synthetic stage: the ten encoders of
/// `zoo_shaped_profiles(3, 12, 32)` with issue 13's interference, whose last module placed
/// cannot join the GPUs the bound says it must (not proven in 10 s before StageEval looked
/// for lost GPUs). Each is solved from scratch every time.
fn stage_eval_rows(args: &PlanArgs) -> Result<Vec<StageRow>> {
    let mut rows = Vec::new();
    for name in ["imagebind", "ofasys"] {
        let spec = mosaic_zoo::model(name)?;
        for cluster in ["h100x8", "h100x32"] {
            let cluster = mosaic_zoo::cluster(cluster)?;
            let model = PerfModel::new(&mosaic_zoo::profile(&spec, &cluster), 0.1, name)?;
            let sources = modules_where(&model, |m| m.parents.is_empty());
            let case = format!("{name}: its {} source modules", sources.len());
            rows.push(time_stage(
                case,
                &model,
                cluster.gpus(),
                sources,
                args.repeats,
            )?);
        }
    }
    let mut file = zoo_shaped_profiles(3, 12, 32);
    file.interference = ISSUE_13_INTERFERENCE;
    let model = PerfModel::new(&file, 0.1, "zoo-shaped")?;
    let encoders = modules_where(&model, |m| m.name.starts_with("enc"));
    let case = format!("zoo-shaped (3, 12, 32): {} encoders", encoders.len());
    rows.push(time_stage(case, &model, 32, encoders, args.repeats)?);
    Ok(rows)
}

/// The modules of `model` that `keep` selects.
fn modules_where(model: &PerfModel, keep: impl Fn(&ModuleModel) -> bool) -> ModuleSet {
    model
        .modules
        .iter()
        .enumerate()
        .filter(|(_, m)| keep(m))
        .fold(ModuleSet::EMPTY, |s, (i, _)| s.union(ModuleSet::single(i)))
}

/// The median time of `repeats` exact StageEval runs on `set` over `gpus` GPUs.
fn time_stage(
    case: String,
    model: &PerfModel,
    gpus: u32,
    set: ModuleSet,
    repeats: u64,
) -> Result<StageRow> {
    let problem = mosaic_plan::Problem::new(model, gpus)?;
    let mut times = Vec::new();
    for _ in 0..repeats {
        let t = Instant::now();
        let alloc = mosaic_plan::stage_eval(&problem, set, f64::INFINITY);
        times.push(t.elapsed().as_secs_f64() * 1e3);
        anyhow::ensure!(alloc.is_some(), "{case}: no allocation fits the pool");
    }
    Ok(StageRow {
        case,
        modules: set.len(),
        gpus,
        median_ms: median(&times),
    })
}
