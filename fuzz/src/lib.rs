//! The fuzz targets' bodies: one function per file format, each taking the bytes of a file and
//! doing with them what the `mosaic` command does with a file of that format — the same loader,
//! then the same first use of what loaded. A target asserts nothing but "no panic": `Ok` and
//! `Err` are both fine (a panic, an abort, a stack overflow or an arithmetic overflow is a
//! crash; the release profile of this package keeps overflow checks and debug assertions on).
//!
//! The binaries in `src/bin/` wrap these in `afl::fuzz!`; run outside AFL++ they read one input
//! from standard input, which is how a crash is replayed (`target/release/plans < crash`);
//! `src/bin/replay.rs` runs files through them and says what each did (`replay --seeds T
//! seeds/T/*` checks that every seed loads).

use std::path::{Path, PathBuf};

/// What a target did with an input: `Ok` if it loaded and its use succeeded, else the error
/// the CLI would have reported (for `replay` and the seeds' check; the fuzzer ignores it).
pub type Outcome = Result<(), String>;

/// The bytes as the CLI reads a text file (`mosaic_kit::files::read_text`, which fails on
/// anything but UTF-8).
fn text(data: &[u8]) -> Result<&str, String> {
    std::str::from_utf8(data).map_err(|e| format!("not UTF-8: {e}"))
}

/// The error's message.
fn msg(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// `mosaic plan --profiles FILE --gpus N --time-budget 20`: `mosaic_profile::load`, the
/// performance model at the default granularity (`crates/mosaic-cli/src/input.rs`), then the
/// solver on a pool of 1 to 4 GPUs (the input's length picks N, so that one input always takes
/// the same path) within 20 ms.
pub fn profiles(data: &[u8]) -> Outcome {
    let file = mosaic_profile::parse(text(data)?, "fuzz.json").map_err(msg)?;
    let model = mosaic_profile::PerfModel::new(&file, 0.1, "fuzz.json").map_err(msg)?;
    let options = mosaic_plan::SolveOptions {
        budget: std::time::Duration::from_millis(20),
        ..Default::default()
    };
    let gpus = 1 + (data.len() % 4) as u32;
    mosaic_plan::solve(&model, gpus, &options).map_err(msg)?;
    Ok(())
}

/// The performance model of clip on h100x8 at `mosaic fit`'s lookup granularity: what the
/// colocations are checked against. Built once per process.
pub fn clip_h100x8() -> &'static mosaic_profile::PerfModel {
    static MODEL: std::sync::OnceLock<mosaic_profile::PerfModel> = std::sync::OnceLock::new();
    MODEL.get_or_init(|| {
        let model = mosaic_zoo::model("clip").expect("the zoo has clip");
        let cluster = mosaic_zoo::cluster("h100x8").expect("the zoo has h100x8");
        let profile = mosaic_zoo::profile(&model, &cluster);
        mosaic_profile::PerfModel::new(&profile, mosaic_fit::LOOKUP_GRANULARITY, "clip@h100x8")
            .expect("clip's profile is valid")
    })
}

/// `mosaic fit --model clip --cluster h100x8 --colocations FILE`
/// (`crates/mosaic-cli/src/commands/fit.rs`): `mosaic_profile::load_colocations`, the
/// observations against clip's performance model, and the regression of e1, e2, e3 on them.
pub fn colocations(data: &[u8]) -> Outcome {
    let c = mosaic_profile::parse_colocations(text(data)?, "fuzz.json").map_err(msg)?;
    let obs = mosaic_fit::observations(clip_h100x8(), &c, "fuzz.json").map_err(msg)?;
    mosaic_fit::evaluate(&obs, mosaic_fit::HOLDOUT_EVERY);
    Ok(())
}

/// `mosaic simulate --plan FILE` (`crates/mosaic-cli/src/commands/simulate.rs`):
/// `mosaic_plan::load_plan`, the plan's model and cluster looked up in the zoo (as if
/// `--model clip --cluster h100x8` were given where the plan names none), then the simulator,
/// which resolves the plan against the model and cluster before it runs it.
pub fn plans(data: &[u8]) -> Outcome {
    let plan = mosaic_plan::parse_plan(text(data)?, "fuzz.json").map_err(msg)?;
    let model = mosaic_zoo::model(plan.model.as_deref().unwrap_or("clip")).map_err(msg)?;
    let cluster = mosaic_zoo::cluster(plan.cluster.as_deref().unwrap_or("h100x8")).map_err(msg)?;
    mosaic_sim::simulate_with(
        &plan,
        "fuzz.json",
        &model,
        &cluster,
        &mosaic_sim::SimOptions::default(),
    )
    .map_err(msg)?;
    Ok(())
}

