//! `mosaic calibrate`, and `--calibration FILE` in the commands that profile, as a user runs
//! them.

use std::path::PathBuf;

use serde_json::Value;

mod common;
use common::{dir, json_of, mosaic, mosaic_line, read_json, refused, s, stderr, stdout};

/// The H100 measurements of CLIP shared in the workspace's `examples/`.
fn clip_profile() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/h100-clip-profile.json")
}

/// Runs `line`, which must succeed.
fn ok(line: &str) {
    let o = mosaic_line(line);
    assert!(o.status.success(), "{line}: {}", stderr(&o));
}

/// `mosaic calibrate` on the CLIP measurements with `extra` flags; it must succeed.
fn calibrate(extra: &str) -> std::process::Output {
    let line = format!(
        "calibrate --profiles {} --model clip --device h100 {extra}",
        s(&clip_profile())
    );
    let o = mosaic_line(&line);
    assert!(o.status.success(), "{line}: {}", stderr(&o));
    o
}

/// Calibrates on the CLIP measurements into `d/calibration.json`, and writes beside it
/// `d/slow.json`, the same constants with `launch_us` host time per kernel launch.
fn calibrations(d: &std::path::Path, launch_us: f64) -> (PathBuf, PathBuf) {
    let out = d.join("calibration.json");
    calibrate(&format!("--out {}", s(&out)));
    let mut slow = read_json(&out);
    slow["constants"]["launch_us"] = launch_us.into();
    let slow_path = d.join("slow.json");
    std::fs::write(&slow_path, slow.to_string()).unwrap();
    (out, slow_path)
}

#[test]
fn calibrate_writes_a_versioned_file_and_reports_held_out_accuracy() {
    let d = dir("calibrate");
    let out = d.join("calibration.json");
    let o = calibrate(&format!("--out {}", s(&out)));
    let text = stdout(&o);
    for word in [
        "sm_exponent",
        "launch_us",
        "overlap_exponent",
        "held-out",
        "assumed",
        "all",
    ] {
        assert!(text.contains(word), "{word} in {text}");
    }
    let file = read_json(&out);
    assert_eq!(file["format"], "mosaic-calibration/1");
    assert_eq!(file["fitted_on"]["model"], "clip");
    assert_eq!(file["fitted_on"]["modules"].as_array().unwrap().len(), 3);
    assert_eq!(file["fitted"].as_array().unwrap().len(), 7);
    assert!(file["error"]["mean_rel"].as_f64().unwrap() < 0.1);
    // The built-in default is this very fit.
    let gamma = file["constants"]["sm_exponent"].as_f64().unwrap();
    assert!((gamma - 0.815).abs() < 0.01, "{gamma}");

    let v: Value = serde_json::from_slice(&calibrate("--json").stdout).expect("stdout is JSON");
    let rows = v["accuracy"].as_array().unwrap();
    let all = rows.iter().find(|r| r["module"] == "all").unwrap();
    let held_dp1 = all["held_out_dp1"]["mean_rel"].as_f64().unwrap();
    let held = all["held_out"]["mean_rel"].as_f64().unwrap();
    assert!(held_dp1 <= 0.15 && held <= 0.25, "{all}");
    assert!(all["in_sample"]["mean_rel"].as_f64() < all["assumed"]["mean_rel"].as_f64());
    assert_eq!(v["calibration"]["format"], "mosaic-calibration/1");
}

/// The built-in constants, fitted to CLIP on an H100, carried over to measurements they never
/// saw: ImageBind's seven modules measured on an H200 with PyTorch (examples/, dp 1).
#[test]
fn the_built_in_constants_predict_imagebind_measured_on_an_h200() {
    let profile = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/h200-imagebind-profile.json");
    let line = format!(
        "calibrate --profiles {} --model imagebind --device h200 --json",
        s(&profile)
    );
    let o = mosaic_line(&line);
    assert!(o.status.success(), "{line}: {}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).expect("stdout is JSON");
    let rows = v["accuracy"].as_array().unwrap();
    assert_eq!(rows.len(), 8, "seven modules and all");
    let all = rows.iter().find(|r| r["module"] == "all").unwrap();
    let built_in = all["built_in_dp1"]["mean_rel"].as_f64().unwrap();
    // 14.7 % (depth, launch-bound, 36 %) since the host/GPU overlap exponent; 16.0 % with the
    // plain maximum. The aim, for an H100: 15 %.
    assert!(built_in <= 0.15, "{all}");
    assert!(all["in_sample_dp1"]["mean_rel"].as_f64().unwrap() < built_in);
    assert!(built_in < all["assumed_dp1"]["mean_rel"].as_f64().unwrap());
    // Most of the miss is the H200 host's faster launches: re-fitted alone, they leave ~10 %.
    let host = &v["host_refit"];
    assert_eq!(host["built_in_dp1"]["mean_rel"].as_f64().unwrap(), built_in);
    assert!(
        host["refitted_dp1"]["mean_rel"].as_f64().unwrap() < 0.11,
        "{host}"
    );
    let text = mosaic_line(&line.replace(" --json", ""));
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("what remains is the GPU model's"),
        "{}",
        String::from_utf8_lossy(&text.stdout)
    );
}

