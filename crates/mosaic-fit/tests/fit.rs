//! The fit against data generated with known coefficients, and the checks of bad input.

use mosaic_profile::{
    ColocatedModule, Colocation, ColocationFile, Device, Interference, ModuleProfile, PerfModel,
    ProfileFile, Sample, COLOCATIONS_FORMAT, FORMAT,
};

use mosaic_fit::*;
use mosaic_kit::rng::SplitMix64;

/// Six modules profiled at dp 1 and 2 on the decile grid: roofline-like times and bandwidth
/// utilisations from 0.05 to 0.9 (so ΣB and ΠB vary independently enough to fit both).
fn profile() -> ProfileFile {
    let modules = (0..6)
        .map(|i| {
            let work = 20.0 + 15.0 * i as f64;
            let sat = 0.3 + 0.12 * i as f64;
            let peak_bw = 0.15 + 0.15 * i as f64;
            ModuleProfile {
                name: format!("m{i}"),
                after: vec![],
                samples: [1u32, 2]
                    .iter()
                    .flat_map(|&dp| {
                        (1..=10).map(move |k| {
                            let sm = k as f64 / 10.0;
                            Sample {
                                dp,
                                sm,
                                time_ms: work / dp as f64 / sm.min(sat) + 1.0,
                                mem_gib: 4.0,
                                sm_util: 0.5,
                                bw_util: peak_bw * (sm / sat).min(1.0),
                            }
                        })
                    })
                    .collect(),
                grad_gib: None,
            }
        })
        .collect();
    ProfileFile {
        format: FORMAT.into(),
        device: Device {
            name: "gpu".into(),
            sm_count: 100,
            memory_gib: 80.0,
            partition: None,
        },
        nodes: None,
        modules,
        interference: Interference::default(),
        source: Some("test; interference coefficients assumed".into()),
    }
}

fn perf(p: &ProfileFile) -> PerfModel {
    PerfModel::new(p, LOOKUP_GRANULARITY, "p.json").unwrap()
}

/// `n` colocations of 2–4 random modules at dp 1 with decile quotas summing to at most 1,
/// measured as the model with coefficients `e` predicts, times (1 ± `noise`) uniform noise.
fn colocations(
    p: &ProfileFile,
    e: Interference,
    n: usize,
    noise: f64,
    seed: u64,
) -> ColocationFile {
    let model = perf(p);
    let mut rng = SplitMix64::new(seed);
    let samples = (0..n)
        .map(|_| {
            let k = 2 + rng.below(3) as usize;
            let mut names: Vec<usize> = (0..model.modules.len()).collect();
            for i in (1..names.len()).rev() {
                names.swap(i, rng.below(i as u64 + 1) as usize);
            }
            let mut left = 10;
            let picks: Vec<(usize, u32)> = (0..k)
                .map(|j| {
                    let room = left - (k - j - 1);
                    let u = 1 + rng.below(room.min(6) as u64) as usize;
                    left -= u;
                    (names[j], u as u32)
                })
                .collect();
            let opts: Vec<_> = picks
                .iter()
                .map(|&(m, u)| {
                    *model.modules[m]
                        .options
                        .iter()
                        .find(|o| o.dp == 1 && o.units == u * 10)
                        .unwrap()
                })
                .collect();
            let delta = e.delta(opts.iter().map(|o| o.bw_util));
            Colocation {
                modules: picks
                    .iter()
                    .zip(&opts)
                    .map(|(&(m, u), o)| ColocatedModule {
                        name: model.modules[m].name.clone(),
                        dp: 1,
                        sm: u as f64 / 10.0,
                        time_ms: o.time_ms
                            * (1.0 + delta)
                            * (1.0 + noise * (2.0 * rng.next_f64() - 1.0)),
                    })
                    .collect(),
            }
        })
        .collect();
    ColocationFile {
        format: COLOCATIONS_FORMAT.into(),
        device: "gpu".into(),
        source: None,
        samples,
    }
}

