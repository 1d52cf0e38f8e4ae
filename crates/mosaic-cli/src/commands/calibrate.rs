//! `mosaic calibrate`: fits the zoo's analytical device model to a measured profile and writes
//! a `mosaic-calibration/1` file; `load` reads one for the commands that take `--calibration`.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use mosaic_fit::calibrate::{
    accuracy, check_constants, check_enough_points, host_refit, match_profile, CalibrationFile,
    FitQuality, FittedOn, HostRefit, ModuleAccuracy, Target, CALIBRATION_FORMAT,
};
use mosaic_zoo::{Calibration, FreeConstant};
use serde::Serialize;

use crate::input::{check_outputs, BadInput, Loaded, Source};

/// Arguments of `mosaic calibrate`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The measured mosaic-profiles/1 file.
    #[arg(long)]
    profiles: PathBuf,
    /// The built-in model it measured (see `mosaic zoo`); its modules must match by name.
    #[arg(long)]
    model: String,
    /// The built-in device it was measured on, e.g. h100 (see `mosaic zoo`).
    #[arg(long)]
    device: String,
    /// The measured times include the gradient all-reduce (dp on real GPUs, not emulated).
    #[arg(long)]
    allreduce: bool,
    /// Where to write the mosaic-calibration/1 file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print the calibration and its accuracy as JSON.
    #[arg(long)]
    json: bool,
}

/// The `--json` document.
#[derive(Serialize)]
struct Report<'a> {
    calibration: &'a CalibrationFile,
    /// Errors per module and overall (`all`): in-sample, leave one module out, uncalibrated.
    accuracy: &'a [ModuleAccuracy],
    /// The built-in constants with only the host's re-fitted to these measurements.
    host_refit: &'a HostRefit,
}

/// Runs `mosaic calibrate`.
pub fn run(args: Args) -> Result<()> {
    check_outputs(
        &[("--out", args.out.as_deref())],
        &[("--profiles", Some(&args.profiles))],
    )?;
    let model = mosaic_zoo::model(&args.model)?;
    let device = mosaic_zoo::devices()
        .into_iter()
        .find(|d| d.short_name.eq_ignore_ascii_case(&args.device))
        .ok_or_else(|| {
            let known: Vec<String> = mosaic_zoo::devices()
                .into_iter()
                .map(|d| d.short_name)
                .collect();
            BadInput(format!(
                "--device: unknown device `{}` (known: {})",
                args.device,
                known.join(", ")
            ))
        })?;
    let profile = mosaic_profile::load(&args.profiles)?;
    let points = match_profile(&profile, &args.profiles, &model, &device)?;
    let free = FreeConstant::ALL;
    check_enough_points(&points, &free, &args.profiles)?;
    let cluster = mosaic_zoo::cluster(&format!(
        "{}x{}",
        device.short_name,
        mosaic_zoo::GPUS_PER_NODE
    ))?;
    let target = Target {
        model: &model,
        cluster: &cluster,
        allreduce: args.allreduce,
        points,
    };
    let start = Calibration::default();
    let fitted = target.fit(&start, &free, |_| true);
    // The fit keeps each constant within its bounds, but constants that are together too slow
    // would give profiles the planner refuses, and `--calibration` would refuse the file.
    check_constants(&fitted).map_err(|(field, msg)| {
        BadInput(format!(
            "{}: the constants fitted to its samples are no calibration of a real GPU: field \
             `{field}`: {msg}",
            args.profiles.display()
        ))
    })?;
    let file = CalibrationFile {
        format: CALIBRATION_FORMAT.into(),
        constants: fitted,
        fitted: free.iter().map(|c| c.name().to_string()).collect(),
        fitted_on: FittedOn {
            profiles: args.profiles.display().to_string(),
            model: model.name.clone(),
            device: device.name.clone(),
            modules: profile.modules.iter().map(|m| m.name.clone()).collect(),
            allreduce: args.allreduce,
        },
        error: target.quality(&fitted, |_| true),
    };
    let rows = accuracy(
        &target,
        &fitted,
        &Calibration::assumed(),
        &Calibration::default(),
        &start,
        &free,
    );
    let host = host_refit(&target, &Calibration::default());
    for r in rows
        .iter()
        .filter(|r| r.module != "all" && r.held_out_fitted_on < free.len())
    {
        eprintln!(
            "warning: {}: held out, `{}` is predicted by a fit of {} constants to {} samples: \
             its held-out errors predict nothing",
            args.profiles.display(),
            r.module,
            free.len(),
            r.held_out_fitted_on
        );
    }
    if let Some(out) = &args.out {
        let json = serde_json::to_string_pretty(&file)? + "\n";
        std::fs::write(out, json).with_context(|| format!("cannot write {}", out.display()))?;
        eprintln!("wrote {}", out.display());
    }
    if args.json {
        let report = Report {
            calibration: &file,
            accuracy: &rows,
            host_refit: &host,
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&file, &rows, &host));
    }
    Ok(())
}

