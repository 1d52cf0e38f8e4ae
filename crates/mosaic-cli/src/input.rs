//! Where a command's profiles come from: a file, or a built-in model on a built-in cluster.

use std::path::{Path, PathBuf};

use anyhow::Result;
use mosaic_profile::{PerfModel, MAX_QUOTA_UNITS};

/// A command-line input that makes no sense (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadInput(pub String);

/// The profile source options shared by the commands that plan.
#[derive(clap::Args, Debug, Clone)]
pub struct Source {
    /// A mosaic-profiles/1 file.
    #[arg(long, conflicts_with = "model")]
    pub profiles: Option<PathBuf>,
    /// A built-in model (see `mosaic zoo`); profiled by the analytical device model.
    #[arg(long, requires = "cluster")]
    pub model: Option<String>,
    /// A built-in cluster such as h100x8 or a100x16 (sets the pool size and the device).
    #[arg(long)]
    pub cluster: Option<String>,
    /// GPUs in the pool (default: the cluster's size; required with --profiles).
    #[arg(long)]
    pub gpus: Option<u32>,
    /// SM quota step: quotas are multiples of it. Only for devices without an SM partition
    /// rule: profiles whose device has one (`device.partition`) plan on its partitions
    /// instead (k × 8 of 132 SMs on an H100, or the whole GPU alone).
    #[arg(long, default_value_t = 0.1)]
    pub granularity: f64,
}

/// Profiles, their model, the pool size and a label for the input.
pub struct Loaded {
    /// Its performance model at the requested granularity.
    pub model: PerfModel,
    /// GPUs in the pool.
    pub gpus: u32,
    /// A short description of the input, for headers.
    pub label: String,
    /// The file name (or `model@cluster`) errors name.
    pub name: String,
    /// The built-in model, when the profiles come from the zoo.
    pub zoo_model: Option<String>,
    /// The built-in cluster, when one was named.
    pub cluster: Option<String>,
}

impl Source {
    /// Loads the profiles and builds the performance model.
    pub fn load(&self) -> Result<Loaded> {
        check_granularity(self.granularity)?;
        let mut zoo_model = None;
        let mut cluster_name = None;
        let (file, name, default_gpus, label) = match (&self.profiles, &self.model) {
            (Some(path), _) => {
                let file = mosaic_profile::load(path)?;
                let cluster_gpus = match &self.cluster {
                    Some(c) => {
                        let cluster = mosaic_zoo::cluster(c)?;
                        // A plan names its cluster; one of another device would not run there.
                        if cluster.device.name != file.device.name {
                            return Err(BadInput(format!(
                                "--cluster {}: its GPUs are {} but {} profiles {}; give --gpus N \
                                 instead to plan the file's device on N GPUs",
                                cluster.name,
                                cluster.device.name,
                                path.display(),
                                mosaic_kit::text::name(&file.device.name)
                            ))
                            .into());
                        }
                        cluster_name = Some(cluster.name.clone());
                        Some(cluster.gpus())
                    }
                    None => None,
                };
                (file, path.display().to_string(), cluster_gpus, path.display().to_string())
            }
            (None, Some(model)) => {
                let spec = mosaic_zoo::model(model)?;
                let cluster = mosaic_zoo::cluster(self.cluster.as_deref().unwrap_or_default())?;
                let file = mosaic_zoo::profile(&spec, &cluster);
                let label = format!("{} on {}", spec.name, cluster.name);
                zoo_model = Some(spec.name.clone());
                cluster_name = Some(cluster.name.clone());
                (file, format!("{}@{}", spec.name, cluster.name), Some(cluster.gpus()), label)
            }
            (None, None) => {
                return Err(BadInput(
                    "no profiles: give --profiles FILE, or --model NAME --cluster NAME (see `mosaic zoo`)".into(),
                )
                .into())
            }
        };
        let gpus = match (self.gpus, default_gpus) {
            (Some(0), _) => return Err(BadInput("--gpus: expected at least 1 GPU".into()).into()),
            // The flag's error alone, not one of the file's planned on too many GPUs.
            (Some(g), _) if g > mosaic_plan::MAX_GPUS => {
                return Err(mosaic_plan::PlanError::TooManyGpus { gpus: g }.into())
            }
            // A plan stamped with a cluster smaller than itself would not run there.
            (Some(g), Some(cluster_gpus)) if g > cluster_gpus => {
                let cluster = cluster_name.as_deref().unwrap_or_default();
                let device = cluster.rsplit_once('x').map_or(cluster, |(d, _)| d);
                return Err(BadInput(format!(
                    "--gpus: {g} GPUs is more than the {cluster_gpus} of cluster {cluster}; name \
                     a cluster of {g} or more (e.g. {device}x{g})"
                ))
                .into());
            }
            (Some(g), _) | (None, Some(g)) => g,
            (None, None) => {
                return Err(BadInput(
                    "--gpus: required with --profiles unless --cluster is given".into(),
                )
                .into())
            }
        };
        let model = PerfModel::new(&file, self.granularity, &name).map_err(|e| match e {
            mosaic_profile::ProfileError::Invalid { field, message, .. }
                if field == "granularity" =>
            {
                anyhow::Error::from(BadInput(format!("--granularity: {message}")))
            }
            other => other.into(),
        })?;
        Ok(Loaded {
            model,
            gpus,
            label,
            name,
            zoo_model,
            cluster: cluster_name,
        })
    }
}

