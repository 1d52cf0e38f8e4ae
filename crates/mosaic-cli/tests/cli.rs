//! Drives the `mosaic` binary as a user would.

use std::path::PathBuf;

use serde_json::{json, Value};

mod common;
use common::{example, json_of, mosaic, refused, stderr, stdout};

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mosaic-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Checks a plan JSON against the invariants a user relies on.
fn assert_valid_plan(plan: &Value, modules: usize, gpus: u64) {
    assert_eq!(plan["format"], "mosaic-plan/1");
    let stages = plan["stages"].as_array().unwrap();
    let mut seen = std::collections::HashSet::new();
    let mut sum = 0.0;
    for st in stages {
        sum += st["time_ms"].as_f64().unwrap();
        let mut quota = vec![0.0; gpus as usize];
        for m in st["modules"].as_array().unwrap() {
            assert!(
                seen.insert(m["name"].as_str().unwrap().to_string()),
                "placed once"
            );
            let gs = m["gpus"].as_array().unwrap();
            assert_eq!(gs.len() as u64, m["dp"].as_u64().unwrap());
            for g in gs {
                quota[g.as_u64().unwrap() as usize] += m["sm"].as_f64().unwrap();
            }
        }
        assert!(
            quota.iter().all(|&q| q <= 1.0 + 1e-9),
            "quota ≤ 1 on every GPU: {quota:?}"
        );
    }
    assert_eq!(seen.len(), modules);
    assert!((sum - plan["iteration_ms"].as_f64().unwrap()).abs() < 1e-2);
}

