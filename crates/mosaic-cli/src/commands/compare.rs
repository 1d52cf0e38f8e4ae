//! `mosaic compare`: Mosaic against Megatron-LM, DistMM, Spindle, DistTrain and FlowTrain on
//! the same profiles and pool.

use std::fmt::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use mosaic_compare::{
    compare, with_data, CompareError, CompareOptions, DataBatch, Strategy, StrategyResult,
};
use mosaic_plan::PlanError;
use serde::Serialize;

use crate::input::{BadInput, Loaded, Samples, Source};

/// The value of the `format` field of `mosaic compare --json`.
pub const COMPARE_FORMAT: &str = "mosaic-compare/1";

/// Arguments of `mosaic compare`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    source: Source,
    /// Milliseconds each exact stage search (Mosaic's and DistMM's) may take before GAHC's
    /// plan is used.
    #[arg(long, default_value_t = 2000)]
    time_budget: u64,
    /// With --model: a mosaic-calibration/1 file (`mosaic calibrate --out`): the device model's constants
    /// (default: the built-in fit to examples/h100-clip-profile.json).
    #[arg(long, value_name = "FILE")]
    calibration: Option<PathBuf>,
    /// Print the comparison as JSON (the input, notes, and one row per strategy with its plan).
    #[arg(long)]
    json: bool,
    /// Spindle: synchronisation cost of each extra slice of a module, in ms.
    #[arg(long, default_value_t = 2.0)]
    slice_sync_ms: f64,
    /// DistTrain: fixed cost of a module's step that every microbatch pays again, in ms.
    #[arg(long, default_value_t = 2.0)]
    step_overhead_ms: f64,
    /// The global batch the profiles were taken at (bounds DistTrain's microbatches; default:
    /// the built-in model's batch on the cluster, unknown for --profiles). Not with --samples,
    /// whose file is the batch.
    #[arg(long, conflicts_with = "samples")]
    global_batch: Option<u32>,
    /// A batch of variable-size samples: every row then includes data heterogeneity
    /// (DistTrain and FlowTrain with their own batching policies, the others with shuffled
    /// equal shares per module replica).
    #[command(flatten)]
    data: Samples,
}

/// The `--json` document.
#[derive(Serialize)]
struct Report<'a> {
    format: &'static str,
    input: InputInfo<'a>,
    notes: Vec<String>,
    rows: Vec<Row<'a>>,
}

/// What was compared.
#[derive(Serialize)]
struct InputInfo<'a> {
    label: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster: Option<&'a str>,
    device: &'a str,
    gpus: u32,
    granularity: f64,
    max_profiled_dp: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    global_batch: Option<u32>,
}

/// One strategy's row: its result and how much faster Mosaic (exact) is.
#[derive(Serialize)]
struct Row<'a> {
    #[serde(flatten)]
    result: &'a StrategyResult,
    /// This row's time over Mosaic (exact)'s.
    mosaic_exact_speedup: f64,
}

/// Runs `mosaic compare`.
pub fn run(args: Args) -> Result<()> {
    check(&args)?;
    let input = super::calibrate::load_source(&args.source, args.calibration.as_deref())?;
    let global_batch = match args.global_batch {
        Some(b) => Some(b),
        None => zoo_batch(&input)?,
    };
    let opts = CompareOptions {
        budget: Duration::from_millis(args.time_budget),
        slice_sync_ms: args.slice_sync_ms,
        step_overhead_ms: args.step_overhead_ms,
        global_batch,
    };
    let batch = data_batch(&args.data, &input, global_batch)?;
    let rows = compare(&input.model, input.gpus, &opts).and_then(|mut rows| {
        if let Some(b) = &batch {
            with_data(&mut rows, b)?;
        }
        Ok(rows)
    });
    let rows = rows.map_err(|e| match e {
        CompareError::NoGpus
        | CompareError::NoWholeGpu { .. }
        | CompareError::NoFit { .. }
        | CompareError::Plan {
            source: PlanError::Unplaceable { .. } | PlanError::TooManyGpus { .. },
            ..
        } => anyhow::Error::from(BadInput(format!("{}: {e}", input.name))),
        other => anyhow::Error::from(other).context(format!("{}: no comparison", input.name)),
    })?;
    let mosaic_ms = rows
        .iter()
        .find(|r| r.strategy == Strategy::MosaicExact)
        .map(|r| r.iteration_ms)
        .expect("compare reports Mosaic (exact)");
    let max_dp = input
        .model
        .modules
        .iter()
        .flat_map(|m| m.options.iter().map(|o| o.dp))
        .max()
        .unwrap_or(1);
    let mut notes = notes(&input, max_dp, global_batch);
    if let Some(b) = &batch {
        notes.push(format!(
            "data: {}, sample cost α·l² + β·l (α = {:.3e}, β = {:.3e} ms); times include data \
             heterogeneity (each row's note says how)",
            b.label, b.alpha, b.beta
        ));
    }
    if args.json {
        let info = InputInfo {
            label: &input.label,
            model: input.zoo_model.as_deref(),
            cluster: input.cluster.as_deref(),
            device: &input.model.device.name,
            gpus: input.gpus,
            granularity: input.model.granularity(),
            max_profiled_dp: max_dp,
            global_batch,
        };
        print_json(info, notes, &rows, mosaic_ms)?;
    } else {
        print!("{}", table(&input, &rows, mosaic_ms, &notes));
    }
    Ok(())
}

