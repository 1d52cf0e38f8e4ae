//! `mosaic data`: one global batch of variable-size samples through the batching policies of
//! the peers (random, DistTrain's reordering, FlowTrain's packing), simulated over a DP × PP
//! grid of 1F1B pipelines; and (`mosaic data write`, with the engine) the data an engine model
//! trains on, as a file.

#[cfg(feature = "engine")]
mod write;

use anyhow::Result;
use mosaic_data::{evaluate, DataError, Layout, PackError, Params, Policy, Report};
use mosaic_zoo::{Calibration, DeviceSpec, ModelSpec, Role, TokenCost};

use crate::input::{BadInput, Samples};

/// Arguments of `mosaic data`: a simulation of the batching policies, or a verb.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    verb: Option<Verb>,
    #[command(flatten)]
    simulate: SimulateArgs,
}

/// What `mosaic data` does besides simulating.
#[derive(clap::Subcommand, Debug)]
enum Verb {
    /// Write the synthetic batches a training run would see as a safetensors file for
    /// `mosaic train --data` (needs the engine feature).
    #[cfg_attr(not(feature = "engine"), command(disable_help_flag = true))]
    Write(WriteArgs),
}

#[cfg(not(feature = "engine"))]
use super::no_engine::Args as WriteArgs;
#[cfg(feature = "engine")]
use write::WriteArgs;

/// A policy as the command line names it.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum PolicyName {
    /// Shuffled samples dealt round robin into equal-count microbatches.
    Random,
    /// DistTrain §6: intra-microbatch balancing over DP ranks and Algorithm 3's reordering.
    Disttrain,
    /// DistTrain's intra-microbatch balancing alone (the ablation of Algorithm 3).
    DisttrainIntra,
    /// FlowTrain §3.4: best-fit packing, cost buckets, zig-zag dispatch over DP ranks.
    Flowtrain,
}

impl PolicyName {
    fn policy(self) -> Policy {
        match self {
            PolicyName::Random => Policy::Random,
            PolicyName::Disttrain => Policy::DistTrain,
            PolicyName::DisttrainIntra => Policy::DistTrainIntra,
            PolicyName::Flowtrain => Policy::FlowTrain,
        }
    }

    fn name(self) -> &'static str {
        match self {
            PolicyName::Random => "random",
            PolicyName::Disttrain => "disttrain",
            PolicyName::DisttrainIntra => "disttrain-intra",
            PolicyName::Flowtrain => "flowtrain",
        }
    }
}

/// The largest DP and PP degrees and microbatch counts accepted: a simulation holds
/// dp × pp × microbatches operations, and 2¹² of each is beyond any published run.
const MAX_DEGREE: u64 = 4096;

/// Arguments of the simulation. `--count` sizes a `--generate`d batch only: with `--samples`
/// it is refused here (clap's `requires = "generate"` on it lets it through, since
/// `--generate`, conflicting with `--samples`, then counts as not needed).
#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("file_or_count").args(["samples", "count"]).multiple(false)))]
struct SimulateArgs {
    #[command(flatten)]
    batch: Samples,
    /// Data-parallel ranks (required).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=MAX_DEGREE))]
    dp: Option<u64>,
    /// Pipeline stages per rank (required).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=MAX_DEGREE))]
    pp: Option<u64>,
    /// Model chunks per pipeline stage (interleaved 1F1B; 1: plain 1F1B).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    vpp: u64,
    /// Microbatches per rank (default: 2 × pp; FlowTrain packs towards this count).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=MAX_DEGREE))]
    microbatches: Option<u64>,
    /// Policies to simulate, comma-separated (default: random,disttrain,flowtrain; with --vpp
    /// above 1, random,disttrain: FlowTrain runs on plain 1F1B only).
    #[arg(long, value_delimiter = ',')]
    policy: Option<Vec<PolicyName>>,
    /// The built-in model whose backbone (its LLM) sets the cost of a sequence.
    #[arg(long, default_value = "qwen3-vl")]
    model: String,
    /// The built-in device the costs are for (see `mosaic zoo`).
    #[arg(long, default_value = "h100")]
    device: String,
    /// FlowTrain's microbatch capacity in tokens (default: the smallest that packs the batch
    /// into dp × microbatches); only with flowtrain among the policies.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=mosaic_data::packing::MAX_CAPACITY as i64))]
    capacity: Option<u32>,
    /// One JSON object per policy, one per line.
    #[arg(long)]
    json: bool,
}

