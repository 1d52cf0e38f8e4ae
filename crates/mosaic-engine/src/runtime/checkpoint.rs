//! Atomic checkpoints: every module's parameters and optimizer state, and the data position.
//!
//! # Format (`mosaic-checkpoint/1`)
//! One safetensors file, `checkpoint.safetensors` in the checkpoint directory. Tensors (f32,
//! bit-exact):
//! - `<module>/param/<name>`: the parameter,
//! - `<module>/adam_m/<name>`, `<module>/adam_v/<name>`: AdamW's first and second moments.
//!
//! The safetensors metadata holds one key, `mosaic`, whose value is JSON ([`Meta`]): the
//! format, the model, the seed and the batch size (which fix the data stream), the data
//! position `step` (batches consumed; the next batch is the one of position `step`), per
//! module AdamW's step count and hyperparameters, and `crc32`, the CRC-32 of every tensor's
//! bytes in the order they are listed above, module by module (safetensors itself has no
//! checksum: a flipped bit in a tensor would load silently). The schedule is recorded for information:
//! a run may resume under another plan (the loss then continues within float tolerance rather
//! than bit for bit, see the equivalence test).
//!
//! # Atomicity
//! The file is written to `checkpoint.safetensors.tmp`, flushed to disk (`fsync`), renamed over
//! the previous checkpoint (atomic on POSIX file systems), and the directory is fsynced so the
//! rename itself survives a crash. A process killed at any point leaves either the previous
//! checkpoint or the new one, never a mix; a write that fails (a full disk) leaves the previous
//! checkpoint in place. Loading reads and checks everything (metadata, shapes, checksum) before
//! it changes the trainer, so a truncated or corrupted file is refused and never half-loaded.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use candle_core::safetensors::Load;
use candle_core::Tensor;
use safetensors::tensor::View;
use serde::{Deserialize, Serialize};

use super::optim::AdamWConfig;
use super::trainer::Trainer;
use crate::error::EngineError;

/// The value of the `format` field of a checkpoint's metadata.
pub const CHECKPOINT_FORMAT: &str = "mosaic-checkpoint/1";

/// The checkpoint's file name inside the checkpoint directory.
pub const CHECKPOINT_FILE: &str = "checkpoint.safetensors";

/// The JSON metadata of a checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Meta {
    /// Always [`CHECKPOINT_FORMAT`].
    pub format: String,
    /// The engine model.
    pub model: String,
    /// The seed of its initialisation and data.
    pub seed: u64,
    /// Samples per step.
    pub batch: usize,
    /// Data position: steps completed.
    pub step: u64,
    /// The schedule the steps ran by (information only).
    pub schedule: String,
    /// Per module, in model order.
    pub modules: Vec<ModuleMeta>,
    /// CRC-32 of the tensors' bytes, in the order they are written.
    pub crc32: u32,
}

/// A module's optimizer state besides its tensors.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModuleMeta {
    /// The module.
    pub name: String,
    /// AdamW steps taken.
    pub adam_t: u64,
    /// AdamW hyperparameters.
    pub adamw: AdamWConfig,
}

/// The checkpoint file of `dir`, if one exists.
pub fn latest(dir: &Path) -> Option<PathBuf> {
    let p = dir.join(CHECKPOINT_FILE);
    p.is_file().then_some(p)
}

fn io(file: &Path) -> impl FnOnce(std::io::Error) -> EngineError + '_ {
    move |e| EngineError::CheckpointIo {
        file: file.to_path_buf(),
        message: e.to_string(),
    }
}

