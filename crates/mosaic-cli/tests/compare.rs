//! `mosaic compare` as a user runs it.

use serde_json::{json, Value};

mod common;
use common::{example, json_of, mosaic, stderr};

const NAMES: [&str; 7] = [
    "Megatron-LM",
    "DistMM",
    "Spindle",
    "DistTrain",
    "FlowTrain",
    "Mosaic (GAHC)",
    "Mosaic (exact)",
];

const IDS: [&str; 7] = [
    "megatron-lm",
    "distmm",
    "spindle",
    "disttrain",
    "flowtrain",
    "mosaic-gahc",
    "mosaic-exact",
];

/// The invariants every `--json` report keeps.
fn check_report(v: &Value, gpus: u64, max_dp: u64) {
    assert_eq!(v["format"], "mosaic-compare/1");
    assert_eq!(v["input"]["gpus"], gpus);
    let rows = v["rows"].as_array().unwrap();
    let ids: Vec<&str> = rows
        .iter()
        .map(|r| r["strategy"].as_str().unwrap())
        .collect();
    assert_eq!(ids, IDS);
    let mosaic = rows[6]["iteration_ms"].as_f64().unwrap();
    assert_eq!(rows[6]["mosaic_exact_speedup"], 1.0);
    for r in rows {
        let t = r["iteration_ms"].as_f64().unwrap();
        assert!(t > 0.0, "{r}");
        let speedup = r["mosaic_exact_speedup"].as_f64().unwrap();
        assert!((speedup - t / mosaic).abs() < 1e-9);
        for key in ["mean_util", "min_util"] {
            let u = r[key].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&u), "{key} {u}");
        }
        assert_eq!(r["gpu_util"].as_array().unwrap().len() as u64, gpus);
        assert!(!r["description"].as_str().unwrap().is_empty());
        if let Some(plan) = r.get("plan").filter(|p| !p.is_null()) {
            assert_eq!(plan["format"], "mosaic-plan/1");
            assert_eq!(plan["gpus"], gpus);
            for stage in plan["stages"].as_array().unwrap() {
                for m in stage["modules"].as_array().unwrap() {
                    assert!(m["dp"].as_u64().unwrap() <= max_dp, "{m}");
                    for g in m["gpus"].as_array().unwrap() {
                        assert!(g.as_u64().unwrap() < gpus);
                    }
                }
                for q in stage["gpu_quota"].as_array().unwrap() {
                    assert!(q.as_f64().unwrap() <= 1.0 + 1e-9);
                }
            }
        }
    }
    // Staged baselines always come with a plan the simulator can run; pipelines never.
    for i in [0, 1, 5, 6] {
        assert!(rows[i]["plan"].is_object(), "{}", rows[i]["name"]);
    }
    for i in [3, 4] {
        assert!(rows[i]["plan"].is_null() && rows[i]["pipelined"] == true);
    }
    // Mosaic (exact) contains Megatron-LM and DistMM.
    for i in [0, 1] {
        assert!(rows[i]["mosaic_exact_speedup"].as_f64().unwrap() >= 1.0 - 1e-6);
    }
}

