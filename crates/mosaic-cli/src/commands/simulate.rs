//! `mosaic simulate`: a plan in, its simulated execution out (summary, JSON report, Chrome
//! trace, SVG picture); or, `mosaic simulate colocations`, random colocations measured on one
//! simulated GPU (the data `mosaic fit` fits the interference term to).

use std::fmt::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use mosaic_sim::SimReport;

use crate::input::{check_output, check_outputs, BadInput};
use mosaic_plan::render::gpu_ranges;

/// Arguments of `mosaic simulate`: a plan to execute, or a verb.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct Args {
    #[command(subcommand)]
    verb: Option<Verb>,
    #[command(flatten)]
    run: Option<PlanArgs>,
}

/// What `mosaic simulate` does besides executing a plan.
#[derive(clap::Subcommand, Debug)]
enum Verb {
    /// Measure random colocations of a built-in model's modules on one simulated GPU of a
    /// built-in cluster (mosaic-colocations/1), for `mosaic fit`.
    Colocations(ColocationArgs),
}

/// Arguments of a plan's simulation.
#[derive(clap::Args, Debug)]
struct PlanArgs {
    /// A mosaic-plan/1 file (`mosaic plan --out`).
    #[arg(long)]
    plan: PathBuf,
    /// A built-in cluster to run on (default: the plan's `cluster`).
    #[arg(long)]
    cluster: Option<String>,
    /// The built-in model the plan places (default: the plan's `model`).
    #[arg(long)]
    model: Option<String>,
    /// A mosaic-calibration/1 file (`mosaic calibrate --out`): the device model's constants
    /// (default: the built-in fit to examples/h100-clip-profile.json).
    #[arg(long, value_name = "FILE")]
    calibration: Option<PathBuf>,
    /// Write the timeline as a Chrome trace (open it in ui.perfetto.dev or chrome://tracing).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Write a picture of the simulated plan as SVG.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Print the full report (with every slice) as JSON instead of a summary.
    #[arg(long)]
    json: bool,
}

