//! Profiles of a multimodal model's modules and the performance model built on them.
//!
//! A [`ProfileFile`] is the `mosaic-profiles/1` JSON a profiler writes (the engine, or the
//! analytical device model of `mosaic-zoo`): per module its DAG edges and, per sampled
//! data-parallel degree `dp` and SM quota `sm`, the measured iteration time, memory and
//! bandwidth utilisation. [`load`] reads and validates one; [`PerfModel`] turns it into the
//! scaling surface `f_m(d, a)` and the interference rectification of Mosaic §3.3.
//!
//! ```
//! let text = r#"{"format": "mosaic-profiles/1",
//!   "device": {"name": "H100-SXM5-80GB", "sm_count": 132, "memory_gib": 80.0},
//!   "modules": [{"name": "vision", "after": [], "samples": [
//!       {"dp": 1, "sm": 0.5, "time_ms": 100.0, "mem_gib": 10.0, "sm_util": 0.9, "bw_util": 0.2},
//!       {"dp": 1, "sm": 1.0, "time_ms": 60.0, "mem_gib": 10.0, "sm_util": 0.8, "bw_util": 0.3}]}],
//!   "interference": {"e1": 0.0, "e2": 0.0, "e3": 0.0}}"#;
//! let file = mosaic_profile::parse(text, "inline.json").unwrap();
//! let model = mosaic_profile::PerfModel::new(&file, 0.1, "inline.json").unwrap();
//! let vision = &model.modules[0];
//! // Interpolated linearly in the quota between the profiled 0.5 and 1.0.
//! let option = vision.options.iter().find(|o| o.dp == 1 && o.units == 7).unwrap();
//! assert!((option.time_ms - 84.0).abs() < 1e-9);
//! // So is the achieved SM utilisation: 0.9 at 0.5, 0.8 at 1.0.
//! assert!((option.sm_util - 0.86).abs() < 1e-9);
//! ```
//!
//! A device with a partition rule (`"partition": {"min_sms": 8, "step_sms": 8}`, what a CUDA
//! green context can hold) plans in whole SMs instead: the quotas are the SM counts of
//! [`SmGranularity::quota_sms`] over `sm_count`, whatever the granularity asked for.
//!
//! ```
//! let text = r#"{"format": "mosaic-profiles/1",
//!   "device": {"name": "H100-SXM5-80GB", "sm_count": 132, "memory_gib": 80.0,
//!              "partition": {"min_sms": 8, "step_sms": 8}},
//!   "modules": [{"name": "vision", "after": [], "samples": [
//!       {"dp": 1, "sm": 0.1212, "time_ms": 800.0, "mem_gib": 10.0, "sm_util": 1.0, "bw_util": 0.1},
//!       {"dp": 1, "sm": 1.0, "time_ms": 140.0, "mem_gib": 10.0, "sm_util": 0.9, "bw_util": 0.5}]}],
//!   "interference": {"e1": 0.0, "e2": 0.0, "e3": 0.0}}"#;
//! let file = mosaic_profile::parse(text, "h100.json").unwrap();
//! let model = mosaic_profile::PerfModel::new(&file, 0.1, "h100.json").unwrap();
//! assert_eq!(model.units_per_gpu, 132); // one unit is one SM
//! let sms: Vec<u32> = model.modules[0].options.iter().map(|o| o.units).collect();
//! // 16 (the profiled 0.1212 = 16/132), 24, …, 128 shared, and the whole GPU alone.
//! assert_eq!(sms.first(), Some(&16));
//! assert_eq!(&sms[sms.len() - 2..], &[128, 132]);
//! assert_eq!(model.modules[0].options[0].time_ms, 800.0);
//! ```

#![warn(missing_docs)]

mod colocations;
mod error;
mod format;
mod model;
pub mod partition;
mod validate;

pub use colocations::{
    load_colocations, parse_colocations, ColocatedModule, Colocation, ColocationFile,
    COLOCATIONS_FORMAT,
};
pub use error::ProfileError;
pub use format::{Device, Interference, ModuleProfile, Nodes, ProfileFile, Sample, FORMAT};
pub use model::{
    ModuleModel, ModuleSet, PerfModel, QuotaOption, MAX_GPUS, MAX_MODULES, MAX_QUOTA_UNITS,
};
pub use partition::{partition_sms, quota_to_sms, sms_for, SmGranularity, SM_QUOTA_TOLERANCE};
pub use validate::{
    load, parse, MAX_INTERFERENCE, MAX_LINK_GBPS, MAX_MEMORY_GIB, MAX_SAMPLE_MS, MIN_LINK_GBPS,
};