const TRUE: Interference = Interference {
    e1: 0.03,
    e2: 0.08,
    e3: 0.5,
};

#[test]
fn fit_recovers_known_coefficients_from_noisy_samples() {
    let p = profile();
    let c = colocations(&p, TRUE, 400, 0.02, 7);
    let obs = observations(&perf(&p), &c, "c.json").unwrap();
    let e = fit(&obs, Model::Full);
    assert!((e.e1 - TRUE.e1).abs() < 0.01, "{e:?}");
    assert!((e.e2 - TRUE.e2).abs() < 0.01, "{e:?}");
    assert!((e.e3 - TRUE.e3).abs() < 0.03, "{e:?}");
    // And the report ranks the models as the data was made: full best on held-out samples.
    // (Slowdown R² is well below 1 only because ±2 % noise is large next to slowdowns of
    // 5–20 %.)
    let r = evaluate(&obs, HOLDOUT_EVERY);
    assert_eq!((r.samples, r.test_samples, r.train_samples), (400, 80, 320));
    let err = |m| r.model(m).test.mean_rel_err;
    assert!(err(Model::Full) < err(Model::Additive), "{r:#?}");
    assert!(err(Model::Additive) < err(Model::Unaware), "{r:#?}");
    let r2 = |m| r.model(m).test.r2_slowdown.unwrap();
    assert!(
        r2(Model::Full) > 0.6 && r2(Model::Full) > r2(Model::Additive),
        "{r:#?}"
    );
    // Noise of ±2 % uniform: mean |error| about 1 %, never above 2 % by much.
    assert!(err(Model::Full) < 0.015 && r.model(Model::Full).test.max_rel_err < 0.03);
    assert_eq!(
        r.model(Model::Unaware).interference,
        Interference::default()
    );
    assert_eq!(r.model(Model::Additive).interference.e3, 0.0);
    let ks: Vec<usize> = r
        .model(Model::Full)
        .by_modules
        .iter()
        .map(|b| b.modules)
        .collect();
    assert_eq!(ks, vec![2, 3, 4]);
    let n: usize = r
        .model(Model::Full)
        .by_modules
        .iter()
        .map(|b| b.samples)
        .sum();
    assert_eq!(n, 80);
}

#[test]
fn fit_is_exact_without_noise_and_metrics_are_perfect() {
    let p = profile();
    let c = colocations(&p, TRUE, 60, 0.0, 3);
    let obs = observations(&perf(&p), &c, "c.json").unwrap();
    let e = fit(&obs, Model::Full);
    for (got, want) in [(e.e1, TRUE.e1), (e.e2, TRUE.e2), (e.e3, TRUE.e3)] {
        assert!((got - want).abs() < 1e-9, "{e:?}");
    }
    let a = accuracy(&obs, &TRUE);
    assert_eq!(a.n, obs.len());
    assert!((a.r2.unwrap() - 1.0).abs() < 1e-12 && (a.r2_slowdown.unwrap() - 1.0).abs() < 1e-12);
    assert!(a.mean_rel_err < 1e-12 && a.max_rel_err < 1e-12);
    // Every module of a sample slows down alike, so a GPU-wide Δ can explain everything.
    let r = evaluate(&obs, HOLDOUT_EVERY);
    assert!((r.ceiling_r2_slowdown.unwrap() - 1.0).abs() < 1e-12);
    assert!(r.mean_slowdown > 0.0 && r.max_slowdown >= r.mean_slowdown);
    // The unaware model's error is exactly the slowdown.
    let u = accuracy(&obs, &Interference::default());
    let want = obs
        .iter()
        .map(|o| (o.measured_ms - o.base_ms) / o.measured_ms)
        .fold(0.0, f64::max);
    assert!((u.max_rel_err - want).abs() < 1e-12);
}