/// Arguments of `mosaic simulate colocations`.
#[derive(clap::Args, Debug)]
struct ColocationArgs {
    /// A built-in model (see `mosaic zoo`).
    #[arg(long)]
    model: String,
    /// A built-in cluster: the colocations run on one of its GPUs.
    #[arg(long)]
    cluster: String,
    /// Colocations to draw and measure (1 to 100,000): 2–8 modules each, dp 1, quotas in whole
    /// SM partitions of the device (8 SMs on an H100) that fit one GPU together.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=100_000))]
    count: u64,
    /// Where to write the mosaic-colocations/1 file.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Seed of the random draws (the same seed gives the same file).
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Runs `mosaic simulate`.
pub fn run(args: Args) -> Result<()> {
    match (args.verb, args.run) {
        (Some(Verb::Colocations(c)), _) => colocations(&c),
        (None, Some(p)) => simulate(&p),
        (None, None) => Err(BadInput("--plan: give a mosaic-plan/1 file".into()).into()),
    }
}

/// Executes the plan and reports it.
fn simulate(args: &PlanArgs) -> Result<()> {
    check_outputs(
        &[
            ("--trace", args.trace.as_deref()),
            ("--svg", args.svg.as_deref()),
        ],
        &[
            ("--plan", Some(&args.plan)),
            ("--calibration", args.calibration.as_deref()),
        ],
    )?;
    let plan_path = &args.plan;
    let plan = mosaic_plan::load_plan(plan_path)?;
    let file = plan_path.display().to_string();
    let model_name = args
        .model
        .as_deref()
        .or(plan.model.as_deref())
        .ok_or_else(|| {
            BadInput(format!(
            "{file}: the plan names no model (field `model`); give --model NAME (see `mosaic zoo`)"
        ))
        })?;
    let cluster_name = args
        .cluster
        .as_deref()
        .or(plan.cluster.as_deref())
        .ok_or_else(|| {
            BadInput(format!(
                "{file}: the plan names no cluster (field `cluster`); give --cluster NAME (see \
                 `mosaic zoo`)"
            ))
        })?;
    // A name from the plan is the plan's field; one from the command line, the flag's.
    let named = |flag: &str, field: &str, given: &Option<String>, e: mosaic_zoo::ZooError| {
        BadInput(match given {
            Some(_) => format!("{flag}: {e}"),
            None => format!("{file}: field `{field}`: {e}"),
        })
    };
    let model =
        mosaic_zoo::model(model_name).map_err(|e| named("--model", "model", &args.model, e))?;
    let cluster = mosaic_zoo::cluster(cluster_name)
        .map_err(|e| named("--cluster", "cluster", &args.cluster, e))?;
    for (what, planned, used) in [
        ("model", &plan.model, &model.name),
        ("cluster", &plan.cluster, &cluster.name),
    ] {
        if let Some(planned) = planned.as_ref().filter(|p| !p.eq_ignore_ascii_case(used)) {
            eprintln!("note: {file} was planned for {what} {planned}; simulating it on {used}");
        }
    }
    let options = mosaic_sim::SimOptions {
        calibration: super::calibrate::load(args.calibration.as_deref())?,
        ..Default::default()
    };
    let report = mosaic_sim::simulate_with(&plan, plan_path, &model, &cluster, &options)?;

    if let Some(path) = &args.trace {
        let text = serde_json::to_string(&mosaic_sim::chrome_trace(&report))? + "\n";
        std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &args.svg {
        std::fs::write(path, mosaic_sim::svg(&report))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", summary(&report));
        for (what, path) in [("trace", &args.trace), ("picture", &args.svg)] {
            if let Some(p) = path {
                println!("wrote the {what} to {}", p.display());
            }
        }
    }
    Ok(())
}

/// `mosaic simulate colocations`: random colocations of the zoo model on one simulated GPU.
fn colocations(args: &ColocationArgs) -> Result<()> {
    check_output("--out", &args.out)?;
    let model = mosaic_zoo::model(&args.model)?;
    let cluster = mosaic_zoo::cluster(&args.cluster)?;
    let name = format!("{}@{}", model.name, cluster.name);
    let perf = mosaic_profile::PerfModel::new(&mosaic_zoo::profile(&model, &cluster), 0.1, &name)?;
    let file =
        mosaic_sim::random_colocations(&model, &cluster, &perf, args.count as usize, args.seed);
    let json = serde_json::to_string_pretty(&file)? + "\n";
    std::fs::write(&args.out, json)
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    let most = file
        .samples
        .iter()
        .map(|s| s.modules.len())
        .max()
        .unwrap_or(0);
    println!(
        "wrote {} colocations of {} on one {} GPU of {} (2–{most} modules each, dp 1, quotas in \
         steps of {} SMs, seed {}) to {}",
        file.samples.len(),
        model.name,
        cluster.device.name,
        cluster.name,
        cluster.device.partition.step_sms,
        args.seed,
        args.out.display()
    );
    Ok(())
}

/// Signed percentage.
fn pct(x: f64) -> String {
    // No "-0.0%" for a difference below the last digit.
    let x = if (1000.0 * x).round() == 0.0 { 0.0 } else { x };
    format!("{:+.1}%", 100.0 * x)
}

/// The report as a readable summary.
fn summary(r: &SimReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} on {} ({} × {}), plan {}\nsimulated iteration: {:.1} ms · plan predicted {:.1} ms · \
         error {}\n",
        r.model,
        r.cluster,
        r.gpus,
        r.device,
        r.plan,
        r.iteration_ms,
        r.predicted_ms,
        pct(r.prediction_error)
    );
    stage_tables(&mut s, r);
    let _ = writeln!(
        s,
        "GPU utilisation (SM-time computing at full rate / SM-time): mean {:.0}%, min {:.0}%; \
         occupancy (SM-time with a kernel resident) mean {:.0}%",
        100.0 * r.mean_utilisation,
        100.0 * r.min_utilisation,
        100.0 * r.mean_occupancy
    );
    for row in r.gpu_utilisation.chunks(8) {
        let cells: Vec<String> = row
            .iter()
            .map(|g| format!("GPU {:>2} {:>3.0}%", g.gpu, 100.0 * g.utilisation))
            .collect();
        let _ = writeln!(s, "  {}", cells.join("  "));
    }
    let _ = writeln!(
        s,
        "(times in ms; alone = the module by itself on its GPUs and links; slowdown = simulated / \
         alone − 1)"
    );
    s
}

/// Every stage: its simulated and predicted time, and its modules as a table.
fn stage_tables(s: &mut String, r: &SimReport) {
    let name_w = r
        .stages
        .iter()
        .flat_map(|st| st.modules.iter().map(|m| m.name.len()))
        .max()
        .unwrap_or(6)
        .max(6);
    for st in &r.stages {
        let _ = writeln!(
            s,
            "stage {} · simulated {:.1} ms · predicted {:.1} ms · {}",
            st.index + 1,
            st.time_ms,
            st.predicted_ms,
            pct(st.error)
        );
        let _ = writeln!(
            s,
            "  {:<name_w$}  {:>3}  {:>5}  {:<12}  {:>9}  {:>8}  {:>8}  {:>8}  {:>9}  {:>9}",
            "module",
            "dp",
            "quota",
            "GPUs",
            "predicted",
            "alone",
            "compute",
            "reduce",
            "simulated",
            "slowdown"
        );
        for m in &st.modules {
            let _ = writeln!(
                s,
                "  {:<name_w$}  {:>3}  {:>5.2}  {:<12}  {:>9.1}  {:>8.1}  {:>8.1}  {:>8.1}  {:>9.1}  {:>9}",
                m.name,
                m.dp,
                m.sm,
                gpu_ranges(&m.gpus),
                m.predicted_ms,
                m.alone_ms,
                m.compute_ms,
                m.allreduce_ms,
                m.time_ms,
                pct(m.slowdown)
            );
        }
        let _ = writeln!(s);
    }
}
