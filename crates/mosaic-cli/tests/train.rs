//! Drives `mosaic train` as a user would: JSON logs, plans from the planner, from `mosaic train
//! template` and by hand, bad input, the slot bench (`mosaic measure slots`), the data format
//! (`mosaic data write`), a run killed with SIGKILL that resumes bit for bit, and a full disk
//! that keeps the previous checkpoint.
#![cfg(feature = "engine")]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

mod common;
use common::{dir, mosaic, mosaic_line, refused, s, stderr, stdout};

/// The JSON lines of a `--json-log` run.
fn events(o: &Output) -> Vec<Value> {
    assert!(o.status.success(), "{}", stderr(o));
    stdout(o)
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line is JSON"))
        .collect()
}

/// `(step, loss bits)` of the step events.
fn losses(events: &[Value]) -> Vec<(u64, u32)> {
    events
        .iter()
        .filter(|e| e["event"] == "step")
        .map(|e| {
            (
                e["step"].as_u64().unwrap(),
                (e["loss"].as_f64().unwrap() as f32).to_bits(),
            )
        })
        .collect()
}

/// A hand-written plan for clip-tiny: both towers in one stage with 2 replicas at half the
/// machine each, then align with 2 replicas.
fn staged_plan(d: &Path) -> PathBuf {
    let path = d.join("staged.json");
    let o = mosaic(&[
        "train",
        "template",
        "--model",
        "clip-tiny",
        "--out",
        s(&path),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let mut plan: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let module = |name: &str, dp: u32, sm: f64| {
        serde_json::json!({"name": name, "dp": dp, "sm": sm, "gpus": (0..dp).collect::<Vec<_>>(),
                           "time_ms": 0.0, "base_ms": 0.0, "mem_gib": 0.0})
    };
    plan["gpus"] = 2.into();
    plan["stages"] = serde_json::json!([
        {"time_ms": 0.0, "gpu_quota": [], "modules": [module("vision", 2, 0.5), module("text", 2, 0.5)]},
        {"time_ms": 0.0, "gpu_quota": [], "modules": [module("align", 2, 1.0)]},
    ]);
    std::fs::write(&path, plan.to_string()).unwrap();
    path
}

#[test]
fn trains_with_a_json_log() {
    let o = mosaic(&[
        "train",
        "--model",
        "omni-tiny",
        "--steps",
        "4",
        "--json-log",
    ]);
    let ev = events(&o);
    assert_eq!(ev.len(), 6, "start, 4 steps, done: {ev:?}");
    assert_eq!(ev[0]["event"], "start");
    assert_eq!(ev[0]["resumed_from"], Value::Null);
    assert_eq!(ev[0]["schedule"]["stages"].as_array().unwrap().len(), 4);
    assert_eq!(ev[0]["modules"][3]["name"], "backbone");
    // On CPU threads no slot is carved from a GPU: one null per module.
    let carving = ev[0]["carving"].as_array().unwrap();
    assert_eq!(carving.len(), ev[0]["modules"].as_array().unwrap().len());
    assert!(carving.iter().all(Value::is_null));
    let steps = losses(&ev);
    assert_eq!(steps.iter().map(|x| x.0).collect::<Vec<_>>(), [1, 2, 3, 4]);
    assert!(
        ev[1]["stages"][0]["modules"][0]["forward_ms"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    // Host time (until the module waited for its slot) never exceeds the pass's time.
    for stage in ev[1]["stages"].as_array().unwrap() {
        for m in stage["modules"].as_array().unwrap() {
            for pass in ["forward", "backward"] {
                let host = m[format!("{pass}_host_ms")].as_f64().unwrap();
                let all = m[format!("{pass}_ms")].as_f64().unwrap();
                assert!(host > 0.0 && host <= all, "{m}");
            }
        }
    }
    assert_eq!(ev[5]["event"], "done");
}

#[test]
fn a_zoo_plan_for_clip_drives_clip_tiny() {
    let d = dir("zoo-plan");
    let plan = d.join("clip.json");
    let o = mosaic(&[
        "plan",
        "--model",
        "clip",
        "--cluster",
        "h100x8",
        "--search",
        "exact",
        "--out",
        s(&plan),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ev = events(&mosaic(&[
        "train",
        "--model",
        "clip-tiny",
        "--plan",
        s(&plan),
        "--steps",
        "2",
        "--json-log",
    ]));
    assert_eq!(losses(&ev).len(), 2);
    // The planner's stages are followed.
    let planned: Value = serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
    assert_eq!(
        ev[0]["schedule"]["stages"].as_array().unwrap().len(),
        planned["stages"].as_array().unwrap().len()
    );
}

#[test]
fn bad_plans_and_settings_exit_2_naming_the_file_and_field() {
    let d = dir("bad");
    let plan = staged_plan(&d);
    let text = std::fs::read_to_string(&plan)
        .unwrap()
        .replace("\"text\"", "\"txt\"");
    let wrong = d.join("wrong.json");
    std::fs::write(&wrong, text).unwrap();
    let o = mosaic(&[
        "train",
        "--model",
        "clip-tiny",
        "--plan",
        s(&wrong),
        "--steps",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("wrong.json: field `stages[0].modules[1].name`"),
        "{e}"
    );
    assert!(e.contains("unknown module \"txt\""), "{e}");

    // A plan for the other model.
    let o = mosaic(&[
        "train",
        "--model",
        "omni-tiny",
        "--plan",
        s(&plan),
        "--steps",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("staged.json: field `model`: the plan is for clip-tiny"),
        "{}",
        stderr(&o)
    );

    // A replica on a GPU outside the plan's pool.
    let text = std::fs::read_to_string(&plan)
        .unwrap()
        .replacen("[0,1]", "[0,5]", 1);
    let outside = d.join("outside.json");
    std::fs::write(&outside, text).unwrap();
    let o = mosaic(&["train", "--model", "clip-tiny", "--plan", s(&outside)]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("outside.json: field `stages[0].modules[0].gpus"),
        "{}",
        stderr(&o)
    );

    // Not a plan at all.
    let junk = d.join("junk.json");
    std::fs::write(&junk, r#"{"format": "mosaic-profiles/1"}"#).unwrap();
    let o = mosaic(&["train", "--model", "clip-tiny", "--plan", s(&junk)]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("field `format`"), "{}", stderr(&o));

    for args in [
        &["train", "--model", "llama-tiny"][..],
        &["train", "--model", "clip-tiny", "--batch", "0"],
        &[
            "train",
            "--model",
            "clip-tiny",
            "--plan",
            s(&plan),
            "--batch",
            "1",
        ],
        &["train", "--model", "clip-tiny", "--checkpoint-every", "0"],
        &["train", "--model", "clip-tiny", "--collective", "gloo"],
    ] {
        let o = mosaic(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
    }

    // NCCL sums across ranks; a process started without mpirun has none.
    let o = mosaic(&["train", "--model", "clip-tiny", "--collective", "nccl"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--collective nccl"), "{}", stderr(&o));
}

/// The zoo-built models train at a small size (`--size`), and a size outside (0, 1], or one
/// given to a tiny model, is refused naming `--size`.
#[test]
fn zoo_built_models_train_at_a_size() {
    for model in ["clip", "imagebind"] {
        let o = mosaic(&[
            "train",
            "--model",
            model,
            "--size",
            "0.03",
            "--steps",
            "3",
            "--json-log",
        ]);
        let steps = losses(&events(&o));
        assert_eq!(steps.len(), 3, "{model}");
    }
    refused(&[
        ("train --model clip --size 0", "--size"),
        ("train --model clip --size 1.5", "--size"),
        ("train --model clip --size NaN", "--size"),
        ("train --model clip-tiny --size 0.5", "--size"),
    ]);
}

/// `mosaic bench engine` on the CPU: a row per (model, batch) with the Mosaic plan's and the
/// one-after-another schedule's measured step times; the prediction error of a zoo plan only on
/// a GPU, of a plan from measured profiles everywhere.
#[test]
fn bench_engine_measures_the_plan_against_one_after_another() {
    let o = mosaic(&[
        "bench", "engine", "--device", "cpu", "--size", "0.03", "--steps", "1", "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Vec<Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line is JSON"))
        .collect();
    assert_eq!(rows.len(), 4, "clip and imagebind at batches 16 and 2");
    for r in &rows {
        assert!(r["mosaic_ms"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["sequential_ms"].as_f64().unwrap() > 0.0, "{r}");
        // The stages are inside the whole step, which draws the batch too.
        for schedule in ["mosaic", "sequential"] {
            let stages = r[format!("{schedule}_ms")].as_f64().unwrap();
            let step = r[format!("{schedule}_step_ms")].as_f64().unwrap();
            assert!(step >= stages, "{schedule}: {r}");
            assert_eq!(r["recomputing"][schedule], serde_json::json!([]), "{r}");
        }
        assert!(r["predicted_ms"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["prediction_error"].is_null(), "{r}");
        assert_eq!(r["plan_from"], "zoo", "{r}");
        assert!(
            r["interference"].is_null(),
            "the zoo's plan fits nothing: {r}"
        );
        // Each stage of shared modules against the same modules one after another.
        let shared = r["shared_stages"].as_array().expect("shared_stages");
        assert!(
            !shared.is_empty(),
            "the zoo's plans co-locate the encoders: {r}"
        );
        for stage in shared {
            let modules = stage["modules"].as_array().unwrap();
            assert!(modules.len() >= 2, "{stage}");
            assert!(stage["colocated_ms"].as_f64().unwrap() > 0.0, "{stage}");
            let alone: f64 = modules
                .iter()
                .map(|m| m["alone_ms"].as_f64().unwrap())
                .sum();
            let one_by_one = stage["one_by_one_ms"].as_f64().unwrap();
            assert!((alone - one_by_one).abs() <= 1e-9 * one_by_one, "{stage}");
            for m in modules {
                let name = m["name"].as_str().unwrap();
                let at = format!("{name}@{:.2}", m["sm"].as_f64().unwrap());
                assert!(r["plan"].as_str().unwrap().contains(&at), "{at} in {r}");
                assert!(m["slot_ms"].as_f64().unwrap() > 0.0, "{stage}");
                // Measured in its slot with no neighbour too.
                assert!(m["isolated_ms"].as_f64().unwrap() > 0.0, "{stage}");
                // On the CPU both trainers launch every module alike (op by op).
                assert_eq!(m["launched_alike"], true, "{stage}");
            }
            // On the CPU nothing is replayed from a CUDA graph.
            assert_eq!(r["graphed"]["mosaic"], serde_json::json!([]), "{r}");
        }
    }
    // Planned from the modules measured alone here first: the prediction is about this CPU,
    // so its error is printed at any size.
    let o = mosaic_line(
        "bench engine --device cpu --size 0.03 --steps 1 --models clip --batches 2 \
         --plan-from measured --json",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let r: Value = serde_json::from_str(stdout(&o).trim()).expect("one JSON line");
    assert_eq!(r["plan_from"], "measured", "{r}");
    assert!(r["prediction_error"].as_f64().unwrap().is_finite(), "{r}");
    assert!(r["predicted_ms"].as_f64().unwrap() > 0.0, "{r}");
    // With interference fitted to colocations measured here: two per module where two slots
    // fit (none on one core), coefficients a profile can hold.
    let fitted = &r["interference"];
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let expected = if cores >= 2 { 6 } else { 0 };
    assert_eq!(fitted["colocations"], expected, "{r}");
    // Each point and colocation is printed as it is measured.
    let progress = stderr(&o);
    assert!(progress.contains("vision dp 1 quota"), "{progress}");
    assert_eq!(
        progress.contains(&format!("[{expected}] ")),
        expected > 0,
        "{progress}"
    );
    assert!(["full", "additive", "unaware"].contains(&fitted["model"].as_str().unwrap()));
    for e in ["e1", "e2", "e3"] {
        let v = fitted["interference"][e].as_f64().unwrap();
        assert!((0.0..=100.0).contains(&v), "{e} {r}");
    }
    refused(&[
        ("bench engine --device cpu --plan-from guess", "--plan-from"),
        ("bench engine --device cpu --size 0", "--size"),
        ("bench engine --device cpu --models nope", "--models"),
        // In the zoo, not an engine model: refused before clip's rows train.
        ("bench engine --device cpu --models clip,ofasys", "--models"),
        ("bench engine --device cpu --batches 1", "--batches"),
    ]);
}

#[test]
fn bench_block_times_every_piece_of_a_block() {
    let o = mosaic_line(
        "bench block --model clip --module text --size 0.05 --batch 2 --device cpu --reps 1",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.starts_with("clip text block at batch 2: 102 tokens (causal), width 4, heads 1"),
        "{out}"
    );
    for piece in [
        "layer norm",
        "qkv projection",
        "attention, composed",
        "MLP",
        "block",
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(piece)),
            "{piece} missing:\n{out}"
        );
    }
    let o = mosaic_line("bench block --module depth --model imagebind --size 0.05 --batch 1 --device cpu --reps 1 --json");
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Vec<Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line is JSON"))
        .collect();
    assert_eq!(rows.len(), 6);
    assert_eq!(rows[5]["piece"], "block");
    assert!(rows[5]["step_ms"].as_f64().unwrap() >= rows[5]["forward_ms"].as_f64().unwrap());
    assert!(rows[0]["tflops"].is_null() && rows[5]["tflops"].as_f64().unwrap() > 0.0);
    assert!(rows[5]["tape_bytes"].as_u64().unwrap() >= rows[4]["tape_bytes"].as_u64().unwrap());
    refused(&[
        (
            "bench block --device cpu --module audio",
            "\"audio\"; its encoders: vision, text",
        ),
        ("bench block --device cpu --model nope", "--model \"nope\""),
        ("bench block --device cpu --size 0", "--size"),
        ("bench block --device cpu --reps 0", "--reps"),
        ("bench block --device cpu --batch 0", "--batch"),
        ("bench block --device tpu", "--device"),
        (
            "bench block --device cpu --batch 4096",
            "lower --batch or --size",
        ),
    ]);
}

/// Where no GPU can run (a CPU build here), `--device cuda` is refused before training, saying
/// how to get the GPU build, and `mosaic check gpu` skips every check saying why.
#[test]
fn gpu_paths_say_why_they_cannot_run_here() {
    let o = mosaic(&[
        "train",
        "--model",
        "clip-tiny",
        "--device",
        "cuda",
        "--steps",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--device"), "{}", stderr(&o));
    assert!(stderr(&o).contains("scripts/cuda-cargo"), "{}", stderr(&o));
    assert!(stdout(&o).is_empty(), "trained: {}", stdout(&o));

    let o = mosaic(&["check", "gpu", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let checks: Vec<Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line is JSON"))
        .collect();
    assert!(!checks.is_empty());
    assert!(checks
        .iter()
        .all(|c| c["outcome"] == "skip" || c["outcome"] == "pass"));
    let o = mosaic(&["check", "gpu", "--device", "5000"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));

    let o = mosaic_line("bench block --size 0.05 --reps 1");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("scripts/cuda-cargo"), "{}", stderr(&o));
}

#[test]
fn a_checkpoint_of_another_run_is_refused() {
    let d = dir("other-ckpt");
    let ck = d.join("ckpt");
    let o = mosaic(&[
        "train",
        "--model",
        "clip-tiny",
        "--steps",
        "2",
        "--checkpoint-dir",
        s(&ck),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(ck.join("checkpoint.safetensors").is_file());
    let o = mosaic(&[
        "train",
        "--model",
        "clip-tiny",
        "--seed",
        "1",
        "--steps",
        "3",
        "--checkpoint-dir",
        s(&ck),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("field `seed`"), "{}", stderr(&o));
    // The same run asked for fewer steps than done: nothing to do.
    let o = mosaic(&[
        "train",
        "--model",
        "clip-tiny",
        "--steps",
        "2",
        "--checkpoint-dir",
        s(&ck),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("nothing to do"), "{}", stderr(&o));
}

#[test]
fn the_slot_bench_prints_pooled_and_on_demand_figures() {
    let o = mosaic(&["measure", "slots", "--model", "clip-tiny", "--steps", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for word in ["pooled", "on demand", "transition", "matmul"] {
        assert!(out.contains(word), "{word}: {out}");
    }
}

/// A checkpoint that cannot be written (the disk is full: the temporary file is `/dev/full`)
/// stops the run with the reason, and leaves the previous checkpoint whole: the next run
/// resumes from it.
#[test]
fn a_full_disk_keeps_the_previous_checkpoint() {
    let d = dir("full-disk");
    let ck = d.join("ckpt");
    let train = |steps: &str| {
        mosaic_line(&format!(
            "train --model clip-tiny --steps {steps} --checkpoint-every 4 --checkpoint-dir {} \
             --json-log",
            s(&ck)
        ))
    };
    let o = train("8");
    assert!(o.status.success(), "{}", stderr(&o));
    let tmp = ck.join("checkpoint.safetensors.tmp");
    std::os::unix::fs::symlink("/dev/full", &tmp).unwrap();
    let o = train("12");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("No space left on device"),
        "{}",
        stderr(&o)
    );
    std::fs::remove_file(&tmp).unwrap();
    let resumed = events(&train("12"));
    assert_eq!(resumed[0]["resumed_from"].as_u64(), Some(8), "{resumed:?}");
    assert_eq!(losses(&resumed).last().unwrap().0, 12);
}

/// A run killed with SIGKILL mid-training resumes from its last checkpoint, and its loss curve
/// is the uninterrupted run's, bit for bit.
#[test]
fn a_killed_run_resumes_bit_for_bit() {
    let d = dir("kill");
    let plan = staged_plan(&d);
    let ck = d.join("ckpt");
    // Killed at step 25 of 100, the run is far from done (and if this reader lags, the run
    // waits on the full pipe rather than finishing).
    let steps = "100";
    let base = [
        "train",
        "--model",
        "clip-tiny",
        "--plan",
        s(&plan),
        "--steps",
        steps,
        "--json-log",
    ];

    let whole = losses(&events(&mosaic(&base)));
    assert_eq!(whole.len(), 100);

    let mut args = base.to_vec();
    args.extend(["--checkpoint-dir", s(&ck), "--checkpoint-every", "4"]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_mosaic"))
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut before = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let e: Value = serde_json::from_str(&line.unwrap()).unwrap();
        before.extend(losses(std::slice::from_ref(&e)));
        if e["event"] == "step" && e["step"].as_u64().unwrap() >= 25 {
            child.kill().unwrap(); // SIGKILL
            break;
        }
    }
    let status = child.wait().unwrap();
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "the run was killed, not finished");
    }
    assert_eq!(before[..], whole[..before.len()]);

    let resumed = events(&mosaic(&args));
    let from = resumed[0]["resumed_from"]
        .as_u64()
        .expect("resumed from a checkpoint");
    assert!(
        (4..=before.len() as u64).contains(&from),
        "resumed from step {from}"
    );
    let after = losses(&resumed);
    assert_eq!(after.first().unwrap().0, from + 1);
    assert_eq!(after.last().unwrap().0, 100);
    assert_eq!(
        after[..],
        whole[from as usize..],
        "the resumed curve is the uninterrupted one"
    );
}

#[test]
fn trains_on_the_users_tensors() {
    let d = dir("data");
    let file = d.join("mine.safetensors");
    let o = mosaic(&[
        "data",
        "write",
        "--model",
        "clip-tiny",
        "--steps",
        "8",
        "--out",
        s(&file),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "image [16, 16] f32, text [16] ids < 64, text_len [] lengths of text, 1 to 16 (optional)"
        ),
        "{}",
        stderr(&o)
    );
    // The written file holds exactly the synthetic batches: the runs agree bit for bit.
    let run = |extra: &[&str]| {
        let mut args = vec![
            "train",
            "--model",
            "clip-tiny",
            "--steps",
            "8",
            "--json-log",
        ];
        args.extend(extra);
        events(&mosaic(&args))
    };
    let mine = run(&["--data", s(&file)]);
    assert_eq!(mine[0]["data"], s(&file));
    assert_eq!(losses(&mine), losses(&run(&[])));

    // Another model's inputs: refused, naming the file and the missing tensor.
    let o = mosaic(&["train", "--model", "omni-tiny", "--data", s(&file)]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "mine.safetensors: field `audio`: missing; the model expects audio [N, 16, 8]"
        ),
        "{}",
        stderr(&o)
    );
    let o = mosaic(&[
        "train",
        "--model",
        "clip-tiny",
        "--data",
        s(&d.join("absent.safetensors")),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("absent.safetensors: field `(file)`"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn the_template_is_the_default_plan_as_a_file() {
    let d = dir("template");
    let path = d.join("plan.json");
    let o = mosaic_line(&format!(
        "train template --model omni-tiny --gpus 2 --out {}",
        s(&path)
    ));
    assert!(o.status.success(), "{}", stderr(&o));
    let plan: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(plan["format"], "mosaic-plan/1");
    assert_eq!(plan["gpus"], 2);
    assert_eq!(plan["stages"].as_array().unwrap().len(), 4);
    assert_eq!(plan["stages"][3]["modules"][0]["name"], "backbone");
    assert_eq!(
        plan["stages"][3]["modules"][0]["gpus"],
        serde_json::json!([0, 1])
    );
    // Without --out, the plan is printed.
    let o = mosaic_line("train template --model clip-tiny");
    assert!(o.status.success(), "{}", stderr(&o));
    let printed: Value = serde_json::from_str(&stdout(&o)).expect("stdout is the plan");
    assert_eq!(printed["stages"].as_array().unwrap().len(), 3);
}

#[test]
fn bad_uses_of_the_engine_verbs_exit_2_naming_what_is_wrong() {
    let path = dir("bad-verbs").join("out.json");
    let out = s(&path);
    refused(&[
        // Unknown verbs, and none at all.
        ("train plan --model clip-tiny".to_string(), "plan"),
        ("data read --model clip-tiny".into(), "read"),
        ("measure weights --model clip-tiny".into(), "weights"),
        ("data".into(), "--generate"),
        ("measure".into(), "Usage"),
        // Missing required flags.
        (format!("train template --out {out}"), "--model"),
        (format!("data write --out {out}"), "--model"),
        (format!("measure profile --out {out}"), "--model"),
        ("measure slots --steps 2".into(), "--model"),
        ("data write --model clip-tiny".into(), "--out"),
        (
            format!("measure colocations --model clip-tiny --out {out}"),
            "--count",
        ),
        // Counts below one.
        ("train template --model clip-tiny --gpus 0".into(), "--gpus"),
        (
            format!("measure colocations --model clip-tiny --count 0 --out {out}"),
            "--count",
        ),
        // A verb's flags are its own, and no zoo cluster means anything to the engine.
        ("train --model clip-tiny template".into(), "template"),
        (
            format!("data write --model clip-tiny --out {out} --plan {out}"),
            "--plan",
        ),
        (
            "measure profile --model clip-tiny --cluster h100x8".into(),
            "--cluster",
        ),
        // Unknown models.
        ("train template --model llama-tiny".into(), "llama-tiny"),
        (
            format!("data write --model llama-tiny --out {out}"),
            "llama-tiny",
        ),
        // The old spellings.
        (
            format!("train --model clip-tiny --write-data {out}"),
            "--write-data",
        ),
        (
            format!("train --model clip-tiny --write-plan {out}"),
            "--write-plan",
        ),
        (
            "train --model clip-tiny --bench-slots".into(),
            "--bench-slots",
        ),
        ("profile --engine --model clip-tiny".into(), "--engine"),
        (
            "measure profile --model clip-tiny --colocations 3".into(),
            "--colocations",
        ),
        (
            format!("measure profile --model clip-tiny --colocations-out {out}"),
            "--colocations-out",
        ),
    ]);
    assert!(!path.exists(), "nothing is written on bad input");
}

/// Sizes beyond what memory allows are refused up front, naming the flag and the limit.
#[test]
fn runaway_sizes_are_refused_naming_the_limit() {
    refused(&[
        (
            "train --model clip-tiny --batch 100000000 --steps 1",
            "--batch",
        ),
        (
            "measure slots --model clip-tiny --batch 100000000",
            "--batch",
        ),
        (
            "measure profile --model clip-tiny --batch 100000000",
            "--batch",
        ),
        (
            "data write --model clip-tiny --out never.safetensors --steps 1000000000",
            "--steps × --batch",
        ),
        (
            "data write --model clip-tiny --out never.safetensors --batch 0",
            "--batch",
        ),
        (
            "measure colocations --model clip-tiny --count 100000000000 --out c.json",
            "--count",
        ),
        (
            "train template --model clip-tiny --gpus 4000000000",
            "--gpus",
        ),
    ]);
}

/// This machine's available memory (`MemAvailable`), in GiB; `None` off Linux.
fn available_gib() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib / (1024.0 * 1024.0))
}

/// Runs `line`, which must be refused (exit code 2) within 20 s, before any long work; returns
/// its standard error.
fn refused_quickly(line: &str) -> String {
    let t0 = std::time::Instant::now();
    let o = mosaic_line(line);
    let secs = t0.elapsed().as_secs_f64();
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{line}: {e}");
    assert!(secs < 20.0, "{line}: refused only after {secs:.1} s: {e}");
    e
}

/// A plan states the model it is for: a plan for another model is refused naming the file,
/// the field and both models, by `train` and `measure slots`; one that names no model (as a
/// plan from measured profiles) is read by its module names.
#[test]
fn a_plan_for_another_model_is_refused_naming_its_model_field() {
    let d = dir("plan-model");
    let template = d.join("t.json");
    let o = mosaic(&[
        "train",
        "template",
        "--model",
        "clip-tiny",
        "--out",
        s(&template),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let mut plan: Value =
        serde_json::from_str(&std::fs::read_to_string(&template).unwrap()).unwrap();
    assert_eq!(plan["model"], "clip-tiny", "the template names its model");
    plan["model"] = "omni-tiny".into();
    let other = d.join("other.json");
    std::fs::write(&other, plan.to_string()).unwrap();
    for line in [
        format!("train --model clip-tiny --plan {} --steps 1", s(&other)),
        format!(
            "measure slots --model clip-tiny --plan {} --steps 1",
            s(&other)
        ),
    ] {
        let e = refused_quickly(&line);
        assert!(
            e.contains(
                "other.json: field `model`: the plan is for omni-tiny, but --model is \
                        clip-tiny: expected clip-tiny or clip"
            ),
            "{line}: {e}"
        );
    }
    // The real-size model's plans are not the tiny one's: refused before CLIP is built.
    let e = refused_quickly(&format!(
        "train --model clip --plan {} --steps 1",
        s(&template)
    ));
    assert!(
        e.contains("the plan is for clip-tiny, but --model is clip"),
        "{e}"
    );
    // Without a model, the module names decide: these are clip-tiny's.
    plan.as_object_mut().unwrap().remove("model");
    let unnamed = d.join("unnamed.json");
    std::fs::write(&unnamed, plan.to_string()).unwrap();
    let ev = events(&mosaic(&[
        "train",
        "--model",
        "clip-tiny",
        "--plan",
        s(&unnamed),
        "--steps",
        "1",
        "--json-log",
    ]));
    assert_eq!(losses(&ev).len(), 1);
}

/// `data write` and `measure slots` run their model on this machine's CPU at one size: a
/// zoo-built model at its real size is refused at once, naming `--model` and the models their
/// `--help` lists, where it took minutes and aborted out of memory.
#[test]
fn real_size_models_are_refused_where_only_tiny_ones_run() {
    let out = dir("real-size").join("x.safetensors");
    for line in [
        format!("data write --model clip --out {}", s(&out)),
        format!(
            "data write --model imagebind --out {} --steps 1 --batch 1",
            s(&out)
        ),
        "measure slots --model clip --steps 1".to_string(),
        "measure slots --model imagebind --steps 1".to_string(),
    ] {
        let e = refused_quickly(&line);
        assert!(e.contains("--model "), "{line}: {e}");
        assert!(e.contains("expected clip-tiny or omni-tiny"), "{line}: {e}");
    }
    assert!(!out.exists());
}

/// A batch within the 65,536-sample limit whose step cannot fit this machine's memory
/// (clip-tiny's contrastive logits alone are 16 GiB a copy at 65,536) is refused before the
/// batch is drawn, naming `--batch` and the estimate, where it aborted out of memory after 41 s
/// (and the CPU profile sweep and colocations ran into it too).
#[test]
fn a_batch_beyond_the_hosts_memory_is_refused_before_step_1() {
    match available_gib() {
        Some(gib) if gib < 150.0 => {}
        other => {
            eprintln!("skipped: {other:?} GiB available, enough for the batch");
            return;
        }
    }
    let d = dir("batch-beyond-memory");
    let out = d.join("colocations.json");
    for line in [
        "train --model clip-tiny --steps 1 --batch 65536".to_string(),
        "measure slots --model clip-tiny --steps 1 --batch 65536".to_string(),
        // A profile's or colocation's replica at dp 1 steps on the whole batch.
        "measure profile --model clip-tiny --reps 1 --batch 65536".to_string(),
        format!(
            "measure colocations --model clip-tiny --reps 1 --count 2 --batch 65536 --out {}",
            out.display()
        ),
    ] {
        let e = refused_quickly(&line);
        assert!(
            e.contains("--batch: a step of 65536 samples of clip-tiny needs about"),
            "{line}: {e}"
        );
        assert!(e.contains("GiB available (MemAvailable"), "{line}: {e}");
        assert!(e.contains("in align"), "{line}: {e}");
    }
    assert!(!out.exists());
}
