//! `mosaic zoo`: what is built in.

use anyhow::Result;

/// Arguments of `mosaic zoo`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print the models, devices and clusters as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `mosaic zoo`.
pub fn run(args: Args) -> Result<()> {
    let (models, devices, clusters) = (
        mosaic_zoo::models(),
        mosaic_zoo::devices(),
        mosaic_zoo::clusters(),
    );
    if args.json {
        let all = serde_json::json!({"models": models, "devices": devices, "clusters": clusters});
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(());
    }
    println!("models:");
    for m in &models {
        let names: Vec<&str> = m.modules.iter().map(|x| x.name.as_str()).collect();
        println!("  {:<14} {}", m.name, m.description);
        println!("  {:<14} modules: {}", "", names.join(", "));
    }
    println!("\ndevices:");
    for d in &devices {
        println!(
            "  {:<16} {} SMs, {} GiB, {} TFLOP/s bf16, {} TB/s HBM",
            d.name, d.sm_count, d.memory_gib, d.peak_tflops, d.hbm_tbps
        );
    }
    println!("\nclusters (any <device>x<N> also works, e.g. h100x24):");
    for c in &clusters {
        println!(
            "  {:<10} {} × {} ({} node(s))",
            c.name,
            c.gpus(),
            c.device.name,
            c.nodes
        );
    }
    Ok(())
}
