//! Deterministic random models for tests and benchmarks.
//!
//! [`random_profiles`] builds a valid `mosaic-profiles/1` file from a seed: a multimodal-looking
//! DAG (encoder chains fanning into a backbone, heads after it, a few extra cross edges) and,
//! per module, a roofline-ish scaling surface sampled on the paper's grid (dp at powers of two,
//! SM quota at deciles, §3.3). The same seed always gives the same file: the generator is the
//! self-contained [`SplitMix64`] of `mosaic-kit`, not the `rand` crate, so no dependency
//! update can change the models a test or benchmark sees.
//!
//! ```
//! use mosaic_plan::synthetic::random_profiles;
//! let file = random_profiles(7, 6, 8);
//! assert_eq!(file.modules.len(), 6);
//! let model = mosaic_profile::PerfModel::new(&file, 0.1, "synthetic").unwrap();
//! assert_eq!(model.topo_order.len(), 6);
//! assert_eq!(random_profiles(7, 6, 8), file, "deterministic");
//! ```

use mosaic_kit::rng::SplitMix64;
use mosaic_profile::{
    Device, Interference, ModuleProfile, ProfileFile, Sample, FORMAT, MAX_MODULES,
};

/// Device memory of the synthetic GPU, in GiB (an 80 GiB H100 SXM5, NVIDIA H100 datasheet).
pub const SYNTHETIC_MEMORY_GIB: f64 = 80.0;

/// Streaming multiprocessors of the synthetic GPU (H100 SXM5: 132 SMs, NVIDIA H100 datasheet).
pub const SYNTHETIC_SM_COUNT: u32 = 132;

/// Encoder modality names, for readable module names.
const MODALITIES: [&str; 8] = [
    "vision", "text", "audio", "depth", "imu", "video", "thermal", "points",
];

/// The role a module plays in the synthetic DAG; it scales the module's work.
#[derive(Clone, Copy, PartialEq)]
enum Role {
    Encoder,
    Backbone,
    Head,
}

/// A random model of `modules` modules profiled at every power-of-two dp up to `max_dp`,
/// as a valid `mosaic-profiles/1` file that [`mosaic_profile::PerfModel::new`] accepts at any
/// quota granularity (the quota 1.0 is always sampled and always fits at `max_dp`).
///
/// The DAG: one to four encoder chains (modality names such as `vision_0 → vision_1`) fan into
/// a backbone (one module, or a two-module chain), followed by zero or more heads; then random
/// extra edges from an earlier to a later module of that numbering, so the graph stays acyclic.
/// The file lists the modules in a shuffled order, so file order is not a topological order.
///
/// Each module is sampled at dp ∈ {1, 2, 4, …, ≤ `max_dp`} and sm ∈ {0.1, 0.2, …, 1.0} from a
/// roofline-ish surface: `time = work / (dp · min(sm, a_sat)) · (1 ± 2 % noise) + overhead +
/// comm(dp)`, with `a_sat` uniform in [0.3, 1], work log-uniform over an order of magnitude
/// (backbones ×3, heads ×½), and a ring all-reduce term `2(dp−1)/dp · c + latency · log2 dp`
/// that grows with dp. Memory per GPU is `static + activations / dp` (replicated weights,
/// split batch), constant in sm; some modules do not fit one 80 GiB GPU at dp = 1, but every
/// module fits at `max_dp`. Bandwidth utilisation grows with the quota until `a_sat` and is
/// higher for modules that saturate early (memory-bound ones), always in [0, 1]. The
/// interference coefficients are uniform in e1 ∈ [0, 0.1], e2 ∈ [0, 0.3], e3 ∈ [0, 0.5].
///
/// `max_dp` values below 1 count as 1. Numbers are rounded to 4 decimals so that files are
/// short and survive a JSON round trip unchanged.
///
/// # Panics
/// If `modules` is 0 or more than [`MAX_MODULES`].
pub fn random_profiles(seed: u64, modules: usize, max_dp: u32) -> ProfileFile {
    assert!(
        (1..=MAX_MODULES).contains(&modules),
        "random_profiles: expected 1..={MAX_MODULES} modules, got {modules}"
    );
    let max_dp = max_dp.max(1);
    let mut rng = SplitMix64::new(seed);
    let (names, roles, parents) = random_dag(&mut rng, modules);
    let dps = powers_of_two(max_dp);
    assemble(
        &mut rng,
        &names,
        &parents,
        |rng, i| random_surface(rng, roles[i], &dps),
        |rng| Interference {
            e1: round4(rng.uniform(0.0, 0.1)),
            e2: round4(rng.uniform(0.0, 0.3)),
            e3: round4(rng.uniform(0.0, 0.5)),
        },
        format!(
            "mosaic_plan::synthetic::random_profiles(seed {seed}, {modules} modules, max dp {max_dp})"
        ),
    )
}

