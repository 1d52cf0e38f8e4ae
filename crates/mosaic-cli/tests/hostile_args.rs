//! Drives every subcommand with hostile arguments: numbers at 0, -1, 1e30, past 2⁶⁴, NaN, inf
//! and empty; input files that are missing, directories, empty, unreadable or random bytes;
//! output files that are directories or lie in a directory that does not exist. Each must be
//! refused at once with exit code 2 and a short message naming the flag or the file (never a
//! panic, never a hang), or succeed where the value is valid: those cases are listed in
//! `valid` or with `accept`, each saying why.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::{dir, example, mosaic, read_json, s, stderr};

/// How long one invocation may take before it counts as a hang and is killed. Refusals take
/// milliseconds; the slowest valid case here, `calibrate` on the shared CLIP file, takes about
/// 6 s of CPU in the ci profile (3 s on two idle cores: its fits run one per core) and went
/// past 10 s on a loaded two-core CI machine; the margin is for that and for a debug build.
const LIMIT: Duration = Duration::from_secs(30);

/// Lines a refusal may take from its `error:` line on: ours take one or two (with a cause),
/// clap's four to six (the message, a usage line, a hint).
const MAX_ERROR_LINES: usize = 8;

/// The hostile numbers, each passed as `--flag=VALUE` (so that `-1` is a value, not a flag).
const NUMBERS: [&str; 7] = ["0", "-1", "1e30", "99999999999999999999", "NaN", "inf", ""];

/// What a case must do.
enum Want {
    /// Exit code 2, the error naming this (a flag or a path).
    Refused(String),
    /// Exit code 0: the value is valid.
    Accepted,
}

/// One invocation of `mosaic` and what it must do.
struct Case {
    args: Vec<String>,
    want: Want,
}

/// The hostile files of one test, in its own directory.
struct Files {
    /// The test's directory (and the working directory of its runs).
    dir: PathBuf,
    missing: PathBuf,
    directory: PathBuf,
    empty: PathBuf,
    random: PathBuf,
    /// A file without read permission; `None` where permissions do not stop reading (as
    /// root, which the CI container runs as: that case alone is skipped there).
    unreadable: Option<PathBuf>,
    /// A file in a directory that does not exist.
    in_missing_dir: PathBuf,
}

impl Files {
    fn new(test: &str) -> Files {
        let dir = dir(test);
        let directory = dir.join("a-directory");
        std::fs::create_dir_all(&directory).unwrap();
        let empty = dir.join("empty.json");
        std::fs::write(&empty, "").unwrap();
        // Deterministic noise, invalid UTF-8 included (a 64-bit LCG's high bytes).
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let bytes: Vec<u8> = (0..4096)
            .map(|_| {
                x = x
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                (x >> 56) as u8
            })
            .collect();
        let random = dir.join("random.bin");
        std::fs::write(&random, bytes).unwrap();
        Files {
            missing: dir.join("missing.json"),
            unreadable: unreadable(&dir),
            in_missing_dir: dir.join("no-such-dir").join("out.json"),
            dir,
            directory,
            empty,
            random,
        }
    }

    /// The hostile input files.
    fn inputs(&self) -> Vec<&Path> {
        let mut v = vec![&*self.missing, &self.directory, &self.empty, &self.random];
        v.extend(self.unreadable.as_deref());
        v
    }
}

/// A valid JSON file nobody may read, if permissions stop this process reading it.
#[cfg(unix)]
fn unreadable(dir: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join("unreadable.json");
    std::fs::write(&p, "{}").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o000)).unwrap();
    if std::fs::read(&p).is_ok() {
        eprintln!("note: running as root, where mode 000 does not stop reading: unreadable-file cases skipped");
        return None;
    }
    Some(p)
}

#[cfg(not(unix))]
fn unreadable(_dir: &Path) -> Option<PathBuf> {
    None
}

/// The words of `line`, split at whitespace; `''` stands for an empty argument or value
/// (`--flag=''`).
fn words(line: &str) -> Vec<String> {
    line.split_whitespace()
        .map(|w| w.strip_suffix("''").unwrap_or(w).to_string())
        .collect()
}