#[test]
fn compares_ofasys_on_one_node_as_a_table() {
    let o = mosaic(&["compare", "--model", "ofasys", "--cluster", "h100x8"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for name in NAMES {
        assert!(
            out.lines().any(|l| l.starts_with(name)),
            "{name} missing:\n{out}"
        );
    }
    assert!(
        out.contains("Mosaic ×") && out.contains("mean util"),
        "{out}"
    );
    assert!(out.contains("ofasys on h100x8"), "{out}");
}

#[test]
fn json_report_of_a_built_in_model() {
    let v = json_of(&[
        "compare",
        "--model",
        "ofasys",
        "--cluster",
        "h100x8",
        "--json",
    ]);
    check_report(&v, 8, 8);
    assert_eq!(v["input"]["model"], "ofasys");
    assert_eq!(v["input"]["cluster"], "h100x8");
    // The zoo's batch on one node (Mosaic §5.1: 16) bounds DistTrain's microbatches.
    assert_eq!(v["input"]["global_batch"], 16);
}

#[test]
fn example_file_on_more_gpus_than_profiled_dp() {
    let ex = example();
    let v = json_of(&[
        "compare",
        "--profiles",
        ex.to_str().unwrap(),
        "--gpus",
        "16",
        "--json",
    ]);
    // The file goes up to dp 8: no module runs on more than 8 GPUs, and the report says why.
    check_report(&v, 16, 8);
    assert_eq!(v["input"]["max_profiled_dp"], 8);
    let notes = v["notes"].to_string();
    assert!(
        notes.contains("dp 8") && notes.contains("16 GPUs"),
        "{notes}"
    );
    // Megatron-LM uses dp 8 for every module: half the pool idles.
    let megatron = &v["rows"][0];
    assert_eq!(megatron["min_util"], 0.0);
    assert!(megatron["description"]
        .as_str()
        .unwrap()
        .split(" | ")
        .all(|m| m.ends_with("dp8")));
    // Staged strategies on 16 GPUs are at least as fast as on 8.
    let on8 = json_of(&[
        "compare",
        "--profiles",
        ex.to_str().unwrap(),
        "--gpus",
        "8",
        "--json",
    ]);
    check_report(&on8, 8, 8);
    for i in [1, 6] {
        let t16 = v["rows"][i]["iteration_ms"].as_f64().unwrap();
        let t8 = on8["rows"][i]["iteration_ms"].as_f64().unwrap();
        assert!(
            t16 <= t8 + 1e-2,
            "{}: {t16} on 16 GPUs > {t8} on 8",
            v["rows"][i]["name"]
        );
    }
}

#[test]
fn bad_input_exits_with_2_and_names_the_problem() {
    // No whole-GPU sample: every baseline needs one.
    let dir = std::env::temp_dir().join(format!("mosaic-compare-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("half.json");
    let file = json!({
        "format": "mosaic-profiles/1",
        "device": {"name": "gpu", "sm_count": 100, "memory_gib": 80.0},
        "modules": [
            {"name": "enc", "after": [], "samples": [
                {"dp": 1, "sm": 0.5, "time_ms": 10.0, "mem_gib": 1.0, "sm_util": 0.5, "bw_util": 0.2}]},
            {"name": "head", "after": ["enc"], "samples": [
                {"dp": 1, "sm": 1.0, "time_ms": 5.0, "mem_gib": 1.0, "sm_util": 0.5, "bw_util": 0.2}]}],
        "interference": {"e1": 0.0, "e2": 0.0, "e3": 0.0}
    });
    std::fs::write(&path, file.to_string()).unwrap();
    let o = mosaic(&[
        "compare",
        "--profiles",
        path.to_str().unwrap(),
        "--gpus",
        "2",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("\"enc\"") && stderr(&o).contains("sm = 1.0"),
        "{}",
        stderr(&o)
    );

    let o = mosaic(&[
        "compare",
        "--model",
        "clip",
        "--cluster",
        "h100x8",
        "--gpus",
        "0",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = mosaic(&[
        "compare",
        "--model",
        "clip",
        "--cluster",
        "h100x8",
        "--slice-sync-ms=-1",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--slice-sync-ms"), "{}", stderr(&o));

    // Only whole-GPU samples at dp 4 on 2 GPUs: the advice names the dp, not the quota alone.
    let path = dir.join("dp4.json");
    let file = json!({
        "format": "mosaic-profiles/1",
        "device": {"name": "gpu", "sm_count": 100, "memory_gib": 80.0},
        "modules": [
            {"name": "enc", "after": [], "samples": [
                {"dp": 4, "sm": 1.0, "time_ms": 10.0, "mem_gib": 1.0, "sm_util": 0.5, "bw_util": 0.2}]}],
        "interference": {"e1": 0.0, "e2": 0.0, "e3": 0.0}
    });
    std::fs::write(&path, file.to_string()).unwrap();
    let o = mosaic(&[
        "compare",
        "--profiles",
        path.to_str().unwrap(),
        "--gpus",
        "2",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("dp of at most 2"), "{}", stderr(&o));

    // A samples file is the batch: a second global batch beside it contradicts it.
    let samples = dir.join("batch.jsonl");
    std::fs::write(&samples, "{\"text_tokens\": 100}\n").unwrap();
    let o = mosaic(&[
        "compare",
        "--model",
        "qwen3-vl",
        "--cluster",
        "h100x8",
        "--samples",
        samples.to_str().unwrap(),
        "--global-batch",
        "5",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--global-batch"), "{}", stderr(&o));
}