/// Names, roles and producer lists of a random multimodal DAG, in a topological numbering
/// (every producer index is smaller than its consumer's).
#[allow(clippy::type_complexity)]
fn random_dag(rng: &mut SplitMix64, n: usize) -> (Vec<String>, Vec<Role>, Vec<Vec<usize>>) {
    // Heads and backbone modules first; whatever is left are encoders (at least one if n ≥ 2).
    let heads = if n >= 4 { rng.range(0, (n - 1) / 3) } else { 0 };
    let backbones = if n >= 6 && rng.chance(0.5) { 2 } else { 1 };
    let encoders = n - heads - backbones;
    let chains = if encoders == 0 {
        0
    } else {
        rng.range(1, encoders.min(4))
    };
    // Chain lengths: one module each, the rest spread at random.
    let mut lengths = vec![1usize; chains];
    for _ in chains..encoders {
        let c = rng.below(chains as u64) as usize;
        lengths[c] += 1;
    }

    let mut names = Vec::with_capacity(n);
    let mut roles = Vec::with_capacity(n);
    let mut parents: Vec<Vec<usize>> = Vec::with_capacity(n);
    let mut chain_ends = Vec::with_capacity(chains);
    for (c, &len) in lengths.iter().enumerate() {
        let modality = if c < MODALITIES.len() {
            MODALITIES[c].to_string()
        } else {
            format!("{}{}", MODALITIES[c % MODALITIES.len()], c)
        };
        for k in 0..len {
            parents.push(if k == 0 {
                Vec::new()
            } else {
                vec![names.len() - 1]
            });
            names.push(format!("{modality}_{k}"));
            roles.push(Role::Encoder);
        }
        chain_ends.push(names.len() - 1);
    }
    for b in 0..backbones {
        parents.push(if b == 0 {
            chain_ends.clone()
        } else {
            vec![names.len() - 1]
        });
        names.push(format!("backbone_{b}"));
        roles.push(Role::Backbone);
    }
    let last_backbone = names.len() - 1;
    for h in 0..heads {
        parents.push(vec![last_backbone]);
        names.push(format!("head_{h}"));
        roles.push(Role::Head);
    }
    debug_assert_eq!(names.len(), n);

    // Extra edges i → j with i < j keep the numbering topological, hence the graph acyclic.
    if n >= 3 {
        for _ in 0..rng.range(0, n / 4) {
            let j = rng.range(1, n - 1);
            let i = rng.below(j as u64) as usize;
            if !parents[j].contains(&i) {
                parents[j].push(i);
            }
        }
    }
    (names, roles, parents)
}

/// One module's samples on the dp × decile grid.
fn random_surface(rng: &mut SplitMix64, role: Role, dps: &[u32]) -> Vec<Sample> {
    let scale = match role {
        Role::Encoder => 1.0,
        Role::Backbone => 3.0,
        Role::Head => 0.5,
    };
    // Time on a whole GPU at dp 1, compute part only: 20–200 ms times the role's scale.
    let full_ms = scale * rng.log_uniform(20.0, 200.0);
    let a_sat = rng.uniform(0.3, 1.0);
    let overhead_ms = rng.uniform(0.5, 3.0);
    // Gradient all-reduce: a ring moves 2(d−1)/d of the gradient bytes, plus per-hop latency.
    let allreduce_ms = full_ms * rng.uniform(0.01, 0.15);
    let hop_ms = rng.uniform(0.1, 1.0);
    // Memory-bound modules (small a_sat) use much of the bandwidth; compute-bound ones little.
    let bw_peak = (0.95 - 0.8 * (a_sat - 0.3) / 0.7 + rng.uniform(-0.1, 0.1)).clamp(0.02, 1.0);
    let efficiency = rng.uniform(0.6, 0.95);
    // Memory at dp 1: log-uniform 4–130 GiB, so roughly one module in seven needs dp ≥ 2.
    let mut mem1 = rng.log_uniform(4.0, 130.0);
    let static_frac = rng.uniform(0.1, 0.6);
    let max_dp = *dps.last().expect("dp 1 is always sampled") as f64;
    let at_max = |mem1: f64| mem1 * (static_frac + (1.0 - static_frac) / max_dp);
    let limit = 0.95 * SYNTHETIC_MEMORY_GIB;
    if at_max(mem1) > limit {
        // Shrink so that the module fits at the largest dp, with some slack left at random.
        mem1 *= rng.uniform(0.5, 0.95) * limit / at_max(mem1);
    }

    let mut samples = Vec::with_capacity(dps.len() * 10);
    for &dp in dps {
        let d = dp as f64;
        let comm_ms = allreduce_ms * 2.0 * (d - 1.0) / d + hop_ms * (dp.trailing_zeros() as f64);
        let mem_gib = mem1 * (static_frac + (1.0 - static_frac) / d);
        for decile in 1..=10u32 {
            let sm = decile as f64 / 10.0;
            let effective = sm.min(a_sat);
            let noise = 1.0 + rng.uniform(-0.02, 0.02);
            let compute_ms = full_ms * a_sat / (d * effective) * noise;
            samples.push(Sample {
                dp,
                sm,
                time_ms: round4(compute_ms + overhead_ms + comm_ms),
                mem_gib: round4(mem_gib),
                sm_util: round4(efficiency * effective / sm).clamp(0.0, 1.0),
                bw_util: round4(bw_peak * effective / a_sat).clamp(0.0, 1.0),
            });
        }
    }
    samples
}

