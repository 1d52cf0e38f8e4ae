//! Drives `mosaic simulate` as a user would: plan, then simulate the plan file.

use std::path::PathBuf;

use serde_json::Value;

mod common;
use common::{dir, mosaic, read_json, s, stderr, stdout};

/// Plans `model` on `cluster` into `dir/plan.json` and returns its path.
fn plan(dir: &std::path::Path, model: &str, cluster: &str) -> PathBuf {
    let out = dir.join("plan.json");
    let o = mosaic(&[
        "plan",
        "--model",
        model,
        "--cluster",
        cluster,
        "--search",
        "exact",
        "--out",
        s(&out),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    out
}

#[test]
fn simulates_a_plan_and_writes_its_trace_and_picture() {
    let d = dir("ofasys");
    let p = plan(&d, "ofasys", "h100x8");
    let (trace, svg) = (d.join("t.json"), d.join("p.svg"));
    let o = mosaic(&[
        "simulate",
        "--plan",
        s(&p),
        "--trace",
        s(&trace),
        "--svg",
        s(&svg),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for want in [
        "ofasys on h100x8",
        "simulated iteration",
        "plan predicted",
        "stage 1",
        "llm",
        "GPU utilisation",
        "GPU  7",
    ] {
        assert!(out.contains(want), "{want}: {out}");
    }
    let t = read_json(&trace);
    assert_eq!(t["displayTimeUnit"], "ms");
    let events = t["traceEvents"].as_array().unwrap();
    assert!(events.iter().any(|e| e["ph"] == "X" && e["name"] == "llm"));
    assert!(events
        .iter()
        .any(|e| e["name"] == "thread_name" && e["args"]["name"] == "GPU 7"));
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(picture.starts_with("<svg") && picture.trim_end().ends_with("</svg>"));
    assert!(picture.contains(">video</text>"));
}

#[test]
fn json_report_matches_the_plan() {
    let d = dir("json");
    let p = plan(&d, "clip", "h100x8");
    let plan = read_json(&p);
    let o = mosaic(&["simulate", "--plan", s(&p), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: Value = serde_json::from_slice(&o.stdout).expect("stdout is JSON");
    assert_eq!(r["format"], "mosaic-sim/1");
    assert_eq!(r["predicted_ms"], plan["iteration_ms"]);
    assert_eq!(
        r["stages"].as_array().unwrap().len(),
        plan["stages"].as_array().unwrap().len()
    );
    let it = r["iteration_ms"].as_f64().unwrap();
    let pred = r["predicted_ms"].as_f64().unwrap();
    assert!(it > 0.0);
    assert!((r["prediction_error"].as_f64().unwrap() - (it - pred) / pred).abs() < 1e-9);
    assert_eq!(r["gpu_utilisation"].as_array().unwrap().len(), 8);
    assert!(!r["slices"].as_array().unwrap().is_empty());
}

#[test]
fn multi_node_plans_simulate() {
    let d = dir("multinode");
    let p = plan(&d, "ofasys", "h100x32");
    let o = mosaic(&["simulate", "--plan", s(&p), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["gpus"], 32);
    assert!(r["slices"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["node"] == 3 && s["phase"] == "allreduce"));
}

/// Writes `plan` with `edit` applied and simulates it; the run must fail with exit code 2
/// and a message naming the file and `field`.
fn refused(test: &str, edit: impl FnOnce(&mut Value), extra: &[&str], field: &str) -> String {
    let d = dir(test);
    let p = plan(&d, "ofasys", "h100x8");
    let mut v = read_json(&p);
    edit(&mut v);
    let bad = d.join("bad.json");
    std::fs::write(&bad, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    let mut args = vec!["simulate", "--plan", s(&bad)];
    args.extend_from_slice(extra);
    let o = mosaic(&args);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("bad.json"), "{err}");
    assert!(err.contains(field), "{field}: {err}");
    err
}

#[test]
fn bad_plans_exit_2_naming_the_field() {
    refused(
        "gpu",
        |v| v["stages"][1]["modules"][0]["gpus"][0] = 99.into(),
        &[],
        "`stages[1].modules[0].gpus[0]`",
    );
    refused(
        "name",
        |v| v["stages"][0]["modules"][0]["name"] = "nope".into(),
        &[],
        "`stages[0].modules[0].name`",
    );
    refused(
        "quota",
        |v| v["stages"][1]["modules"][0]["sm"] = 1.5.into(),
        &[],
        "`stages[1].modules[0].sm`",
    );
    refused(
        "dp",
        |v| v["stages"][1]["modules"][0]["dp"] = 3.into(),
        &[],
        "`stages[1].modules[0].dp`",
    );
    refused(
        "format",
        |v| v["format"] = "mosaic-plan/9".into(),
        &[],
        "`format`",
    );
    refused(
        "syntax",
        |v| v["stages"][0]["modules"][0]["dp"] = "two".into(),
        &[],
        "`stages[0].modules[0].dp`",
    );
    // A plan for H100s on A100s.
    refused("device", |_| {}, &["--cluster", "a100x8"], "`device`");
    // A plan for 8 GPUs on 4.
    refused("pool", |_| {}, &["--cluster", "h100x4"], "`gpus`");
    // Without model and cluster fields, the flags are needed.
    let err = refused(
        "nomodel",
        |v| {
            v.as_object_mut().unwrap().remove("model");
        },
        &[],
        "`model`",
    );
    assert!(err.contains("--model"), "{err}");
}

#[test]
fn model_and_cluster_flags_stand_in_for_the_plans_fields() {
    let d = dir("flags");
    let p = plan(&d, "clip", "h100x8");
    let mut v = read_json(&p);
    let o = v.as_object_mut().unwrap();
    o.remove("model");
    o.remove("cluster");
    let bare = d.join("bare.json");
    std::fs::write(&bare, v.to_string()).unwrap();
    let o = mosaic(&["simulate", "--plan", s(&bare)]);
    assert_eq!(o.status.code(), Some(2));
    let o = mosaic(&[
        "simulate",
        "--plan",
        s(&bare),
        "--model",
        "clip",
        "--cluster",
        "h100x8",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("clip on h100x8"));
}

#[test]
fn unreadable_and_foreign_files_exit_2() {
    let d = dir("files");
    let missing = d.join("missing.json");
    let o = mosaic(&["simulate", "--plan", s(&missing)]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("missing.json"), "{}", stderr(&o));

    let profile = d.join("profile.json");
    let o = mosaic(&[
        "profile",
        "--model",
        "clip",
        "--cluster",
        "h100x8",
        "--out",
        s(&profile),
    ]);
    assert!(o.status.success());
    let o = mosaic(&["simulate", "--plan", s(&profile)]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("mosaic-profiles/1"), "{}", stderr(&o));
}