/// The fitted constants, the accuracy table and the host's share of the built-in miss, as text.
fn render(file: &CalibrationFile, rows: &[ModuleAccuracy], host: &HostRefit) -> String {
    let mut s = String::new();
    let on = &file.fitted_on;
    let _ = writeln!(
        s,
        "calibrated {} on {} from {}",
        on.model, on.device, on.profiles
    );
    for c in FreeConstant::ALL {
        let _ = writeln!(s, "  {:<16} {:.4}", c.name(), c.get(&file.constants));
    }
    let e = &file.error;
    let _ = writeln!(
        s,
        "fit: {} points, rms log error {:.4}, mean error {:.1} %, max {:.1} %\n",
        e.points,
        e.rms_log,
        100.0 * e.mean_rel,
        100.0 * e.max_rel
    );
    let _ = writeln!(s, "mean (max) relative error, %:");
    let _ = writeln!(
        s,
        "{:<8} {:>14} {:>14} {:>14} {:>14} {:>14} {:>14} {:>14} {:>14}",
        "module",
        "fit dp1",
        "fit all dp",
        "held-out dp1",
        "held-out all",
        "assumed dp1",
        "assumed all",
        "built-in dp1",
        "built-in all"
    );
    let cell = |q: &FitQuality| format!("{:.1} ({:.0})", 100.0 * q.mean_rel, 100.0 * q.max_rel);
    for r in rows {
        let _ = writeln!(
            s,
            "{:<8} {:>14} {:>14} {:>14} {:>14} {:>14} {:>14} {:>14} {:>14}",
            r.module,
            cell(&r.in_sample_dp1),
            cell(&r.in_sample),
            cell(&r.held_out_dp1),
            cell(&r.held_out),
            cell(&r.assumed_dp1),
            cell(&r.assumed),
            cell(&r.built_in_dp1),
            cell(&r.built_in)
        );
    }
    let _ = writeln!(
        s,
        "held-out: fitted on the other modules, predicting this one; assumed: the constants \
         before calibration; built-in: the default constants (the fit to \
         examples/h100-clip-profile.json), as `mosaic profile` uses them"
    );
    let (d, h) = (Calibration::default(), &host.constants);
    let _ = writeln!(
        s,
        "host: the built-in constants with only the host's re-fitted (launch {:.1} → {:.1} µs, \
         step {:.2} → {:.2} ms) predict dp 1 at {:.1} % instead of {:.1} %; what remains is the \
         GPU model's",
        d.launch_us,
        h.launch_us,
        d.launch_step_ms,
        h.launch_step_ms,
        100.0 * host.refitted_dp1.mean_rel,
        100.0 * host.built_in_dp1.mean_rel
    );
    s
}

/// The device model's constants from `--calibration FILE`, or the built-in default.
pub fn load(path: Option<&Path>) -> Result<Calibration> {
    let Some(path) = path else {
        return Ok(Calibration::default());
    };
    let name = path.display();
    let text = read_bounded(path)
        .map_err(|e| BadInput(format!("{name}: cannot read the calibration file: {e}")))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| BadInput(format!("{name}: not JSON: {e}")))?;
    match value.get("format").and_then(|f| f.as_str()) {
        Some(CALIBRATION_FORMAT) => {}
        Some(other) => {
            return Err(BadInput(format!(
                "{name}: field `format`: `{other}`, expected `{CALIBRATION_FORMAT}`"
            ))
            .into())
        }
        None => {
            return Err(BadInput(format!(
                "{name}: field `format`: missing, expected `{CALIBRATION_FORMAT}`"
            ))
            .into())
        }
    }
    let constants = value
        .get("constants")
        .ok_or_else(|| BadInput(format!("{name}: field `constants`: missing")))?;
    let cal: Calibration = serde_json::from_value(constants.clone())
        .map_err(|e| BadInput(format!("{name}: field `constants`: {e}")))?;
    check_constants(&cal)
        .map_err(|(field, msg)| BadInput(format!("{name}: field `{field}`: {msg}")))?;
    Ok(cal)
}

/// The most bytes a calibration file may have: one is a few hundred; this refuses `/dev/zero`
/// or a data file given by mistake before it fills memory.
const MAX_CALIBRATION_BYTES: u64 = 1 << 20;

/// The text of the file at `path`: a regular file (a FIFO or a device is refused at once, not
/// waited on) of at most [`MAX_CALIBRATION_BYTES`].
fn read_bounded(path: &Path) -> std::io::Result<String> {
    mosaic_kit::files::read_text(path, MAX_CALIBRATION_BYTES)
}

/// The profiles of `source`, those of a built-in model computed with `--calibration FILE`'s
/// constants when one is given (a `--profiles` file is refused with it: it is already a profile).
pub fn load_source(source: &Source, calibration: Option<&Path>) -> Result<Loaded> {
    let Some(path) = calibration else {
        return source.load();
    };
    let (Some(model), None) = (&source.model, &source.profiles) else {
        return Err(BadInput(
            "--calibration: applies to a built-in model (--model NAME --cluster NAME), not to a \
             --profiles file"
                .into(),
        )
        .into());
    };
    let cal = load(Some(path))?;
    let mut loaded = source.load()?;
    let spec = mosaic_zoo::model(model)?;
    let cluster = mosaic_zoo::cluster(source.cluster.as_deref().unwrap_or_default())?;
    let file = cal.profile(&spec, &cluster);
    loaded.model = mosaic_profile::PerfModel::new(&file, source.granularity, &loaded.name)?;
    loaded.label = format!("{} (calibration {})", loaded.label, path.display());
    Ok(loaded)
}