/// A random model shaped like the zoo's multimodal models, the second generator of the
/// planner's benchmark: many encoders (one or two modules each, up to half the model) all
/// feeding a backbone chain of one to three modules (wide fan-in), then decoders (one or two
/// modules each) after the backbone, some of which also read an encoder's output directly.
///
/// Surfaces differ from [`random_profiles`] too: compute 20–400 ms on a whole GPU at dp 1
/// (log-uniform; the backbone ×2), saturation quota uniform in [0.2, 1] (more quota beyond it
/// does not help), a fixed cost of 1–10 ms per step that neither quota nor dp shrink (launch
/// and optimizer floors, as measured on an H100 in `shared/measurements/h100`), and a ring
/// all-reduce of 1–15 % of the compute that grows with dp. Bandwidth utilisation grows with the
/// quota up to saturation. Interference is e = (0.02, 0.05, 0.3): the coefficients the team's
/// planner issue (13) names. Every module fits one GPU's memory at every dp ≥ 2 and most at 1.
///
/// ```
/// use mosaic_plan::synthetic::zoo_shaped_profiles;
/// let file = zoo_shaped_profiles(3, 12, 32);
/// assert_eq!(file.modules.len(), 12);
/// let model = mosaic_profile::PerfModel::new(&file, 0.1, "zoo-shaped").unwrap();
/// // The backbone reads every encoder: some module has at least three producers.
/// assert!(model.modules.iter().any(|m| m.parents.len() >= 3));
/// ```
///
/// # Panics
/// If `modules` is 0 or more than [`MAX_MODULES`].
pub fn zoo_shaped_profiles(seed: u64, modules: usize, max_dp: u32) -> ProfileFile {
    assert!(
        (1..=MAX_MODULES).contains(&modules),
        "zoo_shaped_profiles: expected 1..={MAX_MODULES} modules, got {modules}"
    );
    let max_dp = max_dp.max(1);
    let mut rng = SplitMix64::stream(seed, "zoo-shaped", modules as u64);
    let n = modules;
    // Backbone length, then encoder and decoder module counts.
    let backbone = match n {
        1..=2 => 1,
        3..=7 => rng.range(1, 2),
        _ => rng.range(1, 3),
    };
    let rest = n - backbone;
    let enc_modules = if rest == 0 {
        0
    } else {
        rng.range(rest.div_ceil(2), rest)
    };
    let dec_modules = rest - enc_modules;
    let mut names: Vec<String> = Vec::with_capacity(n);
    let mut parents: Vec<Vec<usize>> = Vec::with_capacity(n);
    let mut backbone_flags = Vec::with_capacity(n);
    // Encoders: groups of one or two modules, each group a chain.
    let mut encoder_ends = Vec::new();
    let mut left = enc_modules;
    let mut e = 0;
    while left > 0 {
        let len = if left >= 2 && rng.chance(0.4) { 2 } else { 1 };
        let modality = MODALITIES[e % MODALITIES.len()];
        for k in 0..len {
            parents.push(if k == 0 {
                Vec::new()
            } else {
                vec![names.len() - 1]
            });
            names.push(format!("enc{e}_{modality}_{k}"));
            backbone_flags.push(false);
        }
        encoder_ends.push(names.len() - 1);
        left -= len;
        e += 1;
    }
    for b in 0..backbone {
        parents.push(if b == 0 {
            encoder_ends.clone()
        } else {
            vec![names.len() - 1]
        });
        names.push(format!("backbone_{b}"));
        backbone_flags.push(true);
    }
    let last_backbone = names.len() - 1;
    let mut left = dec_modules;
    let mut d = 0;
    while left > 0 {
        let len = if left >= 2 && rng.chance(0.3) { 2 } else { 1 };
        for k in 0..len {
            let mut after = vec![if k == 0 {
                last_backbone
            } else {
                names.len() - 1
            }];
            if k == 0 && !encoder_ends.is_empty() && rng.chance(0.3) {
                after.push(encoder_ends[rng.below(encoder_ends.len() as u64) as usize]);
            }
            parents.push(after);
            names.push(format!("dec{d}_{k}"));
            backbone_flags.push(false);
        }
        left -= len;
        d += 1;
    }
    let dps = powers_of_two(max_dp);
    assemble(
        &mut rng,
        &names,
        &parents,
        |rng, i| floor_surface(rng, backbone_flags[i], &dps),
        |_| Interference {
            e1: 0.02,
            e2: 0.05,
            e3: 0.3,
        },
        format!(
            "mosaic_plan::synthetic::zoo_shaped_profiles(seed {seed}, {modules} modules, max dp {max_dp})"
        ),
    )
}