#[test]
fn calibrate_refuses_inputs_that_do_not_fit() {
    let d = dir("calibrate-bad");
    let profile = clip_profile();
    let mut renamed: Value = read_json(&profile);
    renamed["modules"][1]["name"] = "txt".into();
    renamed["modules"][2]["after"][1] = "txt".into();
    let renamed_path = d.join("renamed.json");
    std::fs::write(&renamed_path, renamed.to_string()).unwrap();
    let mut wrong: Value = read_json(&profile);
    wrong["format"] = "mosaic-profiles/9".into();
    let wrong_path = d.join("wrong.json");
    std::fs::write(&wrong_path, wrong.to_string()).unwrap();
    let p = s(&profile);
    refused(&[
        (
            format!(
                "calibrate --profiles {}/missing.json --model clip --device h100",
                s(&d)
            ),
            "missing.json",
        ),
        (
            format!(
                "calibrate --profiles {} --model clip --device h100",
                s(&wrong_path)
            ),
            "format",
        ),
        (
            format!("calibrate --profiles {p} --model clip --device tpu"),
            "unknown device `tpu`",
        ),
        (
            format!("calibrate --profiles {p} --model clip --device a100"),
            "field `device`",
        ),
        (
            format!("calibrate --profiles {p} --model ofasys --device h100"),
            "modules[2].name",
        ),
        (
            format!(
                "calibrate --profiles {} --model clip --device h100",
                s(&renamed_path)
            ),
            "modules[1].name",
        ),
    ]);
}