/// The batch of `--samples`/`--generate`, costed by the built-in model's backbone on the
/// cluster's device, or Qwen3-VL's on an H100 for a profile file (said in the label).
fn data_batch(
    data: &Samples,
    input: &Loaded,
    global_batch: Option<u32>,
) -> Result<Option<DataBatch>> {
    let default_count = global_batch.map_or(1024, |b| b as usize);
    let Some((sizes, source)) = data.load(default_count)? else {
        return Ok(None);
    };
    let (spec, device) = match (&input.zoo_model, &input.cluster) {
        (Some(m), Some(c)) => (mosaic_zoo::model(m)?, mosaic_zoo::cluster(c)?.device),
        _ => (
            mosaic_zoo::model("qwen3-vl")?,
            mosaic_zoo::cluster("h100x8")?.device,
        ),
    };
    let (cost, costed) = match super::data::sequence_cost(&spec, &device) {
        Ok(c) => c,
        // A model without an LLM (CLIP, ImageBind): Qwen3-VL's backbone sets the attention
        // share of a sequence's cost.
        Err(_) => super::data::sequence_cost(&mosaic_zoo::model("qwen3-vl")?, &device)?,
    };
    Ok(Some(DataBatch {
        sizes,
        alpha: cost.alpha_ms,
        beta: cost.beta_ms,
        seed: data.seed,
        label: format!("{source}, costed as {costed}"),
    }))
}

/// Refuses costs and batches that make no sense.
fn check(args: &Args) -> Result<()> {
    for (flag, v) in [
        ("--slice-sync-ms", args.slice_sync_ms),
        ("--step-overhead-ms", args.step_overhead_ms),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(BadInput(format!("{flag}: expected a time ≥ 0 in ms, found {v}")).into());
        }
    }
    if args.global_batch == Some(0) {
        return Err(BadInput("--global-batch: expected at least 1 sample".into()).into());
    }
    Ok(())
}

/// What the reader should know: unprofiled dp values, and DistTrain's batch.
fn notes(input: &Loaded, max_dp: u32, global_batch: Option<u32>) -> Vec<String> {
    let mut notes = Vec::new();
    if max_dp < input.gpus {
        notes.push(format!(
            "the profiles go up to dp {max_dp}: dp values that were not profiled are not \
             candidates, so no module runs on more than {max_dp} of the {} GPUs",
            input.gpus
        ));
    }
    notes.push(match global_batch {
        Some(b) => {
            format!("DistTrain: global batch {b}, every replica gets ≥ 1 sample per microbatch")
        }
        None => format!(
            "DistTrain: global batch unknown, at most {} microbatches (give --global-batch)",
            mosaic_compare::DEFAULT_MAX_MICROBATCHES
        ),
    });
    notes
}

/// The `--json` document on standard output.
fn print_json(
    input: InputInfo<'_>,
    notes: Vec<String>,
    rows: &[StrategyResult],
    mosaic_ms: f64,
) -> Result<()> {
    let report = Report {
        format: COMPARE_FORMAT,
        input,
        notes,
        rows: rows
            .iter()
            .map(|r| Row {
                result: r,
                mosaic_exact_speedup: r.iteration_ms / mosaic_ms,
            })
            .collect(),
    };
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

/// The built-in model's global batch on its cluster, when the profiles come from the zoo.
fn zoo_batch(input: &Loaded) -> Result<Option<u32>> {
    Ok(match (&input.zoo_model, &input.cluster) {
        (Some(model), Some(cluster)) => {
            Some(mosaic_zoo::model(model)?.batch_on(&mosaic_zoo::cluster(cluster)?))
        }
        _ => None,
    })
}

/// The comparison as a table.
fn table(input: &Loaded, rows: &[StrategyResult], mosaic_ms: f64, notes: &[String]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{}: {} × {}, {}\n",
        input.label,
        input.gpus,
        input.model.device.name,
        mosaic_plan::render::quota_grid(
            input.model.granularity(),
            input.model.device.partitioned_sms()
        )
    );
    let name = |r: &StrategyResult| {
        if r.pipelined {
            format!("{} †", r.name)
        } else {
            r.name.clone()
        }
    };
    let w = rows
        .iter()
        .map(|r| name(r).chars().count())
        .max()
        .unwrap_or(8)
        .max(8);
    let _ = writeln!(
        s,
        "{:<w$}  {:>10}  {:>9}  {:>9}  {:>8}  plan",
        "strategy", "time ms", "Mosaic ×", "mean util", "min util"
    );
    for r in rows {
        let n = name(r);
        let pad = w - n.chars().count();
        let _ = writeln!(
            s,
            "{n}{:pad$}  {:>10.1}  {:>8.2}×  {:>8.1}%  {:>7.1}%  {}",
            "",
            r.iteration_ms,
            r.iteration_ms / mosaic_ms,
            100.0 * r.mean_util,
            100.0 * r.min_util,
            r.description
        );
    }
    let _ = writeln!(
        s,
        "\n† pipelined: time per global batch (DistTrain: 1F1B with fill and drain; FlowTrain: \
         steady state)\nMosaic × is Mosaic (exact)'s speedup over the row; utilisation is \
         quota × time × profiled sm_util over the time, per GPU"
    );
    for r in rows {
        if let Some(note) = &r.note {
            let _ = writeln!(s, "{}: {note}", r.name);
        }
    }
    for n in notes {
        let _ = writeln!(s, "note: {n}");
    }
    s
}