/// One module's samples for [`zoo_shaped_profiles`]: saturating compute, a fixed floor, and a
/// ring all-reduce that grows with dp.
fn floor_surface(rng: &mut SplitMix64, backbone: bool, dps: &[u32]) -> Vec<Sample> {
    let full_ms = rng.log_uniform(20.0, 400.0) * if backbone { 2.0 } else { 1.0 };
    let a_sat = rng.uniform(0.2, 1.0);
    let fixed_ms = rng.uniform(1.0, 10.0);
    let allreduce_ms = full_ms * rng.uniform(0.01, 0.15);
    let bw_peak = rng.uniform(0.1, 0.9);
    let mem1 = rng.log_uniform(4.0, 90.0);
    let mut samples = Vec::with_capacity(dps.len() * 10);
    for &dp in dps {
        let d = dp as f64;
        // Weights and optimizer state replicated (40 %), activations split by dp.
        let mem_gib = (mem1 * (0.4 + 0.6 / d)).min(0.95 * SYNTHETIC_MEMORY_GIB);
        for decile in 1..=10u32 {
            let sm = decile as f64 / 10.0;
            let effective = sm.min(a_sat);
            let compute_ms = full_ms * a_sat / (d * effective);
            let comm_ms = allreduce_ms * 2.0 * (d - 1.0) / d;
            samples.push(Sample {
                dp,
                sm,
                time_ms: round4(compute_ms + fixed_ms + comm_ms),
                mem_gib: round4(mem_gib),
                sm_util: round4(effective / sm),
                bw_util: round4(bw_peak * effective / a_sat).clamp(0.0, 1.0),
            });
        }
    }
    samples
}

/// The powers of two up to `max_dp`: the dp values every synthetic module is sampled at.
fn powers_of_two(max_dp: u32) -> Vec<u32> {
    (0..32)
        .map(|k| 1u32 << k)
        .take_while(|&d| d <= max_dp)
        .collect()
}

/// A file on the synthetic GPU: module `i` is `names[i]` after `parents[i]`, sampled by
/// `surface`; the modules are listed in a shuffled order, then `interference` is drawn.
fn assemble(
    rng: &mut SplitMix64,
    names: &[String],
    parents: &[Vec<usize>],
    mut surface: impl FnMut(&mut SplitMix64, usize) -> Vec<Sample>,
    interference: impl FnOnce(&mut SplitMix64) -> Interference,
    source: String,
) -> ProfileFile {
    let mut profiles: Vec<ModuleProfile> = (0..names.len())
        .map(|i| ModuleProfile {
            name: names[i].clone(),
            after: parents[i].iter().map(|&p| names[p].clone()).collect(),
            samples: surface(rng, i),
            grad_gib: None,
        })
        .collect();
    rng.shuffle(&mut profiles);
    ProfileFile {
        format: FORMAT.to_string(),
        device: Device {
            name: "H100-SXM5-80GB".to_string(),
            sm_count: SYNTHETIC_SM_COUNT,
            memory_gib: SYNTHETIC_MEMORY_GIB,
            partition: None,
        },
        nodes: None,
        modules: profiles,
        interference: interference(rng),
        source: Some(source),
    }
}