/// Writes the trainer's state to `dir/checkpoint.safetensors` atomically; returns the path.
/// In a run of several ranks every rank calls it: the ranks first share the state of the
/// modules some of them hold no replica of, then rank 0 alone writes.
pub fn save(trainer: &Trainer, dir: &Path) -> Result<PathBuf, EngineError> {
    trainer.share_module_states()?;
    if trainer.collective().rank() != 0 {
        return Ok(dir.join(CHECKPOINT_FILE));
    }
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    let mut modules = Vec::new();
    for (m, opt) in trainer.model.modules.iter().zip(&trainer.optimizers) {
        let opt = opt.lock().expect("optimizer lock");
        for (i, (name, var)) in m.params.iter().enumerate() {
            tensors.push((format!("{}/param/{name}", m.name), var.as_detached_tensor()));
            tensors.push((format!("{}/adam_m/{name}", m.name), opt.m[i].clone()));
            tensors.push((format!("{}/adam_v/{name}", m.name), opt.v[i].clone()));
        }
        modules.push(ModuleMeta {
            name: m.name.to_string(),
            adam_t: opt.t,
            adamw: opt.config,
        });
    }
    let mut crc = crc32fast::Hasher::new();
    for (_, t) in &tensors {
        crc.update(&t.data());
    }
    let meta = Meta {
        format: CHECKPOINT_FORMAT.into(),
        model: trainer.model.name.into(),
        seed: trainer.model.seed,
        batch: trainer.config.batch,
        step: trainer.step,
        schedule: trainer.schedule.describe(),
        modules,
        crc32: crc.finalize(),
    };
    let info = HashMap::from([(
        "mosaic".to_string(),
        serde_json::to_string(&meta).expect("metadata serialises"),
    )]);
    let path = dir.join(CHECKPOINT_FILE);
    let tmp = dir.join(format!("{CHECKPOINT_FILE}.tmp"));
    let bytes = safetensors::serialize(tensors.iter().map(|(k, t)| (k.as_str(), t)), Some(info))
        .map_err(|e| EngineError::CheckpointIo {
            file: tmp.clone(),
            message: e.to_string(),
        })?;
    let mut f = File::create(&tmp).map_err(io(&tmp))?;
    f.write_all(&bytes).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    drop(f);
    std::fs::rename(&tmp, &path).map_err(io(&path))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))?;
    Ok(path)
}

/// Restores the trainer from the checkpoint at `path`: parameters, optimizer states and the
/// data position. The checkpoint must be of the same model, seed and batch size. The run's
/// own AdamW hyperparameters are kept (a resumed run may change the learning rate); the
/// checkpoint's are recorded in [`Meta`] for information.
pub fn load(trainer: &mut Trainer, path: &Path) -> Result<Meta, EngineError> {
    let bytes = std::fs::read(path).map_err(io(path))?;
    let meta = read_meta(path, &bytes)?;
    check_run(trainer, &meta, path)?;
    // Read everything before changing anything, so a bad checkpoint leaves the trainer intact.
    let restored = read_states(trainer, &meta, path, &bytes)?;
    for ((m, opt), (params, ms, vs, t)) in trainer
        .model
        .modules
        .iter()
        .zip(&trainer.optimizers)
        .zip(restored)
    {
        for ((_, var), p) in m.params.iter().zip(&params) {
            var.set(p).map_err(EngineError::tensor(m.name))?;
        }
        let mut opt = opt.lock().expect("optimizer lock");
        opt.m = ms;
        opt.v = vs;
        opt.t = t;
    }
    trainer.step = meta.step;
    Ok(meta)
}

/// What is wrong with `field` of checkpoint `file`.
fn bad(file: &Path, field: &str, message: String) -> EngineError {
    EngineError::Checkpoint {
        file: file.to_path_buf(),
        field: field.to_string(),
        message,
    }
}

