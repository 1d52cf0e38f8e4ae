//! The built-in zoo: the paper's multimodal models with their real architectures, the GPUs
//! they train on with their datasheet numbers, clusters of those GPUs, and the analytical
//! device model that turns a model and a cluster into a `mosaic-profiles/1` file.
//!
//! [`models`] holds the six models of Mosaic's evaluation (§5.1) — CLIP, Qwen3-VL, Unified-IO 2,
//! ImageBind, OFASys and CTVLM — and the four-module OFASys of its Fig. 14a. Each
//! [`ModuleSpec`] carries its transformer shape, its input per sample (Table 2 of the paper),
//! whether it is trained, the source of every number and, where the paper's Table 1 lists the
//! module, that row for comparison. [`devices`] and [`clusters`] describe H100, H200 and A100
//! nodes; [`cluster`] also accepts any `<device>x<N>` such as `h100x24`. [`profile`] predicts
//! every module's iteration time, memory and SM / bandwidth utilisation at the paper's
//! data-parallel degrees and at every SM quota the device's partitions grant (see
//! [`Calibration`] for the model and what it was fitted to), which is what the planner reads
//! when no measured profile is at hand.
//!
//! ```
//! let ofasys = mosaic_zoo::model("OFASys")?;
//! let h100x8 = mosaic_zoo::cluster("h100x8")?;
//! let file = mosaic_zoo::profile(&ofasys, &h100x8);
//! assert_eq!(file.modules.len(), ofasys.modules.len());
//!
//! // The file is a valid mosaic-profiles/1 file the planner can build its model from; its
//! // quota units are the H100's SMs (granted 8 at a time, or all 132).
//! let perf = mosaic_profile::PerfModel::new(&file, 0.1, "ofasys@h100x8")?;
//! let llm = &perf.modules[perf.index_of("llm").unwrap()];
//! let full = llm.options.iter().find(|o| o.dp == 8 && o.units == 132).unwrap();
//! let half = llm.options.iter().find(|o| o.dp == 8 && o.units == 64).unwrap();
//! assert!(half.time_ms > full.time_ms);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

mod analytic;
mod bounds;
mod device;
mod error;
mod fitted;
mod kernels;
mod models;
mod spec;
mod token_cost;
mod workload;

pub use analytic::{profile, Calibration, Estimate};
pub use bounds::Bound;
pub use device::{cluster, clusters, devices, ClusterSpec, DeviceSpec, GPUS_PER_NODE};
pub use error::{CalibrationError, ZooError};
pub use fitted::FreeConstant;
pub use kernels::PLAIN_LAYER_KERNELS;
pub use models::{model, models, same_model};
pub use spec::{Extra, ModelSpec, ModuleSpec, PaperRow, Role};
pub use token_cost::TokenCost;