/// The cases of one test.
#[derive(Default)]
struct Cases(Vec<Case>);

impl Cases {
    /// `line` must exit 2, its error containing `says`.
    fn refuse(&mut self, line: &str, says: &str) {
        self.0.push(Case {
            args: words(line),
            want: Want::Refused(says.into()),
        });
    }

    /// `line` must succeed.
    fn accept(&mut self, line: &str) {
        self.0.push(Case {
            args: words(line),
            want: Want::Accepted,
        });
    }

    /// `base --flag=V` for each of [`NUMBERS`]: refused naming the flag, or accepted for the
    /// values in `valid`.
    fn numbers(&mut self, base: &str, flag: &str, valid: &[&str]) {
        for v in NUMBERS {
            let mut args = words(base);
            args.push(format!("{flag}={v}"));
            let want = if valid.contains(&v) {
                Want::Accepted
            } else {
                Want::Refused(flag.into())
            };
            self.0.push(Case { args, want });
        }
    }

    /// `base flag FILE` for each hostile input file, refused naming the file; and `flag=`.
    fn inputs(&mut self, base: &str, flag: &str, f: &Files) {
        for p in f.inputs() {
            let mut args = words(base);
            args.extend([flag.to_string(), s(p).to_string()]);
            self.0.push(Case {
                args,
                want: Want::Refused(s(p).into()),
            });
        }
        self.refuse(&format!("{base} {flag}=''"), flag);
    }

    /// `base flag PATH` for an output file that is a directory or lies in a missing one,
    /// refused naming the path; and `flag=`.
    fn outputs(&mut self, base: &str, flag: &str, f: &Files) {
        for p in [&f.directory, &f.in_missing_dir] {
            self.refuse(&format!("{base} {flag} {}", s(p)), s(p));
        }
        self.refuse(&format!("{base} {flag}=''"), flag);
    }

    /// Runs every case and fails listing each that did not do what it must.
    fn check(self, f: &Files) {
        let t0 = Instant::now();
        let n = self.0.len();
        let failures: Vec<String> = self.0.iter().filter_map(|c| failure(c, &f.dir)).collect();
        eprintln!("{n} cases in {:.1} s", t0.elapsed().as_secs_f64());
        assert!(
            failures.is_empty(),
            "{} of {n} cases failed:\n\n{}",
            failures.len(),
            failures.join("\n\n")
        );
    }
}

/// How a run ended.
struct Run {
    /// The exit code; `None` when killed at [`LIMIT`] (or by a signal).
    code: Option<i32>,
    stderr: String,
    took: Duration,
    hung: bool,
}

/// Runs `mosaic` with `args` in `cwd`, killing it at [`LIMIT`].
fn run(args: &[String], cwd: &Path) -> Run {
    let t0 = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_mosaic"))
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the mosaic binary runs");
    // Both pipes drain on their own threads, so that a chatty child never blocks on a full one.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let drain_out = std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    let drain_err = std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = err.read_to_end(&mut text);
        String::from_utf8_lossy(&text).into_owned()
    });
    let mut hung = false;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if t0.elapsed() > LIMIT {
            hung = true;
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let took = t0.elapsed();
    let _ = drain_out.join();
    Run {
        code: status.code(),
        stderr: drain_err.join().unwrap(),
        took,
        hung,
    }
}