/// The checkpoint's metadata, from the safetensors file's `bytes`, of the expected format.
fn read_meta(path: &Path, bytes: &[u8]) -> Result<Meta, EngineError> {
    let (_, header) = safetensors::SafeTensors::read_metadata(bytes)
        .map_err(|e| bad(path, "(file)", format!("not a safetensors file: {e}")))?;
    let text = header
        .metadata()
        .as_ref()
        .and_then(|m| m.get("mosaic"))
        .ok_or_else(|| {
            bad(
                path,
                "mosaic",
                "no mosaic metadata: not a mosaic checkpoint".into(),
            )
        })?;
    let meta: Meta = serde_json::from_str(text).map_err(|e| bad(path, "mosaic", e.to_string()))?;
    if meta.format != CHECKPOINT_FORMAT {
        return Err(bad(
            path,
            "format",
            format!(
                "expected \"{CHECKPOINT_FORMAT}\", found \"{}\"",
                meta.format
            ),
        ));
    }
    Ok(meta)
}

/// Checks that the checkpoint is of this run: the same model, seed, batch size and modules.
fn check_run(trainer: &Trainer, meta: &Meta, path: &Path) -> Result<(), EngineError> {
    let expect = |field: &str, found: String, want: String| {
        if found == want {
            Ok(())
        } else {
            Err(bad(
                path,
                field,
                format!("the checkpoint has {found} but this run has {want}"),
            ))
        }
    };
    expect("model", meta.model.clone(), trainer.model.name.to_string())?;
    expect(
        "seed",
        meta.seed.to_string(),
        trainer.model.seed.to_string(),
    )?;
    expect(
        "batch",
        meta.batch.to_string(),
        trainer.config.batch.to_string(),
    )?;
    let names: Vec<&str> = meta.modules.iter().map(|m| m.name.as_str()).collect();
    let want: Vec<&str> = trainer.model.modules.iter().map(|m| m.name).collect();
    expect("modules", names.join(", "), want.join(", "))
}

/// One module's state read from a checkpoint: parameters, AdamW's moments, its step count.
type ModuleState = (Vec<Tensor>, Vec<Tensor>, Vec<Tensor>, u64);

/// Every module's state from the checkpoint's `bytes`, each tensor checked against the
/// trainer's.
fn read_states(
    trainer: &Trainer,
    meta: &Meta,
    path: &Path,
    bytes: &[u8],
) -> Result<Vec<ModuleState>, EngineError> {
    let st = safetensors::SafeTensors::deserialize(bytes)
        .map_err(|e| bad(path, "(file)", format!("not a safetensors file: {e}")))?;
    let crc = std::cell::RefCell::new(crc32fast::Hasher::new());
    let get = |key: &str, like: &Tensor| -> Result<Tensor, EngineError> {
        let view = st
            .tensor(key)
            .map_err(|_| bad(path, key, "missing tensor".into()))?;
        crc.borrow_mut().update(view.data());
        // On the device of the tensor it replaces (a GPU slot's, when training on one).
        let t = view
            .load(like.device())
            .map_err(|e| bad(path, key, e.to_string()))?;
        if t.shape() != like.shape() || t.dtype() != like.dtype() {
            return Err(bad(
                path,
                key,
                format!(
                    "shape {:?} {:?}, expected {:?} {:?}",
                    t.dims(),
                    t.dtype(),
                    like.dims(),
                    like.dtype()
                ),
            ));
        }
        Ok(t)
    };
    let mut restored = Vec::new();
    for (m, mm) in trainer.model.modules.iter().zip(&meta.modules) {
        let mut params = Vec::new();
        let (mut ms, mut vs) = (Vec::new(), Vec::new());
        for (name, var) in m.params.iter() {
            let like = var.as_tensor();
            params.push(get(&format!("{}/param/{name}", m.name), like)?);
            ms.push(get(&format!("{}/adam_m/{name}", m.name), like)?);
            vs.push(get(&format!("{}/adam_v/{name}", m.name), like)?);
        }
        restored.push((params, ms, vs, mm.adam_t));
    }
    let found = crc.into_inner().finalize();
    if found != meta.crc32 {
        return Err(bad(
            path,
            "crc32",
            format!(
                "the tensors' checksum is {found:08x} but the checkpoint recorded {:08x}: the \
                 file is corrupted",
                meta.crc32
            ),
        ));
    }
    Ok(restored)
}
