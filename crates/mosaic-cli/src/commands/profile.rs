//! `mosaic profile`: a model's `mosaic-profiles/1` file — the analytical profile of a built-in
//! model on a built-in cluster, or (`--engine`) measured on this machine by training a built-in
//! engine model's modules at every (dp, quota) grid point, with optional co-located runs for
//! `mosaic fit` (`--colocations N --colocations-out FILE`).

use std::path::PathBuf;

use anyhow::{Context, Result};

/// Arguments of `mosaic profile`.
#[derive(clap::Args, Debug)]
#[cfg_attr(not(feature = "engine"), allow(dead_code))]
pub struct Args {
    /// A built-in model (see `mosaic zoo`); with --engine a built-in engine model: clip-tiny or
    /// omni-tiny.
    #[arg(long)]
    model: String,
    /// A built-in cluster, e.g. h100x8.
    #[arg(long, required_unless_present = "engine", conflicts_with = "engine")]
    cluster: Option<String>,
    /// Where to write the mosaic-profiles/1 file (default: standard output).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Measure the profile on this machine instead: every module of the engine model trained
    /// at every (dp, quota) grid point, a quota being a slot of round(quota × cores) threads
    /// (needs a build with --features engine).
    #[arg(long)]
    engine: bool,
    /// --engine: the global batch; a replica at data-parallel degree dp runs batch/dp samples.
    #[arg(long, default_value_t = 16, conflicts_with = "cluster", value_parser = at_least_one())]
    batch: usize,
    /// --engine: the largest data-parallel degree (powers of two up to it and the batch).
    #[arg(long, default_value_t = 8, conflicts_with = "cluster", value_parser = at_least_one())]
    max_dp: usize,
    /// --engine: timed iterations per grid point, after 2 warm-up ones; the median is kept.
    #[arg(long, default_value_t = 21, conflicts_with = "cluster", value_parser = at_least_one())]
    reps: usize,
    /// --engine: seed of the parameters, the data and the colocation draws.
    #[arg(long, default_value_t = 0, conflicts_with = "cluster")]
    seed: u64,
    /// --engine: also measure N random colocations (modules running side by side, each in its
    /// own slot) and write them (mosaic-colocations/1) to --colocations-out, for `mosaic fit`.
    #[arg(
        long,
        value_name = "N",
        requires = "colocations_out",
        conflicts_with = "cluster",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    colocations: Option<u64>,
    /// Where --colocations writes its file.
    #[arg(long, value_name = "FILE", requires = "colocations")]
    colocations_out: Option<PathBuf>,
}

/// A count of at least one.
fn at_least_one() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
}

/// Runs `mosaic profile`.
pub fn run(args: Args) -> Result<()> {
    if args.engine {
        return engine::run(&args);
    }
    let model = mosaic_zoo::model(&args.model)?;
    let cluster = mosaic_zoo::cluster(
        args.cluster
            .as_deref()
            .expect("clap requires --cluster without --engine"),
    )?;
    let file = mosaic_zoo::profile(&model, &cluster);
    let json = serde_json::to_string_pretty(&file)? + "\n";
    match &args.out {
        Some(out) => {
            std::fs::write(out, json).with_context(|| format!("cannot write {}", out.display()))?;
            eprintln!(
                "wrote {} ({} modules of {} profiled on {})",
                out.display(),
                file.modules.len(),
                model.name,
                cluster.name
            );
        }
        None => print!("{json}"),
    }
    Ok(())
}

#[cfg(not(feature = "engine"))]
mod engine {
    use anyhow::Result;

    use crate::input::BadInput;

    /// `--engine` in a build without the engine.
    pub fn run(_args: &super::Args) -> Result<()> {
        Err(BadInput(
            "--engine: this mosaic was built without the engine: rebuild with `cargo build \
             --release -p mosaic-cli --features engine` (it compiles the candle ML framework)"
                .into(),
        )
        .into())
    }
}

#[cfg(feature = "engine")]
mod engine {
    use anyhow::{anyhow, Context, Result};
    use mosaic_engine::models;
    use mosaic_engine::profile::{
        measure_machine, ColocationConfig, EngineProfile, MeasuredColocation, Point, ProfileConfig,
        Profiler, MAX_ATTEMPTS, UNDISTURBED,
    };
    use mosaic_engine::{Device, EngineError};
    use mosaic_profile::{
        ColocatedModule, Colocation, ColocationFile, Interference, ModuleProfile, ProfileFile,
        Sample, COLOCATIONS_FORMAT, FORMAT,
    };

