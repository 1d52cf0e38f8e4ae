//! `mosaic fit`: colocation measurements in, the interference coefficients of Eq. 8 out, with
//! the performance model's accuracy (Mosaic §3.3 Fig. 8b, §5.3.2 Fig. 12a/12b).

use std::fmt::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use mosaic_fit::{FitReport, Model, ProfilingCost, SurfaceAccuracy};
use mosaic_plan::{solve, SolveOptions};
use mosaic_profile::{Interference, PerfModel, ProfileFile};
use serde::Serialize;

use crate::input::{check_outputs, BadInput};

/// Quota step of the end-to-end plans (the planner's default).
const PLAN_GRANULARITY: f64 = 0.1;

/// Arguments of `mosaic fit`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The mosaic-profiles/1 file the measurements are fitted against.
    #[arg(long, conflicts_with = "model", required_unless_present = "model")]
    profiles: Option<PathBuf>,
    /// A built-in model (see `mosaic zoo`), profiled by the analytical device model. Also
    /// checks the sparse surface against the dense device model and plans the model with each
    /// fitted model, executing the plans in the simulator (Fig. 12b).
    #[arg(long, requires = "cluster")]
    model: Option<String>,
    /// The built-in cluster of --model, e.g. h100x8.
    #[arg(long, requires = "model")]
    cluster: Option<String>,
    /// The mosaic-colocations/1 measurements (`mosaic simulate colocations` or `mosaic measure
    /// colocations`).
    #[arg(long)]
    colocations: PathBuf,
    /// Write the profiles with the full model's fitted coefficients to this file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Write the predicted-vs-measured scatter plot of the held-out samples as SVG.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Print the whole result as JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Hold out every N-th sample to test on (the rest is fitted).
    #[arg(
        long,
        value_name = "N",
        default_value_t = mosaic_fit::HOLDOUT_EVERY,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(2..)
    )]
    holdout_every: usize,
    /// GPUs of the end-to-end plans (default: the cluster's).
    #[arg(long, requires = "model")]
    gpus: Option<u32>,
    /// Skip the end-to-end comparison of --model.
    #[arg(long)]
    no_end_to_end: bool,
}

/// The scaling-surface checks.
#[derive(Debug, Serialize)]
struct Surface {
    /// Leave-one-out at the profiled interior quotas.
    leave_one_out: SurfaceAccuracy,
    /// Against the dense device model at every unprofiled 1 % quota (zoo models only).
    dense: Option<SurfaceAccuracy>,
    /// Sparse vs dense profiling cost.
    cost: ProfilingCost,
}

/// One model's plan, executed (Fig. 12b).
#[derive(Debug, Serialize)]
struct EndToEnd {
    model: Model,
    interference: Interference,
    stages: usize,
    search: String,
    /// The planner's iteration time with this model's coefficients, ms.
    predicted_ms: f64,
    /// The simulator's iteration time of that plan, ms.
    simulated_ms: f64,
    /// `simulated_ms` over the unaware plan's.
    normalized: f64,
}

/// Everything `--json` prints.
#[derive(Debug, Serialize)]
struct Output {
    profiles: String,
    colocations: String,
    fit: FitReport,
    surface: Surface,
    #[serde(skip_serializing_if = "Option::is_none")]
    end_to_end: Option<Vec<EndToEnd>>,
}

/// A built-in model on its built-in cluster.
type Zoo = (mosaic_zoo::ModelSpec, mosaic_zoo::ClusterSpec);