/// Rounds to 4 decimals.
fn round4(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

#[cfg(test)]
mod tests {
    use super::*;
    use mosaic_profile::PerfModel;

    fn round_trip(file: &ProfileFile) -> ProfileFile {
        let text = serde_json::to_string_pretty(file).unwrap();
        mosaic_profile::parse(&text, "synthetic.json")
            .unwrap_or_else(|e| panic!("generated file is invalid: {e}\n{text}"))
    }

    #[test]
    fn output_parses_and_models_at_every_size() {
        for seed in 0..40u64 {
            for &(n, max_dp) in &[(1, 1), (2, 2), (3, 1), (5, 4), (8, 8), (12, 16), (64, 8)] {
                let file = random_profiles(seed, n, max_dp);
                let parsed = round_trip(&file);
                assert_eq!(parsed, file, "JSON round trip changes the file");
                for granularity in [0.1, 0.25, 0.5, 1.0] {
                    let model = PerfModel::new(&parsed, granularity, "synthetic.json")
                        .unwrap_or_else(|e| panic!("seed {seed}, {n} modules: {e}"));
                    assert_eq!(model.modules.len(), n);
                    for m in &model.modules {
                        // Every module fits at the largest dp.
                        assert!(m.options.iter().any(|o| o.dp == max_dp));
                    }
                }
            }
        }
    }

    #[test]
    fn same_seed_same_file_other_seed_other_file() {
        assert_eq!(random_profiles(42, 9, 8), random_profiles(42, 9, 8));
        assert_ne!(random_profiles(42, 9, 8), random_profiles(43, 9, 8));
    }

    #[test]
    fn surfaces_look_like_the_paper_says() {
        let mut too_big_for_one_gpu = 0;
        let mut modules = 0;
        for seed in 0..50u64 {
            let file = random_profiles(seed, 8, 8);
            let e = file.interference;
            assert!((0.0..=0.1).contains(&e.e1), "{e:?}");
            assert!((0.0..=0.3).contains(&e.e2), "{e:?}");
            assert!((0.0..=0.5).contains(&e.e3), "{e:?}");
            for m in &file.modules {
                modules += 1;
                let at = |dp: u32, decile: u32| {
                    m.samples
                        .iter()
                        .find(|s| s.dp == dp && (s.sm * 10.0).round() as u32 == decile)
                        .unwrap()
                };
                assert_eq!(m.samples.len(), 4 * 10);
                if at(1, 1).mem_gib > SYNTHETIC_MEMORY_GIB {
                    too_big_for_one_gpu += 1;
                }
                for s in &m.samples {
                    assert!((0.0..=1.0).contains(&s.bw_util) && (0.0..=1.0).contains(&s.sm_util));
                }
                for dp in [1, 2, 4] {
                    // Memory per GPU shrinks with dp; more quota is never much slower.
                    assert!(at(2 * dp, 5).mem_gib < at(dp, 5).mem_gib);
                    assert!(at(dp, 10).time_ms <= at(dp, 1).time_ms);
                }
            }
        }
        assert!(
            too_big_for_one_gpu > 0 && too_big_for_one_gpu < modules / 3,
            "{too_big_for_one_gpu} of {modules} modules do not fit one GPU"
        );
    }

    #[test]
    fn zoo_shaped_models_fan_in_and_parse() {
        for seed in 0..20u64 {
            for &(n, max_dp) in &[(1, 1), (2, 8), (5, 4), (12, 32), (32, 1024), (64, 8)] {
                let file = zoo_shaped_profiles(seed, n, max_dp);
                assert_eq!(round_trip(&file), file, "JSON round trip changes the file");
                let model = PerfModel::new(&file, 0.1, "zoo-shaped.json")
                    .unwrap_or_else(|e| panic!("seed {seed}, {n} modules: {e}"));
                let backbone = model.index_of("backbone_0").expect("a backbone");
                let encoders = file
                    .modules
                    .iter()
                    .filter(|m| m.name.starts_with("enc"))
                    .count();
                let sources = model
                    .modules
                    .iter()
                    .filter(|m| m.parents.is_empty())
                    .count();
                // The backbone reads every encoder group (each starts at a source module).
                let fan_in = model.modules[backbone].parents.len();
                assert_eq!(fan_in, sources - usize::from(fan_in == 0));
                assert!(
                    2 * encoders >= n.saturating_sub(3),
                    "{encoders} encoders of {n}"
                );
                for m in &model.modules {
                    assert!(m.options.iter().any(|o| o.dp == max_dp));
                }
            }
        }
    }

    #[test]
    fn dag_has_encoders_backbone_and_heads() {
        let file = random_profiles(3, 10, 4);
        let backbone = file
            .modules
            .iter()
            .find(|m| m.name == "backbone_0")
            .unwrap();
        assert!(!backbone.after.is_empty());
        assert!(file.modules.iter().any(|m| m.after.is_empty()));
    }
}
