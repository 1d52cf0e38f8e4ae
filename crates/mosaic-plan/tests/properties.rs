//! Property tests of the planner against independent oracles.
//!
//! - StageEval is exact: on tiny stages it agrees with a brute force over every option of every
//!   module and every set of distinct GPUs per module, with Eq. 8 written out again here; on
//!   larger pools it never gets slower with one more GPU or more memory; the result cache and
//!   the pruning bound answer like StageEval itself.
//! - Every plan `solve` returns is valid ([`Plan::check`], and the same conditions re-checked
//!   here from the profile file alone: producers in strictly earlier stages, iteration time the
//!   sum of the stage times, each module's time re-derived from the performance model).
//! - The exact search is exact (it agrees with a plain dynamic programme over the DAG's
//!   down-sets) and never worse than GAHC; GAHC stays close to it on typical models.
//!
//! The whole file runs in a few seconds in a debug build. For a long bug hunt, raise every
//! property's case count with `PROPTEST_CASES=20000 cargo test -p mosaic-plan --test
//! properties`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use mosaic_plan::synthetic::{random_profiles, zoo_shaped_profiles};
use mosaic_plan::{
    exact, gahc, solve, stage_eval, stage_eval_within, Candidates, Limits, Plan, PlanError,
    Problem, Search, SolveOptions, StageAlloc, StageCache, HEURISTIC_LIMITS,
};
use mosaic_profile::{
    Device, Interference, ModuleProfile, ModuleSet, PerfModel, ProfileFile, Sample, SmGranularity,
    FORMAT,
};
use proptest::prelude::*;

mod common;
use common::config;

// ---------------------------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------------------------

/// Serialises `file`, parses it back through the validating parser and builds its model; `None`
/// when the model cannot be built (a module without any option at this granularity).
fn model_of(file: &ProfileFile, granularity: f64) -> Option<(ProfileFile, PerfModel)> {
    let text = serde_json::to_string(file).expect("serialisable");
    let parsed = mosaic_profile::parse(&text, "prop.json")
        .unwrap_or_else(|e| panic!("generated profile rejected: {e}\n{text}"));
    let model = PerfModel::new(&parsed, granularity, "prop.json").ok()?;
    Some((parsed, model))
}

/// A problem built without `Problem::new`'s placeability check, so that StageEval also meets
/// modules that have no candidate on the pool.
fn raw_problem(model: &PerfModel, gpus: u32) -> Problem<'_> {
    Problem {
        model,
        gpus,
        cands: model
            .modules
            .iter()
            .map(|m| Candidates::new(&m.options, gpus))
            .collect(),
    }
}

fn rel_close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs()).max(1e-12)
}

/// One module's replicas in the oracle: a quota option and the set of GPUs (a bitmask).
#[derive(Debug, Clone, Copy)]
struct Pick {
    units: u32,
    mem_gib: f64,
    bw_util: f64,
    time_ms: f64,
    gpus: u32,
}

/// The stage time of `picks` as the issue states it, or `None` when a GPU is over its quota or
/// memory: module time = time_ms · (1 + max over its GPUs of Δ_g), Δ_g = 0 with one module on
/// g, else e1 + e2·ΣB + e3·ΠB.
fn oracle_stage_time(model: &PerfModel, gpus: u32, picks: &[Pick]) -> Option<f64> {
    let e = model.interference;
    let mut delta = vec![0.0f64; gpus as usize];
    for (g, d) in delta.iter_mut().enumerate() {
        let on: Vec<&Pick> = picks.iter().filter(|p| p.gpus >> g & 1 == 1).collect();
        let units: Vec<u32> = on.iter().map(|p| p.units).collect();
        if !quotas_fit(model, &units) {
            return None;
        }
        if on.iter().map(|p| p.mem_gib).sum::<f64>() > model.device.memory_gib + 1e-9 {
            return None;
        }
        if on.len() >= 2 {
            let sum: f64 = on.iter().map(|p| p.bw_util).sum();
            let prod: f64 = on.iter().map(|p| p.bw_util).product();
            *d = e.e1 + e.e2 * sum + e.e3 * prod;
        }
    }
    let mut stage = 0.0f64;
    for p in picks {
        let worst = (0..gpus as usize)
            .filter(|&g| p.gpus >> g & 1 == 1)
            .map(|g| delta[g])
            .fold(0.0f64, f64::max);
        stage = stage.max(p.time_ms * (1.0 + worst));
    }
    Some(stage)
}

/// Whether one GPU can hold quotas of `units` each, by the rule written out again: without a
/// partition rule, at most `units_per_gpu` in all; with one (units are SMs), a module alone may
/// hold the whole GPU, and modules sharing it hold allowed partitions (at least `min_sms`, a
/// multiple of `step_sms`) that one split of the device can hand out (at most the largest
/// multiple of `step_sms` within `sm_count`).
fn quotas_fit(model: &PerfModel, units: &[u32]) -> bool {
    match model.device.partition {
        None => units.iter().sum::<u32>() <= model.units_per_gpu,
        Some(rule) => {
            let sms = model.device.sm_count;
            assert_eq!(model.units_per_gpu, sms, "one unit is one SM");
            match units {
                [] => true,
                [one] => *one <= sms,
                many => {
                    many.iter()
                        .all(|&u| u >= rule.min_sms && u % rule.step_sms == 0)
                        && many.iter().sum::<u32>() <= sms - sms % rule.step_sms
                }
            }
        }
    }
}