/// What is wrong with the run of `case`, if anything.
fn failure(case: &Case, cwd: &Path) -> Option<String> {
    let r = run(&case.args, cwd);
    let line = format!("mosaic {}", shell_words(&case.args));
    let err = r.stderr.trim_end();
    let problem = if r.hung {
        format!("still running after {LIMIT:?}: killed (a hang)")
    } else if err.contains("panicked") || r.code == Some(101) {
        "panicked".to_string()
    } else {
        match &case.want {
            Want::Accepted if r.code == Some(0) => return None,
            Want::Accepted => format!("exit code {:?}, expected 0 (a valid value)", r.code),
            Want::Refused(says) => {
                let message = err
                    .lines()
                    .position(|l| l.starts_with("error:"))
                    .map(|i| err.lines().skip(i).collect::<Vec<_>>());
                match message {
                    _ if r.code != Some(2) => format!("exit code {:?}, expected 2", r.code),
                    None => "no `error:` line on standard error".to_string(),
                    Some(m) if !m.join("\n").contains(says.as_str()) => {
                        format!("the error does not name {says:?}")
                    }
                    Some(m) if m.len() > MAX_ERROR_LINES => {
                        format!("the error takes {} lines", m.len())
                    }
                    Some(_) => return None,
                }
            }
        }
    };
    Some(format!(
        "{line}\n  {problem} ({:.2} s); stderr:\n    {}",
        r.took.as_secs_f64(),
        err.replace('\n', "\n    ")
    ))
}

/// `args` as one would type them.
fn shell_words(args: &[String]) -> String {
    let quoted: Vec<String> = args
        .iter()
        .map(|a| {
            if a.is_empty() {
                "''".to_string()
            } else if a.ends_with('=') {
                format!("{a}''")
            } else {
                a.clone()
            }
        })
        .collect();
    quoted.join(" ")
}

/// A file in the workspace's `examples/`.
fn examples(name: &str) -> String {
    let p = example().with_file_name(name);
    s(&p).to_string()
}

/// The example OFASys profile without its device's SM partition rule, so that
/// `--granularity` sets its quota grid.
fn without_partition(f: &Files) -> String {
    let mut v: Value = read_json(&example());
    v["device"].as_object_mut().unwrap().remove("partition");
    let p = f.dir.join("no-partition.json");
    std::fs::write(&p, v.to_string()).unwrap();
    s(&p).to_string()
}

