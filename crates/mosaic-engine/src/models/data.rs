//! Training on the user's own tensors: a safetensors file holding one tensor per data input of
//! the model, all with the same number of samples along the first dimension.
//!
//! The batch at data position `step` is samples `step·batch … step·batch + batch − 1`, taken
//! modulo the file's sample count (the file is cycled through in order), so a batch depends
//! only on the step and a resumed run sees the batches it would have seen.
//!
//! What a model expects is its [`Field`]s (`mosaic data write --model M --out f` writes
//! synthetic samples in this very format as a template): real-valued inputs are read as f32
//! (f16, bf16 and f64 are converted), token ids and labels as integers (u8, u16, u32, i32, i64)
//! checked against the model's vocabulary.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use crate::error::EngineError;

/// One batch: named tensors whose first dimension is the sample.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    /// Tensors by name.
    pub tensors: BTreeMap<&'static str, Tensor>,
}

/// Where batches come from. A batch depends only on the data position (the step), so a run
/// resumed from a checkpoint sees the same batches as one never stopped.
pub trait DataSource: Send + Sync {
    /// The batch of `batch` samples at data position `step`.
    fn batch(&self, step: u64, batch: usize, device: &Device) -> candle_core::Result<Batch>;

    /// The tensors of a batch: name, shape of one sample, kind of values.
    fn fields(&self) -> Vec<Field>;

    /// Whether drawing a batch costs the caller's thread enough to draw the next one ahead on
    /// another while a GPU step trains ([`crate::runtime::prefetch`]): a source computed where
    /// it is asked, with no order of its own to keep (not a feed, whose producers work ahead
    /// already). No by default.
    fn worth_drawing_ahead(&self) -> bool {
        false
    }
}

/// What kind of values a data input holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Real numbers (pixels, spectrogram frames), f32.
    Real,
    /// Indices below the bound (token ids, class labels), u32.
    Index(u32),
}

/// One data input of a model, as its data source provides it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// The input's name (`image`, `text`, ...).
    pub name: &'static str,
    /// The shape of one sample.
    pub dims: Vec<usize>,
    /// Its values.
    pub kind: Kind,
    /// `Some(field)` for per-sample lengths of that token field (`dims` empty, one integer
    /// `1..=` its width per sample; tokens past it are padding). A file may leave such a field
    /// out: every sample is then full length.
    pub lengths_of: Option<&'static str>,
}

impl Field {
    /// Real values of shape `dims` a sample.
    pub fn real(name: &'static str, dims: Vec<usize>) -> Self {
        Field {
            name,
            dims,
            kind: Kind::Real,
            lengths_of: None,
        }
    }

    /// Ids below `bound` of shape `dims` a sample.
    pub fn ids(name: &'static str, dims: Vec<usize>, bound: usize) -> Self {
        Field {
            name,
            dims,
            kind: Kind::Index(bound as u32),
            lengths_of: None,
        }
    }

    /// Each sample's length, 1 to `width`, of token field `of` (see [`Field::lengths_of`]).
    pub fn lengths(name: &'static str, of: &'static str, width: usize) -> Self {
        Field {
            name,
            dims: vec![],
            kind: Kind::Index(width as u32 + 1),
            lengths_of: Some(of),
        }
    }

    fn describe(&self) -> String {
        let kind = match (self.kind, self.lengths_of) {
            (Kind::Index(n), Some(of)) => format!(
                "lengths 1 to {} of `{of}` (optional: absent, every sample is full length)",
                n.saturating_sub(1)
            ),
            (Kind::Real, _) => "real".to_string(),
            (Kind::Index(n), None) => format!("integer ids below {n}"),
        };
        format!("{} {} of {kind}", self.name, batch_shape(&self.dims))
    }
}

