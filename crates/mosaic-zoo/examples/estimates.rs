//! Prints the analytical device model's breakdown for every module of a built-in model.
//!
//! `cargo run -p mosaic-zoo --example estimates -- ofasys h100x8`

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let model = mosaic_zoo::model(&args.next().unwrap_or_else(|| "ofasys".into()))?;
    let cluster = mosaic_zoo::cluster(&args.next().unwrap_or_else(|| "h100x8".into()))?;
    let cal = mosaic_zoo::Calibration::default();
    println!(
        "{} on {} (batch {})",
        model.name,
        cluster.name,
        model.batch_on(&cluster)
    );
    println!(
        "{:<15} {:>7} {:>3} {:>4} {:>9} {:>8} {:>8} {:>7} {:>7} {:>8} {:>7} {:>5} {:>5} {:>7} {:>3}",
        "module", "params", "dp", "sm", "time ms", "gemm", "memory", "launch", "comm", "mem GiB",
        "TF/smp", "sm_u", "bw_u", "CI", "rc"
    );
    let mut dp = 1;
    let mut dps = vec![];
    while dp <= cluster.gpus().min(model.batch_on(&cluster)) {
        dps.push(dp);
        dp *= 2;
    }
    for (i, m) in model.modules.iter().enumerate() {
        for &dp in &dps {
            for sm in [0.2, 0.5, 1.0] {
                let e = cal.estimate(&model, i, &cluster, dp, sm);
                let tf = e.flops / e.micro_batch as f64 / 1e12;
                println!(
                    "{:<15} {:>6.0}M {:>3} {:>4.1} {:>9.2} {:>8.2} {:>8.2} {:>7.2} {:>7.2} {:>8.2} {:>7.3} {:>5.2} {:>5.2} {:>7.1} {:>3}",
                    m.name,
                    m.params as f64 / 1e6,
                    dp,
                    sm,
                    e.time_ms,
                    e.gemm_ms,
                    e.memory_ms,
                    e.launch_ms,
                    e.comm_ms,
                    e.mem_gib,
                    tf,
                    e.sm_util,
                    e.bw_util,
                    e.flops / e.hbm_bytes,
                    if e.recompute { "y" } else { "" }
                );
            }
        }
    }
    Ok(())
}
