//! Random colocation measurements on a simulated GPU: the `mosaic-colocations/1` data the
//! interference coefficients of Eq. 8 are fitted to (`mosaic simulate colocations --count N`).

use mosaic_kit::rng::SplitMix64;
use mosaic_profile::{
    ColocatedModule, Colocation, ColocationFile, PerfModel, QuotaOption, COLOCATIONS_FORMAT,
};
use mosaic_zoo::{ClusterSpec, ModelSpec};

/// Most modules in one random colocation (the paper's Fig. 12a goes up to 8).
pub const MAX_COLOCATED: usize = 8;

/// Draws `n` random colocations of `model`'s modules on one GPU of `cluster` and measures
/// them with [`crate::colocate`]; `profiles` is the performance model of the same model and
/// device (its candidates decide what may be drawn). The same `seed` gives the same file.
///
/// Each sample draws:
/// - a module count `k` in `2..=min(8, modules, quota units per GPU)`, with probability
///   ∝ 1/√(k − 1): small colocations are the most common in plans, but 8-module ones still
///   make up a few percent (Fig. 12a's largest case);
/// - `k` distinct modules, each at **dp 1**, all on the same GPU, whose memory fits it
///   together. Why dp 1: the profile's time at dp > 1 hides half of the gradient all-reduce
///   behind the backward pass (the device model's `comm_overlap`), while the simulator runs
///   the all-reduce after the whole step, so at dp > 1 the measured time would exceed
///   f_m(dp, sm) by an amount that has nothing to do with co-location and that Eq. 8 could
///   only absorb as a spurious e1. At dp 1 there is no all-reduce and the simulator's time
///   alone is exactly the profile's, so measured / f_m − 1 is pure contention;
/// - a total quota uniform in `k..=` the steps one GPU holds (the model's quota step: 0.1 at
///   the CLI's granularity; on a device with an SM partition rule, its `step_sms` SMs, up to
///   what a split hands out: 16 steps of 8 of an H100's 132 SMs), split uniformly at random
///   into `k` positive parts, each of which must be a candidate of its module (redrawn
///   otherwise).
///
/// Samples for which no valid draw is found in 100 tries (e.g. nothing but one module fits a
/// GPU's memory) are skipped, so the file may hold fewer than `n` samples.
///
/// # Panics
/// If a module of `profiles` is not a module of `model`.
pub fn random_colocations(
    model: &ModelSpec,
    cluster: &ClusterSpec,
    profiles: &PerfModel,
    n: usize,
    seed: u64,
) -> ColocationFile {
    let mut rng = SplitMix64::new(seed);
    let upg = profiles.units_per_gpu;
    // Quota units per drawn step, and the steps a GPU's co-located modules can share.
    let (step, steps) = match profiles.device.partition {
        Some(rule) => (
            rule.step_sms.max(1),
            rule.largest_within(upg).unwrap_or(0) / rule.step_sms.max(1),
        ),
        None => (1, upg),
    };
    let mem_cap = profiles.device.memory_gib;
    // Modules with a dp-1 candidate: (index in the profiles, index in the model, options).
    let pool: Vec<(usize, usize, Vec<QuotaOption>)> = profiles
        .modules
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let spec = model
                .modules
                .iter()
                .position(|s| s.name == m.name)
                .unwrap_or_else(|| panic!("module {} is not a module of {}", m.name, model.name));
            let opts: Vec<QuotaOption> = m.options.iter().filter(|o| o.dp == 1).copied().collect();
            (i, spec, opts)
        })
        .filter(|p| !p.2.is_empty())
        .collect();
    let k_max = MAX_COLOCATED.min(pool.len()).min(steps as usize);
    let mut samples = Vec::with_capacity(n);
    if k_max < 2 {
        return file(profiles, model, cluster, n, seed, samples);
    }
    let weights: Vec<f64> = (2..=k_max).map(|k| 1.0 / ((k - 1) as f64).sqrt()).collect();
    let total: f64 = weights.iter().sum();
    for _ in 0..n {
        let mut u = rng.next_f64() * total;
        let mut k = k_max;
        for (j, w) in weights.iter().enumerate() {
            if u < *w {
                k = j + 2;
                break;
            }
            u -= w;
        }
        if let Some(picks) = (0..100).find_map(|_| draw(&mut rng, &pool, k, (step, steps), mem_cap))
        {
            let placements: Vec<(usize, u32, f64)> =
                picks.iter().map(|&(p, o)| (pool[p].1, 1, o.sm)).collect();
            let times = crate::colocate(model, cluster, &placements);
            samples.push(Colocation {
                modules: picks
                    .iter()
                    .zip(times)
                    .map(|(&(p, o), t)| ColocatedModule {
                        name: profiles.modules[pool[p].0].name.clone(),
                        dp: 1,
                        sm: o.units as f64 / upg as f64,
                        time_ms: (t * 1e4).round() / 1e4,
                    })
                    .collect(),
            });
        }
    }
    file(profiles, model, cluster, n, seed, samples)
}