fn join(dims: &[usize]) -> String {
    dims.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `[N, 16, 16]` for a batch of samples of `dims`, `[N]` for scalar samples.
fn batch_shape(dims: &[usize]) -> String {
    if dims.is_empty() {
        "[N]".into()
    } else {
        format!("[N, {}]", join(dims))
    }
}

/// A model's data read from a safetensors file (see the module documentation).
#[derive(Debug)]
pub struct TensorFile {
    path: PathBuf,
    fields: Vec<Field>,
    tensors: BTreeMap<&'static str, Tensor>,
    samples: usize,
}

impl TensorFile {
    /// Reads `path` and checks it against `fields`: every field present with `[N, dims…]`
    /// and values of its kind, the same `N ≥ 1` everywhere, no other tensor. The first
    /// violation is returned, naming the file and the tensor.
    pub fn load(path: &Path, fields: &[Field]) -> Result<TensorFile, EngineError> {
        let bad = |field: &str, message: String| EngineError::Data {
            file: path.to_path_buf(),
            field: field.to_string(),
            message,
        };
        let expected = || {
            fields
                .iter()
                .map(Field::describe)
                .collect::<Vec<_>>()
                .join("; ")
        };
        // Only a regular file: a device such as /dev/zero would be read until memory runs out.
        mosaic_kit::files::regular_file(path).map_err(|e| bad("(file)", e.to_string()))?;
        let mut found = candle_core::safetensors::load(path, &Device::Cpu).map_err(|e| {
            let message = match e {
                candle_core::Error::Io(io) => io.to_string(),
                other => format!("not a safetensors file: {other}"),
            };
            bad("(file)", message)
        })?;
        let mut tensors = BTreeMap::new();
        let mut samples: Option<(usize, &str)> = None;
        let mut absent = Vec::new();
        for f in fields {
            let Some(t) = found.remove(f.name) else {
                if f.lengths_of.is_some() {
                    absent.push(f);
                    continue;
                }
                return Err(bad(
                    f.name,
                    format!("missing; the model expects {}", expected()),
                ));
            };
            let (&n, sample) = t.dims().split_first().ok_or_else(|| {
                bad(
                    f.name,
                    "a scalar; expected samples along dimension 0".into(),
                )
            })?;
            if sample != f.dims.as_slice() {
                return Err(bad(
                    f.name,
                    format!(
                        "shape [{}], expected {}",
                        join(t.dims()),
                        batch_shape(&f.dims)
                    ),
                ));
            }
            match samples {
                None if n == 0 => return Err(bad(f.name, "no samples (N = 0)".into())),
                None => samples = Some((n, f.name)),
                Some((m, other)) if m != n => {
                    return Err(bad(
                        f.name,
                        format!(
                            "{n} samples, but `{other}` has {m}; every tensor needs the same N"
                        ),
                    ))
                }
                Some(_) => {}
            }
            let t = match (f.lengths_of, f.kind) {
                (Some(of), Kind::Index(bound)) => lengths(&t, of, bound.saturating_sub(1)),
                _ => convert(&t, f.kind),
            }
            .map_err(|m| bad(f.name, m))?;
            tensors.insert(f.name, t);
        }
        // Lengths a file leaves out: every sample full length.
        for f in absent {
            let (Some((n, _)), Kind::Index(bound)) = (samples, f.kind) else {
                continue;
            };
            let full = vec![bound.saturating_sub(1); n];
            let t =
                Tensor::from_vec(full, n, &Device::Cpu).map_err(|e| bad(f.name, e.to_string()))?;
            tensors.insert(f.name, t);
        }
        if let Some(extra) = found.keys().next() {
            return Err(bad(
                extra,
                format!("not an input of the model, which expects {}", expected()),
            ));
        }
        Ok(TensorFile {
            path: path.to_path_buf(),
            fields: fields.to_vec(),
            tensors,
            samples: samples.map_or(0, |s| s.0),
        })
    }

    /// Samples in the file.
    pub fn samples(&self) -> usize {
        self.samples
    }

    /// The file read.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The values of an integer tensor, or why it is not one (`what` says what was expected).
fn integers(t: &Tensor, what: &str) -> std::result::Result<Vec<i64>, String> {
    if !matches!(
        t.dtype(),
        DType::U8 | DType::U32 | DType::I64 | DType::I32 | DType::I16
    ) {
        return Err(format!(
            "dtype {:?}, expected {what} (u32 or i64)",
            t.dtype()
        ));
    }
    t.flatten_all()
        .and_then(|f| f.to_dtype(DType::I64))
        .and_then(|f| f.to_vec1())
        .map_err(|e| e.to_string())
}

/// Per-sample lengths of field `of` (`1..=max`) as u32, or why they are not.
fn lengths(t: &Tensor, of: &str, max: u32) -> std::result::Result<Tensor, String> {
    let values = integers(t, &format!("lengths of `{of}`"))?;
    if let Some((i, v)) = (values.iter().enumerate()).find(|(_, &v)| v < 1 || v > max as i64) {
        return Err(format!(
            "sample {i} has length {v}; a length of `{of}` must be 1 to {max}"
        ));
    }
    let n = values.len();
    let values: Vec<u32> = values.into_iter().map(|v| v as u32).collect();
    Tensor::from_vec(values, n, &Device::Cpu).map_err(|e| e.to_string())
}

/// `t` as the dtype of `kind`, or why it cannot be.
fn convert(t: &Tensor, kind: Kind) -> std::result::Result<Tensor, String> {
    let msg = |e: candle_core::Error| e.to_string();
    match kind {
        Kind::Real => match t.dtype() {
            DType::F32 => Ok(t.clone()),
            DType::F16 | DType::BF16 | DType::F64 => t.to_dtype(DType::F32).map_err(msg),
            other => Err(format!("dtype {other:?}, expected real numbers (f32)")),
        },
        Kind::Index(bound) => {
            let values = integers(t, &format!("integer ids below {bound}"))?;
            if let Some((i, v)) = values
                .iter()
                .enumerate()
                .find(|(_, &v)| v < 0 || v >= bound as i64)
            {
                return Err(format!(
                    "value {v} at flat index {i} is not an id below {bound}"
                ));
            }
            let ids: Vec<u32> = values.into_iter().map(|v| v as u32).collect();
            Tensor::from_vec(ids, t.shape(), &Device::Cpu).map_err(msg)
        }
    }
}

impl DataSource for TensorFile {
    fn batch(&self, step: u64, batch: usize, device: &Device) -> candle_core::Result<Batch> {
        let n = self.samples as u64;
        let first = step.wrapping_mul(batch as u64) % n;
        let rows: Vec<u32> = (0..batch as u64)
            .map(|i| ((first + i) % n) as u32)
            .collect();
        let rows = Tensor::from_vec(rows, batch, &Device::Cpu)?;
        let mut b = Batch::default();
        for (&name, t) in &self.tensors {
            b.tensors
                .insert(name, t.index_select(&rows, 0)?.to_device(device)?);
        }
        Ok(b)
    }

    fn fields(&self) -> Vec<Field> {
        self.fields.clone()
    }
}

/// The most samples in one step: a batch is built whole in memory on every rank, and the
/// built-in models' activations are a few KiB a sample, so 65,536 samples already take GiBs
/// (and a contrastive loss's logits grow with the square of the batch: a CPU run checks its
/// step against the host's memory, [`crate::runtime::memory::HostNeed`]).
pub const MAX_BATCH: usize = 1 << 16;

/// The most samples [`write_batches`] writes: the file is built in memory first, 1.1 KiB a
/// sample for clip-tiny and 1.5 KiB for omni-tiny, so at most 1.5 GiB.
pub const MAX_WRITTEN_SAMPLES: u64 = 1 << 20;

/// The most bytes [`write_batches`] writes, whatever the data: the file is built in memory
/// first (a zoo-built model's samples are megabytes each, where [`MAX_WRITTEN_SAMPLES`] of
/// them would be terabytes); 2²⁰ samples of either tiny model fit under it.
pub const MAX_WRITTEN_BYTES: u64 = 2 << 30;

/// Bytes one sample of `fields` takes in a data file: 4 a value, f32 or u32.
pub fn sample_bytes(fields: &[Field]) -> u64 {
    (fields.iter())
        .map(|f| 4 * f.dims.iter().map(|&d| d as u64).product::<u64>())
        .sum()
}

/// Checks a batch size (`--batch`): at least 1 sample and at most [`MAX_BATCH`].
pub fn check_batch(batch: usize) -> Result<(), EngineError> {
    let message = if batch == 0 {
        "expected at least 1 sample".to_string()
    } else if batch > MAX_BATCH {
        format!("{batch} samples is more than the {MAX_BATCH} a step may hold")
    } else {
        return Ok(());
    };
    Err(EngineError::BadSetting {
        setting: "--batch".into(),
        message,
    })
}

/// The batches `data` gives at data positions `0..steps`, `batch` samples each, one after the
/// other in the format [`TensorFile::load`] reads, written to `path`: training on the file for
/// `steps` steps of `batch` sees exactly the batches training on `data` would.
pub fn write_batches(
    data: &dyn DataSource,
    steps: u64,
    batch: usize,
    path: &Path,
) -> Result<(), EngineError> {
    check_batch(batch)?;
    if steps.max(1).saturating_mul(batch as u64) > MAX_WRITTEN_SAMPLES {
        return Err(EngineError::BadSetting {
            setting: "--steps × --batch".into(),
            message: format!(
                "{} × {batch} samples is more than the {MAX_WRITTEN_SAMPLES} a data file may hold \
                 (the whole file is built in memory first)",
                steps.max(1)
            ),
        });
    }
    let per_sample = sample_bytes(&data.fields());
    let bytes = (steps.max(1) * batch as u64).saturating_mul(per_sample);
    if bytes > MAX_WRITTEN_BYTES {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        return Err(EngineError::BadSetting {
            setting: "--steps × --batch".into(),
            message: format!(
                "{} × {batch} samples of {per_sample} bytes make {:.2} GiB, more than the {:.0} \
                 GiB a data file may hold (the whole file is built in memory first); at most \
                 {} samples of this data fit",
                steps.max(1),
                gib(bytes),
                gib(MAX_WRITTEN_BYTES),
                MAX_WRITTEN_BYTES / per_sample.max(1)
            ),
        });
    }
    let err = |e: candle_core::Error| EngineError::Data {
        file: path.to_path_buf(),
        field: "(file)".into(),
        message: e.to_string(),
    };
    let batches = (0..steps.max(1))
        .map(|s| data.batch(s, batch, &Device::Cpu))
        .collect::<candle_core::Result<Vec<_>>>()
        .map_err(err)?;
    let mut tensors = std::collections::HashMap::new();
    for f in data.fields() {
        let parts: Vec<&Tensor> = batches.iter().map(|b| &b.tensors[f.name]).collect();
        tensors.insert(f.name, Tensor::cat(&parts, 0).map_err(err)?);
    }
    candle_core::safetensors::save(&tensors, path).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models;

    fn dir(test: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("mosaic-data-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn same(a: &Batch, b: &Batch) -> bool {
        a.tensors.keys().eq(b.tensors.keys())
            && a.tensors.iter().all(|(k, t)| {
                let (x, y) = (
                    t.to_dtype(DType::F32).unwrap(),
                    b.tensors[k].to_dtype(DType::F32).unwrap(),
                );
                x.flatten_all().unwrap().to_vec1::<f32>().unwrap()
                    == y.flatten_all().unwrap().to_vec1::<f32>().unwrap()
            })
    }

    /// A zoo-sized sample: 3 MiB of values; drawing a batch of it is an error.
    struct Huge;

    impl DataSource for Huge {
        fn batch(&self, _: u64, _: usize, _: &Device) -> candle_core::Result<Batch> {
            candle_core::bail!("nothing is drawn before the size is checked")
        }

        fn fields(&self) -> Vec<Field> {
            vec![Field::real("vision", vec![1297, 588])]
        }
    }

    #[test]
    fn a_file_is_capped_in_bytes_before_anything_is_drawn() {
        let path = dir("huge").join("d.safetensors");
        // 16 × 50 samples is far below the sample cap, but 2.3 GiB.
        let e = write_batches(&Huge, 50, 16, &path).unwrap_err().to_string();
        assert!(
            e.starts_with("--steps × --batch: 50 × 16 samples of 3050544 bytes"),
            "{e}"
        );
        assert!(e.contains("at most 703 samples"), "{e}");
        assert!(!path.exists());
        // Under the cap, the data is drawn (and here fails).
        let e = write_batches(&Huge, 1, 16, &path).unwrap_err().to_string();
        assert!(e.contains("nothing is drawn"), "{e}");
        // Both tiny models fit the sample cap under the byte cap.
        for (name, bytes) in [("clip-tiny", 1092), ("omni-tiny", 1576)] {
            let model = models::build(name, 0, &Device::Cpu).unwrap();
            assert_eq!(sample_bytes(&model.data.fields()), bytes, "{name}");
            assert!(MAX_WRITTEN_SAMPLES * bytes <= MAX_WRITTEN_BYTES);
        }
    }

    #[test]
    fn a_written_file_replays_the_batches_then_cycles() {
        let model = models::build("omni-tiny", 3, &Device::Cpu).unwrap();
        let path = dir("cycle").join("d.safetensors");
        write_batches(&*model.data, 3, 4, &path).unwrap();
        let file = TensorFile::load(&path, &model.data.fields()).unwrap();
        assert_eq!(file.samples(), 12);
        let cpu = &Device::Cpu;
        for step in 0..3 {
            let (a, b) = (
                file.batch(step, 4, cpu).unwrap(),
                model.data.batch(step, 4, cpu).unwrap(),
            );
            assert!(same(&a, &b), "step {step}");
        }
        let wrapped = file.batch(3, 4, cpu).unwrap();
        assert!(same(&wrapped, &model.data.batch(0, 4, cpu).unwrap()));
        assert!(!same(&wrapped, &model.data.batch(1, 4, cpu).unwrap()));
    }

    #[test]
    fn bad_files_name_the_tensor() {
        let model = models::build("clip-tiny", 3, &Device::Cpu).unwrap();
        let fields = model.data.fields();
        let d = dir("bad");
        let dev = Device::Cpu;
        let image = Tensor::zeros((4, 16, 16), DType::F32, &dev).unwrap();
        let text = Tensor::zeros((4, 16), DType::U32, &dev).unwrap();
        let len = |v: f64| (Tensor::ones(4, DType::U32, &dev).unwrap() * v).unwrap();
        // (file name, its tensors, the error expected)
        type Case<'a> = (&'a str, Vec<(&'a str, Tensor)>, &'a str);
        let cases: Vec<Case> = vec![
            (
                "missing",
                vec![("image", image.clone())],
                "field `text`: missing",
            ),
            (
                "shape",
                vec![
                    ("image", image.clone()),
                    ("text", Tensor::zeros((4, 7), DType::U32, &dev).unwrap()),
                ],
                "field `text`: shape [4, 7], expected [N, 16]",
            ),
            (
                "count",
                vec![
                    ("image", image.clone()),
                    ("text", Tensor::zeros((3, 16), DType::U32, &dev).unwrap()),
                ],
                "field `text`: 3 samples, but `image` has 4",
            ),
            (
                "range",
                vec![
                    ("image", image.clone()),
                    ("text", (text.clone() + 64.0).unwrap()),
                ],
                "field `text`: value 64 at flat index 0 is not an id below 64",
            ),
            (
                "dtype",
                vec![
                    ("image", image.to_dtype(DType::U32).unwrap()),
                    ("text", text.clone()),
                ],
                "field `image`: dtype U32, expected real numbers",
            ),
            (
                "zero_length",
                vec![
                    ("image", image.clone()),
                    ("text", text.clone()),
                    ("text_len", len(0.0)),
                ],
                "field `text_len`: sample 0 has length 0; a length of `text` must be 1 to 16",
            ),
            (
                "long",
                vec![
                    ("image", image.clone()),
                    ("text", text.clone()),
                    ("text_len", len(17.0)),
                ],
                "field `text_len`: sample 0 has length 17",
            ),
            (
                "real_length",
                vec![
                    ("image", image.clone()),
                    ("text", text.clone()),
                    ("text_len", image.flatten_from(1).unwrap().sum(1).unwrap()),
                ],
                "field `text_len`: dtype F32, expected lengths of `text`",
            ),
            (
                "length_shape",
                vec![
                    ("image", image.clone()),
                    ("text", text.clone()),
                    ("text_len", text.clone()),
                ],
                "field `text_len`: shape [4, 16], expected [N]",
            ),
            (
                "extra",
                vec![
                    ("image", image.clone()),
                    ("text", text.clone()),
                    ("audio", image.clone()),
                ],
                "field `audio`: not an input of the model",
            ),
        ];
        for (name, tensors, want) in cases {
            let path = d.join(format!("{name}.safetensors"));
            let map: std::collections::HashMap<String, Tensor> = tensors
                .into_iter()
                .map(|(k, t)| (k.to_string(), t))
                .collect();
            candle_core::safetensors::save(&map, &path).unwrap();
            let e = TensorFile::load(&path, &fields).unwrap_err().to_string();
            assert!(
                e.contains(&format!("{name}.safetensors: {want}")),
                "{name}: {e}"
            );
            assert!(
                TensorFile::load(&path, &fields).unwrap_err().is_bad_input(),
                "{name}"
            );
        }
        // Without lengths, every text is full length.
        let path = d.join("no_lengths.safetensors");
        let map: std::collections::HashMap<String, Tensor> = [
            ("image".to_string(), image.clone()),
            ("text".to_string(), text.clone()),
        ]
        .into();
        candle_core::safetensors::save(&map, &path).unwrap();
        let file = TensorFile::load(&path, &fields).unwrap();
        let b = file.batch(0, 4, &dev).unwrap();
        assert_eq!(b.tensors["text_len"].to_vec1::<u32>().unwrap(), [16; 4]);
        std::fs::write(d.join("junk.safetensors"), b"not a tensor file").unwrap();
        let e = TensorFile::load(&d.join("junk.safetensors"), &fields).unwrap_err();
        assert!(
            e.to_string().contains("junk.safetensors: field `(file)`"),
            "{e}"
        );
    }
}