/// Runs `mosaic fit`.
pub fn run(args: Args) -> Result<()> {
    check_outputs(
        &[
            ("--out", args.out.as_deref()),
            ("--svg", args.svg.as_deref()),
        ],
        &[
            ("--profiles", args.profiles.as_deref()),
            ("--colocations", Some(&args.colocations)),
        ],
    )?;
    check_profiles_flags(&args)?;
    let zoo = match (&args.model, &args.cluster) {
        (Some(m), Some(c)) => Some((mosaic_zoo::model(m)?, mosaic_zoo::cluster(c)?)),
        _ => None,
    };
    if let (Some(gpus), Some((_, cluster))) = (args.gpus, &zoo) {
        // The plans are executed on the cluster, so they may use at most its GPUs.
        if gpus == 0 || gpus > cluster.gpus() {
            return Err(BadInput(format!(
                "--gpus: expected 1 to {} GPUs (the end-to-end plans run on {}), found {gpus}",
                cluster.gpus(),
                cluster.name
            ))
            .into());
        }
    }
    let (profile, name) = profiles(&args, zoo.as_ref())?;
    let colocations = mosaic_profile::load_colocations(&args.colocations)?;
    let perf = PerfModel::new(&profile, mosaic_fit::LOOKUP_GRANULARITY, &name)?;
    let obs = mosaic_fit::observations(&perf, &colocations, &args.colocations)?;
    let report = mosaic_fit::evaluate(&obs, args.holdout_every);
    // Coefficients a profile cannot hold would make every profile written or planned here one
    // the planner refuses; a report alone may show them (tiny CPU-measured bandwidth
    // utilisations fit large coefficients).
    let plans = zoo.is_some() && !args.no_end_to_end;
    if args.out.is_some() || plans {
        mosaic_fit::check_fitted(&report, &obs, &args.colocations)?;
    }
    let surface = surface_checks(&profile, zoo.as_ref());
    let end_to_end = match &zoo {
        Some((model, cluster)) if !args.no_end_to_end => {
            let gpus = args.gpus.unwrap_or(cluster.gpus());
            Some(end_to_end(&profile, &report, model, cluster, gpus)?)
        }
        _ => None,
    };
    write_files(&args, &profile, &name, &report, &obs)?;
    let output = Output {
        profiles: name,
        colocations: args.colocations.display().to_string(),
        fit: report,
        surface,
        end_to_end,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&output)?);
    } else {
        print!("{}", summary(&output));
        if let Some(p) = &args.out {
            println!(
                "wrote {} (the profiles with the full model's coefficients)",
                p.display()
            );
        }
        if let Some(p) = &args.svg {
            println!("wrote the scatter plot to {}", p.display());
        }
    }
    Ok(())
}

/// Refuses the flags that belong to `--model` alongside `--profiles`: the cluster and the GPUs
/// of the end-to-end plans, which a profile file does not run (its device is its own).
fn check_profiles_flags(args: &Args) -> Result<()> {
    let Some(path) = &args.profiles else {
        return Ok(());
    };
    if let Some(name) = &args.cluster {
        // Name both devices where they differ: the likely mistake.
        let devices = match (mosaic_profile::load(path), mosaic_zoo::cluster(name)) {
            (Ok(p), Ok(c)) if p.device.name != c.device.name => format!(
                " (the profiles are of {}, --cluster {name} of {})",
                p.device.name, c.device.name
            ),
            _ => String::new(),
        };
        return Err(BadInput(format!(
            "--cluster: applies with --model only (the cluster its end-to-end plans run on); with \
             --profiles {} the device is the file's{devices}: drop --cluster",
            path.display()
        ))
        .into());
    }
    if args.gpus.is_some() {
        return Err(BadInput(format!(
            "--gpus: applies with --model only (the GPUs of its end-to-end plans); with \
             --profiles {} there are no end-to-end plans: drop --gpus",
            path.display()
        ))
        .into());
    }
    Ok(())
}

/// The profiles the measurements are fitted against, and the name errors give them.
fn profiles(args: &Args, zoo: Option<&Zoo>) -> Result<(ProfileFile, String)> {
    match (&args.profiles, zoo) {
        (Some(path), _) => Ok((mosaic_profile::load(path)?, path.display().to_string())),
        (None, Some((model, cluster))) => Ok((
            mosaic_zoo::profile(model, cluster),
            format!("{}@{}", model.name, cluster.name),
        )),
        (None, None) => Err(BadInput(
            "no profiles: give --profiles FILE, or --model NAME --cluster NAME".into(),
        )
        .into()),
    }
}

/// The scaling surface's checks: leave-one-out, and against the device model for a zoo model.
fn surface_checks(profile: &ProfileFile, zoo: Option<&Zoo>) -> Surface {
    let truth = zoo.map(|(model, cluster)| {
        let cal = mosaic_zoo::Calibration::default();
        move |i: usize, dp: u32, sm: f64| cal.estimate(model, i, cluster, dp, sm).time_ms
    });
    Surface {
        leave_one_out: mosaic_fit::leave_one_out(profile),
        dense: truth
            .as_ref()
            .map(|t| mosaic_fit::dense_error(profile, mosaic_fit::DENSE_STEP, t)),
        cost: mosaic_fit::profiling_cost(
            profile,
            mosaic_fit::DENSE_STEP,
            None,
            mosaic_fit::PROFILED_ITERATIONS,
            truth.as_ref().map(|t| t as &dyn Fn(usize, u32, f64) -> f64),
        ),
    }
}