/// Runs `mosaic data`.
pub fn run(args: Args) -> Result<()> {
    match args.verb {
        #[cfg(feature = "engine")]
        Some(Verb::Write(w)) => write::run(&w),
        #[cfg(not(feature = "engine"))]
        Some(Verb::Write(w)) => super::no_engine::run(w),
        None => simulate(&args.simulate),
    }
}

/// One policy's row: the simulator's report and what it ran on.
#[derive(serde::Serialize)]
struct Row {
    format: &'static str,
    policy: &'static str,
    iteration_ms: f64,
    bubble_fraction: f64,
    dp_imbalance: f64,
    samples: usize,
    tokens: u64,
    dp: usize,
    pp: usize,
    vpp: usize,
    microbatches: usize,
    alpha_ms: f64,
    beta_ms: f64,
}

/// FlowTrain's α and β of `spec`'s backbone on `dev`, and a phrase saying so.
pub(crate) fn sequence_cost(spec: &ModelSpec, dev: &DeviceSpec) -> Result<(TokenCost, String)> {
    let backbone = spec
        .modules
        .iter()
        .find(|m| m.role == Role::Backbone)
        .ok_or_else(|| {
            BadInput(format!(
                "--model {}: has no backbone (an LLM) whose sequences to cost; try qwen3-vl, \
                 ofasys or unified-io-2",
                spec.name
            ))
        })?;
    let cost = Calibration::default().token_cost(backbone, dev);
    Ok((
        cost,
        format!("{}'s {} on an {}", spec.name, backbone.name, dev.name),
    ))
}

/// FlowTrain's α and β of the named model's backbone on the named device.
fn costs(model: &str, device: &str) -> Result<(TokenCost, String)> {
    let spec = mosaic_zoo::model(model)?;
    let key = device.trim().to_ascii_lowercase();
    let devices = mosaic_zoo::devices();
    let dev = devices
        .iter()
        .find(|d| d.short_name == key || d.name.to_ascii_lowercase() == key)
        .ok_or_else(|| {
            let known: Vec<&str> = devices.iter().map(|d| d.short_name.as_str()).collect();
            BadInput(format!(
                "--device {device}: unknown; known devices: {}",
                known.join(", ")
            ))
        })?;
    sequence_cost(&spec, dev)
}

/// The policies to simulate: `--policy`, or by default random, DistTrain and (on plain 1F1B
/// only) FlowTrain. Refuses FlowTrain under `--vpp` above 1 and `--capacity` without
/// FlowTrain: flags that would otherwise be ignored, or give an answer that depends on the
/// seed (whether packing happens to give every rank a multiple of pp microbatches).
fn policies(args: &SimulateArgs) -> Result<Vec<PolicyName>, BadInput> {
    let vpp = args.vpp;
    let policies = match &args.policy {
        Some(p) => p.clone(),
        None if vpp > 1 => vec![PolicyName::Random, PolicyName::Disttrain],
        None => vec![
            PolicyName::Random,
            PolicyName::Disttrain,
            PolicyName::Flowtrain,
        ],
    };
    let flowtrain = policies.contains(&PolicyName::Flowtrain);
    if flowtrain && vpp > 1 {
        return Err(BadInput(format!(
            "--policy flowtrain with --vpp {vpp}: FlowTrain runs on plain 1F1B only (its \
             packing gives the ranks uneven microbatch counts, and interleaved 1F1B needs every \
             rank's count to be a multiple of --pp); expected --vpp 1 for flowtrain, or a \
             --policy without it (random, disttrain, disttrain-intra)"
        )));
    }
    if let (Some(c), false) = (args.capacity, flowtrain) {
        let why = match &args.policy {
            Some(p) => format!(
                "--policy {} does not include flowtrain",
                p.iter().map(|p| p.name()).collect::<Vec<_>>().join(",")
            ),
            None => format!("FlowTrain runs on plain 1F1B only, so --vpp {vpp} leaves it out"),
        };
        return Err(BadInput(format!(
            "--capacity {c}: sets FlowTrain's microbatch capacity, but {why}; expected \
             --capacity only with flowtrain"
        )));
    }
    Ok(policies)
}

