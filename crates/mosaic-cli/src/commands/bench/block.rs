//! `mosaic bench block`: where a transformer block's step goes. One block of a zoo encoder at
//! its real shape on the device present, and each piece of it alone — norm, projections,
//! attention (fused where the device has the kernels, and composed), MLP — timed forward and
//! forward + backward, with the products' throughput, each piece's share of the block and what
//! it leaves on the autograd tape. On a GPU, last, what launching costs: the block's forward
//! pass, and its forward and backward passes, launched op by op against the same passes
//! replayed from a CUDA graph.

use anyhow::Result;
use mosaic_engine::measure::{launch_cost, time_block, LaunchCost, Pass, PieceTime};
use mosaic_engine::models::zoo::encoder_block;
use mosaic_engine::Compute;

use crate::commands::engine::{engine, one_process, set_engine_env, size_factor};
use crate::input::BadInput;

/// Arguments of `mosaic bench block`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The zoo model (`mosaic zoo`).
    #[arg(long, default_value = "clip")]
    model: String,
    /// Its encoder whose block is timed.
    #[arg(long, default_value = "vision")]
    module: String,
    /// Per-GPU batch.
    #[arg(long, default_value_t = 16,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=4096))]
    batch: usize,
    /// Where it computes: cuda (GPU 0, every SM; the GPU build) or cpu.
    #[arg(long, default_value = "cuda", value_parser = ["cuda", "cpu"])]
    device: String,
    /// Scale the block down by this factor in (0, 1] (1: real size).
    #[arg(long, default_value_t = 1.0, value_parser = size_factor)]
    size: f64,
    /// Timed runs of each piece, after one warm-up run; the median counts (1–1,000).
    #[arg(long, default_value_t = 5,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1000))]
    reps: usize,
    /// One JSON object per piece per line instead of the table.
    #[arg(long)]
    json: bool,
}

/// Runs `mosaic bench block`.
pub fn run(args: &Args) -> Result<()> {
    one_process("mosaic bench block")?;
    set_engine_env();
    let (compute, products) = match args.device.as_str() {
        "cuda" => (Compute::Cuda(0), "bf16"),
        _ => (Compute::Cpu, "f32"),
    };
    let block = encoder_block(&args.model, &args.module, args.size).map_err(|e| {
        BadInput(format!(
            "--model {:?} --module {:?}: {e}",
            args.model, args.module
        ))
    })?;
    let pieces = time_block(&block, args.batch, compute, args.reps).map_err(engine)?;
    if args.json {
        for p in &pieces {
            let mut line = serde_json::to_value(p)?;
            line["tflops"] = serde_json::json!(p.tflops());
            println!("{line}");
        }
    } else {
        println!(
            "{} {} block at batch {}: {} tokens{}, width {}, heads {}, MLP {}; {} products on \
             {}; medians of {} runs",
            args.model,
            args.module,
            args.batch,
            block.tokens,
            if block.causal { " (causal)" } else { "" },
            block.dims.dim,
            block.dims.heads,
            block.dims.mlp,
            products,
            args.device,
            args.reps
        );
        print!("{}", table(&pieces));
    }
    // On a GPU, last (the pieces already printed), the launch cost; a capture that fails is
    // reported, not fatal: it says what capturing a module's step would have to get past.
    if let Compute::Cuda(ordinal) = compute {
        for pass in [Pass::Forward, Pass::Step] {
            let cost = launch_cost(&block, args.batch, pass, ordinal, args.reps);
            match (cost, args.json) {
                (Ok(c), true) => println!("{}", serde_json::json!({ "launch": c })),
                (Ok(c), false) => println!("{}", launch_line(&c)),
                (Err(e), true) => println!(
                    "{}",
                    serde_json::json!({ "pass": pass, "launch_error": e.to_string() })
                ),
                (Err(e), false) => println!(
                    "launches: the block's {} was not replayed from a CUDA graph: {e}",
                    pass.describe()
                ),
            }
        }
    }
    Ok(())
}

/// What launching op by op costs one pass of the block, in one line.
fn launch_line(c: &LaunchCost) -> String {
    format!(
        "launches: the block's {} {:.3} ms launched op by op (the host {:.3} ms of it), {:.3} \
         ms replayed from a CUDA graph of {} nodes: launching costs {:.3} ms ({:.0} %); the \
         replay matches to {:.1e}",
        c.pass.describe(),
        c.eager_ms,
        c.eager_host_ms,
        c.graph_ms,
        c.nodes,
        c.launch_ms(),
        100.0 * c.launch_ms() / c.eager_ms,
        c.replay_error
    )
}

/// The pieces as a table: times, share of the block's forward + backward, throughput, tape.
fn table(pieces: &[PieceTime]) -> String {
    let block_ms = pieces.last().map_or(f64::NAN, |p| p.step_ms);
    let mut out = format!(
        "{:<22} {:>11} {:>11} {:>7} {:>8} {:>10}\n",
        "piece", "forward ms", "fwd+bwd ms", "share", "TFLOP/s", "tape MiB"
    );
    for p in pieces {
        out += &format!(
            "{:<22} {:>11.3} {:>11.3} {:>6.0}% {:>8} {:>10.1}\n",
            p.piece,
            p.forward_ms,
            p.step_ms,
            100.0 * p.step_ms / block_ms,
            p.tflops().map_or("—".into(), |t| format!("{t:.1}")),
            p.tape_bytes as f64 / (1u64 << 20) as f64
        );
    }
    out
}