/// One try at a colocation of `k` modules of `pool`: (pool index, its dp-1 option) each;
/// quotas are drawn in `(step, steps)`: `steps` steps of `step` units to share.
fn draw(
    rng: &mut SplitMix64,
    pool: &[(usize, usize, Vec<QuotaOption>)],
    k: usize,
    (step, steps): (u32, u32),
    mem_cap: f64,
) -> Option<Vec<(usize, QuotaOption)>> {
    let mut order: Vec<usize> = (0..pool.len()).collect();
    rng.shuffle(&mut order);
    let chosen = &order[..k];
    let total = rng.range(k, steps as usize);
    // k − 1 distinct cut points in 1..total split it into k positive parts.
    let mut cuts: Vec<usize> = (1..total).collect();
    rng.shuffle(&mut cuts);
    let mut cuts: Vec<usize> = cuts[..k - 1].to_vec();
    cuts.sort_unstable();
    cuts.insert(0, 0);
    cuts.push(total);
    let mut picks = Vec::with_capacity(k);
    let mut mem = 0.0;
    for (j, &p) in chosen.iter().enumerate() {
        let units = (cuts[j + 1] - cuts[j]) as u32 * step;
        let o = *pool[p].2.iter().find(|o| o.units == units)?;
        mem += o.mem_gib;
        picks.push((p, o));
    }
    (mem <= mem_cap).then_some(picks)
}