/// The optimal stage time of `set` by brute force: every option of every module (dp ≤ gpus)
/// on every set of dp distinct GPUs, each full assignment timed by [`oracle_stage_time`].
/// Partial assignments that already overfill a GPU's quota or memory are cut short (no full
/// assignment below them fits either), which only saves time. `None` when nothing fits.
fn oracle_stage(model: &PerfModel, gpus: u32, set: ModuleSet) -> Option<f64> {
    let per_module: Vec<Vec<Pick>> = set
        .iter()
        .map(|m| {
            let mut v = Vec::new();
            for o in model.modules[m].options.iter().filter(|o| o.dp <= gpus) {
                for mask in 0u32..1 << gpus {
                    if mask.count_ones() == o.dp {
                        v.push(Pick {
                            units: o.units,
                            mem_gib: o.mem_gib,
                            bw_util: o.bw_util,
                            time_ms: o.time_ms,
                            gpus: mask,
                        });
                    }
                }
            }
            v
        })
        .collect();
    struct Walk<'a> {
        model: &'a PerfModel,
        gpus: u32,
        per_module: Vec<Vec<Pick>>,
        chosen: Vec<Pick>,
        units: Vec<u32>,
        mem: Vec<f64>,
        best: Option<f64>,
    }
    impl Walk<'_> {
        fn go(&mut self) {
            let k = self.chosen.len();
            if k == self.per_module.len() {
                if let Some(t) = oracle_stage_time(self.model, self.gpus, &self.chosen) {
                    if self.best.is_none_or(|b| t < b) {
                        self.best = Some(t);
                    }
                }
                return;
            }
            for i in 0..self.per_module[k].len() {
                let p = self.per_module[k][i];
                let on: Vec<usize> = (0..self.gpus as usize)
                    .filter(|&g| p.gpus >> g & 1 == 1)
                    .collect();
                for &g in &on {
                    self.units[g] += p.units;
                    self.mem[g] += p.mem_gib;
                }
                if on.iter().all(|&g| {
                    self.units[g] <= self.model.units_per_gpu
                        && self.mem[g] <= self.model.device.memory_gib + 1e-9
                }) {
                    self.chosen.push(p);
                    self.go();
                    self.chosen.pop();
                }
                for &g in &on {
                    self.units[g] -= p.units;
                    self.mem[g] -= p.mem_gib;
                }
            }
        }
    }
    let mut walk = Walk {
        model,
        gpus,
        per_module,
        chosen: Vec::new(),
        units: vec![0; gpus as usize],
        mem: vec![0.0; gpus as usize],
        best: None,
    };
    walk.go();
    walk.best
}

/// Checks a StageEval answer on its own terms: one placement per module of the set, each a
/// real option of its module on dp distinct GPUs of the pool, every GPU within quota and
/// memory, and times that match the oracle's formula.
fn check_alloc(model: &PerfModel, gpus: u32, set: ModuleSet, alloc: &StageAlloc) {
    assert_eq!(alloc.set, set);
    let modules: Vec<usize> = alloc.placements.iter().map(|p| p.module).collect();
    assert_eq!(
        modules,
        set.iter().collect::<Vec<_>>(),
        "one placement per module"
    );
    let mut picks = Vec::new();
    for p in &alloc.placements {
        let c = p.choice;
        let option = model.modules[p.module]
            .options
            .iter()
            .find(|o| o.dp == c.dp && o.units == c.units)
            .unwrap_or_else(|| panic!("candidate {c:?} is no option of module {}", p.module));
        assert_eq!(
            (option.time_ms, option.mem_gib, option.bw_util),
            (c.time_ms, c.mem_gib, c.bw_util)
        );
        assert_eq!(p.gpus.len(), c.dp as usize, "{p:?}");
        let mut mask = 0u32;
        for &g in &p.gpus {
            assert!(g < gpus && mask >> g & 1 == 0, "bad GPU list {:?}", p.gpus);
            mask |= 1 << g;
        }
        picks.push(Pick {
            units: c.units,
            mem_gib: c.mem_gib,
            bw_util: c.bw_util,
            time_ms: c.time_ms,
            gpus: mask,
        });
    }
    let t = oracle_stage_time(model, gpus, &picks).expect("the allocation fits the GPUs");
    assert!(
        rel_close(t, alloc.time_ms, 1e-9),
        "reported {} but the placements take {t}",
        alloc.time_ms
    );
    for (p, pick) in alloc.placements.iter().zip(&picks) {
        let alone = oracle_stage_time(model, gpus, std::slice::from_ref(pick)).unwrap();
        assert!(p.time_ms + 1e-9 >= alone && p.time_ms <= alloc.time_ms * (1.0 + 1e-12));
    }
}

