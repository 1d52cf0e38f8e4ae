//! `mpirun -np 2 mosaic train`: data parallelism across two processes through OpenMPI, as a
//! user starts it. Built with the `mpi` feature, which needs OpenMPI, so `mpirun` must exist.
#![cfg(feature = "mpi")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

mod common;
use common::{dir, s};

/// `mosaic args…` alone, or under `mpirun -np ranks`.
fn mosaic(ranks: Option<usize>, args: &[&str]) -> Output {
    let bin = env!("CARGO_BIN_EXE_mosaic");
    let mut cmd = match ranks {
        None => Command::new(bin),
        Some(n) => {
            let mut c = mpirun();
            c.args(["-np", &n.to_string(), bin]);
            c
        }
    };
    cmd.args(args)
        .output()
        .expect("mpirun (openmpi-bin) is installed: the mpi feature needs OpenMPI")
}

/// `mpirun --oversubscribe`, allowed to start as root (CI machines run as root; mpirun refuses
/// without these).
fn mpirun() -> Command {
    let mut c = Command::new("mpirun");
    c.arg("--oversubscribe")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    c
}

/// `mosaic train template --model model --out out`: one process's default plan, written.
fn template(model: &str, out: &Path) {
    let o = mosaic(
        None,
        &["train", "template", "--model", model, "--out", s(out)],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// The step losses of a `--json-log` run, and its start event.
fn run(o: &Output) -> (Value, Vec<f32>) {
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let events: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line is JSON (only rank 0 logs)"))
        .collect();
    let losses = events
        .iter()
        .filter(|e| e["event"] == "step")
        .map(|e| e["loss"].as_f64().unwrap() as f32)
        .collect();
    (events[0].clone(), losses)
}

/// clip-tiny on 2 GPUs with unlike placements: vision ×2 on both, text on GPU 1 only, align
/// on GPU 0 only — so activations and gradients cross ranks at both boundaries, and each rank
/// holds a module the other does not.
fn mixed_plan(d: &Path) -> PathBuf {
    let module = |name: &str, gpus: &[u32], sm: f64| {
        serde_json::json!({"name": name, "dp": gpus.len(), "sm": sm, "gpus": gpus,
                           "time_ms": 0.0, "base_ms": 0.0, "mem_gib": 0.0})
    };
    let plan = serde_json::json!({
        "format": "mosaic-plan/1", "iteration_ms": 0.0, "search": "hand", "solve_ms": 0.0,
        "gpus": 2, "device": "cpu", "granularity": 0.5,
        "stages": [
            {"time_ms": 0.0, "gpu_quota": [0.5, 1.0],
             "modules": [module("vision", &[0, 1], 0.5), module("text", &[1], 0.5)]},
            {"time_ms": 0.0, "gpu_quota": [1.0, 0.0], "modules": [module("align", &[0], 1.0)]}
        ]
    });
    let path = d.join("mixed.json");
    std::fs::write(&path, plan.to_string()).unwrap();
    path
}

/// `train --model clip-tiny --plan plan --steps steps --json-log`.
fn clip_by<'a>(plan: &'a Path, steps: &'a str) -> Vec<&'a str> {
    vec![
        "train",
        "--model",
        "clip-tiny",
        "--plan",
        s(plan),
        "--steps",
        steps,
        "--json-log",
    ]
}

fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-5 * x.abs().max(1.0),
            "step {}: {x} vs {y}",
            i + 1
        );
    }
}

#[test]
fn two_processes_train_like_one() {
    let d = dir("like-one");
    let plan = mixed_plan(&d);
    let args = clip_by(&plan, "12");
    let (start, two) = run(&mosaic(Some(2), &args));
    assert_eq!(start["collective"], "mpi");
    assert_eq!(start["ranks"], 2);
    let (start, one) = run(&mosaic(None, &args));
    assert_eq!(start["collective"], "in-process");
    close(&one, &two);
    assert!(two[11] < two[0], "the loss falls: {two:?}");

    // The default plan under mpirun: every module replicated on both ranks.
    let default = [
        "train",
        "--model",
        "omni-tiny",
        "--steps",
        "6",
        "--json-log",
    ];
    let (start, two) = run(&mosaic(Some(2), &default));
    assert_eq!(start["schedule"]["stages"][0][0]["dp"], 2);
    let (_, one) = run(&mosaic(None, &default));
    close(&one, &two);
}

