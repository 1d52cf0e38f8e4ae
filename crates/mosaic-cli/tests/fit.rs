//! Drives `mosaic simulate colocations` and `mosaic fit` as a user would: measure random
//! colocations in the simulator, fit the interference term, plan with the fitted profile.

use std::path::{Path, PathBuf};

use serde_json::Value;

mod common;
use common::{clip_files, dir, mosaic, read_json, refused, s, stderr, stdout};

/// `mosaic simulate colocations --count n` of OFASys on h100x8 into `dir/c.json`.
fn colocations(dir: &Path, n: &str) -> PathBuf {
    let out = dir.join("c.json");
    let o = mosaic(&[
        "simulate",
        "colocations",
        "--model",
        "ofasys",
        "--cluster",
        "h100x8",
        "--count",
        n,
        "--out",
        s(&out),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(&format!("wrote {n} colocations of ofasys")),
        "{}",
        stdout(&o)
    );
    out
}

#[test]
fn fits_simulated_colocations_and_the_planner_reads_the_result() {
    let d = dir("ofasys");
    let c = colocations(&d, "200");
    let file = read_json(&c);
    assert_eq!(file["format"], "mosaic-colocations/1");
    assert_eq!(file["samples"].as_array().unwrap().len(), 200);
    let (fitted, svg) = (d.join("fitted.json"), d.join("scatter.svg"));
    let o = mosaic(&[
        "fit",
        "--model",
        "ofasys",
        "--cluster",
        "h100x8",
        "--colocations",
        s(&c),
        "--out",
        s(&fitted),
        "--svg",
        s(&svg),
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: Value = serde_json::from_slice(&o.stdout).expect("stdout is JSON");
    let fit = &r["fit"];
    assert_eq!(fit["format"], "mosaic-fit/1");
    assert_eq!(
        (fit["train_samples"].as_u64(), fit["test_samples"].as_u64()),
        (Some(160), Some(40))
    );
    let model = |name: &str| {
        fit["models"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["model"] == name)
            .unwrap_or_else(|| panic!("model {name}"))
            .clone()
    };
    let (unaware, additive, full) = (model("unaware"), model("additive"), model("full"));
    let r2 = |m: &Value, which: &str| m["test"][which].as_f64().unwrap();
    // Held out, the full model explains the slowdowns better than additive-only, which beats
    // ignoring interference (slowdown R²: times span three decades, so their R² is ≈ 1 for
    // all three and the full model is still ahead of additive-only there).
    assert!(
        r2(&full, "r2_slowdown") >= r2(&additive, "r2_slowdown")
            && r2(&additive, "r2_slowdown") >= r2(&unaware, "r2_slowdown"),
        "{fit:#}"
    );
    assert!(r2(&full, "r2") >= r2(&additive, "r2"), "{fit:#}");
    for m in [&unaware, &additive, &full] {
        for k in ["e1", "e2", "e3"] {
            assert!(m["interference"][k].as_f64().unwrap() >= 0.0);
        }
        let counts: Vec<u64> = m["by_modules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["modules"].as_u64().unwrap())
            .collect();
        assert_eq!(
            counts,
            (2..=8).collect::<Vec<u64>>(),
            "Fig. 12a's 2 to 8 modules"
        );
    }
    assert_eq!(additive["interference"]["e3"], 0.0);
    // The surface checks, with the dense device model as the truth.
    let surface = &r["surface"];
    assert!(surface["leave_one_out"]["points"].as_u64().unwrap() > 0);
    assert!(surface["dense"]["points"].as_u64().unwrap() > 0);
    assert_eq!(surface["cost"]["dense_estimated"], false);
    assert!(surface["cost"]["time_ratio"].as_f64().unwrap() > 5.0);
    // Fig. 12b: one plan per model, executed.
    let e2e = r["end_to_end"].as_array().unwrap();
    assert_eq!(e2e.len(), 3);
    assert_eq!(e2e[0]["normalized"], 1.0);
    assert!(e2e
        .iter()
        .all(|x| x["simulated_ms"].as_f64().unwrap() > 0.0));

    // The fitted profile carries the full model's coefficients and plans.
    let p = read_json(&fitted);
    assert_eq!(p["interference"], full["interference"]);
    assert!(p["source"]
        .as_str()
        .unwrap()
        .contains("fitted to colocation measurements"));
    let o = mosaic(&["plan", "--profiles", s(&fitted), "--gpus", "8"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("predicted iteration"));
    let pic = std::fs::read_to_string(&svg).unwrap();
    assert!(pic.starts_with("<svg") && pic.contains("full Eq. 8") && pic.contains("y = x"));

    // The table: coefficients, the three models, Fig. 12a's rows, the surface, Fig. 12b.
    let o = mosaic(&[
        "fit",
        "--model",
        "ofasys",
        "--cluster",
        "h100x8",
        "--colocations",
        s(&c),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for want in [
        "fitted on 160, tested on 40 held-out samples",
        "interference-unaware",
        "additive only",
        "full Eq. 8",
        "by co-located modules",
        "leave-one-out",
        "against the device model",
        "profiling cost",
        "end to end (Fig. 12b)",
    ] {
        assert!(out.contains(want), "missing {want:?} in\n{out}");
    }
}

#[test]
fn fits_against_a_profile_file() {
    let d = dir("file");
    let c = colocations(&d, "30");
    let profile = d.join("p.json");
    let o = mosaic(&[
        "profile",
        "--model",
        "ofasys",
        "--cluster",
        "h100x8",
        "--out",
        s(&profile),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = mosaic(&[
        "fit",
        "--profiles",
        s(&profile),
        "--colocations",
        s(&c),
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(r.get("end_to_end").is_none(), "no zoo model, no simulation");
    assert!(r["surface"]["dense"].is_null());
    assert_eq!(r["surface"]["cost"]["dense_estimated"], true);
    assert_eq!(r["fit"]["test_samples"], 6);
}

/// A shared measurement of one real H100 in `examples/` (`docs/reference.md`, "Measured on a
/// real H100").
fn h100_example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(name)
}

/// The measured H100 files fit as they are: their quotas are SM partitions (80/132 written
/// 0.6061), which the profile's partition rule makes the lookup grid. Eq. 8 explains little of
/// them (co-located modules serialised on the host, README "The performance model"), and the
/// fitted profile plans in whole partitions and no longer co-locates vision and text.
#[test]
fn fits_the_measured_h100_files_as_they_are() {
    let d = dir("h100");
    let (profile, colocations) = (
        h100_example("h100-clip-profile.json"),
        h100_example("h100-clip-colocations.json"),
    );
    let fitted = d.join("fitted.json");
    let o = mosaic(&[
        "fit",
        "--profiles",
        s(&profile),
        "--colocations",
        s(&colocations),
        "--out",
        s(&fitted),
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    let fit = &r["fit"];
    assert_eq!(
        (fit["samples"].as_u64(), fit["test_samples"].as_u64()),
        (Some(40), Some(8))
    );
    // Co-located modules took about both modules' time: slowdowns far beyond Eq. 8's reach.
    assert!(fit["mean_slowdown"].as_f64().unwrap() > 1.0, "{fit}");
    let full = &fit["models"][2];
    assert_eq!(full["model"], "full");
    let e1 = full["interference"]["e1"].as_f64().unwrap();
    assert!(e1 > 0.0, "{full}");
    assert!(full["test"]["r2"].as_f64().unwrap() < 0.5, "{full}");

    let plan = |p: &Path| {
        let o = mosaic(&["plan", "--profiles", s(p), "--gpus", "1", "--json"]);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_slice::<Value>(&o.stdout).unwrap()
    };
    let sms = |plan: &Value| -> Vec<Vec<f64>> {
        let stages = plan["stages"].as_array().unwrap();
        stages
            .iter()
            .map(|st| {
                let modules = st["modules"].as_array().unwrap();
                modules
                    .iter()
                    .map(|m| m["sm"].as_f64().unwrap() * 132.0)
                    .collect()
            })
            .collect()
    };
    // Measured alone, vision and text share the GPU in whole partitions of 8 SMs (at most
    // the 128 a split hands out); with the fitted interference they run one after another.
    let unaware = plan(&profile);
    assert_eq!(unaware["granularity"], 0.060606);
    let first = &sms(&unaware)[0];
    assert_eq!(first.len(), 2, "{unaware}");
    for n in first {
        assert!(
            (n - n.round()).abs() < 1e-3 && (n.round() as u32).is_multiple_of(8),
            "{first:?}"
        );
    }
    assert!(first.iter().sum::<f64>() <= 128.0 + 1e-3, "{first:?}");
    let fitted_plan = plan(&fitted);
    assert!(
        sms(&fitted_plan).iter().all(|stage| stage.len() == 1),
        "{fitted_plan}"
    );
}

#[test]
fn bad_colocations_exit_2_naming_the_field() {
    let d = dir("bad");
    let c = colocations(&d, "5");
    let mut file = read_json(&c);
    let fit = |path: &Path| {
        mosaic(&[
            "fit",
            "--model",
            "ofasys",
            "--cluster",
            "h100x8",
            "--colocations",
            s(path),
            "--no-end-to-end",
        ])
    };
    let bad = d.join("bad.json");

    file["samples"][2]["modules"][1]["name"] = "lidar".into();
    std::fs::write(&bad, file.to_string()).unwrap();
    let o = fit(&bad);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("field `samples[2].modules[1].name`: unknown module \"lidar\""),
        "{}",
        stderr(&o)
    );

    let mut file = read_json(&c);
    file["samples"][0]["modules"][0]["dp"] = 3.into();
    std::fs::write(&bad, file.to_string()).unwrap();
    let o = fit(&bad);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("field `samples[0].modules[0]`: (dp 3"),
        "{}",
        stderr(&o)
    );

    let mut file = read_json(&c);
    file["device"] = "A100-SXM4-80GB".into();
    std::fs::write(&bad, file.to_string()).unwrap();
    let o = fit(&bad);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("field `device`"), "{}", stderr(&o));

    let mut file = read_json(&c);
    file["format"] = "mosaic-plan/1".into();
    std::fs::write(&bad, file.to_string()).unwrap();
    let o = fit(&bad);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("field `format`"), "{}", stderr(&o));

    let o = fit(&d.join("missing.json"));
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn simulate_colocations_needs_a_model_and_an_out_file() {
    let d = dir("args");
    let out = d.join("c.json");
    let o = mosaic(&["simulate", "colocations", "--count", "10", "--out", s(&out)]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--model"), "{}", stderr(&o));
    let o = mosaic(&[
        "simulate",
        "colocations",
        "--count",
        "10",
        "--model",
        "ofasys",
        "--cluster",
        "h100x8",
    ]);
    assert_eq!(o.status.code(), Some(2), "--out is required");
    assert!(stderr(&o).contains("--out"), "{}", stderr(&o));
    let o = mosaic(&[
        "simulate",
        "colocations",
        "--count",
        "0",
        "--model",
        "ofasys",
        "--cluster",
        "h100x8",
        "--out",
        s(&out),
    ]);
    assert_eq!(o.status.code(), Some(2), "at least one colocation");
    let o = mosaic(&["simulate"]);
    assert_eq!(o.status.code(), Some(2), "--plan or a verb");
    // How many is required; the old spelling, an unknown verb, and a plan's flags are refused.
    let rest = format!("--model ofasys --cluster h100x8 --out {}", s(&out));
    refused(&[
        (format!("simulate colocations {rest}"), "--count"),
        (format!("simulate --colocations 10 {rest}"), "--colocations"),
        (format!("simulate colocate --count 10 {rest}"), "colocate"),
        (
            format!("simulate colocations --count 10 --json {rest}"),
            "--json",
        ),
    ]);
    assert!(!out.exists(), "nothing is written on bad input");
    // The same seed gives the same file; another seed another one.
    let (a, b, c) = (d.join("a.json"), d.join("b.json"), d.join("c2.json"));
    for (p, seed) in [(&a, "7"), (&b, "7"), (&c, "8")] {
        let o = mosaic(&[
            "simulate",
            "colocations",
            "--count",
            "20",
            "--model",
            "clip",
            "--cluster",
            "h100x8",
            "--seed",
            seed,
            "--out",
            s(p),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    assert_eq!(read_json(&a), read_json(&b));
    assert_ne!(read_json(&a), read_json(&c));
}

/// `fit` never writes a profile that `plan` refuses: a colocated time within a profile's
/// limits that fits coefficients above a profile's is refused naming the samples that drove
/// them, and a time past the limits is refused at its field instead of being dropped.
#[test]
fn fit_refuses_measurements_no_profile_could_hold() {
    let d = dir("hostile-times");
    let (profile, c) = clip_files(&d);
    let out = d.join("f.json");
    let fit = |file: &Path| {
        mosaic(&[
            "fit",
            "--profiles",
            s(&profile),
            "--colocations",
            s(file),
            "--out",
            s(&out),
        ])
    };
    let o = fit(&c);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = mosaic(&["plan", "--profiles", s(&out), "--gpus", "8"]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::remove_file(&out).unwrap();

    let bad = d.join("bad.json");
    for (sample, time, says) in [
        // Within the 10⁷ ms of a profile's times, but a slowdown no coefficient ≤ 100 holds.
        (1, 1e7, "field `samples[1].modules[0].time_ms`: the "),
        (
            0,
            1e100,
            "field `samples[0].modules[0].time_ms`: expected a positive time",
        ),
        // Used to be dropped silently: the squares overflowed and the fit returned zeros.
        (
            0,
            1e308,
            "field `samples[0].modules[0].time_ms`: expected a positive time",
        ),
    ] {
        let mut file = read_json(&c);
        file["samples"][sample]["modules"][0]["time_ms"] = time.into();
        std::fs::write(&bad, file.to_string()).unwrap();
        let o = fit(&bad);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{time}: {err}");
        assert!(
            err.contains(&format!("{}: {says}", s(&bad))),
            "{time}: {err}"
        );
        assert!(!out.exists(), "{time}: wrote {}", s(&out));
        if time == 1e7 {
            assert!(
                err.contains("at most 100") && err.contains("samples[1].modules[0] (\""),
                "{err}"
            );
        }
    }
}

/// `--cluster` belongs to `--model`; with `--profiles` the device is the file's, and a cluster
/// of another device was silently ignored.
#[test]
fn fit_refuses_a_cluster_beside_a_profile_file() {
    let d = dir("profiles-cluster");
    let (profile, c) = clip_files(&d);
    for (cluster, says) in [
        (
            "a100x8",
            "the profiles are of H100-SXM5-80GB, --cluster a100x8 of A100-SXM4-80GB",
        ),
        ("h100x8", "--cluster: applies with --model only"),
    ] {
        let o = mosaic(&[
            "fit",
            "--profiles",
            s(&profile),
            "--cluster",
            cluster,
            "--colocations",
            s(&c),
        ]);
        assert_eq!(o.status.code(), Some(2), "{cluster}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{cluster}: {}", stderr(&o));
    }
}
