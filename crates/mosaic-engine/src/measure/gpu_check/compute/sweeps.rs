//! `mosaic measure profile|colocations --device cuda` in small: the files must validate.

use mosaic_profile::{ColocationFile, ProfileFile};

use super::Res;
use crate::measure::ProfileConfig;
use crate::runtime::slot::cuda::GpuDevice;
use crate::EngineError;

/// clip-tiny's measuring in small: batch 4 at dp up to `max_dp`, one warm-up, three timed.
fn small(max_dp: usize) -> ProfileConfig {
    ProfileConfig {
        batch: 4,
        max_dp,
        warmup: 1,
        reps: 3,
        ..ProfileConfig::default()
    }
}

/// `mosaic measure colocations --device cuda` in small: two colocations of clip-tiny at
/// batch 4, dp 1; the file must validate, every module have kept iterations and finite times,
/// and the colocations hold against `profile` (the profile sweep's, where it ran), as `mosaic
/// fit` reads them: every module's quota one the profile has.
pub(super) fn colocations(
    device: &GpuDevice,
    profile: Option<&ProfileFile>,
) -> Res<(bool, String)> {
    use crate::measure::{
        colocation_file, colocations_gpu, gpu_colocation_source, ColocationConfig,
    };
    let config = small(1);
    let draws = ColocationConfig {
        samples: 2,
        seed: 0,
    };
    let host = crate::measure::measure_machine(1, 1)?;
    let (gpu, measured) = colocations_gpu(
        "clip-tiny",
        config.clone(),
        host,
        device.ordinal(),
        &draws,
        |_, _| {},
    )?;
    let source = gpu_colocation_source(&gpu, "clip-tiny", &config, &draws);
    let file = colocation_file(&gpu.name, &measured, source);
    let text = serde_json::to_string(&file).map_err(|e| EngineError::BadSetting {
        setting: "colocations".into(),
        message: e.to_string(),
    })?;
    let parsed = mosaic_profile::parse_colocations(&text, "the GPU colocations");
    let runs: Vec<&crate::measure::ColocatedRun> =
        measured.iter().flat_map(|s| &s.modules).collect();
    let sane = runs.iter().all(|m| {
        m.iterations >= 1 && m.alone_ms > 0.0 && m.colocated_ms.is_finite() && m.cores > 0
    });
    let figure = runs
        .iter()
        .map(|m| {
            format!(
                "{} on {} SMs {:.2} → {:.2} ms",
                m.module, m.cores, m.alone_ms, m.colocated_ms
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let valid = parsed
        .as_ref()
        .map_or_else(|e| e.to_string(), |_| "valid".into());
    let fitted = match (profile, &parsed) {
        (Some(profile), Ok(parsed)) => fit(profile, parsed),
        _ => Err("not fitted: no valid profile and colocations".into()),
    };
    let fit_figure = fitted.as_ref().map_or_else(Clone::clone, Clone::clone);
    Ok((
        parsed.is_ok() && sane && fitted.is_ok(),
        format!("{figure}; file {valid}; {fit_figure}"),
    ))
}

/// Eq. 8 fitted to `colocations` against `profile`, as `mosaic fit` does, in words; an error
/// where a colocation does not hold against the profile.
fn fit(profile: &ProfileFile, colocations: &ColocationFile) -> Result<String, String> {
    let perf = mosaic_profile::PerfModel::new(profile, mosaic_fit::LOOKUP_GRANULARITY, "profile")
        .map_err(|e| e.to_string())?;
    let obs = mosaic_fit::observations(&perf, colocations, "colocations")
        .map_err(|e| format!("not fitted to the profile sweep's profile: {e}"))?;
    let e = mosaic_fit::fit(&obs, mosaic_fit::Model::Full);
    Ok(format!(
        "fitted to the profile sweep's profile: e1 {:.3}, e2 {:.3}, e3 {:.3}",
        e.e1, e.e2, e.e3
    ))
}

/// `mosaic measure profile --device cuda` in small: clip-tiny at batch 4, dp 1, on every
/// partition of the grid, kept in `keep`; the file must validate and plan, every figure be
/// finite, vision on the fewest SMs be no faster than on the whole GPU (within 25 %: clip-tiny
/// cannot fill 16 SMs, and replayed from graphs its points differ by jitter), and some points
/// replay CUDA graphs (unless `MOSAIC_GRAPHS=off`).
pub(super) fn sweep(device: &GpuDevice, keep: &mut Option<ProfileFile>) -> Res<(bool, String)> {
    use crate::measure::{gpu_sm_grid, profile_file, sweep_gpu, Launched};
    use crate::runtime::graphed::GRAPHS;
    let config = small(1);
    let host = crate::measure::measure_machine(1, 1)?;
    let profile = sweep_gpu("clip-tiny", config, host, device.ordinal(), |_| {})?;
    let file = profile_file(&profile);
    let text = serde_json::to_string(&file).map_err(|e| EngineError::BadSetting {
        setting: "profile".into(),
        message: e.to_string(),
    })?;
    let parsed = mosaic_profile::parse(&text, "the GPU profile");
    *keep = parsed.as_ref().ok().cloned();
    let plans = parsed.as_ref().ok().and_then(|p| {
        let perf = mosaic_profile::PerfModel::new(p, 0.1, "the GPU profile").ok()?;
        mosaic_plan::solve(&perf, 1, &mosaic_plan::SolveOptions::default()).ok()
    });
    let grid = gpu_sm_grid(device.sms(), device.granularity());
    let finite = profile.points.iter().all(|p| {
        p.time_ms.is_finite()
            && p.time_ms > 0.0
            && (0.0..=1.0).contains(&p.sm_util)
            && (0.0..=1.0).contains(&p.bw_util)
    });
    let vision: Vec<&crate::measure::Point> = profile.points_of("vision").collect();
    let (fewest, whole) = (vision[0], vision[vision.len() - 1]);
    // clip-tiny at batch 4 is launch-bound: its points replay CUDA graphs, as it trains.
    let graphed = (profile.points.iter())
        .filter(|p| p.launched == Launched::Graphed)
        .count();
    let refused = profile.points.iter().find_map(|p| match &p.launched {
        Launched::Refused(why) => Some(format!(" ({} not: {why:.200})", p.module)),
        _ => None,
    });
    let pass = parsed.is_ok()
        && plans.is_some()
        && finite
        && profile.points.len() == 3 * grid.len()
        && fewest.time_ms >= 0.75 * whole.time_ms
        && (graphed > 0 || !GRAPHS.is_on());
    Ok((
        pass,
        format!(
            "{} points on SMs {grid:?}, {graphed} replayed from CUDA graphs{}; vision {:.2} ms \
             on {} SMs, {:.2} ms on {} (sm_util {:.2}, bw_util {:.2}); file {}; plan {}",
            profile.points.len(),
            refused.unwrap_or_default(),
            fewest.time_ms,
            fewest.cores,
            whole.time_ms,
            whole.cores,
            whole.sm_util,
            whole.bw_util,
            parsed.map_or_else(|e| e.to_string(), |_| "valid".into()),
            plans.map_or("none".to_string(), |p| format!("{:.2} ms", p.iteration_ms)),
        ),
    ))
}
