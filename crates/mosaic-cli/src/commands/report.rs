//! `mosaic report`: the paper's headline experiments side by side (Mosaic §5.2, §5.4.1).
//!
//! Runs every built-in model of the paper's evaluation on 8 and 32 H100s with every strategy
//! of `mosaic compare`, executes the staged plans in the simulator, sweeps OFASys-4 over 8, 16
//! and 32 GPUs, and writes a Markdown table, bar charts like the paper's Figs. 9, 10 and 14a,
//! and the data as JSON.

use std::fmt::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use mosaic_compare::{compare, CompareOptions, Strategy, StrategyResult};
use mosaic_profile::PerfModel;
use mosaic_zoo::Calibration;
use serde::Serialize;

use crate::chart::BarChart;
use crate::input::create_output_dir;

/// The models of the paper's Figs. 9 and 10 (§5.1).
const MODELS: [&str; 6] = [
    "clip",
    "qwen3-vl",
    "unified-io-2",
    "imagebind",
    "ofasys",
    "ctvlm",
];
/// The paper's two cluster scales (§5.1): one HGX node and four.
const CLUSTERS: [&str; 2] = ["h100x8", "h100x32"];
/// The cluster-scale sweep of Fig. 14a.
const SWEEP: [&str; 3] = ["h100x8", "h100x16", "h100x32"];
/// The strategies the charts show (GAHC's row is in the JSON).
const SHOWN: [Strategy; 6] = [
    Strategy::MegatronLm,
    Strategy::DistMm,
    Strategy::Spindle,
    Strategy::DistTrain,
    Strategy::FlowTrain,
    Strategy::MosaicExact,
];

/// Arguments of `mosaic report`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Directory to write table.md, iteration.svg, utilisation.svg, scale.svg, report.json.
    #[arg(long, default_value = "report")]
    out: PathBuf,
    /// A mosaic-calibration/1 file (`mosaic calibrate --out`): the device model's constants
    /// (default: the built-in fit to examples/h100-clip-profile.json).
    #[arg(long, value_name = "FILE")]
    calibration: Option<PathBuf>,
}

/// One model on one cluster.
#[derive(Serialize)]
struct Case {
    model: String,
    cluster: String,
    gpus: u32,
    rows: Vec<StrategyResult>,
    /// Simulated iteration time of each staged strategy's plan, by strategy id.
    simulated_ms: Vec<(Strategy, f64)>,
}

impl Case {
    fn time(&self, s: Strategy) -> f64 {
        self.rows
            .iter()
            .find(|r| r.strategy == s)
            .map_or(f64::NAN, |r| r.iteration_ms)
    }
    fn util(&self, s: Strategy) -> f64 {
        self.rows
            .iter()
            .find(|r| r.strategy == s)
            .map_or(f64::NAN, |r| r.mean_util)
    }
    fn simulated(&self, s: Strategy) -> Option<f64> {
        self.simulated_ms
            .iter()
            .find(|(x, _)| *x == s)
            .map(|(_, t)| *t)
    }
}

fn run_case(cal: &Calibration, model: &str, cluster: &str) -> Result<Case> {
    let spec = mosaic_zoo::model(model)?;
    let cluster = mosaic_zoo::cluster(cluster)?;
    let file = cal.profile(&spec, &cluster);
    let perf = PerfModel::new(&file, 0.1, format!("{}@{}", spec.name, cluster.name))?;
    let opts = CompareOptions {
        global_batch: Some(spec.batch_on(&cluster)),
        ..Default::default()
    };
    let rows = compare(&perf, cluster.gpus(), &opts)?;
    let mut simulated_ms = Vec::new();
    for r in &rows {
        if let Some(plan) = &r.plan {
            let name = format!("{} plan of {} on {}", r.name, spec.name, cluster.name);
            let options = mosaic_sim::SimOptions {
                calibration: *cal,
                ..Default::default()
            };
            let sim = mosaic_sim::simulate_with(plan, name, &spec, &cluster, &options)?;
            simulated_ms.push((r.strategy, sim.iteration_ms));
        }
    }
    Ok(Case {
        model: spec.name.clone(),
        cluster: cluster.name.clone(),
        gpus: cluster.gpus(),
        rows,
        simulated_ms,
    })
}

/// The smallest and largest of `xs`, as "a–b×".
fn range(xs: &[f64]) -> String {
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = xs.iter().copied().fold(0.0, f64::max);
    format!("{lo:.2}–{hi:.2}×")
}

/// Runs `mosaic report`.
pub fn run(args: Args) -> Result<()> {
    let cal = super::calibrate::load(args.calibration.as_deref())?;
    create_output_dir("--out", &args.out)?;
    let mut cases = Vec::new();
    for cluster in CLUSTERS {
        for model in MODELS {
            cases.push(run_case(&cal, model, cluster)?);
        }
    }
    let sweep: Vec<Case> = SWEEP
        .iter()
        .map(|c| run_case(&cal, "ofasys-4", c))
        .collect::<Result<_>>()?;
    let mut md = String::new();
    headline_table(&mut md, &cases);
    sweep_table(&mut md, &sweep);
    let [iteration, utilisation, scale] = charts(&cases, &sweep);
    let write = |name: &str, text: &str| -> Result<()> {
        let path = args.out.join(name);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))
    };
    write("table.md", &md)?;
    write("iteration.svg", &iteration.svg())?;
    write("utilisation.svg", &utilisation.svg())?;
    write("scale.svg", &scale.svg())?;
    let json = serde_json::json!({"format": "mosaic-report/1", "cases": cases, "sweep": sweep});
    write(
        "report.json",
        &(serde_json::to_string_pretty(&json)? + "\n"),
    )?;
    print!("{md}");
    eprintln!(
        "wrote table.md, iteration.svg, utilisation.svg, scale.svg and report.json to {}",
        args.out.display()
    );
    Ok(())
}

