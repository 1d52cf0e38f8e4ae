//! The engine's file loaders on hostile input: thousands of mutations of valid checkpoints and
//! data files (bytes flipped, cut, inserted, the JSON header edited) each give a value or a
//! clear error, never a panic, and a refused checkpoint leaves the trainer untouched.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use mosaic_engine::models::{self, nn::to_f32s, TensorFile};
use mosaic_engine::runtime::checkpoint;
use mosaic_engine::{Device, EngineError, Schedule, TrainConfig, Trainer};
use proptest::prelude::*;

fn trainer() -> Trainer {
    let m = models::build("clip-tiny", 3, &Device::Cpu).unwrap();
    let schedule = Schedule::sequential(&m, 1);
    Trainer::new(m, schedule, TrainConfig::default()).unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mosaic-hostile-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A valid checkpoint of clip-tiny after one step, as bytes.
fn checkpoint_bytes() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        let mut t = trainer();
        t.step().unwrap();
        let path = checkpoint::save(&t, &scratch("good-ckpt")).unwrap();
        std::fs::read(path).unwrap()
    })
}

/// A valid data file of clip-tiny (2 steps of 4 samples), as bytes.
fn data_bytes() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        let m = models::build("clip-tiny", 0, &Device::Cpu).unwrap();
        let path = scratch("good-data").join("d.safetensors");
        models::data::write_batches(&*m.data, 2, 4, &path).unwrap();
        std::fs::read(path).unwrap()
    })
}

/// One way to damage a file.
#[derive(Debug, Clone)]
enum Mutation {
    /// XOR a byte at a position (taken modulo the length).
    Flip(usize, u8),
    /// Keep only a prefix (a fraction of the length, in thousandths).
    Cut(u16),
    /// Insert bytes at a position.
    Insert(usize, Vec<u8>),
    /// Replace a byte of the header (the first 8 + header-length bytes hold the JSON).
    Header(usize, u8),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1..=255u8).prop_map(|(i, x)| Mutation::Flip(i, x)),
        (0..1000u16).prop_map(Mutation::Cut),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(i, b)| Mutation::Insert(i, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Header(i, b)),
    ]
}

fn damage(good: &[u8], mutations: &[Mutation]) -> Vec<u8> {
    let mut b = good.to_vec();
    for m in mutations {
        match m {
            Mutation::Flip(i, x) if !b.is_empty() => {
                let n = b.len();
                b[i % n] ^= x;
            }
            Mutation::Cut(k) => b.truncate(b.len() * *k as usize / 1000),
            Mutation::Insert(i, bytes) => {
                let at = i % (b.len() + 1);
                b.splice(at..at, bytes.iter().copied());
            }
            Mutation::Header(i, x) if b.len() > 8 => {
                let header = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
                let end = (8 + header).min(b.len());
                b[8 + i % (end - 8).max(1)] = *x;
            }
            _ => {}
        }
    }
    b
}

fn params(t: &Trainer) -> Vec<Vec<f32>> {
    (t.model().modules.iter())
        .flat_map(|m| {
            m.params
                .iter()
                .map(|(_, v)| to_f32s(v.as_tensor()).unwrap())
        })
        .collect()
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// A truncated or corrupted checkpoint is refused, naming what is wrong, and the trainer
/// loading it is left exactly as it was (nothing half-loaded).
#[test]
fn a_damaged_checkpoint_is_refused_and_changes_nothing() {
    let dir = std::env::temp_dir().join(format!("mosaic-engine-bad-{}", std::process::id()));
    let mut t = trainer();
    t.step().unwrap();
    t.step().unwrap();
    let path = checkpoint::save(&t, &dir).unwrap();
    let good = std::fs::read(&path).unwrap();
    let damaged = |bytes: Vec<u8>, field: &str| {
        std::fs::write(&path, bytes).unwrap();
        let mut fresh = trainer();
        let before = params(&fresh);
        let e = checkpoint::load(&mut fresh, &path).unwrap_err();
        assert!(
            matches!(&e, EngineError::Checkpoint { field: f, .. } if f == field),
            "{field}: {e}"
        );
        assert!(e.is_bad_input());
        assert_eq!(fresh.step_count(), 0);
        assert_eq!(params(&fresh), before, "{field}: the trainer changed");
    };
    // One bit flipped in the last tensor's data (the end of the file).
    let mut flipped = good.clone();
    *flipped.last_mut().unwrap() ^= 0x10;
    damaged(flipped, "crc32");
    // Cut short: safetensors finds the header and the data lengths inconsistent.
    damaged(good[..good.len() - 100].to_vec(), "(file)");
    damaged(good[..4].to_vec(), "(file)");
    std::fs::write(&path, &good).unwrap();
    checkpoint::load(&mut trainer(), &path).unwrap();
    std::fs::remove_dir_all(&dir).ok();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(600))]

    /// A damaged checkpoint loads (the damage missed everything checked) or is refused as bad
    /// input; refused, the trainer is exactly as it was.
    #[test]
    fn damaged_checkpoints_never_panic(ms in prop::collection::vec(mutation(), 1..4)) {
        let dir = scratch("ckpt");
        let path = write(&dir, "checkpoint.safetensors", &damage(checkpoint_bytes(), &ms));
        let mut fresh = trainer();
        let before = params(&fresh);
        if let Err(e) = checkpoint::load(&mut fresh, &path) {
            prop_assert!(e.is_bad_input(), "{}", e);
            prop_assert_eq!(fresh.step_count(), 0);
            prop_assert_eq!(params(&fresh), before);
        }
    }

    /// A damaged `--data` file loads or is refused as bad input naming the file.
    #[test]
    fn damaged_data_files_never_panic(ms in prop::collection::vec(mutation(), 1..4)) {
        let dir = scratch("data");
        let path = write(&dir, "d.safetensors", &damage(data_bytes(), &ms));
        let m = models::build("clip-tiny", 0, &Device::Cpu).unwrap();
        if let Err(e) = TensorFile::load(&path, &m.data.fields()) {
            prop_assert!(e.is_bad_input(), "{}", e);
            prop_assert!(e.to_string().contains("d.safetensors"), "{}", e);
        }
    }
}