#[test]
fn fit_never_returns_negative_coefficients() {
    // Co-location that speeds modules up the more bandwidth they use: the unconstrained
    // optimum has a negative e2; the planner needs e ≥ 0.
    let p = profile();
    let e = Interference {
        e1: 0.3,
        e2: -0.2,
        e3: 0.0,
    };
    let c = colocations(&p, e, 50, 0.0, 11);
    let obs = observations(&perf(&p), &c, "c.json").unwrap();
    for model in Model::ALL {
        let f = fit(&obs, model);
        assert!(
            f.e1 >= 0.0 && f.e2 >= 0.0 && f.e3 >= 0.0,
            "{model:?}: {f:?}"
        );
    }
    assert_eq!(fit(&obs, Model::Additive).e2, 0.0);
}

#[test]
fn leave_one_out_is_exact_on_a_linear_surface_and_not_on_a_curved_one() {
    let mut p = profile();
    for m in &mut p.modules {
        for s in &mut m.samples {
            s.time_ms = 100.0 - 50.0 * s.sm + s.dp as f64;
        }
    }
    let loo = leave_one_out(&p);
    assert_eq!(
        loo.points,
        6 * 2 * 8,
        "interior quotas 0.2..0.9 of every row"
    );
    assert!(loo.max_rel_err < 1e-12, "{loo:?}");
    let dense = dense_error(&p, DENSE_STEP, |_, dp, sm| 100.0 - 50.0 * sm + dp as f64);
    assert_eq!(
        dense.points,
        6 * 2 * 81,
        "1 % steps from 0.1 to 1.0, deciles excluded"
    );
    assert!(dense.max_rel_err < 1e-12);
    // 1/sm is convex: interpolation overestimates between samples.
    let curved = profile();
    let loo = leave_one_out(&curved);
    assert!(loo.max_rel_err > 0.01 && loo.worst.is_some());
    let dense = dense_error(&curved, DENSE_STEP, |i, dp, sm| {
        let sat = 0.3 + 0.12 * i as f64;
        (20.0 + 15.0 * i as f64) / dp as f64 / sm.min(sat) + 1.0
    });
    assert!(dense.mean_rel_err > 0.0 && dense.max_rel_err < loo.max_rel_err);
}

#[test]
fn profiling_cost_counts_points_and_time() {
    let p = profile();
    let truth = |i: usize, dp: u32, sm: f64| {
        let sat = 0.3 + 0.12 * i as f64;
        (20.0 + 15.0 * i as f64) / dp as f64 / sm.min(sat) + 1.0
    };
    let c = profiling_cost(&p, DENSE_STEP, None, 10, Some(&truth));
    assert_eq!(
        (c.sparse_points, c.dense_points, c.max_dp),
        (120, 6 * 2 * 100, 2)
    );
    assert!((c.point_ratio - 10.0).abs() < 1e-12);
    let sparse: f64 = p
        .modules
        .iter()
        .flat_map(|m| &m.samples)
        .map(|s| s.time_ms)
        .sum();
    assert!((c.sparse_s - sparse * 10.0 / 1e3).abs() < 1e-9);
    assert!(c.time_ratio > 5.0 && !c.dense_estimated);
    // Without a truth the dense times are estimated from the sparse surface: close to it here.
    let est = profiling_cost(&p, DENSE_STEP, Some(4), 10, None);
    assert!(est.dense_estimated && est.dense_points == 6 * 4 * 100);
    let exact = profiling_cost(&p, DENSE_STEP, Some(2), 10, None);
    assert!(
        (exact.dense_s / c.dense_s - 1.0).abs() < 0.05,
        "{exact:?} vs {c:?}"
    );
    // The estimate interpolates in 1/dp between profiled degrees and extrapolates ∝ 1/dp.
    let m = &p.modules[0];
    assert_eq!(estimate(m, 1, 0.5), m.samples[4].time_ms);
    assert!((estimate(m, 4, 0.5) - (estimate(m, 2, 0.5) / 2.0)).abs() < 1e-12);
}