    use super::Args;
    use crate::input::BadInput;

    /// Size of each STREAM-triad array: 3 × 64 MiB, well above the caches of the machines this
    /// was written on (2 MiB L2 per core) and measured to have reached the DRAM plateau there.
    const STREAM_MIB: usize = 64;
    /// STREAM-triad runs per slot size (the best is kept).
    const STREAM_REPS: usize = 5;
    /// Untimed iterations before the timed ones at every grid point.
    const WARMUP: usize = 2;

    /// Turns an engine error into bad input (exit code 2) when it is the user's.
    fn engine(e: EngineError) -> anyhow::Error {
        if e.is_bad_input() {
            BadInput(e.to_string()).into()
        } else {
            e.into()
        }
    }

    /// `mosaic profile --engine`.
    pub fn run(args: &Args) -> Result<()> {
        // candle runs elementwise ops of 64 Ki elements or more on a process-wide pool of its
        // own that no slot bounds; with one "thread" that pool is empty and they run on the
        // calling slot thread (see mosaic_engine::slot), so a slot's threads are all its
        // module uses. No other thread exists yet and no candle op has run, so setting the
        // variable here is safe and takes effect.
        if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
            std::env::set_var("CANDLE_NUM_THREADS", "1");
        }
        // A wrong model name fails now, not after the machine is measured.
        models::build(&args.model, args.seed, &Device::Cpu).map_err(engine)?;
        let config = ProfileConfig {
            batch: args.batch,
            max_dp: args.max_dp,
            warmup: WARMUP,
            reps: args.reps,
            seed: args.seed,
        };
        eprintln!("measuring this machine (STREAM triad, 3 × {STREAM_MIB} MiB arrays)…");
        let machine = measure_machine(STREAM_MIB, STREAM_REPS).map_err(engine)?;
        let stream: Vec<String> = machine
            .stream
            .iter()
            .map(|s| {
                format!(
                    "{} thread{} {:.1} GB/s{}",
                    s.threads,
                    if s.threads == 1 { "" } else { "s" },
                    s.gbps,
                    if s.busy < UNDISTURBED {
                        format!(
                            " (the slot was busy {:.0}% of the time: other processes had its \
                             cores)",
                            100.0 * s.busy
                        )
                    } else {
                        String::new()
                    }
                )
            })
            .collect();
        eprintln!(
            "device: {}, {:.1} GiB; STREAM triad: {}",
            machine.name,
            machine.memory_gib,
            stream.join(", ")
        );
        let profiler = Profiler::new(&args.model, config, machine).map_err(engine)?;
        let total = profiler.grid_points();
        let quotas: Vec<String> = profiler.quotas().iter().map(|q| format!("{q}")).collect();
        let dps: Vec<String> = profiler.dps().iter().map(usize::to_string).collect();
        eprintln!(
            "profiling {} ({}) at dp {{{}}} × quota {{{}}}: {total} grid points, {WARMUP} \
             warm-up + {} timed iterations each, batch {}",
            profiler.model().name,
            profiler.model().module_names(),
            dps.join(", "),
            quotas.join(", "),
            args.reps,
            args.batch
        );
        let width = total.to_string().len();
        let mut done = 0;
        let profile = profiler
            .sweep(|p| {
                done += 1;
                eprintln!("[{done:>width$}/{total}] {}", point_line(p));
            })
            .map_err(engine)?;

        let file = profile_file(&profile);
        let json = serde_json::to_string_pretty(&file)? + "\n";
        // What is written must be what the planner reads.
        mosaic_profile::parse(&json, "the measured profile")
            .map_err(|e| anyhow!("internal error: {e}"))?;
        match &args.out {
            Some(out) => {
                std::fs::write(out, &json)
                    .with_context(|| format!("cannot write {}", out.display()))?;
                eprintln!(
                    "wrote {} ({} modules of {}, {} samples each, measured on {})",
                    out.display(),
                    file.modules.len(),
                    profile.model,
                    file.modules[0].samples.len(),
                    file.device.name
                );
            }
            None => print!("{json}"),
        }

