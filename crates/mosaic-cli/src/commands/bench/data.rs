//! `mosaic bench data`: what the data-side algorithms cost per global batch.
//!
//! - **FlowTrain's scheduler** (§4.7 reports 0.7–1.0 ms at 2K rising to 8.6–13.8 ms at 32K
//!   tokens per microbatch, its Fig. 10): best-fit packing of one global batch into microbatches
//!   of each capacity, then cost buckets and zig-zag dispatch over the DP ranks. The batch holds
//!   `--samples` interleaved image–text sequences (the skewed generator) clamped to the capacity.
//! - **DistTrain's reordering** (§6): intra-microbatch balancing over the DP ranks (greedy
//!   partitioning) and Algorithm 3 per rank, on `--reorder-samples` samples.
//!
//! Each figure is the median over `--repeats` runs on fresh seeds (medians are stable on a
//! shared machine where means are not).

use std::time::Instant;

use anyhow::Result;
use mosaic_data::{assign, generate, Distribution, Layout, Params, Policy};

/// Arguments of `mosaic bench data`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Runs per figure; the median is reported.
    #[arg(long, default_value_t = 21, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    repeats: u64,
    /// Sequences per global batch for the packing benchmark.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    samples: u64,
    /// Samples per global batch for the reordering benchmark.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    reorder_samples: u64,
    /// Data-parallel ranks the batch is spread over.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=4096))]
    dp: u64,
    /// Print the rows as JSON.
    #[arg(long)]
    json: bool,
}

/// One measured figure.
#[derive(serde::Serialize)]
struct Row {
    what: String,
    median_ms: f64,
    max_ms: f64,
    microbatches: usize,
}

/// Capacities of FlowTrain's Fig. 10: 2K to 32K tokens.
const CAPACITIES: [u32; 5] = [2048, 4096, 8192, 16384, 32768];

/// The interleaved generator's sizes, clamped to `max` tokens.
fn interleaved(max: u32) -> Distribution {
    match Distribution::INTERLEAVED {
        Distribution::Interleaved {
            text_median,
            text_sigma,
            image_tokens,
            image_continue,
            ..
        } => Distribution::Interleaved {
            text_median,
            text_sigma,
            image_tokens,
            image_continue,
            max,
        },
        other => other,
    }
}

/// Times `policy` on fresh batches of `n` samples of `dist`: median and max in ms, and the
/// microbatches of the last run.
fn time(
    policy: Policy,
    dist: Distribution,
    n: usize,
    layout: Layout,
    params: Params,
    repeats: u64,
) -> Result<(f64, f64, usize)> {
    let mut times = Vec::new();
    let mut microbatches = 0;
    for seed in 0..repeats {
        let sizes = generate(dist, n, seed);
        let params = Params { seed, ..params };
        let start = Instant::now();
        let ranks = assign(policy, &sizes, layout, &params)?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
        microbatches = ranks.iter().map(Vec::len).sum();
    }
    let median = mosaic_kit::stats::median(&times).unwrap_or(0.0);
    let max = times.iter().copied().fold(0.0, f64::max);
    Ok((median, max, microbatches))
}

/// Runs `mosaic bench data`.
pub fn run(args: &Args) -> Result<()> {
    let dp = args.dp as usize;
    let mut rows = Vec::new();
    for capacity in CAPACITIES {
        let layout = Layout {
            dp,
            pp: 1,
            microbatches: 1,
            vpp: 1,
        };
        let params = Params {
            capacity: Some(capacity),
            ..Params::default()
        };
        let (median_ms, max_ms, microbatches) = time(
            Policy::FlowTrain,
            interleaved(capacity),
            args.samples as usize,
            layout,
            params,
            args.repeats,
        )?;
        rows.push(Row {
            what: format!(
                "FlowTrain: pack {} sequences into {}K-token microbatches, buckets, zig-zag over {dp} ranks",
                args.samples,
                capacity / 1024
            ),
            median_ms,
            max_ms,
            microbatches,
        });
    }
    let layout = Layout {
        dp,
        pp: 4,
        microbatches: 8,
        vpp: 1,
    };
    let (median_ms, max_ms, microbatches) = time(
        Policy::DistTrain,
        Distribution::INTERLEAVED,
        args.reorder_samples as usize,
        layout,
        Params::default(),
        args.repeats,
    )?;
    rows.push(Row {
        what: format!(
            "DistTrain: reorder {} samples over {dp} ranks × 8 microbatches (pp 4): greedy \
             partitioning + Algorithm 3",
            args.reorder_samples
        ),
        median_ms,
        max_ms,
        microbatches,
    });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!("{:>10} {:>10} {:>6}  what", "median ms", "max ms", "mbs");
    for r in &rows {
        println!(
            "{:>10.3} {:>10.3} {:>6}  {}",
            r.median_ms, r.max_ms, r.microbatches, r.what
        );
    }
    Ok(())
}