#[test]
fn bad_colocations_name_the_field() {
    let p = profile();
    let model = perf(&p);
    let good = colocations(&p, TRUE, 3, 0.0, 5);
    let err = |c: &ColocationFile| observations(&model, c, "c.json").unwrap_err();

    let mut c = good.clone();
    c.samples[1].modules[1].name = "lidar".into();
    let e = err(&c);
    assert_eq!(e.field(), "samples[1].modules[1].name");
    assert!(
        e.to_string()
            .starts_with("c.json: field `samples[1].modules[1].name`: unknown module \"lidar\""),
        "{e}"
    );

    let mut c = good.clone();
    c.samples[2].modules[0].dp = 4;
    let e = err(&c);
    assert_eq!(e.field(), "samples[2].modules[0]");
    assert!(e.to_string().contains("candidate dp: 1, 2"), "{e}");

    let mut c = good.clone();
    c.samples[0].modules[1].sm = 0.055;
    let e = err(&c);
    assert_eq!(e.field(), "samples[0].modules[1]");
    assert!(e.to_string().contains("from 0.10 to 1.00"), "{e}");

    let mut c = good.clone();
    c.samples[0].modules[0].sm = 0.123;
    assert_eq!(err(&c).field(), "samples[0].modules[0]");

    let mut c = good;
    c.device = "A100".into();
    assert_eq!(err(&c).field(), "device");
}

/// On a device with an SM partition rule the lookup grid is its partitions: quotas rounded in
/// the file (80/132 as 0.6061) name their SM count; a quota between SM counts, or an SM count
/// that is no partition, is no candidate.
#[test]
fn quotas_on_sm_partitions_are_looked_up_as_whole_sms() {
    let sample = |sms: u32, time_ms: f64, bw_util: f64| Sample {
        dp: 1,
        sm: (sms as f64 / 132.0 * 1e4).round() / 1e4,
        time_ms,
        mem_gib: 4.0,
        sm_util: 0.9,
        bw_util,
    };
    let module = |name: &str| ModuleProfile {
        name: name.into(),
        after: vec![],
        samples: vec![
            sample(16, 400.0, 0.1),
            sample(80, 120.0, 0.3),
            sample(132, 80.0, 0.5),
        ],
        grad_gib: None,
    };
    let p = ProfileFile {
        format: FORMAT.into(),
        device: Device {
            name: "H100-SXM5-80GB".into(),
            sm_count: 132,
            memory_gib: 80.0,
            partition: Some(mosaic_profile::SmGranularity {
                min_sms: 8,
                step_sms: 8,
            }),
        },
        nodes: None,
        modules: vec![module("a"), module("b")],
        interference: Interference::default(),
        source: None,
    };
    let p = mosaic_profile::parse(&serde_json_text(&p), "p.json").unwrap();
    let model = PerfModel::new(&p, LOOKUP_GRANULARITY, "p.json").unwrap();
    assert_eq!(model.units_per_gpu, 132);
    let pair = |a: f64, b: f64| ColocationFile {
        format: COLOCATIONS_FORMAT.into(),
        device: "H100-SXM5-80GB".into(),
        source: None,
        samples: vec![Colocation {
            modules: vec![
                ColocatedModule {
                    name: "a".into(),
                    dp: 1,
                    sm: a,
                    time_ms: 150.0,
                },
                ColocatedModule {
                    name: "b".into(),
                    dp: 1,
                    sm: b,
                    time_ms: 500.0,
                },
            ],
        }],
    };
    let obs = observations(&model, &pair(0.6061, 0.1212), "c.json").unwrap();
    assert_eq!((obs[0].base_ms, obs[1].base_ms), (120.0, 400.0));
    assert!((obs[0].sum_bw() - 0.4).abs() < 1e-12);
    // 48 SMs, between the profiled 16 and 80: interpolated, as the planner would.
    let obs = observations(&model, &pair(48.0 / 132.0, 0.1212), "c.json").unwrap();
    assert!((obs[0].base_ms - 260.0).abs() < 1e-9);
    // 0.6 of 132 SMs is 79.2: no SM count; 84/132 is no partition of 8.
    for bad in [0.6, 84.0 / 132.0] {
        let e = observations(&model, &pair(bad, 0.1212), "c.json").unwrap_err();
        assert_eq!(e.field(), "samples[0].modules[0]");
        assert!(e.to_string().contains("partitions of 8"), "{e}");
    }
}