fn file(
    profiles: &PerfModel,
    model: &ModelSpec,
    cluster: &ClusterSpec,
    n: usize,
    seed: u64,
    samples: Vec<Colocation>,
) -> ColocationFile {
    ColocationFile {
        format: COLOCATIONS_FORMAT.to_string(),
        device: profiles.device.name.clone(),
        source: Some(format!(
            "mosaic-sim: {} of {n} random colocations of {} on one {} GPU of {} at dp 1 (seed \
             {seed}), measured by the simulator's max-min fair HBM sharing",
            samples.len(),
            model.name,
            cluster.device.name,
            cluster.name
        )),
        samples,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (ModelSpec, ClusterSpec, PerfModel) {
        let model = mosaic_zoo::model("ofasys").unwrap();
        let cluster = mosaic_zoo::cluster("h100x8").unwrap();
        let perf = PerfModel::new(&mosaic_zoo::profile(&model, &cluster), 0.1, "p").unwrap();
        (model, cluster, perf)
    }

    #[test]
    fn colocations_are_valid_deterministic_and_cover_up_to_eight_modules() {
        let (model, cluster, perf) = setup();
        let c = random_colocations(&model, &cluster, &perf, 120, 42);
        assert_eq!(c.samples.len(), 120);
        assert_eq!(c, random_colocations(&model, &cluster, &perf, 120, 42));
        assert_ne!(c, random_colocations(&model, &cluster, &perf, 120, 43));
        // A valid file, as the fit reads it.
        let text = serde_json::to_string(&c).unwrap();
        assert_eq!(
            mosaic_profile::parse_colocations(&text, "c.json").unwrap(),
            c
        );
        let mut counts = [0usize; 9];
        for s in &c.samples {
            counts[s.modules.len()] += 1;
            let total: f64 = s.modules.iter().map(|m| m.sm).sum();
            assert!(total <= 1.0 + 1e-9);
            let mut mem = 0.0;
            for m in &s.modules {
                assert_eq!(m.dp, 1);
                let i = perf.index_of(&m.name).unwrap();
                let o = perf.modules[i]
                    .options
                    .iter()
                    .find(|o| o.dp == 1 && (o.sm - m.sm).abs() < 1e-9)
                    .expect("a candidate");
                mem += o.mem_gib;
                // Sharing only takes bandwidth away: never faster than alone (the profile), up
                // to the file's rounding to 0.1 µs.
                assert!(m.time_ms >= o.time_ms - 0.6e-4, "{m:?} vs {o:?}");
            }
            assert!(mem <= perf.device.memory_gib);
        }
        assert!(counts[2] > counts[8] && counts[8] > 0, "{counts:?}");
        assert!(counts[2..=8].iter().all(|&c| c > 0), "{counts:?}");
    }

    /// On a profile with the device's SM partitions (dp 1, sampled at every quota of the H100's
    /// grid), colocations are drawn in whole partitions of 8 SMs, at most the 128 a split
    /// hands out, each a candidate of its module.
    #[test]
    fn colocations_on_sm_partitions_are_whole_partitions() {
        let model = mosaic_zoo::model("ofasys").unwrap();
        let cluster = mosaic_zoo::cluster("h100x8").unwrap();
        let cal = mosaic_zoo::Calibration::default();
        let mut file = mosaic_zoo::profile(&model, &cluster);
        file.device = cluster.device.profile_device();
        for (i, m) in file.modules.iter_mut().enumerate() {
            m.samples = cluster
                .device
                .quota_grid()
                .iter()
                .map(|&sm| cal.estimate(&model, i, &cluster, 1, sm).sample())
                .collect();
        }
        let perf = PerfModel::new(&file, 0.1, "p").unwrap();
        assert_eq!(perf.units_per_gpu, 132);
        let c = random_colocations(&model, &cluster, &perf, 60, 7);
        assert!(c.samples.len() >= 50, "{} samples", c.samples.len());
        for s in &c.samples {
            let sms: Vec<f64> = s.modules.iter().map(|m| m.sm * 132.0).collect();
            assert!(
                sms.iter()
                    .all(|n| (n - n.round()).abs() < 1e-9 && (n.round() as u32).is_multiple_of(8)),
                "{sms:?}"
            );
            assert!(sms.iter().sum::<f64>() <= 128.0 + 1e-9, "{sms:?}");
        }
        assert!(c.samples.iter().any(|s| s.modules.len() >= 4));
        // Every quota is a candidate of its module, as the fit looks it up.
        for m in c.samples.iter().flat_map(|s| &s.modules) {
            let units = (m.sm * 132.0).round() as u32;
            let module = &perf.modules[perf.index_of(&m.name).unwrap()];
            assert!(module.options.iter().any(|o| o.dp == 1 && o.units == units));
        }
    }

    #[test]
    fn a_module_alone_would_be_its_profile_and_contention_slows_heavy_pairs() {
        let (model, cluster, perf) = setup();
        // Two bandwidth-heavy modules at half a GPU each slow each other down.
        let text = model.modules.iter().position(|m| m.name == "text").unwrap();
        let video = model
            .modules
            .iter()
            .position(|m| m.name == "video")
            .unwrap();
        // 64 of 132 SMs each: half a GPU as green contexts grant it.
        let half = 64.0 / 132.0;
        let t = crate::colocate(&model, &cluster, &[(text, 1, half), (video, 1, half)]);
        let alone = |name: &str| {
            let m = &perf.modules[perf.index_of(name).unwrap()];
            m.options
                .iter()
                .find(|o| o.dp == 1 && o.units == 64)
                .unwrap()
                .time_ms
        };
        assert!(
            t[0] > alone("text") * 1.01 && t[1] > alone("video") * 1.001,
            "{t:?}"
        );
    }
}