#[test]
fn commands_take_a_calibration_file_and_refuse_bad_ones() {
    let d = dir("calibration-flag");
    // A calibration that launches kernels ten times slower makes small modules slower.
    let (out, slow_path) = calibrations(&d, 400.0);
    let time = |cal: &PathBuf| -> f64 {
        let o = mosaic(&[
            "profile",
            "--model",
            "imagebind",
            "--cluster",
            "h100x8",
            "--calibration",
            s(cal),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        let imu = v["modules"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == "imu")
            .unwrap();
        imu["samples"][0]["time_ms"].as_f64().unwrap()
    };
    assert!(time(&slow_path) > 3.0 * time(&out));
    let v = json_of(&[
        "compare",
        "--model",
        "clip",
        "--cluster",
        "h100x8",
        "--calibration",
        s(&slow_path),
        "--json",
    ]);
    assert!(v["input"]["label"].as_str().unwrap().contains("slow.json"));

    let mut unknown = read_json(&out);
    unknown["constants"]["warp_speed"] = 9.0.into();
    let mut negative = read_json(&out);
    negative["constants"]["bw_saturation"] = (-0.5).into();
    let mut format = read_json(&out);
    format["format"] = "mosaic-calibration/2".into();
    let write = |name: &str, v: &Value| {
        let p = d.join(name);
        std::fs::write(&p, v.to_string()).unwrap();
        s(&p).to_string()
    };
    let (unknown, negative, format) = (
        write("unknown.json", &unknown),
        write("negative.json", &negative),
        write("format.json", &format),
    );
    let missing = format!("{}/missing.json", s(&d));
    refused(&[
        (
            format!("profile --model clip --cluster h100x8 --calibration {missing}"),
            "missing.json",
        ),
        (
            format!("profile --model clip --cluster h100x8 --calibration {format}"),
            "field `format`",
        ),
        (
            format!("compare --model clip --cluster h100x8 --calibration {unknown}"),
            "warp_speed",
        ),
        (
            format!("report --out {}/r --calibration {negative}", s(&d)),
            "field `constants.bw_saturation`",
        ),
        (
            format!("simulate --plan {missing} --calibration {negative}"),
            "missing.json",
        ),
        (
            format!(
                "compare --profiles {} --gpus 8 --calibration {}",
                s(&clip_profile()),
                s(&out)
            ),
            "--calibration",
        ),
    ]);
}

#[test]
fn simulate_runs_a_plan_under_a_calibration() {
    let d = dir("simulate-calibration");
    let plan = d.join("plan.json");
    ok(&format!(
        "plan --model clip --cluster h100x8 --out {}",
        s(&plan)
    ));
    let (cal, slow_path) = calibrations(&d, 400.0);
    let at = |c: &PathBuf| {
        json_of(&[
            "simulate",
            "--plan",
            s(&plan),
            "--calibration",
            s(c),
            "--json",
        ])["iteration_ms"]
            .as_f64()
            .unwrap()
    };
    assert!(at(&slow_path) > at(&cal));
}

/// The CLIP measurements with only the first `n` samples of each module.
fn first_samples(d: &std::path::Path, n: usize) -> PathBuf {
    let mut v = read_json(&clip_profile());
    for m in v["modules"].as_array_mut().unwrap() {
        m["samples"].as_array_mut().unwrap().truncate(n);
    }
    let p = d.join(format!("first-{n}.json"));
    std::fs::write(&p, v.to_string()).unwrap();
    p
}

/// Seven constants fitted to three samples fit them exactly and predict nothing: refused,
/// saying how many samples are needed. Nine samples fit, but each module held out leaves six,
/// and the command says so.
#[test]
fn calibrate_refuses_fewer_samples_than_constants() {
    let d = dir("calibrate-few");
    let (p1, p3) = (first_samples(&d, 1), first_samples(&d, 3));
    let out = d.join("c.json");
    refused(&[(
        format!(
            "calibrate --profiles {} --model clip --device h100 --out {}",
            s(&p1),
            s(&out)
        ),
        &format!(
            "{}: field `modules`: the modules hold 3 samples in all, but 7 constants are fitted",
            s(&p1)
        ),
    )]);
    assert!(!out.exists());
    let o = mosaic_line(&format!(
        "calibrate --profiles {} --model clip --device h100",
        s(&p3)
    ));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("`align` is predicted by a fit of 7 constants to 6 samples"),
        "{}",
        stderr(&o)
    );
}

/// Measurements so slow that the constants fitted to them, each at the slow end of its range,
/// would give profiles the planner refuses: refused, naming the measured file, rather than
/// written into a calibration that `--calibration` would refuse.
#[test]
fn calibrate_refuses_constants_no_profile_could_hold() {
    let d = dir("calibrate-slow");
    let mut v = read_json(&clip_profile());
    for m in v["modules"].as_array_mut().unwrap() {
        for x in m["samples"].as_array_mut().unwrap() {
            let t = x["time_ms"].as_f64().unwrap();
            x["time_ms"] = (t * 1000.0).min(1e7).into();
        }
    }
    let slow = d.join("slow.json");
    std::fs::write(&slow, v.to_string()).unwrap();
    let out = d.join("c.json");
    refused(&[(
        format!(
            "calibrate --profiles {} --model clip --device h100 --out {}",
            s(&slow),
            s(&out)
        ),
        &format!(
            "{}: the constants fitted to its samples are no calibration of a real GPU: field \
             `constants`",
            s(&slow)
        ),
    )]);
    assert!(!out.exists());
}

/// Constants that pass the old (0, 1] checks but give absurd plans and profiles the planner
/// refuses: each refused by every command that reads it, naming the file and the field.
#[test]
fn calibrations_outside_physical_bounds_are_refused_by_every_command() {
    let d = dir("calibration-bounds");
    let good = d.join("calibration.json");
    std::fs::write(
        &good,
        serde_json::json!({"format": "mosaic-calibration/1",
            "constants": serde_json::to_value(mosaic_zoo::Calibration::default()).unwrap()})
        .to_string(),
    )
    .unwrap();
    let plan = d.join("plan.json");
    ok(&format!(
        "plan --model clip --cluster h100x8 --out {}",
        s(&plan)
    ));
    let profile = d.join("p.json");
    let mut cases = Vec::new();
    for (field, value, says) in [
        (
            "gemm_efficiency",
            1e-300,
            "field `constants.gemm_efficiency`",
        ),
        ("hbm_efficiency", 1e-300, "field `constants.hbm_efficiency`"),
        (
            "link_efficiency",
            1e-300,
            "field `constants.link_efficiency`",
        ),
        ("workspace_gib", 1e6, "field `constants.workspace_gib`"),
        // Within its range, but matmuls this slow give Qwen3-VL's LLM more than 10⁷ ms.
        (
            "gemm_efficiency",
            0.015,
            "field `constants`: together these constants",
        ),
    ] {
        let mut v = read_json(&good);
        v["constants"][field] = value.into();
        let path = d.join(format!("{field}-{value:e}.json"));
        std::fs::write(&path, v.to_string()).unwrap();
        let c = s(&path).to_string();
        let says = format!("{c}: {says}");
        for line in [
            format!("compare --model clip --cluster h100x8 --calibration {c}"),
            format!("simulate --plan {} --calibration {c}", s(&plan)),
            format!(
                "profile --model clip --cluster h100x8 --calibration {c} --out {}",
                s(&profile)
            ),
            format!("report --out {}/r --calibration {c}", s(&d)),
        ] {
            cases.push((line, says.clone()));
        }
    }
    let cases: Vec<(String, &str)> = cases.iter().map(|(l, w)| (l.clone(), w.as_str())).collect();
    refused(&cases);
    assert!(!profile.exists());
    // The built-in constants, written as a file, are accepted and give a profile plan reads.
    ok(&format!(
        "profile --model clip --cluster h100x8 --calibration {} --out {}",
        s(&good),
        s(&profile)
    ));
    ok(&format!("plan --profiles {} --gpus 8", s(&profile)));
}