/// Refuses a `--granularity` that is no quota step, whatever the device: profiles of a device
/// with an SM partition rule ignore it, but a NaN or a negative step is still a mistake.
fn check_granularity(g: f64) -> Result<(), BadInput> {
    let units = (1.0 / g).round();
    if g > 0.0 && g <= 1.0 && (units * g - 1.0).abs() <= 1e-9 && units <= MAX_QUOTA_UNITS as f64 {
        return Ok(());
    }
    Err(BadInput(format!(
        "--granularity: expected a quota step in [1/{MAX_QUOTA_UNITS}, 1] that divides 1 (e.g. \
         0.1, 0.05), found {g}"
    )))
}

/// Refuses, before any work, an output file that cannot be written: a directory, or a file in a
/// directory that does not exist. (Writing it may still fail later, for want of permission or
/// of space; that error names the file too.)
pub fn check_output(flag: &str, path: &Path) -> Result<(), BadInput> {
    let name = path.display();
    if path.is_dir() {
        return Err(BadInput(format!(
            "{flag} {name}: is a directory, expected a file to write"
        )));
    }
    match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(dir) if dir.exists() && !dir.is_dir() => Err(BadInput(format!(
            "{flag} {name}: {} is not a directory, expected the directory to write the file in",
            dir.display()
        ))),
        Some(dir) if !dir.is_dir() => Err(BadInput(format!(
            "{flag} {name}: the directory {} does not exist",
            dir.display()
        ))),
        _ => Ok(()),
    }
}

/// [`check_output`] for each output file given (flag, path), and refuses one that is an input
/// file of the same command or another output: writing it would destroy the input (`mosaic
/// plan --profiles p.json --out p.json`) or the other output.
pub fn check_outputs(
    outputs: &[(&str, Option<&Path>)],
    inputs: &[(&str, Option<&Path>)],
) -> Result<(), BadInput> {
    let mut taken: Vec<(&str, PathBuf)> = (inputs.iter())
        .filter_map(|&(flag, p)| Some((flag, resolved(p?)?)))
        .collect();
    for &(flag, path) in outputs {
        let Some(path) = path else { continue };
        check_output(flag, path)?;
        let Some(at) = resolved(path) else { continue };
        if let Some((other, _)) = taken.iter().find(|(_, p)| *p == at) {
            return Err(BadInput(format!(
                "{flag} {}: is also {other}'s file; writing it would destroy that, expected \
                 another path",
                path.display()
            )));
        }
        taken.push((flag, at));
    }
    Ok(())
}

/// The absolute path `path` names, links resolved, for a file that may not exist yet (its
/// directory must); `None` where that cannot be told.
fn resolved(path: &Path) -> Option<PathBuf> {
    if let Ok(p) = path.canonicalize() {
        return Some(p);
    }
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    Some(
        dir.unwrap_or(Path::new("."))
            .canonicalize()
            .ok()?
            .join(path.file_name()?),
    )
}

/// Creates the output directory `path` (and its parents) before any work, refusing a path that
/// is a file or cannot be created.
pub fn create_output_dir(flag: &str, path: &Path) -> Result<(), BadInput> {
    let name = path.display();
    if path.exists() && !path.is_dir() {
        return Err(BadInput(format!(
            "{flag} {name}: is a file, expected a directory"
        )));
    }
    if let Some(file) = path.ancestors().skip(1).find(|a| a.exists() && !a.is_dir()) {
        return Err(BadInput(format!(
            "{flag} {name}: {} is not a directory, expected a directory to create it in",
            file.display()
        )));
    }
    std::fs::create_dir_all(path)
        .map_err(|e| BadInput(format!("{flag} {name}: cannot create the directory: {e}")))
}

/// The most samples a generated batch may hold: the JSON Lines reader's limit.
pub const MAX_SAMPLES: u64 = mosaic_data::samples::MAX_SAMPLES as u64;

/// Where a global batch of variable-size samples comes from (`mosaic data`, `mosaic compare`).
#[derive(clap::Args, Debug, Clone)]
pub struct Samples {
    /// A global batch of your own: JSON Lines, one sample per line, e.g. `{"text_tokens":
    /// 312, "images": [[336, 336]], "audio_seconds": 4.5}` (every field optional).
    #[arg(long, value_name = "FILE", conflicts_with = "generate")]
    pub samples: Option<PathBuf>,
    /// A seeded synthetic global batch with a skewed size distribution: text (log-normal
    /// lengths) or interleaved (text plus a geometric number of 256-token images).
    #[arg(long, value_name = "DISTRIBUTION", value_parser = ["text", "interleaved"])]
    pub generate: Option<String>,
    /// Samples to generate (default: the global batch where known, else 1,024).
    #[arg(long, requires = "generate", conflicts_with = "samples",
          value_parser = clap::value_parser!(u64).range(1..=MAX_SAMPLES))]
    pub count: Option<u64>,
    /// Seed of the generated sizes and of the batching policies' shuffles.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl Samples {
    /// The batch's per-sample sequence lengths and where they came from, or `None` when
    /// neither `--samples` nor `--generate` was given.
    pub fn load(&self, default_count: usize) -> Result<Option<(Vec<u32>, String)>> {
        use mosaic_data::samples::{read_jsonl, token_counts, Tokenizer};
        if let Some(path) = &self.samples {
            let samples = read_jsonl(path)?;
            let sizes = token_counts(&samples, &Tokenizer::default())?;
            let label = format!("{} ({} samples)", path.display(), samples.len());
            return Ok(Some((sizes, label)));
        }
        let Some(name) = self.generate.as_deref() else {
            return Ok(None);
        };
        let dist = mosaic_data::Distribution::by_name(name)
            .ok_or_else(|| BadInput(format!("--generate: unknown distribution {name}")))?;
        let count = self.count.map_or(default_count, |c| c as usize);
        let sizes = mosaic_data::generate(dist, count, self.seed);
        let label = format!("{count} generated {name} samples (seed {})", self.seed);
        Ok(Some((sizes, label)))
    }
}