/// `--out`: the profiles with the full model's coefficients; `--svg`: the scatter plot.
fn write_files(
    args: &Args,
    profile: &ProfileFile,
    name: &str,
    report: &FitReport,
    obs: &[mosaic_fit::Observation],
) -> Result<()> {
    if let Some(out) = &args.out {
        let fitted = mosaic_fit::write_fitted(profile, report.model(Model::Full).interference);
        let json = serde_json::to_string_pretty(&fitted)? + "\n";
        std::fs::write(out, json).with_context(|| format!("cannot write {}", out.display()))?;
    }
    if let Some(path) = &args.svg {
        let title = report.scatter_title(name, &args.colocations.display().to_string());
        let svg = mosaic_fit::scatter_svg(&title, &mosaic_fit::scatter_series(report, obs));
        std::fs::write(path, svg).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// Plans `model` with each fitted model's coefficients and executes each plan (Fig. 12b).
fn end_to_end(
    profile: &ProfileFile,
    report: &FitReport,
    model: &mosaic_zoo::ModelSpec,
    cluster: &mosaic_zoo::ClusterSpec,
    gpus: u32,
) -> Result<Vec<EndToEnd>> {
    let opts = SolveOptions {
        budget: Duration::from_millis(5000),
        ..SolveOptions::default()
    };
    let mut rows: Vec<EndToEnd> = Vec::new();
    for m in Model::ALL {
        let e = report.model(m).interference;
        let name = format!("{}@{} ({} model)", model.name, cluster.name, m.name());
        let perf = PerfModel::new(
            &mosaic_fit::write_fitted(profile, e),
            PLAN_GRANULARITY,
            &name,
        )?;
        let mut plan = solve(&perf, gpus, &opts).with_context(|| format!("{name}: no plan"))?;
        plan.model = Some(model.name.clone());
        plan.cluster = Some(cluster.name.clone());
        let sim = mosaic_sim::simulate(&plan, &name, model, cluster)?;
        rows.push(EndToEnd {
            model: m,
            interference: e,
            stages: plan.stages.len(),
            search: plan.search.clone(),
            predicted_ms: plan.iteration_ms,
            simulated_ms: sim.iteration_ms,
            normalized: 1.0,
        });
    }
    let base = rows[0].simulated_ms;
    for r in &mut rows {
        r.normalized = r.simulated_ms / base;
    }
    Ok(rows)
}

fn pct(x: f64) -> String {
    format!("{:.2}%", 100.0 * x)
}

fn r2(x: Option<f64>) -> String {
    x.map_or("n/a".into(), |v| format!("{v:.3}"))
}

/// The result as readable tables.
fn summary(o: &Output) -> String {
    let mut s = String::new();
    let w = Model::ALL
        .iter()
        .map(|m| m.describe().chars().count())
        .max()
        .unwrap_or(10);
    fit_header(&mut s, o);
    fit_table(&mut s, &o.fit, w);
    by_modules(&mut s, &o.fit);
    surface(&mut s, &o.surface);
    if let Some(rows) = &o.end_to_end {
        end_to_end_table(&mut s, &o.profiles, rows, w);
    }
    s
}

/// What was fitted against what, how the samples were split, and the measured slowdown.
fn fit_header(s: &mut String, o: &Output) {
    let f = &o.fit;
    let split = if f.held_out {
        format!(
            "fitted on {}, tested on {} held-out samples (every {}th)",
            f.train_samples, f.test_samples, f.holdout_every
        )
    } else {
        format!(
            "all {} fitted and tested on (fewer than {} samples: nothing held out)",
            f.samples, f.holdout_every
        )
    };
    let _ = writeln!(
        s,
        "interference fit: {} colocations ({}) against {}\n{split}\nheld-out measured slowdown \
         (time / f_m(dp, sm) − 1): mean {}, max {}\n",
        f.samples,
        o.colocations,
        o.profiles,
        pct(f.mean_slowdown),
        pct(f.max_slowdown)
    );
}

/// Each model's coefficients and held-out accuracy; `w`: the model column's width.
fn fit_table(s: &mut String, f: &FitReport, w: usize) {
    let _ = writeln!(
        s,
        "{:<w$}  {:>7}  {:>7}  {:>7}  {:>8}  {:>11}  {:>8}  {:>8}",
        "model (fitted; held-out accuracy)",
        "e1",
        "e2",
        "e3",
        "R² time",
        "R² slowdown",
        "mean err",
        "max err"
    );
    for m in &f.models {
        let e = m.interference;
        let _ = writeln!(
            s,
            "{:<w$}  {:>7.4}  {:>7.4}  {:>7.4}  {:>8}  {:>11}  {:>8}  {:>8}",
            m.model.describe(),
            e.e1,
            e.e2,
            e.e3,
            m.test.r2.map_or("n/a".into(), |v| format!("{v:.6}")),
            r2(m.test.r2_slowdown),
            pct(m.test.mean_rel_err),
            pct(m.test.max_rel_err)
        );
    }
    let _ = writeln!(
        s,
        "best slowdown R² any GPU-wide Δ (one Δ for all modules of a colocation, as Eq. 8) \
         could reach on these samples: {}",
        r2(f.ceiling_r2_slowdown)
    );
}

/// Held-out error by the number of co-located modules (Fig. 12a).
fn by_modules(s: &mut String, f: &FitReport) {
    let _ = writeln!(
        s,
        "\nheld-out mean (max) relative error by co-located modules (Fig. 12a):"
    );
    let _ = writeln!(
        s,
        "{:>7}  {:>7}  {:>13}  {:>15}  {:>15}  {:>15}",
        "modules", "samples", "mean slowdown", "unaware", "additive", "full"
    );
    let groups = &f.model(Model::Unaware).by_modules;
    for (g, b) in groups.iter().enumerate() {
        let cell = |m: Model| {
            let a = f.model(m).by_modules[g].accuracy;
            format!("{} ({})", pct(a.mean_rel_err), pct(a.max_rel_err))
        };
        let _ = writeln!(
            s,
            "{:>7}  {:>7}  {:>13}  {:>15}  {:>15}  {:>15}",
            b.modules,
            b.samples,
            pct(b.mean_slowdown),
            cell(Model::Unaware),
            cell(Model::Additive),
            cell(Model::Full)
        );
    }
}

/// The scaling surface's accuracy and the profiling cost it saves (§3.3).
fn surface(s: &mut String, sf: &Surface) {
    let worst = |a: &SurfaceAccuracy| {
        a.worst.as_ref().map_or(String::new(), |p| {
            format!(
                " (worst: {} at dp {} quota {:.2}: {:.2} ms interpolated vs {:.2} ms)",
                p.module, p.dp, p.sm, p.interpolated_ms, p.actual_ms
            )
        })
    };
    let l = &sf.leave_one_out;
    let _ = writeln!(
        s,
        "\nscaling surface (§3.3), linear in the quota between profiled quotas of one dp:\n  \
         leave-one-out at {} interior profiled points: mean {}, max {}{}",
        l.points,
        pct(l.mean_rel_err),
        pct(l.max_rel_err),
        worst(l)
    );
    if let Some(d) = &sf.dense {
        let _ = writeln!(
            s,
            "  against the device model at every unprofiled 1% quota: {} points, mean {}, max {}{}",
            d.points,
            pct(d.mean_rel_err),
            pct(d.max_rel_err),
            worst(d)
        );
    }
    let c = &sf.cost;
    let _ = writeln!(
        s,
        "  profiling cost ({} iterations per point, one after another): sparse grid {} points, \
         {:.0} s; dense grid (dp 1–{}, every {}% quota) {} points, {:.0} s{}: {:.1}× the time, \
         {:.1}× the points",
        c.iterations,
        c.sparse_points,
        c.sparse_s,
        c.max_dp,
        (c.dense_step * 100.0).round(),
        c.dense_points,
        c.dense_s,
        if c.dense_estimated {
            " (estimated from the sparse surface)"
        } else {
            ""
        },
        c.time_ratio,
        c.point_ratio
    );
}

/// Each fitted model's plan, predicted and simulated (Fig. 12b); `w`: the model column's width.
fn end_to_end_table(s: &mut String, profiles: &str, rows: &[EndToEnd], w: usize) {
    let _ = writeln!(
        s,
        "\nend to end (Fig. 12b): {profiles} planned with each model's coefficients, each plan \
         executed in the simulator"
    );
    let _ = writeln!(
        s,
        "{:<w$}  {:>6}  {:>12}  {:>12}  {:>10}",
        "model", "stages", "predicted ms", "simulated ms", "vs unaware"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<w$}  {:>6}  {:>12.1}  {:>12.1}  {:>10.3}",
            r.model.describe(),
            r.stages,
            r.predicted_ms,
            r.simulated_ms,
            r.normalized
        );
    }
}