#[test]
fn fitted_profile_is_a_valid_profile_the_planner_reads() {
    let p = profile();
    let f = write_fitted(&p, TRUE);
    assert_eq!(f.interference, TRUE);
    assert_eq!(f.modules, p.modules);
    let src = f.source.clone().unwrap();
    assert!(src.starts_with("test; interference e1 = 0.030000"), "{src}");
    assert!(!src.contains("assumed"));
    // Refitting replaces the note instead of appending another.
    let again = write_fitted(&f, Interference::default());
    assert_eq!(again.source.unwrap().matches("fitted").count(), 1);
    let text = serde_json_text(&f);
    let back = mosaic_profile::parse(&text, "fitted.json").unwrap();
    assert_eq!(back.interference, TRUE);
    PerfModel::new(&back, 0.1, "fitted.json").unwrap();
}

fn serde_json_text(p: &ProfileFile) -> String {
    serde_json::to_string_pretty(p).unwrap()
}

#[test]
fn ceiling_counts_the_variance_a_gpu_wide_delta_cannot_explain() {
    // In each of two samples one module slows down 10 % and the other not at all, so both
    // samples have the same mean: all of the variance lies within samples, and no GPU-wide Δ
    // explains any of it.
    let p = profile();
    let mut c = colocations(&p, Interference::default(), 2, 0.0, 9);
    for s in &mut c.samples {
        s.modules.truncate(2);
        s.modules[0].time_ms *= 1.1;
    }
    let obs = observations(&perf(&p), &c, "c.json").unwrap();
    let r = evaluate(&obs, 2); // sample 1 held out
    assert_eq!(r.test_samples, 1);
    assert!(r.ceiling_r2_slowdown.unwrap().abs() < 1e-12, "{r:#?}");
    assert!((r.mean_slowdown - 0.05).abs() < 1e-12 && (r.max_slowdown - 0.1).abs() < 1e-12);
    assert!((r.model(Model::Full).by_modules[0].mean_slowdown - 0.05).abs() < 1e-12);
}

/// Colocation times past a profile's limit are refused at the field, whatever their size: they
/// were silently dropped by the fit (1e308) or fitted into coefficients no profile holds.
#[test]
fn colocated_times_past_a_profiles_limit_are_refused() {
    let p = profile();
    let model = perf(&p);
    let good = colocations(&p, TRUE, 10, 0.0, 5);
    observations(&model, &good, "c.json").unwrap();
    for bad in [1.0000001e7, 1e100, 1e308] {
        let mut c = good.clone();
        c.samples[0].modules[1].time_ms = bad;
        let e = observations(&model, &c, "c.json").unwrap_err();
        assert_eq!(e.field(), "samples[0].modules[1].time_ms", "{bad}");
        let text = e.to_string();
        assert!(text.starts_with("c.json: field `samples[0].modules[1].time_ms`"));
        assert!(text.contains("at most 1e7"), "{text}");
    }
    // At the limit it is a measurement like any other.
    let mut c = good.clone();
    c.samples[0].modules[1].time_ms = MAX_COLOCATED_MS;
    observations(&model, &c, "c.json").unwrap();
    // Against a profiled time so small that the slowdown is not a number.
    let mut tiny = p.clone();
    for s in &mut tiny.modules.iter_mut().flat_map(|m| m.samples.iter_mut()) {
        s.time_ms = 1e-310;
    }
    let e = observations(&perf(&tiny), &good, "c.json").unwrap_err();
    assert_eq!(e.field(), "samples[0].modules[0].time_ms");
}