/// Compares StageEval with the oracle on `set` (and the cutoff semantics around the optimum).
fn stage_eval_agrees(model: &PerfModel, gpus: u32, set: ModuleSet) -> Result<(), TestCaseError> {
    let problem = raw_problem(model, gpus);
    let expected = oracle_stage(model, gpus, set);
    let got = stage_eval(&problem, set, f64::INFINITY);
    match (&expected, &got) {
        (None, None) => {}
        (Some(e), Some(alloc)) => {
            prop_assert!(
                rel_close(*e, alloc.time_ms, 1e-9),
                "set {:?} on {gpus} GPUs: brute force {e}, StageEval {}\n{alloc:#?}",
                set,
                alloc.time_ms
            );
            check_alloc(model, gpus, set, alloc);
            // Strictly below the cutoff: the optimum itself is not, a hair above it is.
            prop_assert!(stage_eval(&problem, set, alloc.time_ms).is_none());
            let above = stage_eval(&problem, set, alloc.time_ms * (1.0 + 1e-6));
            prop_assert!(above.is_some_and(|a| rel_close(a.time_ms, alloc.time_ms, 1e-9)));
        }
        _ => prop_assert!(
            false,
            "set {:?} on {gpus} GPUs: brute force {:?}, StageEval {:?}",
            set,
            expected,
            got.map(|a| a.time_ms)
        ),
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// StageEval is exact
// ---------------------------------------------------------------------------------------------

/// A small hand-made profile from discrete values, so that ties (equal times, exact memory
/// fits, zero bandwidth) are common: per module a list of (dp, quarter of a GPU, time step,
/// index into [`MEM`], bandwidth step).
type RawModule = Vec<(u32, u32, u32, usize, u32)>;

/// Memory values of hand-made samples on an 80 GiB device: exact fits (40 + 40, 20 + 60) and
/// near misses (40.5 + 40, 39.75 + 40.5) both occur.
const MEM: [f64; 7] = [0.0, 20.0, 39.75, 40.0, 40.5, 60.0, 80.0];

fn arb_raw_file(max_modules: usize) -> impl Strategy<Value = (Vec<RawModule>, [usize; 3])> {
    let sample = (1u32..=3, 1u32..=4, 1u32..=6, 0..MEM.len(), 0u32..=4);
    (
        prop::collection::vec(prop::collection::vec(sample, 1..=6), 1..=max_modules),
        [0usize..5, 0usize..5, 0usize..5],
    )
}

/// The device of [`raw_file`]s with a partition rule: 18 SMs in partitions of at least 4 and
/// multiples of 4, so that a split hands out at most 16 and only a module alone gets all 18.
const RAW_PARTITIONED_SMS: u32 = 18;

/// SM counts of the quarters 1–4 of the partitioned raw device: whole SMs, off the grid of
/// partitions but for 4 (so the grid's 8, 12 and 16 are interpolated) and 18 (the whole GPU).
const RAW_QUARTER_SMS: [u32; 4] = [4, 9, 13, 18];

fn raw_file(modules: &[RawModule], e: [usize; 3]) -> ProfileFile {
    raw_file_on(modules, e, false)
}

/// [`raw_file`], on the partitioned 18-SM device when `partitioned`.
fn raw_file_on(modules: &[RawModule], e: [usize; 3], partitioned: bool) -> ProfileFile {
    const COEF: [f64; 5] = [0.0, 0.05, 0.1, 0.5, 1.0];
    let modules = modules
        .iter()
        .enumerate()
        .map(|(i, raw)| {
            let mut samples: Vec<Sample> = Vec::new();
            for &(dp, quarter, t, mem, bw) in raw {
                let sm = if partitioned {
                    RAW_QUARTER_SMS[quarter as usize - 1] as f64 / RAW_PARTITIONED_SMS as f64
                } else {
                    quarter as f64 / 4.0
                };
                if samples.iter().any(|s| s.dp == dp && s.sm == sm) {
                    continue;
                }
                samples.push(Sample {
                    dp,
                    sm,
                    time_ms: 10.0 * t as f64,
                    mem_gib: MEM[mem],
                    sm_util: 0.5,
                    bw_util: 0.25 * bw as f64,
                });
            }
            ModuleProfile {
                name: format!("m{i}"),
                after: Vec::new(),
                samples,
                grad_gib: None,
            }
        })
        .collect();
    ProfileFile {
        format: FORMAT.to_string(),
        device: Device {
            name: "test".to_string(),
            sm_count: if partitioned {
                RAW_PARTITIONED_SMS
            } else {
                100
            },
            memory_gib: 80.0,
            partition: partitioned.then_some(SmGranularity {
                min_sms: 4,
                step_sms: 4,
            }),
        },
        nodes: None,
        modules,
        interference: Interference {
            e1: COEF[e[0]],
            e2: COEF[e[1]],
            e3: COEF[e[2]],
        },
        source: None,
    }
}

/// StageEval against brute force on a raw file; `granularity` 0 means the partitioned device.
fn arbitrary_case(
    raw: &[RawModule],
    e: [usize; 3],
    gpus: u32,
    granularity: f64,
    set_bits: u64,
) -> Result<(), TestCaseError> {
    let file = raw_file_on(raw, e, granularity == 0.0);
    let Some((_, model)) = model_of(&file, granularity) else {
        return Err(TestCaseError::reject(
            "a module has no option at this granularity",
        ));
    };
    let all = ModuleSet::all(model.modules.len());
    let set = match ModuleSet(set_bits).intersect(all) {
        s if s.is_empty() => all,
        s => s,
    };
    stage_eval_agrees(&model, gpus, set)
}

/// Quota grids of the raw files: quarters, halves, or (0) the partitioned device's SMs.
fn granularity() -> impl Strategy<Value = f64> {
    prop_oneof![Just(0.25), Just(0.5), Just(0.0)]
}

proptest! {
    #![proptest_config(config(256))]

    /// Arbitrary (non-smooth, tie-heavy) surfaces.
    #[test]
    fn stage_eval_matches_brute_force_on_arbitrary_surfaces(
        (raw, e) in arb_raw_file(3),
        gpus in 1u32..=3,
        granularity in granularity(),
        set_bits in 1u64..8,
    ) {
        arbitrary_case(&raw, e, gpus, granularity, set_bits)?;
    }

    /// One size up: four modules on four GPUs, where GPUs hosting different modules must not
    /// be treated as interchangeable.
    #[test]
    fn stage_eval_matches_brute_force_on_four_gpus(
        (raw, e) in arb_raw_file(4),
        gpus in 3u32..=4,
        granularity in granularity(),
    ) {
        arbitrary_case(&raw, e, gpus, granularity, u64::MAX)?;
    }

    /// Synthetic roofline surfaces, with the memory and interference made tighter at random.
    #[test]
    fn stage_eval_matches_brute_force_on_synthetic_models(
        seed in any::<u64>(),
        modules in 1usize..=3,
        gpus in 1u32..=3,
        granularity in granularity(),
        max_dp in prop_oneof![Just(1u32), Just(2), Just(4)],
        memory_gib in prop_oneof![Just(80.0), 20.0f64..80.0],
        interference_scale in prop_oneof![Just(1.0), Just(4.0)],
    ) {
        let tightened =
            tightened_model(seed, modules, max_dp, granularity, memory_gib, interference_scale);
        let Some((_, model)) = tightened else {
            return Err(TestCaseError::reject("a module does not fit the smaller memory"));
        };
        stage_eval_agrees(&model, gpus, ModuleSet::all(modules))?;
    }
}

/// A hand-checked case: two modules (80 ms at half a GPU, 50 ms at three quarters) share one
/// GPU at half each and pay Eq. 8; on two GPUs each runs alone at three quarters.
#[test]
fn stage_eval_small_known_case() {
    let raw: Vec<RawModule> = vec![vec![(1, 2, 8, 1, 2), (1, 3, 5, 1, 2)]; 2];
    let file = raw_file(&raw, [1, 1, 1]);
    let (_, model) = model_of(&file, 0.25).unwrap();
    let both = ModuleSet::all(2);
    // One GPU: 0.5 + 0.5 with interference 0.05 + 0.05·1.0 + 0.05·0.25 = 0.1125 → 80 · 1.1125.
    let one = raw_problem(&model, 1);
    let alloc = stage_eval(&one, both, f64::INFINITY).unwrap();
    assert!((alloc.time_ms - 89.0).abs() < 1e-9, "{alloc:#?}");
    // Two GPUs: each alone at 0.75 → 50.
    let two = raw_problem(&model, 2);
    assert!((stage_eval(&two, both, f64::INFINITY).unwrap().time_ms - 50.0).abs() < 1e-9);
    assert!((oracle_stage(&model, 1, both).unwrap() - 89.0).abs() < 1e-9);
}

/// Eq. 8's product term falls when a module joins a GPU: two bandwidth-bound modules slow each
/// other by 0.05 · 2 + 1 · 1 · 1 = 110 %, and a third with no bandwidth of its own on the same
/// GPU cuts that to 10 %, so the stage of all three is faster than the stage of the two.
#[test]
fn a_module_that_joins_a_gpu_can_speed_its_stage_up() {
    let heavy = vec![(1, 1, 8, 1, 4)]; // 80 ms on a quarter, B = 1
    let light = vec![(1, 1, 2, 1, 0)]; // 20 ms on a quarter, B = 0
    let file = raw_file(&[heavy.clone(), heavy, light], [0, 1, 4]);
    let (_, model) = model_of(&file, 0.25).unwrap();
    let one = raw_problem(&model, 1);
    let pair = stage_eval(&one, ModuleSet::all(2), f64::INFINITY).unwrap();
    let three = stage_eval(&one, ModuleSet::all(3), f64::INFINITY).unwrap();
    assert!((pair.time_ms - 168.0).abs() < 1e-9, "{pair:#?}");
    assert!((three.time_ms - 88.0).abs() < 1e-9, "{three:#?}");
    for set in [ModuleSet::all(2), ModuleSet::all(3)] {
        let oracle = oracle_stage(&model, 1, set).unwrap();
        assert!((stage_eval(&one, set, f64::INFINITY).unwrap().time_ms - oracle).abs() < 1e-9);
    }
}

/// With SM partitions (18 SMs, partitions of 4): a module alone takes all 18 SMs, but two
/// modules sharing the GPU get at most the 16 a split hands out, never 18 between them.
#[test]
fn stage_eval_respects_the_partition_rule() {
    // 100 ms at 4 SMs, 20 ms at 18 (alone), linear in between: 4 → 100, 9 → 80, 13 → 60.
    let raw: Vec<RawModule> = vec![
        vec![
            (1, 1, 10, 1, 0),
            (1, 2, 8, 1, 0),
            (1, 3, 6, 1, 0),
            (1, 4, 2, 1, 0)
        ];
        2
    ];
    let (_, model) = model_of(&raw_file_on(&raw, [0, 0, 0], true), 0.1).unwrap();
    assert_eq!(model.units_per_gpu, 18);
    let sms: Vec<u32> = model.modules[0].options.iter().map(|o| o.units).collect();
    assert_eq!(sms, vec![4, 8, 12, 16, 18]);
    // Alone on one GPU: the whole 18 SMs.
    let one = raw_problem(&model, 1);
    let alone = stage_eval(&one, ModuleSet::single(0), f64::INFINITY).unwrap();
    assert_eq!(alone.placements[0].choice.units, 18);
    assert!((alone.time_ms - 20.0).abs() < 1e-9);
    // Both on one GPU: 8 + 8 SMs (84 ms each; 9 → 80 and 4 → 100 interpolate 8 → 84), not
    // 9 + 9, which are no partitions, and 16 in all.
    let both = stage_eval(&one, ModuleSet::all(2), f64::INFINITY).unwrap();
    let units: Vec<u32> = both.placements.iter().map(|p| p.choice.units).collect();
    assert_eq!(units, vec![8, 8]);
    assert!((both.time_ms - 84.0).abs() < 1e-9, "{both:#?}");
    assert!((oracle_stage(&model, 1, ModuleSet::all(2)).unwrap() - 84.0).abs() < 1e-9);
}

/// A synthetic model with its memory and interference coefficients scaled, or `None` when a
/// module no longer fits a GPU.
///
/// A `granularity` of 0 puts the model on a device with SM partitions instead: 100 SMs (so the
/// synthetic deciles are whole SM counts) in partitions of 8 — 16, 24, …, 96 SMs shared, all
/// 100 alone, as 128 and 132 on an H100.
fn tightened_model(
    seed: u64,
    modules: usize,
    max_dp: u32,
    granularity: f64,
    memory_gib: f64,
    interference_scale: f64,
) -> Option<(ProfileFile, PerfModel)> {
    // Both generators, by the seed's parity: the zoo-shaped one's wide fan-in into a backbone
    // chain is where the lower bound's solo modules and time windows bite.
    let mut file = if seed.is_multiple_of(2) {
        random_profiles(seed, modules, max_dp)
    } else {
        zoo_shaped_profiles(seed, modules, max_dp)
    };
    if granularity == 0.0 {
        file.device.sm_count = 100;
        file.device.partition = Some(SmGranularity {
            min_sms: 8,
            step_sms: 8,
        });
    }
    file.device.memory_gib = memory_gib;
    let e = &mut file.interference;
    e.e1 *= interference_scale;
    e.e2 *= interference_scale;
    e.e3 *= interference_scale;
    model_of(&file, granularity)
}

proptest! {
    #![proptest_config(config(64))]

    /// Beyond brute-force sizes: one more GPU never makes a stage slower (every allocation on
    /// g GPUs is one on g + 1), and neither does more memory per GPU. A placement that the
    /// symmetry reduction wrongly skipped on the larger pool would show up here.
    #[test]
    fn stage_eval_is_monotone_in_the_pool(
        seed in any::<u64>(),
        modules in 2usize..=5,
        granularity in prop_oneof![Just(0.1), Just(0.25), Just(0.0)],
        max_dp in prop_oneof![Just(2u32), Just(4), Just(8)],
        memory_gib in 40.0f64..80.0,
    ) {
        let Some((_, model)) = tightened_model(seed, modules, max_dp, granularity, memory_gib, 2.0)
        else {
            return Err(TestCaseError::reject("a module does not fit the smaller memory"));
        };
        let Some((_, roomier)) = tightened_model(seed, modules, max_dp, granularity, 80.0, 2.0) else {
            unreachable!("synthetic modules fit 80 GiB")
        };
        let set = ModuleSet::all(modules);
        let mut previous: Option<f64> = None;
        for gpus in 1..=8u32 {
            let t = stage_eval(&raw_problem(&model, gpus), set, f64::INFINITY).map(|a| a.time_ms);
            if let Some(p) = previous {
                prop_assert!(t.is_some_and(|t| t <= p * (1.0 + 1e-12)),
                    "{gpus} GPUs: {t:?}, but {p} on {} GPUs", gpus - 1);
            }
            let more_memory =
                stage_eval(&raw_problem(&roomier, gpus), set, f64::INFINITY).map(|a| a.time_ms);
            if let Some(t) = t {
                prop_assert!(more_memory.is_some_and(|m| m <= t * (1.0 + 1e-12)),
                    "{gpus} GPUs: {t} at {memory_gib} GiB but {more_memory:?} at 80 GiB");
            }
            previous = previous.or(t).map(|p| t.map_or(p, |t| t.min(p)));
        }
    }

    /// A capped StageEval, whose allocation the large-neighbourhood search then re-places
    /// neighbourhood by neighbourhood, still answers with a valid allocation (each GPU within
    /// quota and memory, times re-derived from Eq. 8), on stages wide enough that every round
    /// keeps some placements (`tests/anytime.rs` checks it against the optimum on narrower
    /// ones, where the exact search is quick).
    #[test]
    fn capped_stage_eval_answers_are_valid(
        seed in any::<u64>(),
        modules in 5usize..=8,
        gpus in 4u32..=8,
        nodes in 1u64..=64,
        memory_gib in prop_oneof![Just(80.0), 30.0f64..80.0],
        granularity in prop_oneof![Just(0.1f64), Just(0.0)],
    ) {
        let Some((_, model)) = tightened_model(seed, modules, 8, granularity, memory_gib, 2.0)
        else {
            return Err(TestCaseError::reject("a module does not fit the smaller memory"));
        };
        let problem = raw_problem(&model, gpus);
        let set = ModuleSet::all(modules);
        let limits = Limits { deadline: None, nodes, splits: 2 };
        let capped = stage_eval_within(&problem, set, f64::INFINITY, &limits);
        if let Some(alloc) = &capped.alloc {
            check_alloc(&model, gpus, set, alloc);
        }
    }

    /// No stage outweighs its time: the stage-packing weights of any set of modules that may
    /// share a stage (none an ancestor of another) sum to at most StageEval's optimum for
    /// that set, with interference scaled ×0, ×1 or ×3 and on either SM grid.
    #[test]
    fn no_stage_outweighs_its_time(
        seed in any::<u64>(),
        modules in 2usize..=8,
        gpus in 1u32..=8,
        scale in prop_oneof![Just(0.0f64), Just(1.0), Just(3.0)],
        granularity in prop_oneof![Just(0.1f64), Just(0.0)],
        sets in prop::collection::vec(1u64..256, 1..24),
    ) {
        let Some((_, model)) = tightened_model(seed, modules, 8, granularity, 80.0, scale) else {
            return Err(TestCaseError::reject("no model"));
        };
        if unplaceable(&model, gpus) {
            return Err(TestCaseError::reject("needs more GPUs"));
        }
        let problem = Problem::new(&model, gpus).unwrap();
        let weight = problem.packing_weights();
        prop_assert!(weight.iter().all(|&w| w >= 0.0), "{weight:?}");
        let all = ModuleSet::all(modules);
        for bits in sets {
            let set = ModuleSet(bits).intersect(all);
            if set.is_empty() || set.iter().any(|m| !model.modules[m].ancestors.intersect(set).is_empty()) {
                continue;
            }
            let Some(stage) = stage_eval(&problem, set, f64::INFINITY) else { continue };
            let held: f64 = set.iter().map(|m| weight[m]).sum();
            prop_assert!(held <= stage.time_ms * (1.0 + 1e-9),
                "set {set:?} weighs {held} but its stage takes {} ms", stage.time_ms);
        }
    }

    /// The result cache and the pruning bound answer every query like StageEval itself:
    /// `eval_below(set, cutoff)` is the optimum when it is below the cutoff and `None`
    /// otherwise, whatever was asked before, and `Problem::lower_bound` never exceeds the
    /// optimum.
    #[test]
    fn cache_and_lower_bound_agree_with_stage_eval(
        seed in any::<u64>(),
        modules in 2usize..=6,
        gpus in 1u32..=8,
        queries in prop::collection::vec((1u64..64, 0.5f64..1.5), 1..40),
    ) {
        let Some((_, model)) = tightened_model(seed, modules, 8, 0.1, 80.0, 1.0) else {
            unreachable!("synthetic modules fit 80 GiB")
        };
        if unplaceable(&model, gpus) {
            return Err(TestCaseError::reject("needs more GPUs"));
        }
        let problem = Problem::new(&model, gpus).unwrap();
        let mut cache = StageCache::new(&problem);
        let mut optimum: HashMap<u64, Option<f64>> = HashMap::new();
        let all = ModuleSet::all(modules);
        for (bits, factor) in queries {
            let set = match ModuleSet(bits).intersect(all) {
                s if s.is_empty() => all,
                s => s,
            };
            let opt = *optimum.entry(set.0).or_insert_with(|| {
                stage_eval(&problem, set, f64::INFINITY).map(|a| a.time_ms)
            });
            let lower = problem.lower_bound(set);
            prop_assert!(opt.is_none_or(|o| lower <= o), "lower bound {lower} > optimum {opt:?}");
            // Cutoffs around the optimum, sometimes exactly at it.
            let cutoff = match opt {
                Some(o) if factor < 0.6 => o,
                Some(o) => o * factor,
                None => 1e3 * factor,
            };
            let got = cache.eval_below(set, cutoff).map(|a| a.time_ms);
            match opt.filter(|&o| o < cutoff) {
                Some(o) => prop_assert!(got.is_some_and(|g| rel_close(g, o, 1e-12)),
                    "set {set:?} below {cutoff}: cache {got:?}, optimum {o}"),
                None => prop_assert!(got.is_none(),
                    "set {set:?} below {cutoff}: cache {got:?}, optimum {opt:?}"),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Plans from `solve` are valid; the exact search is exact and never worse than GAHC
// ---------------------------------------------------------------------------------------------

/// Checks `plan` against the profile file without trusting `Plan::check` or the model's
/// derived graph: every module once, producers (`after`) in strictly earlier stages, distinct
/// GPUs in the pool, quotas and memory within each GPU, times re-derived from the options and
/// Eq. 8, stage time = slowest module, iteration time = sum of stage times.
fn check_plan_independently(file: &ProfileFile, model: &PerfModel, plan: &Plan) {
    let mut stage_of: HashMap<&str, usize> = HashMap::new();
    for (si, stage) in plan.stages.iter().enumerate() {
        assert!(!stage.modules.is_empty(), "stage {si} is empty");
        for m in &stage.modules {
            assert!(
                stage_of.insert(m.name.as_str(), si).is_none(),
                "{} placed twice",
                m.name
            );
        }
    }
    assert_eq!(stage_of.len(), file.modules.len(), "every module placed");
    for m in &file.modules {
        let s = stage_of[m.name.as_str()];
        for p in &m.after {
            assert!(
                stage_of[p.as_str()] < s,
                "{} (stage {s}) runs before or with its producer {p} (stage {})",
                m.name,
                stage_of[p.as_str()]
            );
        }
    }
    let upg = model.units_per_gpu as f64;
    let e = model.interference;
    let mut total = 0.0;
    for (si, stage) in plan.stages.iter().enumerate() {
        // The exact option of every module, from the model by (dp, units).
        let options: Vec<_> = stage
            .modules
            .iter()
            .map(|m| {
                let i = model.index_of(&m.name).unwrap();
                let units = (m.sm * upg).round() as u32;
                assert!(
                    (units as f64 / upg - m.sm).abs() < 1e-6,
                    "{}: quota {}",
                    m.name,
                    m.sm
                );
                let o = *model.modules[i]
                    .options
                    .iter()
                    .find(|o| o.dp == m.dp && o.units == units)
                    .unwrap_or_else(|| {
                        panic!("{}: (dp {}, sm {}) is no option", m.name, m.dp, m.sm)
                    });
                assert!(
                    (o.time_ms - m.base_ms).abs() <= 1e-3 && (o.mem_gib - m.mem_gib).abs() <= 1e-3
                );
                assert!(m.dp <= plan.gpus);
                o
            })
            .collect();
        let n = plan.gpus as usize;
        let (mut units, mut mem, mut bws) = (vec![0u32; n], vec![0.0f64; n], vec![Vec::new(); n]);
        for (m, o) in stage.modules.iter().zip(&options) {
            assert_eq!(m.gpus.len(), m.dp as usize, "{}: dp vs GPUs", m.name);
            let mut seen = vec![false; n];
            for &x in &m.gpus {
                let x = x as usize;
                assert!(x < n && !seen[x], "{}: GPU list {:?}", m.name, m.gpus);
                seen[x] = true;
                units[x] += o.units;
                mem[x] += o.mem_gib;
                bws[x].push(o.bw_util);
            }
        }
        let delta: Vec<f64> = bws
            .iter()
            .map(|b| {
                if b.len() < 2 {
                    0.0
                } else {
                    e.e1 + e.e2 * b.iter().sum::<f64>() + e.e3 * b.iter().product::<f64>()
                }
            })
            .collect();
        for x in 0..n {
            let on: Vec<u32> = stage
                .modules
                .iter()
                .zip(&options)
                .filter(|(m, _)| m.gpus.contains(&(x as u32)))
                .map(|(_, o)| o.units)
                .collect();
            assert!(
                quotas_fit(model, &on),
                "stage {si} GPU {x}: quotas {on:?} do not fit"
            );
            assert!(
                mem[x] <= model.device.memory_gib + 1e-9,
                "stage {si} GPU {x}: {} GiB",
                mem[x]
            );
            assert!((stage.gpu_quota[x] - units[x] as f64 / upg).abs() < 1e-6);
        }
        let mut slowest = 0.0f64;
        for (m, o) in stage.modules.iter().zip(&options) {
            let worst = m
                .gpus
                .iter()
                .map(|&x| delta[x as usize])
                .fold(0.0, f64::max);
            let t = o.time_ms * (1.0 + worst);
            assert!(
                (t - m.time_ms).abs() <= 1e-3,
                "{}: plan says {} but Eq. 8 gives {t}",
                m.name,
                m.time_ms
            );
            slowest = slowest.max(m.time_ms);
        }
        assert!(
            (stage.time_ms - slowest).abs() <= 1e-9,
            "stage {si}: time is not its slowest module's"
        );
        total += stage.time_ms;
    }
    assert!(
        (plan.iteration_ms - total).abs() <= 1e-6 + 1e-9 * total,
        "iteration {} but stages sum to {total}",
        plan.iteration_ms
    );
}

/// The optimal iteration time by a plain dynamic programme over the DAG's down-sets, with
/// StageEval (checked above against brute force) as the stage cost.
fn oracle_iteration(problem: &Problem) -> f64 {
    fn best_from(
        problem: &Problem,
        done: ModuleSet,
        memo: &mut HashMap<u64, f64>,
        stages: &mut HashMap<u64, f64>,
    ) -> f64 {
        let model = problem.model;
        let all = ModuleSet::all(model.modules.len());
        if done == all {
            return 0.0;
        }
        if let Some(&v) = memo.get(&done.0) {
            return v;
        }
        let avail: u64 = all
            .minus(done)
            .iter()
            .filter(|&m| model.modules[m].parents.is_subset(done))
            .fold(0, |acc, m| acc | 1 << m);
        let mut best = f64::INFINITY;
        let mut sub = avail;
        while sub != 0 {
            let t = *stages.entry(sub).or_insert_with(|| {
                stage_eval(problem, ModuleSet(sub), f64::INFINITY)
                    .map_or(f64::INFINITY, |a| a.time_ms)
            });
            if t.is_finite() {
                best = best.min(t + best_from(problem, done.union(ModuleSet(sub)), memo, stages));
            }
            sub = (sub - 1) & avail;
        }
        memo.insert(done.0, best);
        best
    }
    best_from(
        problem,
        ModuleSet::EMPTY,
        &mut HashMap::new(),
        &mut HashMap::new(),
    )
}

/// Whether some module has no option on `gpus` GPUs (so planning must fail as unplaceable).
fn unplaceable(model: &PerfModel, gpus: u32) -> bool {
    model
        .modules
        .iter()
        .any(|m| m.options.iter().all(|o| o.dp > gpus))
}

fn total_ms(stages: &[std::rc::Rc<StageAlloc>]) -> f64 {
    stages.iter().map(|s| s.time_ms).sum()
}

const EXACT_BUDGET: Duration = Duration::from_secs(60);

proptest! {
    #![proptest_config(config(128))]

    /// Plans of both searches are valid; the exact search (from scratch, without GAHC's
    /// incumbent) finds the optimum of a plain dynamic programme and is never worse than GAHC.
    #[test]
    fn solved_plans_are_valid_and_exact_beats_gahc(
        seed in any::<u64>(),
        modules in 3usize..=8,
        gpus in 1u32..=8,
        max_dp in prop_oneof![Just(1u32), Just(2), Just(4), Just(8)],
        memory_gib in prop_oneof![2 => Just(80.0), 1 => 40.0f64..80.0],
        interference_scale in prop_oneof![2 => Just(1.0), 1 => Just(3.0)],
        granularity in prop_oneof![2 => Just(0.1), 1 => Just(0.0)],
    ) {
        let tightened =
            tightened_model(seed, modules, max_dp, granularity, memory_gib, interference_scale);
        let Some((file, model)) = tightened else {
            return Err(TestCaseError::reject("a module does not fit the smaller memory"));
        };
        let options = |search| SolveOptions { search, budget: EXACT_BUDGET };
        let greedy = solve(&model, gpus, &options(Search::Gahc));
        if unplaceable(&model, gpus) {
            prop_assert!(matches!(greedy, Err(PlanError::Unplaceable { .. })), "{greedy:?}");
            return Ok(());
        }
        let greedy = greedy.unwrap();
        let best = solve(&model, gpus, &options(Search::Exact)).unwrap();
        prop_assert_eq!(&greedy.search, "gahc");
        prop_assert!(best.optimal, "the exact search finishes: {best:?}");
        for plan in [&greedy, &best] {
            let bound = plan.lower_bound_ms.expect("solve states a lower bound");
            prop_assert!(bound <= plan.iteration_ms, "bound {bound} above {}", plan.iteration_ms);
        }
        prop_assert_eq!(best.lower_bound_ms, Some(best.iteration_ms));

        // The same searches without rounding: GAHC (on StageEval capped as `solve` caps it),
        // A* from scratch, and the oracle.
        let problem = Problem::new(&model, gpus).unwrap();
        let mut cache = StageCache::with_limits(&problem, HEURISTIC_LIMITS);
        let g = total_ms(&gahc(&mut cache, Instant::now() + EXACT_BUDGET).unwrap());
        let mut fresh = StageCache::new(&problem);
        let found = exact(&mut fresh, f64::INFINITY, Instant::now() + EXACT_BUDGET);
        prop_assert!(found.finished, "the exact search finishes");
        let a_star = found.better.expect("some plan exists");
        prop_assert!(rel_close(found.lower_ms, total_ms(&a_star), 1e-12));
        let x = total_ms(&a_star);
        let from_scratch = Plan::new(&model, gpus, &a_star, "exact", 0.0);

        for plan in [&greedy, &best, &from_scratch] {
            plan.check(&model)
                .map_err(|e| TestCaseError::fail(format!("Plan::check: {e}\n{plan:#?}")))?;
            check_plan_independently(&file, &model, plan);
        }
        prop_assert!(x <= g * (1.0 + 1e-6), "exact {x} > GAHC {g}");
        let dp = oracle_iteration(&problem);
        prop_assert!(rel_close(x, dp, 1e-9), "A* {x}, dynamic programme {dp}");
        // The static bound holds on its own (`solve` reports it capped by the plan).
        let bound = problem.plan_lower_bound(None);
        prop_assert!(bound <= x * (1.0 + 1e-9), "lower bound {bound} above the optimum {x}");
        // `solve` reports the better of the two, rounded to µs per stage.
        let slack = |plan: &Plan| 1e-3 * plan.stages.len() as f64;
        prop_assert!((best.iteration_ms - x).abs() <= slack(&best),
            "solve(exact) {} vs optimum {x}", best.iteration_ms);
        prop_assert!((greedy.iteration_ms - g).abs() <= slack(&greedy),
            "solve(gahc) {} vs GAHC {g}", greedy.iteration_ms);
    }
}

// ---------------------------------------------------------------------------------------------
// GAHC quality
// ---------------------------------------------------------------------------------------------

/// GAHC is within a few percent of the optimum on typical models: over 30 fixed synthetic
/// models of 6–10 modules on 8 GPUs, the median of optimum / GAHC is at least 0.9.
#[test]
fn gahc_is_close_to_exact() {
    let mut ratios = Vec::new();
    for seed in 0..30u64 {
        let modules = 6 + (seed % 5) as usize;
        let file = random_profiles(1000 + seed, modules, 8);
        let (_, model) = model_of(&file, 0.1).unwrap();
        let problem = Problem::new(&model, 8).unwrap();
        let mut cache = StageCache::new(&problem);
        let greedy = total_ms(&gahc(&mut cache, Instant::now() + EXACT_BUDGET).unwrap());
        let found = exact(&mut cache, greedy, Instant::now() + EXACT_BUDGET);
        assert!(found.finished, "seed {seed}: exact search timed out");
        let optimum = found.better.map_or(greedy, |stages| total_ms(&stages));
        let ratio = optimum / greedy;
        assert!(
            ratio <= 1.0 + 1e-9,
            "seed {seed}: exact {optimum} worse than GAHC {greedy}"
        );
        println!("seed {seed:2} ({modules:2} modules): GAHC {greedy:9.3} ms, exact {optimum:9.3} ms, ratio {ratio:.4}");
        ratios.push(ratio);
    }
    ratios.sort_by(f64::total_cmp);
    let median = (ratios[14] + ratios[15]) / 2.0;
    println!(
        "exact/GAHC over {} models: median {median:.4}, min {:.4}, mean {:.4}",
        ratios.len(),
        ratios[0],
        ratios.iter().sum::<f64>() / ratios.len() as f64
    );
    assert!(median >= 0.9, "median exact/GAHC {median}");
}
