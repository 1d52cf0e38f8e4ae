//! Helpers shared by the integration tests of the `mosaic` binary.
// Every test binary compiles this module, and not every one uses every helper.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// Runs the `mosaic` binary with `args` and returns what it did.
pub fn mosaic(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mosaic"))
        .args(args)
        .output()
        .expect("the mosaic binary runs")
}

/// Runs the `mosaic` binary with the words of `line`, split at whitespace (the tests' paths
/// have none).
pub fn mosaic_line(line: &str) -> Output {
    mosaic(&line.split_whitespace().collect::<Vec<_>>())
}

/// Runs each `(line, says)` with [`mosaic_line`]: each must exit with code 2 (bad input),
/// its standard error containing `says`.
pub fn refused<L: AsRef<str>>(cases: &[(L, &str)]) {
    for (line, says) in cases {
        let line = line.as_ref();
        let o = mosaic_line(line);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{line}: {err}");
        assert!(err.contains(says), "{line}: expected {says:?} in {err}");
    }
}

/// Runs a command that must succeed and print JSON, and returns the JSON.
pub fn json_of(args: &[&str]) -> Value {
    let o = mosaic(args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).expect("stdout is JSON")
}

/// The standard output of a run, as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The standard error of a run, as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The example job in the workspace's `examples/`: OFASys on 8 H100s.
pub fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/ofasys-h100x8.json")
}

/// A fresh, empty directory for one test, unique to the test binary (its crate name), the
/// process and `test`, so that binaries and tests running in parallel never share one.
pub fn dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "mosaic-{}-test-{}-{test}",
        env!("CARGO_CRATE_NAME"),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `p` as a command-line argument (temporary paths are UTF-8).
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Reads and parses the JSON file at `p`.
pub fn read_json(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// CLIP on h100x8, profiled into `dir/clip.json`, and 20 simulated colocations of it into
/// `dir/c.json`.
pub fn clip_files(dir: &Path) -> (PathBuf, PathBuf) {
    let (profile, c) = (dir.join("clip.json"), dir.join("c.json"));
    for args in [
        vec!["profile", "--model", "clip", "--cluster", "h100x8"],
        vec![
            "simulate",
            "colocations",
            "--model",
            "clip",
            "--cluster",
            "h100x8",
            "--count",
            "20",
        ],
    ] {
        let out = if args[0] == "profile" { &profile } else { &c };
        let o = mosaic(&[&args[..], &["--out", s(out)]].concat());
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    }
    (profile, c)
}
