//! Drives `mosaic measure profile` and `mosaic measure colocations` as a user would: a
//! measured profile and measured colocations of clip-tiny, accepted by `mosaic plan` and
//! `mosaic fit`, and the plan trained by `mosaic train`; and bad input.
#![cfg(feature = "engine")]

mod common;
use common::{dir, mosaic, mosaic_line, read_json, s, stderr, stdout};

#[test]
fn measured_profiles_feed_plan_fit_and_train() {
    let d = dir("pipeline");
    let (measured, coloc, plan) = (
        d.join("measured.json"),
        d.join("coloc.json"),
        d.join("plan.json"),
    );
    let settings = [
        "--model",
        "clip-tiny",
        "--batch",
        "8",
        "--max-dp",
        "2",
        "--reps",
        "2",
    ];
    let measure = |verb: &str, rest: &[&str]| {
        let mut args = vec!["measure", verb];
        args.extend(settings);
        args.extend(rest);
        mosaic(&args)
    };
    let o = measure("profile", &["--out", s(&measured)]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("device: ") && err.contains("STREAM triad"),
        "{err}"
    );
    let o = measure("colocations", &["--count", "3", "--out", s(&coloc)]);
    let coloc_err = stderr(&o);
    assert!(o.status.success(), "{coloc_err}");

    let p = read_json(&measured);
    assert_eq!(p["format"], "mosaic-profiles/1");
    let cores = p["device"]["sm_count"].as_u64().unwrap();
    assert!(cores >= 1 && p["device"]["memory_gib"].as_f64().unwrap() > 0.0);
    let modules = p["modules"].as_array().unwrap();
    let names: Vec<&str> = modules
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["vision", "text", "align"]);
    assert_eq!(modules[2]["after"], serde_json::json!(["vision", "text"]));
    let quotas = cores.min(10) as usize;
    // One progress line per grid point: 3 modules × dp {1, 2} × the quotas; one per colocation.
    let points = 3 * 2 * quotas;
    let progress = |err: &str| err.lines().filter(|l| l.starts_with('[')).count();
    assert_eq!(progress(&err), points, "{err}");
    assert_eq!(progress(&coloc_err), 3, "{coloc_err}");
    for m in modules {
        let samples = m["samples"].as_array().unwrap();
        assert_eq!(samples.len(), 2 * quotas);
        for x in samples {
            assert!(x["time_ms"].as_f64().unwrap() > 0.0, "{x}");
            assert!(x["mem_gib"].as_f64().unwrap() > 0.0, "{x}");
        }
    }
    assert!(p["source"].as_str().unwrap().contains("clip-tiny"));

    let c = read_json(&coloc);
    assert_eq!(c["format"], "mosaic-colocations/1");
    assert_eq!(c["device"], p["device"]["name"]);
    assert_eq!(c["samples"].as_array().unwrap().len(), 3);

    let o = mosaic(&[
        "plan",
        "--profiles",
        s(&measured),
        "--gpus",
        "2",
        "--out",
        s(&plan),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = mosaic(&[
        "fit",
        "--profiles",
        s(&measured),
        "--colocations",
        s(&coloc),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("interference fit"), "{}", stdout(&o));
    // The plan made from the measured profile drives the engine model it was measured on.
    let o = mosaic(&[
        "train",
        "--model",
        "clip-tiny",
        "--plan",
        s(&plan),
        "--batch",
        "8",
        "--steps",
        "2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn unknown_engine_model_exits_2_naming_the_known_ones() {
    let d = dir("unknown-model");
    let out = d.join("c.json");
    for line in [
        "measure profile --model clip-huge".to_string(),
        format!(
            "measure colocations --model clip-huge --count 2 --out {}",
            s(&out)
        ),
        "measure slots --model clip-huge".into(),
    ] {
        let o = mosaic_line(&line);
        assert_eq!(o.status.code(), Some(2), "{line}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(
            e.contains("\"clip-huge\"") && e.contains("clip-tiny") && e.contains("omni-tiny"),
            "{e}"
        );
        assert!(
            stdout(&o).is_empty(),
            "nothing is written on bad input: {}",
            stdout(&o)
        );
    }
    assert!(!out.exists());
}

#[test]
fn bad_settings_exit_2() {
    let o = mosaic(&["measure", "profile", "--model", "clip-tiny", "--reps", "0"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--reps"), "{}", stderr(&o));
    // Engine settings for the analytical profile, and colocations without a file to write.
    let o = mosaic(&[
        "profile",
        "--model",
        "clip",
        "--cluster",
        "h100x8",
        "--reps",
        "3",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = mosaic(&[
        "measure",
        "colocations",
        "--model",
        "clip-tiny",
        "--count",
        "3",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--out"), "{}", stderr(&o));
}

#[test]
fn measuring_under_an_mpi_launcher_is_refused() {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_mosaic"))
        .args(["measure", "slots", "--model", "clip-tiny", "--steps", "1"])
        .env("OMPI_COMM_WORLD_SIZE", "2")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("without mpirun"), "{}", stderr(&o));
}