/// The headline table (Figs. 9 and 10): every case's times, speedups, utilisation and
/// simulated times, and Mosaic's speedup ranges.
fn headline_table(md: &mut String, cases: &[Case]) {
    let _ = writeln!(
        md,
        "Predicted iteration time in ms (per global batch for † pipelined strategies) from the\n\
         analytical profiles, Mosaic (exact)'s speedup over each, mean GPU utilisation, and the\n\
         simulated iteration time of the staged plans. Made by `mosaic report`.\n"
    );
    let _ = writeln!(
        md,
        "| model | GPUs | Megatron-LM | DistMM | Spindle | DistTrain † | FlowTrain † | Mosaic GAHC | Mosaic exact | \
         × Spindle | × DistMM | × Megatron | util Spindle → Mosaic | simulated Megatron / DistMM / Mosaic |"
    );
    let _ = writeln!(
        md,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for c in cases {
        let t = |s| c.time(s);
        let m = t(Strategy::MosaicExact);
        let sim = |s| {
            c.simulated(s)
                .map_or("–".to_string(), |v| format!("{v:.1}"))
        };
        let _ = writeln!(
            md,
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2}× | {:.2}× | {:.2}× | {:.0}% → {:.0}% | {} / {} / {} |",
            c.model,
            c.gpus,
            t(Strategy::MegatronLm),
            t(Strategy::DistMm),
            t(Strategy::Spindle),
            t(Strategy::DistTrain),
            t(Strategy::FlowTrain),
            t(Strategy::MosaicGahc),
            m,
            t(Strategy::Spindle) / m,
            t(Strategy::DistMm) / m,
            t(Strategy::MegatronLm) / m,
            100.0 * c.util(Strategy::Spindle),
            100.0 * c.util(Strategy::MosaicExact),
            sim(Strategy::MegatronLm),
            sim(Strategy::DistMm),
            sim(Strategy::MosaicExact),
        );
    }
    let over = |s: Strategy| -> Vec<f64> {
        cases
            .iter()
            .map(|c| c.time(s) / c.time(Strategy::MosaicExact))
            .collect()
    };
    let _ = writeln!(
        md,
        "\nMosaic (exact) over Spindle {}, over DistMM {}, over Megatron-LM {} (the paper, Fig. 9: \
         1.07–1.31×, 1.10–1.42×, 1.17–1.48×).",
        range(&over(Strategy::Spindle)),
        range(&over(Strategy::DistMm)),
        range(&over(Strategy::MegatronLm))
    );
}

/// OFASys-4's throughput by cluster size (Fig. 14a).
fn sweep_table(md: &mut String, sweep: &[Case]) {
    let _ = writeln!(
        md,
        "\nOFASys-4 throughput (iterations/s) by cluster size (the paper's Fig. 14a):\n"
    );
    let _ = writeln!(md, "| GPUs | Megatron-LM | DistMM | Spindle | Mosaic exact | × Megatron | × DistMM | × Spindle |");
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    for c in sweep {
        let tp = |s| 1000.0 / c.time(s);
        let m = tp(Strategy::MosaicExact);
        let _ = writeln!(
            md,
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2}× | {:.2}× | {:.2}× |",
            c.gpus,
            tp(Strategy::MegatronLm),
            tp(Strategy::DistMm),
            tp(Strategy::Spindle),
            m,
            m / tp(Strategy::MegatronLm),
            m / tp(Strategy::DistMm),
            m / tp(Strategy::Spindle)
        );
    }
}

/// The charts: iteration time and utilisation of every case, and the sweep's throughput.
fn charts(cases: &[Case], sweep: &[Case]) -> [BarChart<'static>; 3] {
    let groups: Vec<String> = cases
        .iter()
        .map(|c| format!("{} ×{}", c.model, c.gpus))
        .collect();
    let series: Vec<String> = SHOWN.iter().map(|s| s.name().to_string()).collect();
    let iteration = BarChart {
        title: "Iteration time normalised to Mosaic (exact) (cf. the paper's Fig. 9)",
        y_label: "time / Mosaic's",
        groups: groups.clone(),
        series: series.clone(),
        values: cases
            .iter()
            .map(|c| {
                SHOWN
                    .iter()
                    .map(|&s| Some(c.time(s) / c.time(Strategy::MosaicExact)))
                    .collect()
            })
            .collect(),
    };
    let utilisation = BarChart {
        title: "Mean GPU utilisation, SM-time used / available (cf. the paper's Fig. 10)",
        y_label: "utilisation",
        groups,
        series: series.clone(),
        values: cases
            .iter()
            .map(|c| SHOWN.iter().map(|&s| Some(c.util(s))).collect())
            .collect(),
    };
    let scale = BarChart {
        title: "OFASys-4 throughput by pool size (cf. the paper's Fig. 14a)",
        y_label: "iterations / s",
        groups: sweep.iter().map(|c| format!("{} GPUs", c.gpus)).collect(),
        series,
        values: sweep
            .iter()
            .map(|c| SHOWN.iter().map(|&s| Some(1000.0 / c.time(s))).collect())
            .collect(),
    };
    [iteration, utilisation, scale]
}