/// `--collective nccl`: with NCCL and a GPU per rank, the losses of one process; without
/// them (CI has no GPU), every rank stops at start-up with an error naming why, and the test
/// says it skipped the GPU part.
#[cfg(feature = "cuda")]
#[test]
fn nccl_sums_like_one_process_or_refuses_cleanly() {
    let d = dir("nccl");
    let plan = mixed_plan(&d);
    let args = clip_by(&plan, "6");
    let with_nccl = [&args[..], &["--collective", "nccl"]].concat();
    let o = mosaic(Some(2), &with_nccl);
    if !o.status.success() {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("panicked"), "{err}");
        assert!(
            err.contains("--collective nccl: NCCL cannot be used here"),
            "{err}"
        );
        let why = [
            "no usable CUDA driver or GPU",
            "no NCCL library",
            "NCCL needs a GPU per rank",
        ];
        assert!(why.iter().any(|w| err.contains(w)), "{err}");
        assert!(
            String::from_utf8_lossy(&o.stdout).trim().is_empty(),
            "no step ran"
        );
        eprintln!("skipped: NCCL on GPUs (the run was refused cleanly): {err}");
        return;
    }
    let (start, two) = run(&o);
    assert_eq!(start["collective"], "nccl");
    let (_, one) = run(&mosaic(None, &args));
    close(&one, &two);
}

#[test]
fn two_processes_checkpoint_and_resume_exactly() {
    let d = dir("resume");
    let plan = mixed_plan(&d);
    let ckpt = d.join("ckpt");
    let train = |steps: &str, ckpt: Option<&Path>| {
        let mut args = clip_by(&plan, steps);
        args.extend(["--checkpoint-every", "4"]);
        if let Some(c) = ckpt {
            args.extend(["--checkpoint-dir", s(c)]);
        }
        run(&mosaic(Some(2), &args)).1
    };
    let whole = train("10", None);
    // Stop after step 4 (checkpointed), then resume to 10: rank 0 wrote text's state, which
    // only rank 1 trains, and every rank read it back.
    let first = train("4", Some(&ckpt));
    let rest = train("10", Some(&ckpt));
    let joined: Vec<f32> = first.into_iter().chain(rest).collect();
    assert_eq!(
        joined.iter().map(|l| l.to_bits()).collect::<Vec<_>>(),
        whole.iter().map(|l| l.to_bits()).collect::<Vec<_>>(),
        "resumed {joined:?} vs whole {whole:?}"
    );
}

/// The processes `pid` started (from `/proc`: the fourth field of `stat` is the parent).
fn children(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            // After the command's name, in parentheses: state, then the parent's pid.
            let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
            after.split_whitespace().nth(1) == Some(pid.to_string().as_str())
        })
        .collect()
}

