//! Drives the `mosaic` binary with hostile files and a hostile standard output: a FIFO given as
//! `--calibration`, files with trailing garbage after their JSON value, plan fields out of
//! range, plans naming no such model or cluster, output paths under a regular file, names of
//! a million characters, a full disk and a closed pipe on standard output, and runaway bench
//! counts. Each must end at once, with exit code 2 and a short message naming the file and the
//! field (or the flag) for bad input, never a panic, a hang or a plan.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::{clip_files, dir, json_of, mosaic, s, stderr};

/// How long one invocation may take before it counts as a hang and is killed (refusals take
/// milliseconds).
const LIMIT: Duration = Duration::from_secs(30);

/// Runs `mosaic` with `args` and standard output to `stdout`, killing it past [`LIMIT`] (then
/// failing the test: it hung).
fn run_with(args: &[&str], stdout: Stdio) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mosaic"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .expect("the mosaic binary runs");
    // Standard error is read on a thread, so that a long message cannot block the child.
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = err.read_to_end(&mut text);
        text
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?}: still running after {LIMIT:?} (a hang)");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: Vec::new(),
        stderr: reader.join().unwrap(),
    }
}

/// Runs `mosaic` with `args` (killed past [`LIMIT`]): it must exit with code 2, printing
/// nothing on standard output, its message on standard error containing each of `says` and
/// no panic.
fn refused(args: &[&str], says: &[&str]) -> String {
    let path = std::env::temp_dir().join(format!(
        "mosaic-hostile-io-stdout-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let out = std::fs::File::create(&path).unwrap();
    let o = run_with(args, Stdio::from(out));
    let printed = std::fs::read_to_string(&path).unwrap_or_default();
    let _ = std::fs::remove_file(&path);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert!(printed.is_empty(), "{args:?}: printed {printed}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    for want in says {
        assert!(err.contains(want), "{args:?}: expected {want:?} in {err}");
    }
    err
}

/// `mosaic plan --model clip --cluster h100x8 --json`, as JSON.
fn clip_plan() -> Value {
    json_of(&["plan", "--model", "clip", "--cluster", "h100x8", "--json"])
}

/// Writes `value` as JSON to `d/name` and returns its path.
fn write_json(d: &Path, name: &str, value: &Value) -> PathBuf {
    let path = d.join(name);
    std::fs::write(&path, serde_json::to_string_pretty(value).unwrap()).unwrap();
    path
}

/// A copy of the file at `path` with `tail` appended, as `d/name`.
fn with_tail(d: &Path, path: &Path, name: &str, tail: &str) -> PathBuf {
    let out = d.join(name);
    let text = std::fs::read_to_string(path).unwrap();
    std::fs::write(&out, format!("{text}{tail}")).unwrap();
    out
}

#[cfg(unix)]
#[test]
fn a_fifo_as_calibration_is_refused_at_once() {
    let d = dir("fifo");
    let fifo = d.join("ff");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let plan = write_json(&d, "plan.json", &clip_plan());
    let f = s(&fifo);
    let out = d.join("report");
    for args in [
        vec![
            "profile",
            "--model",
            "clip",
            "--cluster",
            "h100x8",
            "--calibration",
            f,
        ],
        vec![
            "compare",
            "--model",
            "clip",
            "--cluster",
            "h100x8",
            "--calibration",
            f,
        ],
        vec!["simulate", "--plan", s(&plan), "--calibration", f],
        vec!["report", "--out", s(&out), "--calibration", f],
    ] {
        refused(&args, &[f, "not a regular file"]);
    }
}

#[test]
fn trailing_garbage_after_the_json_value_is_refused() {
    let d = dir("trailing");
    let plan = write_json(&d, "plan.json", &clip_plan());
    let (profiles, colocations) = clip_files(&d);

    for tail in ["not json at all\n", "{}", "\n]"] {
        let bad_plan = with_tail(&d, &plan, "tplan.json", tail);
        refused(
            &["simulate", "--plan", s(&bad_plan)],
            &["tplan.json", "trailing characters"],
        );
        let bad_profiles = with_tail(&d, &profiles, "tprofiles.json", tail);
        refused(
            &["plan", "--profiles", s(&bad_profiles), "--gpus", "8"],
            &["tprofiles.json", "trailing characters"],
        );
        let bad_colocations = with_tail(&d, &colocations, "tc.json", tail);
        refused(
            &[
                "fit",
                "--model",
                "clip",
                "--cluster",
                "h100x8",
                "--colocations",
                s(&bad_colocations),
                "--no-end-to-end",
            ],
            &["tc.json", "trailing characters"],
        );
    }
    // Whitespace after the value is no garbage.
    let spaced = with_tail(&d, &plan, "spaced.json", " \n\t\n");
    let o = mosaic(&["simulate", "--plan", s(&spaced)]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[cfg(feature = "engine")]
#[test]
fn trailing_garbage_after_a_template_plan_is_refused_by_train() {
    let d = dir("trailing-train");
    let template = d.join("t.json");
    let o = mosaic(&[
        "train",
        "template",
        "--model",
        "clip-tiny",
        "--gpus",
        "2",
        "--out",
        s(&template),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let bad = with_tail(&d, &template, "tt.json", "not json at all\n");
    refused(
        &[
            "train",
            "--model",
            "clip-tiny",
            "--plan",
            s(&bad),
            "--steps",
            "1",
            "--device",
            "cpu",
        ],
        &["tt.json", "trailing characters"],
    );
}

#[test]
fn plan_fields_out_of_range_are_refused_naming_the_field() {
    let d = dir("fields");
    let plan = clip_plan();
    let cases: [(&str, Value); 8] = [
        ("granularity", 0.into()),
        ("granularity", (-1).into()),
        ("granularity", 1e308.into()),
        ("granularity", 1.5.into()),
        ("lower_bound_ms", (-1).into()),
        ("lower_bound_ms", (-1e300).into()),
        ("lower_bound_ms", 1e300.into()),
        ("search", "magic".into()),
    ];
    for (field, value) in cases {
        let mut bad = plan.clone();
        bad[field] = value;
        let path = write_json(&d, "bad.json", &bad);
        refused(
            &["simulate", "--plan", s(&path)],
            &["bad.json", &format!("field `{field}`")],
        );
    }
    // What the tools write reads back: each search, the finest and the coarsest step.
    for (field, value) in [
        ("search", Value::from("exact")),
        ("search", "local".into()),
        ("search", "hand".into()),
        ("granularity", 1.0.into()),
        ("granularity", 0.0001.into()),
    ] {
        let mut ok = plan.clone();
        ok[field] = value;
        let path = write_json(&d, "ok.json", &ok);
        let o = mosaic(&["simulate", "--plan", s(&path)]);
        assert!(o.status.success(), "{field}: {}", stderr(&o));
    }
}

#[test]
fn a_plans_unknown_model_or_cluster_names_the_file_and_the_field() {
    let d = dir("names");
    for (field, value, says) in [
        ("cluster", "h100x0", "at least 1 GPU"),
        ("cluster", "nope", "unknown cluster \"nope\""),
        ("model", "nope", "unknown model \"nope\""),
    ] {
        let mut bad = clip_plan();
        bad[field] = value.into();
        let path = write_json(&d, "p.json", &bad);
        refused(
            &["simulate", "--plan", s(&path)],
            &[&format!("p.json: field `{field}`"), says],
        );
    }
    // The same names given on the command line are the flags'.
    let plan = write_json(&d, "ok.json", &clip_plan());
    refused(
        &["simulate", "--plan", s(&plan), "--model", "nope"],
        &["--model: unknown model \"nope\""],
    );
    refused(
        &["simulate", "--plan", s(&plan), "--cluster", "h100x0"],
        &["--cluster: cluster \"h100x0\""],
    );
}

#[test]
fn an_output_under_a_regular_file_says_it_is_not_a_directory() {
    let d = dir("not-a-dir");
    let rfile = d.join("rfile");
    std::fs::write(&rfile, "").unwrap();
    let under = rfile.join("x");
    let plan = write_json(&d, "plan.json", &clip_plan());
    let not_dir = format!("{} is not a directory", rfile.display());
    for args in [
        vec![
            "profile",
            "--model",
            "clip",
            "--cluster",
            "h100x8",
            "--out",
            s(&under),
        ],
        vec!["simulate", "--plan", s(&plan), "--trace", s(&under)],
        vec!["report", "--out", s(&under.join("deeper"))],
    ] {
        let err = refused(&args, &[&not_dir]);
        assert!(!err.contains("does not exist"), "{args:?}: {err}");
    }
}

#[test]
fn an_output_that_is_an_input_or_another_output_is_refused_untouched() {
    let d = dir("clobber");
    let plan = write_json(&d, "plan.json", &clip_plan());
    let (profiles, coloc) = clip_files(&d);
    let before: Vec<String> = [&plan, &profiles, &coloc]
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    // The same file by another spelling too.
    let profiles_again = d.join(".").join("clip.json");
    let fitted = d.join("f.json");
    let cases: Vec<(Vec<&str>, [&str; 2])> = vec![
        (
            vec![
                "plan",
                "--profiles",
                s(&profiles),
                "--gpus",
                "8",
                "--out",
                s(&profiles_again),
            ],
            ["--out", "--profiles"],
        ),
        (
            vec![
                "fit",
                "--profiles",
                s(&profiles),
                "--colocations",
                s(&coloc),
                "--out",
                s(&coloc),
            ],
            ["--out", "--colocations"],
        ),
        (
            vec![
                "fit",
                "--profiles",
                s(&profiles),
                "--colocations",
                s(&coloc),
                "--out",
                s(&fitted),
                "--svg",
                s(&fitted),
            ],
            ["--svg", "--out"],
        ),
        (
            vec!["simulate", "--plan", s(&plan), "--trace", s(&plan)],
            ["--trace", "--plan"],
        ),
    ];
    for (args, says) in cases {
        refused(&args, &says);
    }
    for (p, text) in [&plan, &profiles, &coloc].iter().zip(&before) {
        assert_eq!(
            &std::fs::read_to_string(p).unwrap(),
            text,
            "{} changed",
            p.display()
        );
    }
}

#[test]
fn a_flag_error_does_not_blame_the_profiles_file() {
    let d = dir("gpus");
    let profiles = d.join("clip.json");
    let o = mosaic(&[
        "profile",
        "--model",
        "clip",
        "--cluster",
        "h100x8",
        "--out",
        s(&profiles),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    for command in ["plan", "compare"] {
        let err = refused(
            &[command, "--profiles", s(&profiles), "--gpus", "65537"],
            &["--gpus: 65537 GPUs is more than the 65536"],
        );
        assert!(!err.contains("clip.json"), "{command}: {err}");
        assert_eq!(err.lines().count(), 1, "{command}: {err}");
    }
}

#[test]
fn errors_quote_a_huge_name_clipped() {
    let d = dir("long");
    let huge = "x".repeat(1_000_000);
    let mut plan = clip_plan();
    plan["stages"][0]["modules"][0]["name"] = huge.as_str().into();
    let path = write_json(&d, "long-name.json", &plan);
    let err = refused(
        &["simulate", "--plan", s(&path)],
        &[
            "long-name.json",
            "stages[0].modules[0].name",
            "1000000 characters in all",
        ],
    );
    assert!(err.len() < 2_000, "{} bytes of error", err.len());

    for (field, value) in [("model", &huge), ("cluster", &huge), ("search", &huge)] {
        let mut plan = clip_plan();
        plan[field] = value.as_str().into();
        let path = write_json(&d, "long-field.json", &plan);
        let err = refused(
            &["simulate", "--plan", s(&path)],
            &["long-field.json", &format!("field `{field}`")],
        );
        assert!(err.len() < 2_000, "{field}: {} bytes of error", err.len());
    }

    // A string where a number belongs: the parser's message echoes it, clipped.
    let mut plan = clip_plan();
    plan["stages"][0]["modules"][0]["dp"] = huge.as_str().into();
    let path = write_json(&d, "long-dp.json", &plan);
    let err = refused(
        &["simulate", "--plan", s(&path)],
        &["long-dp.json", "stages[0].modules[0].dp", "left out"],
    );
    assert!(err.len() < 3_000, "{} bytes of error", err.len());
}

#[test]
fn a_full_standard_output_is_one_error_line_and_exit_code_1() {
    let full = Path::new("/dev/full");
    if !full.exists() {
        return; // Linux only
    }
    for args in [
        vec!["plan", "--model", "clip", "--cluster", "h100x8", "--json"],
        vec!["profile", "--model", "clip", "--cluster", "h100x8"],
        vec!["zoo"],
    ] {
        let out = std::fs::OpenOptions::new().write(true).open(full).unwrap();
        let o = run_with(&args, Stdio::from(out));
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(
            err.trim_end(),
            "error: cannot write to standard output: No space left on device (os error 28)",
            "{args:?}"
        );
    }
}

#[cfg(unix)]
#[test]
fn a_closed_pipe_on_standard_output_ends_quietly() {
    // Far more than a pipe holds (about 300 KB), so that the writer meets the closed end
    // whenever the reader closes it.
    let args = ["profile", "--model", "ofasys", "--cluster", "h100x32"];
    let mut child = Command::new(env!("CARGO_BIN_EXE_mosaic"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut first = [0u8; 10];
    out.read_exact(&mut first).unwrap();
    assert_eq!(&first[..1], b"{");
    drop(out);
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert!(err.is_empty(), "a closed pipe is no error to report: {err}");
    assert_eq!(
        o.status.code(),
        Some(141),
        "128 + SIGPIPE, as a shell reports it"
    );
}

#[test]
fn bench_counts_are_capped_naming_the_flag() {
    let cheap = [
        "bench",
        "--modules",
        "8",
        "--gpus",
        "8",
        "--time-budget",
        "10",
    ];
    for (flag, value) in [
        ("--repeats", "18446744073709551615"),
        ("--repeats", "10001"),
        ("--seeds", "18446744073709551615"),
        ("--seeds", "10001"),
    ] {
        let mut args = cheap.to_vec();
        args.extend([flag, value]);
        refused(&args, &[flag, "1..=10000"]);
    }
}