/// `--calibration FILE` of `mosaic profile`, `compare`, `simulate` and `report`: the steps of
/// `load` in `crates/mosaic-cli/src/commands/calibrate.rs` (a function of the binary, so
/// repeated here call for call: JSON, the `format` field, `constants` as a
/// `mosaic_zoo::Calibration`, `mosaic_fit::calibrate::check_constants`), then what
/// `mosaic profile --model clip --cluster h100x8 --calibration FILE` does with it: the
/// analytical profile with those constants, and its performance model.
pub fn calibration(data: &[u8]) -> Outcome {
    let cal = parse_calibration(text(data)?)?;
    let model = mosaic_zoo::model("clip").map_err(msg)?;
    let cluster = mosaic_zoo::cluster("h100x8").map_err(msg)?;
    let file = cal.profile(&model, &cluster);
    mosaic_profile::PerfModel::new(&file, 0.1, "clip@h100x8").map_err(msg)?;
    Ok(())
}

/// The calibration `mosaic ... --calibration FILE` would use, or why it exits 2.
pub fn parse_calibration(text: &str) -> Result<mosaic_zoo::Calibration, String> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(msg)?;
    match value.get("format").and_then(|f| f.as_str()) {
        Some(mosaic_fit::calibrate::CALIBRATION_FORMAT) => {}
        other => return Err(format!("format: {other:?}")),
    }
    let constants = value.get("constants").ok_or("constants: missing")?;
    let cal: mosaic_zoo::Calibration = serde_json::from_value(constants.clone()).map_err(msg)?;
    mosaic_fit::calibrate::check_constants(&cal).map_err(|(f, m)| format!("{f}: {m}"))?;
    Ok(cal)
}

/// `mosaic data --samples FILE` (`crates/mosaic-cli/src/input.rs`): the JSONL of per-sample
/// sizes through `mosaic_data::samples::read_jsonl`'s parser, then the token counts the
/// batching policies take, with the default tokenizer.
pub fn samples(data: &[u8]) -> Outcome {
    use mosaic_data::samples::{parse_jsonl, token_counts, Tokenizer};
    let samples = parse_jsonl(text(data)?, "fuzz.jsonl").map_err(msg)?;
    token_counts(&samples, &Tokenizer::default()).map_err(msg)?;
    Ok(())
}

/// The engine model, seed and batch size every engine target and seed uses: what
/// `mosaic train --model clip-tiny --seed 0 --batch 2` builds.
pub const ENGINE_MODEL: &str = "clip-tiny";
/// See [`ENGINE_MODEL`].
pub const ENGINE_SEED: u64 = 0;
/// See [`ENGINE_MODEL`].
pub const ENGINE_BATCH: usize = 2;

/// A trainer as `mosaic train --model clip-tiny --seed 0 --batch 2` builds it on one core.
pub fn trainer() -> mosaic_engine::Trainer {
    use mosaic_engine::{models, Device, Schedule, TrainConfig, Trainer};
    let m = models::build(ENGINE_MODEL, ENGINE_SEED, &Device::Cpu).expect("clip-tiny builds");
    let schedule = Schedule::sequential(&m, 1);
    let config = TrainConfig {
        batch: ENGINE_BATCH,
        ..TrainConfig::default()
    };
    Trainer::new(m, schedule, config).expect("a trainer")
}

/// A file of this process under `/dev/shm` (memory, not disk) that the path-based engine
/// loaders read: each input is written there first. One per process, so that parallel fuzzers
/// (`-M`/`-S`) do not share it.
pub fn scratch_file(name: &str) -> PathBuf {
    let base = Path::new("/dev/shm");
    let dir = if base.is_dir() {
        base.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    dir.join(format!("mosaic-fuzz-{}-{name}", std::process::id()))
}

/// `mosaic train --checkpoint-dir DIR` resuming from `DIR/checkpoint.safetensors`:
/// `mosaic_engine::runtime::checkpoint::load` into the run's trainer (metadata, the run's
/// model, seed, batch and modules, every tensor's shape and dtype, the checksum).
pub fn checkpoint(trainer: &mut mosaic_engine::Trainer, path: &Path, data: &[u8]) -> Outcome {
    std::fs::write(path, data).expect("the scratch file is writable");
    mosaic_engine::runtime::checkpoint::load(trainer, path).map_err(msg)?;
    Ok(())
}

/// `mosaic train --data FILE`: `TensorFile::load` against the model's inputs, then the first
/// batch drawn from it as the trainer draws it.
pub fn data_file(fields: &[mosaic_engine::models::Field], path: &Path, data: &[u8]) -> Outcome {
    use mosaic_engine::models::{DataSource, TensorFile};
    std::fs::write(path, data).expect("the scratch file is writable");
    let file = TensorFile::load(path, fields).map_err(msg)?;
    // The first batch, and the one a checkpoint at the last data position would draw.
    for step in [0, u64::MAX] {
        file.batch(step, ENGINE_BATCH, &mosaic_engine::Device::Cpu)
            .map_err(msg)?;
    }
    Ok(())
}
