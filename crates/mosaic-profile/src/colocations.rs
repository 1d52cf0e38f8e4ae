//! The `mosaic-colocations/1` file: measured times of modules sharing GPUs, the data the
//! interference coefficients of Eq. 8 are fitted to (Mosaic §3.3, Fig. 8).
//!
//! Each sample is one colocation: two or more modules, each with its data-parallel degree,
//! SM quota and measured iteration time, all of whose replicas share the same GPUs (replica
//! `r` of every module on the sample's GPU `r`, so every GPU hosts the same set of modules).

use std::collections::HashSet;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::ProfileError;
use crate::validate::MAX_SAMPLE_MS;

/// The value of the `format` field of a colocations file.
pub const COLOCATIONS_FORMAT: &str = "mosaic-colocations/1";

/// A set of colocation measurements taken on one device kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColocationFile {
    /// Always [`COLOCATIONS_FORMAT`].
    pub format: String,
    /// The device the measurements were taken on (its profile-file name).
    pub device: String,
    /// Where the measurements come from (simulator, engine), free text; optional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The measurements.
    pub samples: Vec<Colocation>,
}

/// Modules that ran at the same time on the same GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Colocation {
    /// The co-located modules, two or more.
    pub modules: Vec<ColocatedModule>,
}

/// One module of a colocation and its measured time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColocatedModule {
    /// Module name, as in the profile file.
    pub name: String,
    /// Data-parallel degree.
    pub dp: u32,
    /// SM quota on each of its GPUs, in (0, 1].
    pub sm: f64,
    /// Measured iteration time while co-located, in ms.
    pub time_ms: f64,
}

/// Reads and validates the colocations file at `path`.
pub fn load_colocations(path: impl AsRef<Path>) -> Result<ColocationFile, ProfileError> {
    let path = path.as_ref();
    let text = ProfileError::read(path)?;
    parse_colocations(&text, path)
}

/// Parses and validates a colocations file's text; `file` names it in errors.
pub fn parse_colocations(
    text: &str,
    file: impl AsRef<Path>,
) -> Result<ColocationFile, ProfileError> {
    let file = file.as_ref();
    crate::validate::check_format(text, file, COLOCATIONS_FORMAT)?;
    let c: ColocationFile = crate::validate::deserialize(text, file)?;
    let bad = |field: String, msg: &str| Err(ProfileError::invalid(file, field, msg));
    if c.samples.is_empty() {
        return bad("samples".into(), "expected at least one colocation");
    }
    for (i, s) in c.samples.iter().enumerate() {
        if s.modules.len() < 2 {
            return bad(
                format!("samples[{i}].modules"),
                "a colocation needs two or more modules",
            );
        }
        let mut names = HashSet::new();
        for (k, m) in s.modules.iter().enumerate() {
            let f = |x: &str| format!("samples[{i}].modules[{k}].{x}");
            if !names.insert(m.name.as_str()) {
                return bad(
                    f("name"),
                    &format!(
                        "\"{}\" appears twice in one colocation",
                        mosaic_kit::text::name(&m.name)
                    ),
                );
            }
            if m.dp < 1 || m.dp > crate::MAX_GPUS {
                return bad(
                    f("dp"),
                    "expected a data-parallel degree from 1 to 65536 (the largest pool the \
                     planner takes)",
                );
            }
            if !(m.sm.is_finite() && m.sm > 0.0 && m.sm <= 1.0) {
                return bad(f("sm"), "expected an SM quota in (0, 1]");
            }
            // A colocated time is a profiled time slowed down: a profile's range.
            if !(m.time_ms.is_finite() && m.time_ms > 0.0 && m.time_ms <= MAX_SAMPLE_MS) {
                return bad(
                    f("time_ms"),
                    &format!("expected a positive time in ms, at most {MAX_SAMPLE_MS:e}"),
                );
            }
        }
        let total: f64 = s.modules.iter().map(|m| m.sm).sum();
        if total > 1.0 + 1e-6 {
            return bad(
                format!("samples[{i}].modules"),
                &format!("the quotas add up to {total:.3}, more than one GPU"),
            );
        }
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid() -> serde_json::Value {
        serde_json::json!({"format": "mosaic-colocations/1", "device": "H100-SXM5-80GB",
            "samples": [{"modules": [
                {"name": "text", "dp": 1, "sm": 0.4, "time_ms": 12.0},
                {"name": "audio", "dp": 1, "sm": 0.5, "time_ms": 20.0}]}]})
    }

    fn field_of(v: serde_json::Value) -> String {
        let e = parse_colocations(&v.to_string(), "c.json").unwrap_err();
        assert!(e.to_string().starts_with("c.json: "), "{e}");
        e.field().unwrap_or_default().to_string()
    }

    #[test]
    fn valid_file_parses() {
        assert_eq!(
            parse_colocations(&valid().to_string(), "c.json")
                .unwrap()
                .samples
                .len(),
            1
        );
    }

    #[test]
    fn text_after_the_json_value_is_refused() {
        let text = valid().to_string();
        for tail in ["not json at all", "{}", "]"] {
            let e = parse_colocations(&format!("{text}{tail}"), "c.json").unwrap_err();
            assert!(
                e.to_string()
                    .starts_with("c.json: field `(root)`: trailing"),
                "{e}"
            );
        }
        parse_colocations(&format!("{text}\n\n"), "c.json").unwrap();
    }

    #[test]
    fn bad_files_name_the_field() {
        let mut v = valid();
        v["format"] = "mosaic-profiles/1".into();
        assert_eq!(field_of(v), "format");
        let mut v = valid();
        v["samples"][0]["modules"][1]["sm"] = 0.7.into();
        assert_eq!(field_of(v), "samples[0].modules");
        let mut v = valid();
        v["samples"][0]["modules"][1]["name"] = "text".into();
        assert_eq!(field_of(v), "samples[0].modules[1].name");
        let mut v = valid();
        v["samples"][0]["modules"].as_array_mut().unwrap().pop();
        assert_eq!(field_of(v), "samples[0].modules");
        let mut v = valid();
        v["samples"][0]["modules"][0]["time_ms"] = (-1.0).into();
        assert_eq!(field_of(v.clone()), "samples[0].modules[0].time_ms");
        v["samples"][0]["modules"][0]["time_ms"] = (MAX_SAMPLE_MS * 1.001).into();
        assert_eq!(field_of(v), "samples[0].modules[0].time_ms");
        let mut v = valid();
        v["samples"][0]["modules"][0]
            .as_object_mut()
            .unwrap()
            .remove("dp");
        assert_eq!(field_of(v), "samples[0].modules[0]");
        let mut v = valid();
        v["samples"] = serde_json::json!([]);
        assert_eq!(field_of(v), "samples");
    }
}