/// How `job` ended, which must be within `secs` seconds of `what` (else it is killed and the
/// test fails: a hung job).
fn ended_within(job: &mut std::process::Child, secs: u64, what: &str) -> std::process::ExitStatus {
    let since = std::time::Instant::now();
    loop {
        if let Some(status) = job.try_wait().unwrap() {
            return status;
        }
        if since.elapsed() > std::time::Duration::from_secs(secs) {
            job.kill().ok();
            panic!("the job still runs {secs} s after {what}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// One rank killed with SIGKILL mid-run: the other stops within seconds (mpirun aborts the
/// job, never a hang), and rerunning resumes from the last checkpoint on the uninterrupted
/// run's loss curve, bit for bit.
#[test]
fn a_killed_rank_stops_the_run_and_it_resumes() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    let d = dir("kill-rank");
    let plan = mixed_plan(&d);
    let ck = d.join("ckpt");
    let mut args = clip_by(&plan, "400");
    let whole = run(&mosaic(Some(2), &args)).1;
    args.extend(["--checkpoint-every", "4", "--checkpoint-dir", s(&ck)]);

    let bin = env!("CARGO_BIN_EXE_mosaic");
    let mut job = mpirun()
        .args(["-np", "2", bin])
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("mpirun (openmpi-bin) is installed");
    let mut lines = BufReader::new(job.stdout.take().unwrap()).lines();
    // Wait for step 30 (checkpoints at 4, 8, …, 28 are written by then).
    for line in lines.by_ref() {
        let e: Value = serde_json::from_str(&line.unwrap()).unwrap();
        if e["event"] == "step" && e["step"].as_u64().unwrap() >= 30 {
            break;
        }
    }
    let ranks = children(job.id());
    assert_eq!(ranks.len(), 2, "mpirun's ranks: {ranks:?}");
    let killed = Instant::now();
    Command::new("kill")
        .args(["-KILL", &ranks[1].to_string()])
        .status()
        .unwrap();
    // Drain what rank 0 still prints, so that it never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    let status = ended_within(&mut job, 30, "a rank was killed");
    assert!(!status.success());
    assert!(
        killed.elapsed() < Duration::from_secs(10),
        "stopped after {:?}",
        killed.elapsed()
    );

    let o = mosaic(Some(2), &args);
    let (start, rest) = run(&o);
    let from = start["resumed_from"]
        .as_u64()
        .expect("resumed from a checkpoint") as usize;
    assert!((28..400).contains(&from), "resumed from step {from}");
    assert_eq!(
        rest.iter().map(|l| l.to_bits()).collect::<Vec<_>>(),
        whole[from..]
            .iter()
            .map(|l| l.to_bits())
            .collect::<Vec<_>>(),
        "the resumed curve is the uninterrupted one"
    );
}

#[test]
fn a_plan_with_fewer_gpus_than_ranks_is_refused() {
    let d = dir("too-few");
    let plan = d.join("one.json");
    template("clip-tiny", &plan);
    let o = mosaic(
        Some(2),
        &["train", "--model", "clip-tiny", "--plan", s(&plan)],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("one.json: field `gpus`: the plan has 1 GPU(s) but the run has 2 rank(s)"),
        "{err}"
    );
}

/// Ranks on one machine share its memory: a batch whose step fits one process alone (the
/// largest that `train` names when it refuses 65,536 samples) is refused under `mpirun -np 2`,
/// where each rank's contrastive head holds the whole batch's logits, naming the other rank.
#[test]
fn ranks_on_one_machine_are_checked_against_its_memory_together() {
    let train = |ranks, batch: &str| {
        let args = [
            "train",
            "--model",
            "clip-tiny",
            "--steps",
            "1",
            "--batch",
            batch,
        ];
        mosaic(ranks, &args)
    };
    let alone = train(None, "65536");
    let e = String::from_utf8_lossy(&alone.stderr);
    let Some(n) = e
        .split("above about ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse::<usize>().ok())
    else {
        eprintln!("skipped: 65536 samples fit this machine, or its memory is unknown: {e}");
        return;
    };
    let both = train(Some(2), &n.to_string());
    assert!(!both.status.success());
    let e = String::from_utf8_lossy(&both.stderr);
    assert!(
        e.contains(&format!(
            "--batch: a step of {n} samples of clip-tiny needs about"
        )),
        "{e}"
    );
    assert!(e.contains("the other rank on this machine needs"), "{e}");
}

/// A rank that fails where the others go on (here rank 1 alone is handed a plan for another
/// model) ends the whole job with its error: returning, it would wait in `MPI_Finalize` for
/// rank 0, which waits for it in the trainer's first collective, and the job would hang.
#[test]
fn a_rank_that_fails_alone_ends_the_job() {
    use std::process::Stdio;

    let d = dir("failing-rank");
    let omni = d.join("omni.json");
    template("omni-tiny", &omni);
    let bin = env!("CARGO_BIN_EXE_mosaic");
    let train = ["train", "--model", "clip-tiny", "--steps", "100"];
    // One job, two programs (OpenMPI's MPMD form): rank 0 as given, rank 1 with the wrong plan.
    let mut job = mpirun()
        .args(["-np", "1", bin])
        .args(train)
        .args([":", "-np", "1", bin])
        .args(train)
        .args(["--plan", s(&omni)])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mpirun (openmpi-bin) is installed");
    let status = ended_within(&mut job, 60, "rank 1 failed");
    let mut e = String::new();
    std::io::Read::read_to_string(&mut job.stderr.take().unwrap(), &mut e).unwrap();
    assert_eq!(status.code(), Some(2), "{e}");
    assert!(e.contains("error:") && e.contains("omni-tiny"), "{e}");
}
