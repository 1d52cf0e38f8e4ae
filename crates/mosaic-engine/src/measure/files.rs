//! The engine's measurements as the typed values of the files the planner and `mosaic fit`
//! read: a sweep as a `mosaic-profiles/1` file ([`profile_file`]), measured colocations as a
//! `mosaic-colocations/1` file ([`colocation_file`]). `mosaic-profile`, the formats' owner,
//! serialises and validates them.

use mosaic_profile::{
    ColocatedModule, Colocation, ColocationFile, Interference, ModuleProfile, ProfileFile, Sample,
    COLOCATIONS_FORMAT, FORMAT,
};

use super::colocate::MeasuredColocation;
use super::sweep::EngineProfile;
use crate::runtime::trainer::micro;

/// Rounds a utilisation to six decimals (shorter files; the measurement is not finer).
fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

/// The profile file of a sweep: the GPU as the device (with its partition rule), or the
/// machine (cores as SMs, RAM as memory); every grid point a sample (times rounded to 0.1 µs,
/// as `mosaic train` logs them), its [`EngineProfile::source`] as the source, interference not
/// fitted.
pub fn profile_file(p: &EngineProfile) -> ProfileFile {
    let device = match &p.gpu {
        Some(gpu) => mosaic_profile::Device {
            name: gpu.name.clone(),
            sm_count: gpu.sms,
            memory_gib: gpu.memory_gib,
            partition: Some(gpu.partition),
        },
        None => mosaic_profile::Device {
            name: p.machine.name.clone(),
            sm_count: p.machine.cores as u32,
            memory_gib: p.machine.memory_gib,
            // CPU slots are thread pools: no SM partitions.
            partition: None,
        },
    };
    ProfileFile {
        format: FORMAT.to_string(),
        device,
        nodes: None,
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
                // Measured on one machine: no gradient all-reduce across nodes to charge.
                grad_gib: None,
            })
            .collect(),
        interference: Interference::default(),
        source: Some(p.source()),
    }
}

/// The colocations file of colocations measured on the device named `device` (the profile
/// file's device name: the machine's, or the GPU's): every module's colocated median (rounded
/// to 0.1 µs), with `source` (e.g. [`super::Profiler::colocation_source`]).
pub fn colocation_file(
    device: &str,
    measured: &[MeasuredColocation],
    source: String,
) -> ColocationFile {
    ColocationFile {
        format: COLOCATIONS_FORMAT.to_string(),
        device: device.to_string(),
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

#[cfg(test)]
mod tests {
    use super::{colocation_file, profile_file};
    use crate::measure::gpu_info::tests::h100;
    use crate::measure::machine::tests::machine;
    use crate::measure::{ColocationConfig, ProfileConfig, Profiler};
    use mosaic_profile::SmGranularity;

    #[test]
    fn measured_files_validate_and_feed_the_fit() {
        let config = ProfileConfig {
            batch: 4,
            max_dp: 2,
            warmup: 1,
            reps: 2,
            seed: 1,
            size: 1.0,
        };
        let profiler = Profiler::new("omni-tiny", config, machine(2)).unwrap();
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
        let coloc = colocation_file(
            &profiler.machine().name,
            &measured,
            profiler.colocation_source(&config),
        );
        let text = serde_json::to_string(&coloc).unwrap();
        let parsed = mosaic_profile::parse_colocations(&text, "c.json").unwrap();
        assert_eq!(parsed.samples.len(), 2);
        assert_eq!(parsed.device, file.device.name);
        let lookup =
            mosaic_profile::PerfModel::new(&file, mosaic_fit::LOOKUP_GRANULARITY, "p").unwrap();
        let obs = mosaic_fit::observations(&lookup, &parsed, "c.json").unwrap();
        assert_eq!(obs.len(), 4);
    }

    #[test]
    fn a_gpu_profile_carries_the_gpu_and_plans_on_its_partitions() {
        let config = ProfileConfig {
            batch: 2,
            max_dp: 1,
            warmup: 1,
            reps: 1,
            seed: 1,
            size: 1.0,
        };
        let profiler = Profiler::new("clip-tiny", config, machine(2)).unwrap();
        let mut profile = profiler.sweep(|_| {}).unwrap();
        // As `sweep_gpu` writes it on an H100: quotas of whole SMs, 64 and all 132.
        for (i, p) in profile.points.iter_mut().enumerate() {
            let sms = [64, 132][i % 2];
            p.sm = sms as f64 / 132.0;
            p.cores = sms;
        }
        let hopper = SmGranularity::for_compute_capability(9);
        profile.gpu = Some(h100());
        let file = profile_file(&profile);
        assert!(file.source.as_deref().unwrap().contains("NVML"));
        let text = serde_json::to_string(&file).unwrap();
        let parsed = mosaic_profile::parse(&text, "gpu.json").unwrap();
        assert_eq!(parsed.device.name, "NVIDIA H100 80GB HBM3");
        assert_eq!(
            (parsed.device.sm_count, parsed.device.partition),
            (132, Some(hopper))
        );
        let perf = mosaic_profile::PerfModel::new(&parsed, 0.1, "gpu.json").unwrap();
        let plan = mosaic_plan::solve(&perf, 1, &mosaic_plan::SolveOptions::default()).unwrap();
        for m in plan.stages.iter().flat_map(|s| &s.modules) {
            let sms = (m.sm * 132.0).round() as u32;
            assert!(sms == 132 || hopper.allows(sms), "{} SMs", sms);
        }
    }
}
