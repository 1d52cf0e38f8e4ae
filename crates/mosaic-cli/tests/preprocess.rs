//! Drives training on encoded images as a user would: `mosaic train --producers K` trains,
//! exits 0 and leaves no producer behind; it sees the very batches preprocessing in process
//! gives (bit-identical losses); bad flags exit 2; `mosaic measure preprocess` reports.
#![cfg(feature = "engine")]

use std::path::Path;
use std::process::Output;

use serde_json::Value;

mod common;
use common::{mosaic_line, refused, stderr, stdout};

/// The JSON lines of a successful `--json-log` run.
fn events(o: &Output) -> Vec<Value> {
    assert!(o.status.success(), "{}", stderr(o));
    stdout(o)
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line is JSON"))
        .collect()
}

/// Loss bits of the step events.
fn losses(events: &[Value]) -> Vec<u32> {
    events
        .iter()
        .filter(|e| e["event"] == "step")
        .map(|e| (e["loss"].as_f64().unwrap() as f32).to_bits())
        .collect()
}

const RUN: &str = "train --model clip-tiny --steps 3 --batch 8 --images-per-sample 3 \
                   --image-resolution 64 --json-log";

#[test]
fn preprocess_producers_train_and_are_gone_after_exit() {
    let o = mosaic_line(&format!("{RUN} --producers 2"));
    let e = events(&o);
    let pids: Vec<u64> = e[0]["producers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_u64().unwrap())
        .collect();
    assert_eq!(pids.len(), 2, "{}", e[0]);
    assert!(e[0]["data"].as_str().unwrap().contains("2 producer"));
    assert_eq!(e.last().unwrap()["event"], "done");
    assert_eq!(losses(&e).len(), 3);
    for pid in pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "producer {pid} outlived the trainer"
        );
    }
    // The same batches in process: the same losses, bit for bit.
    let local = events(&mosaic_line(&format!("{RUN} --producers 0")));
    assert_eq!(local[0]["producers"].as_array().unwrap().len(), 0);
    assert_eq!(losses(&local), losses(&e));
}

#[test]
fn preprocess_bad_flags_exit_2() {
    refused(&[
        (
            "train --model omni-tiny --producers 1 --steps 1",
            "the model also reads `audio`",
        ),
        (
            "train --model clip-tiny --producers 65 --steps 1",
            "--producers",
        ),
        (
            "train --model clip-tiny --images-per-sample 0 --steps 1",
            "--images-per-sample",
        ),
        (
            "train --model clip-tiny --image-resolution 5000 --steps 1",
            "--image-resolution",
        ),
        (
            "train --model clip-tiny --data x.safetensors --producers 1",
            "cannot be used with",
        ),
        (
            "measure preprocess --resolutions 4 --steps 1",
            "--resolutions",
        ),
        ("measure preprocess --producers 0 --steps 1", "--producers"),
        (
            "measure preprocess --model omni-tiny --steps 1 --resolutions 16 --images 1",
            "`audio`",
        ),
    ]);
}

#[test]
fn preprocess_measure_reports_both_modes() {
    let o = mosaic_line(
        "measure preprocess --resolutions 32 --images 1,2 --producers 1 --steps 2 --batch 4 \
         --json",
    );
    let rows = events(&o);
    assert_eq!(rows.len(), 2);
    for r in &rows {
        let row = &r["row"];
        assert_eq!(row["resolution"], 32);
        assert_eq!(row["in_process"]["producers"], 0);
        assert_eq!(row["disaggregated"]["producers"], 1);
        assert!(row["in_process"]["step_ms"].as_f64().unwrap() > 0.0);
        assert!(row["images_per_step"].as_f64().unwrap() >= 4.0);
    }
}

/// `measure preprocess` names its own flag, `--model`, for a model the image feed cannot make
/// samples of (not `train`'s feed flags, which it does not have), and refuses the real-size
/// CLIP at once, where it ran far beyond 20 s.
#[test]
fn measure_preprocess_refuses_models_naming_its_own_flag() {
    for (line, says) in [
        (
            "measure preprocess --model omni-tiny",
            "--model omni-tiny: the image feed makes",
        ),
        (
            "measure preprocess --model clip",
            "--model clip: measure preprocess runs",
        ),
        (
            "measure preprocess --model llama",
            "--model llama: unknown engine model",
        ),
    ] {
        let t0 = std::time::Instant::now();
        let o = mosaic_line(line);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{line}: {e}");
        assert!(t0.elapsed().as_secs() < 20, "{line}: {e}");
        assert!(
            e.contains(says) && e.contains("expected clip-tiny"),
            "{line}: {e}"
        );
        assert!(!e.contains("--images-per-sample"), "{line}: {e}");
    }
}