/// `mosaic data` without a verb: the policies side by side on one batch.
fn simulate(args: &SimulateArgs) -> Result<()> {
    let policies = policies(args)?;
    let (sizes, source) = args.batch.load(1024)?.ok_or_else(|| {
        BadInput("give a batch: --samples FILE (JSON Lines) or --generate text|interleaved".into())
    })?;
    let (cost, costed) = costs(&args.model, &args.device)?;
    // Optional to clap so that `mosaic data write` needs neither (a verb cannot lift the
    // requirements of flattened arguments).
    let required = |v: Option<u64>, flag: &str| {
        v.map(|v| v as usize).ok_or_else(|| {
            BadInput(format!(
                "{flag}: required, e.g. `mosaic data --generate text --dp 8 --pp 4`"
            ))
        })
    };
    let (dp, pp) = (required(args.dp, "--dp")?, required(args.pp, "--pp")?);
    let vpp = args.vpp as usize;
    let microbatches = args.microbatches.map_or(2 * pp, |m| m as usize);
    let layout = Layout {
        dp,
        pp,
        microbatches,
        vpp,
    };
    let tokens: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
    let mut rows = Vec::new();
    for &name in &policies {
        let params = Params {
            alpha: cost.alpha_ms,
            beta: cost.beta_ms,
            seed: args.batch.seed,
            capacity: args.capacity,
            ..Params::default()
        };
        let report: Report = evaluate(name.policy(), &sizes, layout, &params).map_err(|e| {
            let hint = match e {
                DataError::Pack(PackError::CapacityTooLarge { .. }) => {
                    " (this batch in dp × microbatches microbatches would need that many tokens each: \
                         raise --microbatches or give --capacity)"
                }
                _ => "",
            };
            BadInput(format!("--policy {}: {e}{hint}", name.name()))
        })?;
        rows.push(Row {
            format: "mosaic-data/1",
            policy: name.name(),
            iteration_ms: report.iteration_ms,
            bubble_fraction: report.bubble_fraction,
            dp_imbalance: report.dp_imbalance,
            samples: sizes.len(),
            tokens,
            dp,
            pp,
            vpp,
            microbatches,
            alpha_ms: cost.alpha_ms,
            beta_ms: cost.beta_ms,
        });
    }
    if args.json {
        for row in &rows {
            println!("{}", serde_json::to_string(row)?);
        }
        return Ok(());
    }
    let longest = sizes.iter().copied().max().unwrap_or(0);
    println!("batch: {source}, {tokens} tokens, longest {longest}");
    println!(
        "cost of a sequence of l tokens ({costed}): α·l² + β·l ms, α = {:.3e}, β = {:.3e}",
        cost.alpha_ms, cost.beta_ms
    );
    println!(
        "layout: dp {dp} × pp {pp}{}, {microbatches} microbatches per rank; stages split each \
         microbatch's cost equally, backward = 2 × forward, communication free",
        if vpp > 1 {
            format!(" (interleaved, {vpp} chunks per stage)")
        } else {
            String::new()
        }
    );
    println!();
    println!(
        "{:<16} {:>14} {:>8} {:>13}",
        "policy", "iteration", "bubble", "DP imbalance"
    );
    for r in &rows {
        println!(
            "{:<16} {:>11.1} ms {:>8.3} {:>13.3}",
            r.policy, r.iteration_ms, r.bubble_fraction, r.dp_imbalance
        );
    }
    Ok(())
}