/// A zoo plan of clip on h100x8, for `simulate`.
fn clip_plan(f: &Files) -> String {
    let p = f.dir.join("plan.json");
    let o = mosaic(&[
        "plan",
        "--model",
        "clip",
        "--cluster",
        "h100x8",
        "--out",
        s(&p),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    s(&p).to_string()
}

#[test]
fn plan_refuses_hostile_arguments() {
    let f = Files::new("plan");
    let mut c = Cases::default();
    let zoo = "plan --model clip --cluster h100x8 --time-budget 100";
    c.accept(zoo);
    c.numbers(zoo, "--gpus", &[]);
    // MAX_GPUS itself is planned (at once: clip has three modules); one more is refused. A
    // pool larger than the named cluster is refused: the plan would not run there.
    c.accept("plan --model clip --cluster h100x65536 --gpus 65536 --time-budget 100");
    c.refuse(&format!("{zoo} --gpus 16"), "--gpus");
    // A profile file planned for a named cluster of another device.
    let ofasys = s(&example()).to_string();
    c.accept(&format!(
        "plan --profiles {ofasys} --cluster h100x8 --time-budget 100"
    ));
    c.refuse(
        &format!("plan --profiles {ofasys} --cluster a100x8"),
        "--cluster a100x8",
    );
    // A device with an SM partition rule ignores --granularity, but not a nonsensical one.
    c.numbers(zoo, "--granularity", &[]);
    c.numbers(
        &format!("plan --profiles {} --gpus 8", without_partition(&f)),
        "--granularity",
        &[],
    );
    // 0 ms: the first plan found (GAHC's) is returned. u64::MAX: clip's optimum is proven at
    // once (and the planner caps its deadline at a year).
    c.numbers(
        "plan --model clip --cluster h100x8",
        "--time-budget",
        &["0"],
    );
    c.accept("plan --model clip --cluster h100x8 --time-budget=18446744073709551615");
    for search in ["", "NaN", "0"] {
        c.refuse(&format!("{zoo} --search={search}"), "--search");
    }
    for cluster in [
        "h100x0",
        "h100x-1",
        "h100x99999999999999999999",
        "h100xNaN",
        "",
    ] {
        c.refuse(
            &format!("plan --model clip --cluster={cluster}"),
            &format!("cluster \"{cluster}\""),
        );
    }
    c.refuse("plan --model='' --cluster h100x8", "model \"\"");
    c.inputs("plan --gpus 8", "--profiles", &f);
    if Path::new("/dev/zero").exists() {
        // An endless file is refused as not a regular file, not read until memory runs out.
        c.refuse("plan --gpus 2 --profiles /dev/zero", "/dev/zero");
        c.refuse(
            &format!(
                "fit --profiles {} --colocations /dev/zero",
                examples("h100-clip-profile.json")
            ),
            "/dev/zero",
        );
        c.refuse(
            "simulate --plan /dev/zero --model clip --cluster h100x8",
            "/dev/zero",
        );
    }
    c.outputs(zoo, "--out", &f);
    c.check(&f);
}

#[test]
fn compare_refuses_hostile_arguments() {
    let f = Files::new("compare");
    let mut c = Cases::default();
    let base = "compare --model clip --cluster h100x8 --time-budget 100";
    c.accept(base);
    // Costs are any finite time ≥ 0 (1e20 and 1e30 ms too: a strategy paying them is simply
    // not chosen).
    let costs = ["0", "1e30", "99999999999999999999"];
    c.numbers(base, "--slice-sync-ms", &costs);
    c.numbers(base, "--step-overhead-ms", &costs);
    c.numbers(base, "--global-batch", &[]);
    // The largest u32 batch: DistTrain's microbatches stay bounded by the pool.
    c.accept(&format!("{base} --global-batch=4294967295"));
    c.numbers(base, "--gpus", &[]);
    c.numbers(base, "--granularity", &[]);
    c.numbers(
        "compare --model clip --cluster h100x8",
        "--time-budget",
        &["0"],
    );
    c.inputs("compare --gpus 8", "--profiles", &f);
    c.inputs(base, "--calibration", &f);
    c.check(&f);
}

#[test]
fn bench_refuses_hostile_arguments() {
    let f = Files::new("bench");
    let mut c = Cases::default();
    // A cheap grid: one model per cell, one solve, 8 modules on 8 GPUs (about 0.1 s).
    let flags = [
        ("--repeats", "1"),
        ("--seeds", "1"),
        ("--modules", "8"),
        ("--gpus", "8"),
        ("--time-budget", "10"),
    ];
    let without = |skip: &str| {
        let rest: Vec<String> = flags
            .iter()
            .filter(|(flag, _)| *flag != skip)
            .map(|(flag, v)| format!("{flag} {v}"))
            .collect();
        format!("bench {}", rest.join(" "))
    };
    let cheap = without("");
    c.accept(&format!("{cheap} --json"));
    for (flag, _) in flags {
        // A time budget of 0 ms is valid: each plan is the first one found.
        let valid: &[&str] = if flag == "--time-budget" { &["0"] } else { &[] };
        c.numbers(&without(flag), flag, valid);
    }
    c.numbers(&cheap, "--reference-budget", &["0"]);
    c.refuse(
        &format!("{} --modules=65", without("--modules")),
        "--modules",
    );
    c.refuse(
        &format!("{} --modules=8,,16", without("--modules")),
        "--modules",
    );
    c.refuse(&format!("{} --gpus=,", without("--gpus")), "--gpus");
    c.refuse(&format!("{} --gpus=65537", without("--gpus")), "--gpus");
    c.check(&f);
}

#[test]
fn simulate_refuses_hostile_arguments() {
    let f = Files::new("simulate");
    let plan = clip_plan(&f);
    let mut c = Cases::default();
    let base = format!("simulate --plan {plan}");
    c.accept(&base);
    c.inputs("simulate", "--plan", &f);
    c.inputs(&base, "--calibration", &f);
    c.outputs(&base, "--trace", &f);
    c.outputs(&base, "--svg", &f);
    c.refuse(&format!("{base} --model=''"), "model \"\"");
    c.refuse(&format!("{base} --cluster=''"), "cluster \"\"");
    c.refuse(&format!("{base} --cluster=h100x0"), "h100x0");

    let out = s(&f.dir.join("colocations.json")).to_string();
    let colocations = format!("simulate colocations --model clip --cluster h100x8 --out {out}");
    c.numbers(&colocations, "--count", &[]);
    c.accept(&format!("{colocations} --count=1"));
    c.refuse(&format!("{colocations} --count=100001"), "--count");
    // Any u64 seeds the draws.
    c.numbers(&format!("{colocations} --count 2"), "--seed", &["0"]);
    c.accept(&format!(
        "{colocations} --count 2 --seed=18446744073709551615"
    ));
    c.outputs(
        "simulate colocations --model clip --cluster h100x8 --count 2",
        "--out",
        &f,
    );
    c.check(&f);
}

#[test]
fn calibrate_and_fit_refuse_hostile_arguments() {
    let f = Files::new("calibrate-fit");
    let profile = examples("h100-clip-profile.json");
    let measured = examples("h100-clip-colocations.json");
    let mut c = Cases::default();

    let calibrate = format!("calibrate --model clip --device h100 --profiles {profile}");
    c.accept(&calibrate);
    c.inputs("calibrate --model clip --device h100", "--profiles", &f);
    c.outputs(&calibrate, "--out", &f);
    c.refuse(
        &format!("calibrate --model clip --device='' --profiles {profile}"),
        "--device",
    );
    c.refuse(
        &format!("calibrate --model='' --device h100 --profiles {profile}"),
        "model \"\"",
    );

    let fit = format!("fit --profiles {profile} --colocations {measured}");
    c.accept(&fit);
    c.inputs(&format!("fit --colocations {measured}"), "--profiles", &f);
    c.inputs(&format!("fit --profiles {profile}"), "--colocations", &f);
    c.outputs(&fit, "--out", &f);
    c.outputs(&fit, "--svg", &f);
    c.numbers(&fit, "--holdout-every", &[]);
    // Every 2nd sample held out, or (u64::MAX) none: fitted and tested on all, and it says so.
    c.accept(&format!("{fit} --holdout-every=2"));
    c.accept(&format!("{fit} --holdout-every=18446744073709551615"));
    // The end-to-end plans run on the cluster: 1 to its 8 GPUs.
    let zoo = format!("fit --model clip --cluster h100x8 --colocations {measured}");
    c.numbers(&zoo, "--gpus", &[]);
    c.accept(&format!("{zoo} --gpus=1"));
    c.refuse(&format!("{zoo} --gpus=9"), "--gpus");
    c.check(&f);
}

#[test]
fn profile_report_and_zoo_refuse_hostile_arguments() {
    let f = Files::new("profile-report");
    let mut c = Cases::default();
    let profile = "profile --model clip --cluster h100x8";
    c.accept(&format!("{profile} --out {}", s(&f.dir.join("p.json"))));
    c.inputs(profile, "--calibration", &f);
    if Path::new("/dev/zero").exists() {
        // An endless file is refused at its size limit, not read until memory runs out.
        c.refuse(&format!("{profile} --calibration /dev/zero"), "/dev/zero");
    }
    c.outputs(profile, "--out", &f);
    c.refuse("profile --model='' --cluster h100x8", "model \"\"");
    c.refuse("profile --model clip --cluster=''", "cluster \"\"");

    let report = format!("report --out {}", s(&f.dir.join("report")));
    c.inputs(&report, "--calibration", &f);
    // --out is a directory to create, with its parents: a missing one is valid.
    c.accept(&format!(
        "report --out {}",
        s(&f.dir.join("new-parent").join("report"))
    ));
    c.refuse(&format!("report --out {}", s(&f.empty)), s(&f.empty));
    c.refuse("report --out=''", "--out");

    c.accept("zoo");
    c.accept("zoo --json");
    c.check(&f);
}

#[cfg(feature = "engine")]
#[test]
fn train_and_data_refuse_hostile_arguments() {
    let f = Files::new("train");
    let mut c = Cases::default();
    let train = "train --model clip-tiny --steps 1";
    c.accept(train);
    if Path::new("/dev/zero").exists() {
        c.refuse(&format!("{train} --data /dev/zero"), "/dev/zero");
    }
    // 0 steps: nothing to do, and it says so.
    c.numbers("train --model clip-tiny", "--steps", &["0"]);
    c.numbers(train, "--batch", &[]);
    c.refuse(&format!("{train} --batch=65537"), "--batch");
    // One step at 1e20 or 1e30 is valid (its loss is taken before the update); the next
    // diverges, and the run stops there, naming --lr.
    c.numbers(train, "--lr", &["1e30", "99999999999999999999"]);
    c.refuse("train --model clip-tiny --steps 3 --lr=1e30", "--lr");
    c.numbers(train, "--seed", &["0"]);
    c.accept(&format!("{train} --seed=18446744073709551615"));
    c.numbers(train, "--checkpoint-every", &[]);
    c.inputs(train, "--plan", &f);
    c.inputs(train, "--data", &f);
    c.refuse(&format!("{train} --collective=''"), "--collective");
    c.refuse(&format!("{train} --device=''"), "--device");
    c.refuse(&format!("{train} --device=cuda"), "--device");
    c.refuse("train --model='' --steps 1", "model \"\"");
    // --size scales the zoo-built models: a factor in (0, 1]; tiny models have one size.
    c.numbers("train --model clip --steps 1", "--size", &[]);
    c.accept("train --model imagebind --steps 1 --size=0.02");
    c.refuse(&format!("{train} --size=0.5"), "--size");
    // --checkpoint-dir: created with its parents; a file, or a checkpoint that is a directory
    // or random bytes, is refused before training.
    let created = f.dir.join("new-parent").join("ckpt");
    c.accept(&format!("{train} --checkpoint-dir {}", s(&created)));
    c.refuse(
        &format!("{train} --checkpoint-dir {}", s(&f.empty)),
        s(&f.empty),
    );
    let odd = f.dir.join("odd-checkpoint");
    std::fs::create_dir_all(odd.join("checkpoint.safetensors")).unwrap();
    c.refuse(&format!("{train} --checkpoint-dir {}", s(&odd)), s(&odd));
    let noise = f.dir.join("noise-checkpoint");
    std::fs::create_dir_all(&noise).unwrap();
    std::fs::copy(&f.random, noise.join("checkpoint.safetensors")).unwrap();
    c.refuse(
        &format!("{train} --checkpoint-dir {}", s(&noise)),
        "checkpoint.safetensors",
    );

    let template = "train template --model clip-tiny";
    let plan = s(&f.dir.join("template.json")).to_string();
    c.numbers(&format!("{template} --out {plan}"), "--gpus", &[]);
    c.accept(&format!("{template} --out {plan} --gpus=65536"));
    c.outputs(template, "--out", &f);

    let data = format!(
        "data write --model clip-tiny --out {}",
        s(&f.dir.join("d.safetensors"))
    );
    c.numbers(&format!("{data} --batch 1"), "--steps", &[]);
    c.refuse(
        &format!("{data} --batch 1 --steps=18446744073709551615"),
        "--steps",
    );
    c.numbers(&format!("{data} --steps 1"), "--batch", &[]);
    c.refuse(&format!("{data} --steps 1 --batch=65537"), "--batch");
    c.numbers(&format!("{data} --steps 1 --batch 1"), "--seed", &["0"]);
    c.outputs(
        "data write --model clip-tiny --steps 1 --batch 1",
        "--out",
        &f,
    );
    c.check(&f);
}

#[cfg(feature = "engine")]
#[test]
fn check_and_bench_engine_and_block_refuse_hostile_arguments() {
    let f = Files::new("check");
    let mut c = Cases::default();
    // No GPU here: the check skips saying why (exit 0) for any device number it accepts.
    c.numbers("check gpu", "--device", &["0"]);
    c.refuse("check gpu --device=1024", "--device");
    let bench = "bench engine --device cpu --size 0.02 --steps 1 --models clip --batches 2";
    c.accept(bench);
    c.numbers(
        "bench engine --device cpu --steps 1 --models clip --batches 2",
        "--size",
        &[],
    );
    c.numbers(
        "bench engine --device cpu --size 0.02 --models clip --batches 2",
        "--steps",
        &[],
    );
    c.refuse(&format!("{bench} --steps=1001"), "--steps");
    c.numbers(
        "bench engine --device cpu --size 0.02 --steps 1 --models clip",
        "--batches",
        &[],
    );
    c.refuse(&format!("{bench} --models=''"), "--models");
    c.refuse(&format!("{bench} --device=tpu"), "--device");
    c.refuse(&format!("{bench} --cluster=nope"), "--cluster");
    let block = "bench block --device cpu --size 0.05 --reps 1 --batch 1";
    c.accept(block);
    c.numbers("bench block --device cpu --reps 1 --batch 1", "--size", &[]);
    c.numbers(
        "bench block --device cpu --size 0.05 --batch 1",
        "--reps",
        &[],
    );
    c.numbers(
        "bench block --device cpu --size 0.05 --reps 1",
        "--batch",
        &[],
    );
    c.refuse(&format!("{block} --reps=1001"), "--reps");
    c.refuse(&format!("{block} --batch=4097"), "--batch");
    c.refuse(&format!("{block} --model=''"), "--model");
    c.refuse(&format!("{block} --module=''"), "--module");
    c.check(&f);
}

#[cfg(feature = "engine")]
#[test]
fn measure_refuses_hostile_arguments() {
    let f = Files::new("measure");
    let mut c = Cases::default();
    // The least measurement there is: one timed iteration at dp 1 of one sample (about 1 s,
    // measuring the machine's bandwidth first). Every refusal comes before any measuring.
    let cheap = "--reps 1 --max-dp 1 --batch 1";
    let out = s(&f.dir.join("measured.json")).to_string();
    for sub in ["profile", "colocations --count 1"] {
        let base = format!("measure {sub} --model clip-tiny --out {out}");
        c.numbers(&format!("{base} --reps 1 --max-dp 1"), "--batch", &[]);
        c.refuse(&format!("{base} --batch=65537"), "--batch");
        c.numbers(&format!("{base} --reps 1 --batch 1"), "--max-dp", &[]);
        c.numbers(&format!("{base} --max-dp 1 --batch 1"), "--reps", &[]);
        c.refuse(&format!("{base} --reps=10001"), "--reps");
        c.outputs(
            &format!("measure {sub} --model clip-tiny {cheap}"),
            "--out",
            &f,
        );
        c.refuse(
            &format!("measure {sub} --model='' --out {out}"),
            "model \"\"",
        );
        // --size scales the zoo-built models; tiny ones have one size; the GPU needs the GPU
        // build. All refused before anything is measured.
        c.numbers(
            &format!("measure {sub} --model clip --out {out} {cheap}"),
            "--size",
            &[],
        );
        c.refuse(&format!("{base} {cheap} --size=0.5"), "--size");
        c.refuse(&format!("{base} {cheap} --device=tpu"), "--device");
        #[cfg(not(mosaic_gpu))]
        c.refuse(&format!("{base} {cheap} --device=cuda"), "--device");
    }
    let profile = format!("measure profile --model clip-tiny --out {out} {cheap}");
    c.accept(&profile);
    c.numbers(&profile, "--seed", &["0"]);
    let colocations = format!("measure colocations --model clip-tiny --out {out} {cheap}");
    c.numbers(&colocations, "--count", &[]);
    c.refuse(&format!("{colocations} --count=100001"), "--count");

    let slots = "measure slots --model clip-tiny --steps 1";
    c.accept(slots);
    c.numbers("measure slots --model clip-tiny", "--steps", &[]);
    c.refuse("measure slots --model clip-tiny --steps=100001", "--steps");
    c.numbers(slots, "--batch", &[]);
    c.inputs(slots, "--plan", &f);
    c.check(&f);
}