#[test]
fn plans_the_example_file_as_a_table() {
    let ex = example();
    let o = mosaic(&["plan", "--profiles", ex.to_str().unwrap(), "--gpus", "8"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("stage 1") && out.contains("predicted iteration"),
        "{out}"
    );
}

#[test]
fn plans_a_built_in_model_as_json_and_writes_the_file() {
    let path = temp("plan.json");
    let out = path.to_str().unwrap();
    let printed = json_of(&[
        "plan",
        "--model",
        "ofasys",
        "--cluster",
        "h100x8",
        "--json",
        "--out",
        out,
    ]);
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(printed, written);
    let modules = mosaic_zoo::model("ofasys").unwrap().modules.len();
    assert_valid_plan(&printed, modules, 8);
    assert!(["exact", "local", "gahc"].contains(&printed["search"].as_str().unwrap()));
    // OFASys on 8 GPUs is proven optimal within the default budget, and says so.
    assert_eq!(printed["optimal"], true);
    assert_eq!(printed["lower_bound_ms"], printed["iteration_ms"]);
}

#[test]
fn exact_is_never_worse_than_gahc() {
    let ex = example();
    let run = |search: &str| -> f64 {
        let ex = ex.to_str().unwrap();
        let plan = json_of(&[
            "plan",
            "--profiles",
            ex,
            "--gpus",
            "8",
            "--json",
            "--search",
            search,
        ]);
        if search == "gahc" {
            assert_eq!(plan["search"], "gahc");
        } else {
            assert_eq!(
                plan["optimal"], true,
                "the exact search proves the example's optimum"
            );
        }
        plan["iteration_ms"].as_f64().unwrap()
    };
    assert!(run("exact") <= run("gahc") + 1e-6);
}

#[test]
fn profile_writes_a_file_the_planner_reads() {
    let path = temp("clip.json");
    let path = path.to_str().unwrap();
    let o = mosaic(&[
        "profile",
        "--model",
        "clip",
        "--cluster",
        "h100x8",
        "--out",
        path,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let plan = json_of(&["plan", "--profiles", path, "--gpus", "4", "--json"]);
    assert_eq!(plan["gpus"], 4);
}

#[test]
fn zoo_lists_the_papers_models() {
    let o = mosaic(&["zoo"]);
    assert!(o.status.success());
    let out = stdout(&o).to_lowercase();
    for m in [
        "clip",
        "qwen3-vl",
        "unified-io-2",
        "imagebind",
        "ofasys",
        "ctvlm",
        "h100",
        "h200",
        "a100",
    ] {
        assert!(out.contains(m), "zoo lists {m}: {out}");
    }
}

/// A small valid profile file as JSON, for breaking one thing at a time.
fn small() -> Value {
    let samples = |t: f64| {
        json!([{"dp": 1, "sm": 0.5, "time_ms": t * 1.5, "mem_gib": 4.0, "sm_util": 0.9, "bw_util": 0.3},
               {"dp": 1, "sm": 1.0, "time_ms": t, "mem_gib": 4.0, "sm_util": 0.7, "bw_util": 0.4},
               {"dp": 2, "sm": 1.0, "time_ms": t * 0.6, "mem_gib": 3.0, "sm_util": 0.6, "bw_util": 0.4}])
    };
    json!({"format": "mosaic-profiles/1",
           "device": {"name": "H100-SXM5-80GB", "sm_count": 132, "memory_gib": 80.0},
           "modules": [{"name": "vision", "after": [], "samples": samples(100.0)},
                       {"name": "text", "after": [], "samples": samples(30.0)},
                       {"name": "llm", "after": ["vision", "text"], "samples": samples(300.0)}],
           "interference": {"e1": 0.02, "e2": 0.1, "e3": 0.3}})
}

/// Plans a broken file and returns stderr, asserting exit code 2 and no plan on stdout.
fn rejected(v: &Value, extra: &[&str]) -> String {
    let path = temp(&format!("bad-{}.json", rand_suffix()));
    std::fs::write(&path, v.to_string()).unwrap();
    let mut args = vec!["plan", "--profiles", path.to_str().unwrap(), "--gpus", "2"];
    args.extend_from_slice(extra);
    let o = mosaic(&args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "exit code 2: {err}");
    assert!(o.stdout.is_empty(), "no plan on bad input");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains(path.to_str().unwrap()),
        "names the file: {err}"
    );
    err
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

#[test]
fn small_file_plans() {
    let path = temp("small.json");
    std::fs::write(&path, small().to_string()).unwrap();
    let plan = json_of(&[
        "plan",
        "--profiles",
        path.to_str().unwrap(),
        "--gpus",
        "2",
        "--json",
    ]);
    assert_valid_plan(&plan, 3, 2);
}

#[test]
fn bad_inputs_are_rejected_with_the_file_and_field() {
    let mut v = small();
    v["modules"][0]["after"] = json!(["llm"]);
    assert!(rejected(&v, &[]).contains("cycle"));

    let mut v = small();
    v["modules"][2]["after"] = json!(["vision", "audio"]);
    assert!(rejected(&v, &[]).contains("modules[2].after[1]"));

    let mut v = small();
    v["modules"][1]["name"] = "vision".into();
    assert!(rejected(&v, &[]).contains("modules[1].name"));

    let mut v = small();
    v["modules"][0]["samples"][0]
        .as_object_mut()
        .unwrap()
        .remove("bw_util");
    assert!(rejected(&v, &[]).contains("bw_util"));

    let mut v = small();
    v["modules"][1]["samples"][1]["sm"] = 1.2.into();
    assert!(rejected(&v, &[]).contains("modules[1].samples[1].sm"));

    let mut v = small();
    for s in v["modules"][2]["samples"].as_array_mut().unwrap() {
        s["mem_gib"] = 200.0.into();
    }
    assert!(rejected(&v, &[]).contains("fits on no GPU"));

    let mut v = small();
    v["format"] = "mosaic-plan/1".into();
    assert!(rejected(&v, &[]).contains("format"));
}

#[test]
fn a_granularity_that_does_not_divide_one_is_refused() {
    let path = temp("granularity.json");
    std::fs::write(&path, small().to_string()).unwrap();
    let o = mosaic(&[
        "plan",
        "--profiles",
        path.to_str().unwrap(),
        "--gpus",
        "2",
        "--granularity",
        "0.3",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(o.stdout.is_empty());
    assert!(stderr(&o).contains("--granularity"), "{}", stderr(&o));
}

#[test]
fn missing_pool_size_and_unknown_names_exit_2() {
    let ex = example();
    let o = mosaic(&["plan", "--profiles", ex.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--gpus"));

    let o = mosaic(&["plan", "--model", "gpt-17", "--cluster", "h100x8"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).to_lowercase().contains("clip"),
        "lists the known models: {}",
        stderr(&o)
    );

    let o = mosaic(&["plan", "--profiles", "/nonexistent.json", "--gpus", "8"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("/nonexistent.json"));
}

#[test]
fn a_module_needing_more_gpus_than_the_pool_is_refused() {
    let mut v = small();
    v["modules"][2]["samples"] = json!([{"dp": 4, "sm": 1.0, "time_ms": 10.0, "mem_gib": 1.0, "sm_util": 0.5, "bw_util": 0.5}]);
    let err = rejected(&v, &[]);
    assert!(
        err.contains("llm") && err.contains("cannot be placed"),
        "{err}"
    );
}

#[cfg(not(feature = "engine"))]
#[test]
fn train_without_the_engine_says_how_to_get_it() {
    let o = mosaic(&["train", "--model", "clip-tiny", "--steps", "5"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--features engine"), "{}", stderr(&o));
}

#[cfg(not(feature = "engine"))]
#[test]
fn engine_profile_without_the_engine_says_how_to_get_it() {
    let o = mosaic(&["measure", "profile", "--model", "clip-tiny"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--features engine"), "{}", stderr(&o));
}

#[cfg(not(feature = "engine"))]
#[test]
fn every_engine_command_without_the_engine_says_how_to_get_it() {
    let engine = "--features engine";
    refused(&[
        (
            "measure colocations --model clip-tiny --count 3 --out c.json",
            engine,
        ),
        ("measure slots --model omni-tiny", engine),
        ("measure --help", engine),
        (
            "data write --model clip-tiny --out mine.safetensors",
            engine,
        ),
        ("train template --model clip-tiny", engine),
    ]);
}

#[test]
fn the_analytical_profile_refuses_the_engines_flags() {
    // `mosaic profile` is the zoo's device model only: measuring is `mosaic measure profile`.
    refused(&[
        ("profile --engine --model clip-tiny", "--engine"),
        (
            "profile --model clip --cluster h100x8 --colocations 3",
            "--colocations",
        ),
        ("profile --model clip", "--cluster"),
    ]);
}

/// The smallest grid: one model per generator and interference setting, the zoo's models, and
/// StageEval alone on the zoo's widest stages and on the hard synthetic stage.
#[test]
fn bench_times_the_planner_and_stage_eval() {
    let out = json_of(&[
        "bench",
        "--modules",
        "8",
        "--gpus",
        "8",
        "--seeds",
        "1",
        "--repeats",
        "1",
        "--json",
    ]);
    let plans = out["plans"].as_array().unwrap();
    let grid = plans.iter().filter(|r| r["modules"] == 8 && r["gpus"] == 8);
    assert!(grid.count() >= 4, "two generators, interference on and off");
    for r in plans {
        assert!(r["optimal"].as_u64() <= r["models"].as_u64(), "{r}");
        assert!(r["gap_median"].as_f64().unwrap() >= 0.0, "{r}");
    }
    let stages = out["stage_eval"].as_array().unwrap();
    let cases: Vec<&str> = stages.iter().map(|r| r["case"].as_str().unwrap()).collect();
    assert_eq!(stages.len(), 5, "{cases:?}");
    let hard = &stages[4];
    assert_eq!(hard["case"], "zoo-shaped (3, 12, 32): 10 encoders");
    assert_eq!(
        (hard["modules"].as_u64(), hard["gpus"].as_u64()),
        (Some(10), Some(32))
    );
    assert!(stages
        .iter()
        .all(|r| r["median_ms"].as_f64().unwrap() >= 0.0));
}

#[test]
fn bench_refuses_to_measure_nothing() {
    refused(&[
        ("bench --repeats 0", "--repeats"),
        ("bench --seeds 0", "--seeds"),
    ]);
}

/// Sizes beyond the planner's limits are refused at once, naming the input and the limit.
#[test]
fn runaway_sizes_are_refused_naming_the_limit() {
    let example = example();
    let e = example.to_str().unwrap();
    // A profile without an SM partition rule, where --granularity sets the quota grid.
    let path = temp("fine-granularity.json");
    std::fs::write(&path, small().to_string()).unwrap();
    let fine = path.to_str().unwrap();
    refused(&[
        (
            "plan --model clip --cluster h100x1000000000".to_string(),
            "more than the 65536",
        ),
        (format!("plan --profiles {e} --gpus 100000"), "--gpus"),
        (
            format!("plan --profiles {fine} --gpus 2 --granularity 0.000000001"),
            "--granularity",
        ),
        (
            "compare --model qwen3-vl --cluster h100x8 --global-batch 1".to_string(),
            "raise --global-batch",
        ),
    ]);
}