        let (Some(n), Some(out)) = (args.colocations, &args.colocations_out) else {
            return Ok(());
        };
        let config = ColocationConfig {
            samples: n as usize,
            seed: args.seed,
        };
        eprintln!(
            "measuring {n} random colocations of {}'s modules, each module alone and then \
             together in its own slot…",
            profile.model
        );
        let width = n.to_string().len();
        let measured = profiler
            .colocations(&config, |i, s| {
                eprintln!("[{:>width$}/{n}] {}", i + 1, colocation_line(s));
            })
            .map_err(engine)?;
        let file = colocation_file(&profile, &measured, profiler.colocation_source(&config));
        let json = serde_json::to_string_pretty(&file)? + "\n";
        mosaic_profile::parse_colocations(&json, "the measured colocations")
            .map_err(|e| anyhow!("internal error: {e}"))?;
        std::fs::write(out, &json).with_context(|| format!("cannot write {}", out.display()))?;
        let slowdowns: Vec<f64> = measured
            .iter()
            .flat_map(|s| s.modules.iter().map(|m| m.slowdown()))
            .collect();
        let mean = slowdowns.iter().sum::<f64>() / slowdowns.len().max(1) as f64;
        let max = slowdowns.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        eprintln!(
            "wrote {} ({} colocations; slowdown together vs alone: mean {:+.1}%, max {:+.1}%)",
            out.display(),
            file.samples.len(),
            100.0 * mean,
            100.0 * max
        );
        let disturbed = measured.iter().filter(|s| !s.undisturbed()).count();
        if disturbed > 0 {
            eprintln!(
                "note: {disturbed} of {n} colocations stayed disturbed after {MAX_ATTEMPTS} \
                 attempts (a slot got under {:.0}% of the core time together that it had alone): \
                 other processes were running on this machine, and those times include their load",
                100.0 * UNDISTURBED
            );
        }
        Ok(())
    }

    /// Rounds milliseconds to 0.1 µs, as `mosaic train` logs them.
    fn micro(ms: f64) -> f64 {
        (ms * 1e4).round() / 1e4
    }

    /// Rounds a utilisation to six decimals (shorter files; the measurement is not finer).
    fn round6(x: f64) -> f64 {
        (x * 1e6).round() / 1e6
    }

    /// The profile file of a sweep: the machine as the device (cores as SMs, RAM as memory),
    /// every grid point a sample, interference not fitted.
    pub(super) fn profile_file(p: &EngineProfile) -> ProfileFile {
        ProfileFile {
            format: FORMAT.to_string(),
            device: mosaic_profile::Device {
                name: p.machine.name.clone(),
                sm_count: p.machine.cores as u32,
                memory_gib: p.machine.memory_gib,
            },
            modules: p
                .modules
                .iter()
                .map(|m| ModuleProfile {
                    name: m.name.clone(),
                    after: m.after.clone(),
                    samples: p
                        .points_of(&m.name)
                        .map(|s| Sample {
                            dp: s.dp as u32,
                            sm: s.sm,
                            time_ms: micro(s.time_ms),
                            mem_gib: s.memory.gib(),
                            sm_util: round6(s.sm_util),
                            bw_util: round6(s.bw_util),
                        })
                        .collect(),
                })
                .collect(),
            interference: Interference::default(),
            source: Some(p.source()),
        }
    }

    /// The colocations file of measured colocations: the colocated medians.
    pub(super) fn colocation_file(
        p: &EngineProfile,
        measured: &[MeasuredColocation],
        source: String,
    ) -> ColocationFile {
        ColocationFile {
            format: COLOCATIONS_FORMAT.to_string(),
            device: p.machine.name.clone(),
            source: Some(source),
            samples: measured
                .iter()
                .map(|s| Colocation {
                    modules: s
                        .modules
                        .iter()
                        .map(|m| ColocatedModule {
                            name: m.module.clone(),
                            dp: m.dp as u32,
                            sm: m.sm,
                            time_ms: micro(m.colocated_ms),
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    /// One grid point as a progress line.
    fn point_line(p: &Point) -> String {
        let t = &p.parts;
        format!(
            "{} dp {} quota {:.2} ({} thread{}, {} sample{}): {:.3} ms (forward {:.3}, backward \
             {:.3}, all-reduce {:.3}, AdamW {:.3}), {:.3} MiB, ~{:.2} GB/s (bw_util {:.4}), \
             sm_util {:.2}",
            p.module,
            p.dp,
            p.sm,
            p.threads,
            if p.threads == 1 { "" } else { "s" },
            p.rows,
            if p.rows == 1 { "" } else { "s" },
            p.time_ms,
            t.forward_ms,
            t.backward_ms,
            t.allreduce_ms,
            t.optimizer_ms,
            p.memory.total() as f64 / (1u64 << 20) as f64,
            p.achieved_gbps,
            p.bw_util,
            p.sm_util
        )
    }

    /// One colocation as a progress line.
    fn colocation_line(s: &MeasuredColocation) -> String {
        let line = s
            .modules
            .iter()
            .map(|m| {
                format!(
                    "{} dp {} quota {:.2}: {:.3} ms alone, {:.3} together ({:+.1}%; slot busy \
                     {:.0}% → {:.0}%)",
                    m.module,
                    m.dp,
                    m.sm,
                    m.alone_ms,
                    m.colocated_ms,
                    100.0 * m.slowdown(),
                    100.0 * m.alone_busy,
                    100.0 * m.together_busy
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        match s.attempts {
            1 => line,
            n => format!("{line} [best of {n} attempts]"),
        }
    }
}

#[cfg(all(test, feature = "engine"))]
mod tests {
    use mosaic_engine::profile::{ColocationConfig, Machine, ProfileConfig, Profiler};

    use super::engine::{colocation_file, profile_file};

    fn machine() -> Machine {
        Machine {
            name: "test machine (2 cores)".into(),
            cpu: None,
            cores: 2,
            memory_gib: 8.0,
            stream_array_mib: 0,
            stream: vec![],
            peak_gbps: 10.0,
        }
    }

    #[test]
    fn measured_files_validate_and_feed_the_fit() {
        let config = ProfileConfig {
            batch: 4,
            max_dp: 2,
            warmup: 1,
            reps: 2,
            seed: 1,
        };
        let profiler = Profiler::new("omni-tiny", config, machine()).unwrap();
        let profile = profiler.sweep(|_| {}).unwrap();
        let file = profile_file(&profile);
        let text = serde_json::to_string(&file).unwrap();
        let parsed = mosaic_profile::parse(&text, "p.json").unwrap();
        assert_eq!(parsed.device, file.device);
        assert_eq!(parsed.modules.len(), file.modules.len());
        assert_eq!(file.device.sm_count, 2);
        assert_eq!(file.modules[3].name, "backbone");
        assert_eq!(file.modules[3].after, ["vision", "audio", "text"]);
        for m in &file.modules {
            let grid: Vec<(u32, f64)> = m.samples.iter().map(|s| (s.dp, s.sm)).collect();
            assert_eq!(grid, [(1, 0.5), (1, 1.0), (2, 0.5), (2, 1.0)]);
            // A sharded module's replica holds less at dp 2 than at dp 1.
            if m.name != "backbone" {
                assert!(m.samples[2].mem_gib < m.samples[0].mem_gib, "{m:?}");
            }
        }
        let perf = mosaic_profile::PerfModel::new(&parsed, 0.1, "p.json").unwrap();
        assert_eq!(perf.modules.len(), 4);

        let config = ColocationConfig {
            samples: 2,
            seed: 5,
        };
        let measured = profiler.colocations(&config, |_, _| {}).unwrap();
        let coloc = colocation_file(&profile, &measured, profiler.colocation_source(&config));
        let text = serde_json::to_string(&coloc).unwrap();
        let parsed = mosaic_profile::parse_colocations(&text, "c.json").unwrap();
        assert_eq!(parsed.samples.len(), 2);
        assert_eq!(parsed.device, file.device.name);
        let lookup =
            mosaic_profile::PerfModel::new(&file, mosaic_fit::LOOKUP_GRANULARITY, "p").unwrap();
        let obs = mosaic_fit::observations(&lookup, &parsed, "c.json").unwrap();
        assert_eq!(obs.len(), 4);
    }
}