/// A fit whose coefficients a profile cannot hold is refused, naming the samples that drove
/// it, rather than written into a profile the planner refuses.
#[test]
fn coefficients_no_profile_holds_are_refused_naming_the_samples() {
    let p = profile();
    let model = perf(&p);
    let good = colocations(&p, TRUE, 20, 0.01, 9);
    let obs = observations(&model, &good, "c.json").unwrap();
    check_fitted(&evaluate(&obs, HOLDOUT_EVERY), &obs, "c.json").unwrap();
    // One module of sample 1 (fitted, not held out) measured at the largest time a file may
    // state: a slowdown of ~10⁵, which the fit spreads into coefficients ≫ 100.
    let mut c = good.clone();
    c.samples[1].modules[0].time_ms = MAX_COLOCATED_MS;
    let obs = observations(&model, &c, "c.json").unwrap();
    let report = evaluate(&obs, HOLDOUT_EVERY);
    let e = report.model(Model::Full).interference;
    assert!(e.e1.max(e.e2).max(e.e3) > MAX_COEFFICIENT, "{e:?}");
    let e = check_fitted(&report, &obs, "c.json").unwrap_err();
    assert_eq!(e.field(), "samples[1].modules[0].time_ms");
    let text = e.to_string();
    assert!(text.starts_with("c.json: "), "{text}");
    assert!(
        text.contains("at most 100") && text.contains("fits e"),
        "{text}"
    );
    assert!(text.contains("samples[1].modules[0] (\"m"), "{text}");
    // The same sample held out (sample 4 with every 5th held out) drives nothing.
    let mut c = good;
    c.samples[4].modules[0].time_ms = MAX_COLOCATED_MS;
    let obs = observations(&model, &c, "c.json").unwrap();
    check_fitted(&evaluate(&obs, HOLDOUT_EVERY), &obs, "c.json").unwrap();
}

/// A colocation of two modules of bandwidths `a` and `b`, each measured `slowdown` slower.
fn pair(sample: usize, a: f64, b: f64, slowdown: f64) -> Vec<Observation> {
    [a, b]
        .iter()
        .map(|&bw| Observation {
            sample,
            module: format!("m{bw}"),
            modules: 2,
            dp: 1,
            sm: 0.5,
            base_ms: 10.0,
            bw_util: bw,
            sample_bw: vec![a, b],
            measured_ms: 10.0 * (1.0 + slowdown),
        })
        .collect()
}

#[test]
fn interference_is_fitted_by_the_fullest_model_a_profile_can_hold() {
    // Slowdowns of 0.2 + 0.3·ΠB: the full model fits them exactly.
    let obs: Vec<_> = [(0.5, 0.4), (0.2, 0.9), (0.7, 0.7)]
        .iter()
        .enumerate()
        .flat_map(|(k, &(a, b))| pair(k, a, b, 0.2 + 0.3 * a * b))
        .collect();
    let (model, e) = fit_holdable(&obs);
    assert_eq!(model, Model::Full);
    assert!(
        (e.e1 - 0.2).abs() < 1e-6 && (e.e3 - 0.3).abs() < 1e-6,
        "{e:?}"
    );
    // Slowdowns of 5000·ΠB at tiny bandwidths (a CPU's): the full model's e3 is past what
    // a profile holds, so a smaller model is fitted instead.
    let tiny: Vec<_> = [(0.01, 0.02), (0.03, 0.01), (0.02, 0.02)]
        .iter()
        .enumerate()
        .flat_map(|(k, &(a, b))| pair(k, a, b, 5000.0 * a * b))
        .collect();
    assert!(fit(&tiny, Model::Full).e3 > 100.0);
    let (model, e) = fit_holdable(&tiny);
    assert_ne!(model, Model::Full);
    for v in [e.e1, e.e2, e.e3] {
        assert!((0.0..=MAX_COEFFICIENT).contains(&v), "{e:?}");
    }
}
