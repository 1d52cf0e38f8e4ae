//! Reading a profile file and checking that it describes a valid model.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use crate::error::ProfileError;
use crate::format::{Device, Interference, ModuleProfile, Nodes, ProfileFile, Sample, FORMAT};
use crate::model::MAX_MODULES;
use crate::partition::whole_sms;

/// Reads and validates the profile file at `path`.
pub fn load(path: impl AsRef<Path>) -> Result<ProfileFile, ProfileError> {
    let path = path.as_ref();
    let text = ProfileError::read(path)?;
    parse(&text, path)
}

/// Parses and validates a profile file's text; `file` names it in errors.
pub fn parse(text: &str, file: impl AsRef<Path>) -> Result<ProfileFile, ProfileError> {
    let file = file.as_ref();
    check_format(text, file, FORMAT)?;
    let profiles: ProfileFile = deserialize(text, file)?;
    validate(&profiles, file)?;
    Ok(profiles)
}

/// Checks the `format` field first, so that a file of another format gets that error and not
/// a confusing complaint about its fields.
pub(crate) fn check_format(text: &str, file: &Path, expected: &str) -> Result<(), ProfileError> {
    if let Ok(serde_json::Value::Object(map)) = serde_json::from_str::<serde_json::Value>(text) {
        match map.get("format") {
            Some(serde_json::Value::String(f)) if f == expected => {}
            Some(other) => {
                return Err(ProfileError::invalid(
                    file,
                    "format",
                    format!(
                        "expected \"{expected}\", found {}",
                        mosaic_kit::text::name(&other.to_string())
                    ),
                ))
            }
            None => {
                return Err(ProfileError::invalid(
                    file,
                    "format",
                    format!("missing; expected \"{expected}\""),
                ))
            }
        }
    }
    Ok(())
}

/// Deserialises `text`, naming the path of the offending field on error.
pub(crate) fn deserialize<T: serde::de::DeserializeOwned>(
    text: &str,
    file: &Path,
) -> Result<T, ProfileError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| ProfileError::Syntax {
        file: file.to_path_buf(),
        field: match e.path().to_string() {
            p if p == "." => "(root)".to_string(),
            p => p,
        },
        message: e.inner().to_string(),
    })?;
    // One JSON value and nothing after it but whitespace.
    de.end().map_err(|e| ProfileError::Syntax {
        file: file.to_path_buf(),
        field: "(root)".into(),
        message: format!("{e}; expected nothing but whitespace after the file's JSON object"),
    })?;
    Ok(value)
}

/// `Ok` if `ok`, else the error `msg` on the field named by `field`.
fn check(
    ok: bool,
    file: &Path,
    field: impl FnOnce() -> String,
    msg: &str,
) -> Result<(), ProfileError> {
    if ok {
        Ok(())
    } else {
        Err(ProfileError::invalid(file, field(), msg))
    }
}

/// Whether `x` is finite and in [`lo`, `hi`].
fn finite_in(x: f64, lo: f64, hi: f64) -> bool {
    x.is_finite() && x >= lo && x <= hi
}

/// Checks everything serde cannot: ranges, unique names, known edges, an acyclic graph.
fn validate(p: &ProfileFile, file: &Path) -> Result<(), ProfileError> {
    check_device(&p.device, file)?;
    if let Some(nodes) = &p.nodes {
        check_nodes(nodes, file)?;
    }
    check_module_count(p, file)?;
    let index = index_names(p, file)?;
    for (i, m) in p.modules.iter().enumerate() {
        check_after(i, m, &index, file)?;
        check_samples(i, m, &p.device, file)?;
        check_grad(i, m, file)?;
    }
    check_interference(&p.interference, file)?;
    check_acyclic(p, &index, file)
}

/// Checks that the device has SMs and a positive, finite memory capacity.
fn check_device(d: &Device, file: &Path) -> Result<(), ProfileError> {
    check(
        d.sm_count > 0 && d.sm_count <= crate::MAX_QUOTA_UNITS,
        file,
        || "device.sm_count".into(),
        "expected an SM count from 1 to 10,000",
    )?;
    check(
        d.memory_gib.is_finite() && d.memory_gib > 0.0 && d.memory_gib <= MAX_MEMORY_GIB,
        file,
        || "device.memory_gib".into(),
        &format!("expected a positive capacity in GiB, at most {MAX_MEMORY_GIB:e}"),
    )?;
    if let Some(g) = d.partition {
        check(
            g.min_sms >= 1 && g.step_sms >= 1,
            file,
            || "device.partition".into(),
            "expected min_sms and step_sms of at least 1",
        )?;
        check(
            g.largest_within(d.sm_count).is_some(),
            file,
            || "device.partition".into(),
            &format!(
                "a partition of at least {} SMs does not fit the device's {} SMs",
                g.min_sms, d.sm_count
            ),
        )?;
    }
    Ok(())
}

/// The largest all-reduce bandwidth a profile may state, GB/s per GPU (NVLink 5 is 900 GB/s
/// both directions; this leaves two orders of magnitude).
pub const MAX_LINK_GBPS: f64 = 1e5;

/// The smallest all-reduce bandwidth a profile may state, GB/s per GPU: 8 Gb/s, below any
/// GPU cluster's interconnect. With `MAX_GRAD_GIB` it bounds a cross-node charge at
/// 2 × 4,096 GiB / 1 GB/s ≈ 8.8·10⁶ ms, so a plan's times stay within what a plan file holds.
pub const MIN_LINK_GBPS: f64 = 1.0;

/// The largest gradient a module may all-reduce per step, GiB (two trillion bf16 parameters
/// are about 3,700 GiB).
pub(crate) const MAX_GRAD_GIB: f64 = 4096.0;

/// Checks the node size and the two all-reduce bandwidths.
fn check_nodes(n: &Nodes, file: &Path) -> Result<(), ProfileError> {
    check(
        n.gpus_per_node >= 1 && n.gpus_per_node <= crate::MAX_GPUS,
        file,
        || "nodes.gpus_per_node".into(),
        &format!(
            "expected GPUs per node from 1 to {} (the largest pool the planner takes)",
            crate::MAX_GPUS
        ),
    )?;
    for (name, v) in [("intra_gbps", n.intra_gbps), ("inter_gbps", n.inter_gbps)] {
        check(
            finite_in(v, MIN_LINK_GBPS, MAX_LINK_GBPS),
            file,
            || format!("nodes.{name}"),
            &format!("expected a bandwidth in GB/s from {MIN_LINK_GBPS} to {MAX_LINK_GBPS:e}"),
        )?;
    }
    Ok(())
}

/// Checks module `i`'s gradient size, when it has one.
fn check_grad(i: usize, m: &ModuleProfile, file: &Path) -> Result<(), ProfileError> {
    match m.grad_gib {
        Some(g) => check(
            finite_in(g, 0.0, MAX_GRAD_GIB),
            file,
            || format!("modules[{i}].grad_gib"),
            &format!("expected a non-negative, finite size in GiB, at most {MAX_GRAD_GIB}"),
        ),
        None => Ok(()),
    }
}

/// Checks that there is at least one module and no more than `MAX_MODULES`.
fn check_module_count(p: &ProfileFile, file: &Path) -> Result<(), ProfileError> {
    check(
        !p.modules.is_empty(),
        file,
        || "modules".into(),
        "expected at least one module",
    )?;
    check(
        p.modules.len() <= MAX_MODULES,
        file,
        || "modules".into(),
        &format!(
            "at most {MAX_MODULES} modules are supported, found {}",
            p.modules.len()
        ),
    )
}

/// Maps each module name to its index, rejecting empty and duplicate names.
fn index_names<'a>(
    p: &'a ProfileFile,
    file: &Path,
) -> Result<HashMap<&'a str, usize>, ProfileError> {
    let mut index = HashMap::new();
    for (i, m) in p.modules.iter().enumerate() {
        check(
            !m.name.is_empty(),
            file,
            || format!("modules[{i}].name"),
            "expected a non-empty name",
        )?;
        if let Some(j) = index.insert(m.name.as_str(), i) {
            return Err(ProfileError::invalid(
                file,
                format!("modules[{i}].name"),
                format!(
                    "duplicate module name \"{}\" (also modules[{j}])",
                    mosaic_kit::text::name(&m.name)
                ),
            ));
        }
    }
    Ok(index)
}

/// Checks that module `i`'s `after` edges name known, other, distinct modules.
fn check_after(
    i: usize,
    m: &ModuleProfile,
    index: &HashMap<&str, usize>,
    file: &Path,
) -> Result<(), ProfileError> {
    let mut seen = HashSet::new();
    for (k, a) in m.after.iter().enumerate() {
        let field = || format!("modules[{i}].after[{k}]");
        check(
            index.contains_key(a.as_str()),
            file,
            field,
            &format!("unknown module \"{}\"", mosaic_kit::text::name(a)),
        )?;
        check(
            a != &m.name,
            file,
            field,
            "a module cannot come after itself",
        )?;
        check(
            seen.insert(a),
            file,
            field,
            &format!("\"{}\" is listed twice", mosaic_kit::text::name(a)),
        )?;
    }
    Ok(())
}

/// Checks that module `i` has samples, each in range and at a distinct (dp, sm) point; on a
/// device with a partition rule, every quota must be a whole number of SMs.
fn check_samples(i: usize, m: &ModuleProfile, d: &Device, file: &Path) -> Result<(), ProfileError> {
    check(
        !m.samples.is_empty(),
        file,
        || format!("modules[{i}].samples"),
        "expected at least one sample",
    )?;
    let mut grid = HashSet::new();
    for (k, s) in m.samples.iter().enumerate() {
        check_sample_ranges(s, file, |name| format!("modules[{i}].samples[{k}].{name}"))?;
        let point = match d.partition {
            Some(_) => whole_sms(s.sm, d.sm_count, file, || {
                format!("modules[{i}].samples[{k}].sm")
            })? as i64,
            None => (s.sm * 1e6).round() as i64,
        };
        check(
            grid.insert((s.dp, point)),
            file,
            || format!("modules[{i}].samples[{k}]"),
            &format!("duplicate sample at dp {} sm {}", s.dp, s.sm),
        )?;
    }
    Ok(())
}

/// Checks each field of one sample against its range; `f` names a field in errors.
fn check_sample_ranges(
    s: &Sample,
    file: &Path,
    f: impl Fn(&str) -> String,
) -> Result<(), ProfileError> {
    check(
        s.dp >= 1 && s.dp <= crate::MAX_GPUS,
        file,
        || f("dp"),
        "expected a data-parallel degree from 1 to 65536 (the largest pool the planner takes)",
    )?;
    check(
        s.sm.is_finite() && s.sm > 0.0 && s.sm <= 1.0,
        file,
        || f("sm"),
        "expected an SM quota in (0, 1]",
    )?;
    check(
        s.time_ms.is_finite() && s.time_ms > 0.0 && s.time_ms <= MAX_SAMPLE_MS,
        file,
        || f("time_ms"),
        &format!("expected a positive time in ms, at most {MAX_SAMPLE_MS:e}"),
    )?;
    check(
        finite_in(s.mem_gib, 0.0, MAX_MEMORY_GIB),
        file,
        || f("mem_gib"),
        &format!("expected a non-negative memory in GiB, at most {MAX_MEMORY_GIB:e}"),
    )?;
    check(
        finite_in(s.sm_util, 0.0, 1.0),
        file,
        || f("sm_util"),
        "expected a utilisation in [0, 1]",
    )?;
    check(
        finite_in(s.bw_util, 0.0, 1.0),
        file,
        || f("bw_util"),
        "expected a utilisation in [0, 1]",
    )
}

/// The longest time a sample may state, in ms (about 2.8 hours for one module's iteration).
/// With [`MAX_INTERFERENCE`], 64 modules in 64 stages stay below 5·10¹² ms, within what a plan
/// file holds.
pub const MAX_SAMPLE_MS: f64 = 1e7;
/// The largest interference coefficient: a slowdown of 100× per unit of bandwidth is far past
/// any measured colocation (the zoo assumes e3 = 0.6).
pub const MAX_INTERFERENCE: f64 = 100.0;
/// The largest memory a sample or a device may state, in GiB (a plan file's limit).
pub const MAX_MEMORY_GIB: f64 = 1e6;

/// Checks that the interference coefficients are non-negative and at most [`MAX_INTERFERENCE`].
fn check_interference(e: &Interference, file: &Path) -> Result<(), ProfileError> {
    for (name, v) in [("e1", e.e1), ("e2", e.e2), ("e3", e.e3)] {
        check(
            finite_in(v, 0.0, MAX_INTERFERENCE),
            file,
            || format!("interference.{name}"),
            &format!(
                "expected a non-negative coefficient (colocation never speeds a module up), at \
                 most {MAX_INTERFERENCE}"
            ),
        )?;
    }
    Ok(())
}

/// Rejects `after` edges that form a cycle, naming the modules on it.
fn check_acyclic(
    p: &ProfileFile,
    index: &HashMap<&str, usize>,
    file: &Path,
) -> Result<(), ProfileError> {
    if let Some(cycle) = find_cycle(p, index) {
        let i = index[cycle[0].as_str()];
        return Err(ProfileError::invalid(
            file,
            format!("modules[{i}].after"),
            format!(
                "the `after` edges form a cycle: {}",
                cycle
                    .iter()
                    .map(|n| mosaic_kit::text::name(n))
                    .collect::<Vec<_>>()
                    .join(" -> ")
            ),
        ));
    }
    Ok(())
}

/// A cycle of module names (first repeated at the end), if the `after` edges have one.
fn find_cycle(p: &ProfileFile, index: &HashMap<&str, usize>) -> Option<Vec<String>> {
    // Iterative DFS with colours: 0 new, 1 on the stack, 2 done.
    let n = p.modules.len();
    let mut colour = vec![0u8; n];
    for root in 0..n {
        if colour[root] != 0 {
            continue;
        }
        let mut stack = vec![(root, 0usize)];
        colour[root] = 1;
        while let Some(&mut (v, ref mut k)) = stack.last_mut() {
            if let Some(parent) = p.modules[v].after.get(*k) {
                *k += 1;
                let u = index[parent.as_str()];
                match colour[u] {
                    0 => {
                        colour[u] = 1;
                        stack.push((u, 0));
                    }
                    1 => {
                        let start = stack.iter().position(|&(w, _)| w == u).unwrap_or(0);
                        // Edges point from consumer to producer; report producer -> consumer.
                        let mut names: Vec<String> = stack[start..]
                            .iter()
                            .map(|&(w, _)| p.modules[w].name.clone())
                            .collect();
                        names.reverse();
                        names.push(names[0].clone());
                        return Some(names);
                    }
                    _ => {}
                }
            } else {
                colour[v] = 2;
                stack.pop();
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A valid two-module file; tests break one thing at a time.
    fn valid() -> serde_json::Value {
        serde_json::json!({
            "format": "mosaic-profiles/1",
            "device": {"name": "H100-SXM5-80GB", "sm_count": 132, "memory_gib": 80.0},
            "modules": [
                {"name": "vision", "after": [], "samples": [
                    {"dp": 1, "sm": 0.5, "time_ms": 10.0, "mem_gib": 5.0, "sm_util": 0.9, "bw_util": 0.2},
                    {"dp": 1, "sm": 1.0, "time_ms": 6.0, "mem_gib": 5.0, "sm_util": 0.8, "bw_util": 0.3}]},
                {"name": "llm", "after": ["vision"], "samples": [
                    {"dp": 1, "sm": 1.0, "time_ms": 50.0, "mem_gib": 40.0, "sm_util": 0.9, "bw_util": 0.4}]}],
            "interference": {"e1": 0.01, "e2": 0.1, "e3": 0.2}
        })
    }

    /// The error of parsing `v`, as (field, message).
    fn error_of(v: serde_json::Value) -> (String, String) {
        let e = parse(&v.to_string(), "bad.json").expect_err("must be rejected");
        let text = e.to_string();
        assert!(
            text.starts_with("bad.json: "),
            "error names the file: {text}"
        );
        (e.field().unwrap_or_default().to_string(), text)
    }

    #[test]
    fn valid_file_parses() {
        let p = parse(&valid().to_string(), "ok.json").unwrap();
        assert_eq!(p.modules.len(), 2);
    }

    #[test]
    fn wrong_or_missing_format() {
        let mut v = valid();
        v["format"] = "mosaic-profiles/2".into();
        assert_eq!(error_of(v).0, "format");
        let mut v = valid();
        v.as_object_mut().unwrap().remove("format");
        assert_eq!(error_of(v).0, "format");
    }

    #[test]
    fn missing_field_is_named_with_its_path() {
        let mut v = valid();
        v["modules"][1]["samples"][0]
            .as_object_mut()
            .unwrap()
            .remove("time_ms");
        let (field, text) = error_of(v);
        assert_eq!(field, "modules[1].samples[0]");
        assert!(text.contains("time_ms"), "{text}");
    }

    #[test]
    fn wrong_type_is_named() {
        let mut v = valid();
        v["device"]["sm_count"] = "many".into();
        assert_eq!(error_of(v).0, "device.sm_count");
    }

    #[test]
    fn unknown_field_is_rejected() {
        let mut v = valid();
        v["modules"][0]["afterr"] = serde_json::json!([]);
        assert!(error_of(v).1.contains("afterr"));
    }

    #[test]
    fn cycle_is_reported_with_its_modules() {
        let mut v = valid();
        v["modules"][0]["after"] = serde_json::json!(["llm"]);
        let (field, text) = error_of(v);
        assert!(field.ends_with(".after"), "{field}");
        assert!(
            text.contains("cycle") && text.contains("vision") && text.contains("llm"),
            "{text}"
        );
    }

    #[test]
    fn unknown_and_self_edges() {
        let mut v = valid();
        v["modules"][1]["after"] = serde_json::json!(["audio"]);
        let (field, text) = error_of(v);
        assert_eq!(field, "modules[1].after[0]");
        assert!(text.contains("unknown module \"audio\""), "{text}");
        let mut v = valid();
        v["modules"][1]["after"] = serde_json::json!(["llm"]);
        assert_eq!(error_of(v).0, "modules[1].after[0]");
    }

    #[test]
    fn text_after_the_json_value_is_refused() {
        let text = valid().to_string();
        for tail in ["not json at all", "{}", "]", "0"] {
            let e = parse(&format!("{text}\n{tail}\n"), "bad.json").unwrap_err();
            assert_eq!(e.field(), Some("(root)"), "{e}");
            assert!(e.to_string().starts_with("bad.json: "), "{e}");
            assert!(e.to_string().contains("trailing characters"), "{e}");
        }
        parse(&format!("{text} \n\t\r\n"), "ok.json").unwrap();
    }

    #[test]
    fn huge_names_are_quoted_clipped() {
        let huge = "v".repeat(1_000_000);
        let mut v = valid();
        v["modules"][1]["name"] = huge.as_str().into();
        v["modules"][0]["name"] = huge.as_str().into();
        let mut after = valid();
        after["modules"][1]["after"] = serde_json::json!([huge]);
        let mut format = valid();
        format["format"] = huge.as_str().into();
        let mut number = valid();
        number["device"]["sm_count"] = huge.as_str().into();
        for v in [v, after, format, number] {
            let (_, text) = error_of(v);
            assert!(text.len() < 1_200, "{} bytes: {}", text.len(), &text[..200]);
        }
    }

    #[test]
    fn duplicate_name() {
        let mut v = valid();
        v["modules"][1]["name"] = "vision".into();
        let (field, text) = error_of(v);
        assert_eq!(field, "modules[1].name");
        assert!(text.contains("duplicate"), "{text}");
    }

    #[test]
    fn quota_outside_unit_interval() {
        for bad in [0.0, -0.1, 1.5] {
            let mut v = valid();
            v["modules"][0]["samples"][0]["sm"] = bad.into();
            assert_eq!(error_of(v).0, "modules[0].samples[0].sm");
        }
    }

    #[test]
    fn other_ranges() {
        let cases: [(&str, serde_json::Value); 7] = [
            ("dp", 0.into()),
            ("time_ms", (-1.0).into()),
            ("time_ms", 1.1e7.into()),
            ("mem_gib", (-2.0).into()),
            ("mem_gib", 1e300.into()),
            ("bw_util", 1.2.into()),
            ("sm_util", (-0.5).into()),
        ];
        for (name, bad) in cases {
            let mut v = valid();
            v["modules"][0]["samples"][1][name] = bad;
            assert_eq!(error_of(v).0, format!("modules[0].samples[1].{name}"));
        }
        for bad in [-0.1, 101.0, 1e300] {
            let mut v = valid();
            v["interference"]["e2"] = bad.into();
            assert_eq!(error_of(v).0, "interference.e2");
        }
        for bad in [0.0, 2e6] {
            let mut v = valid();
            v["device"]["memory_gib"] = bad.into();
            assert_eq!(error_of(v).0, "device.memory_gib");
        }
    }

    #[test]
    fn duplicate_sample_and_empty_lists() {
        let mut v = valid();
        let s = v["modules"][0]["samples"][0].clone();
        v["modules"][0]["samples"][1] = s;
        assert_eq!(error_of(v).0, "modules[0].samples[1]");
        let mut v = valid();
        v["modules"][0]["samples"] = serde_json::json!([]);
        assert_eq!(error_of(v).0, "modules[0].samples");
        let mut v = valid();
        v["modules"] = serde_json::json!([]);
        assert_eq!(error_of(v).0, "modules");
    }

    #[test]
    fn module_that_fits_on_no_gpu() {
        let mut v = valid();
        v["modules"][1]["samples"][0]["mem_gib"] = 120.0.into();
        let p = parse(&v.to_string(), "big.json").unwrap();
        let e = crate::PerfModel::new(&p, 0.1, "big.json").unwrap_err();
        assert_eq!(e.field(), Some("modules[1].samples"));
        assert!(e.to_string().contains("fits on no GPU"), "{e}");
    }

    #[test]
    fn granularity_must_divide_one() {
        let p = parse(&valid().to_string(), "ok.json").unwrap();
        for bad in [0.0, 0.3, 1.5, -0.1] {
            let e = crate::PerfModel::new(&p, bad, "ok.json").unwrap_err();
            assert_eq!(e.field(), Some("granularity"));
        }
        assert!(crate::PerfModel::new(&p, 0.05, "ok.json").is_ok());
    }

    /// `valid()` on a device with Hopper's partition rule and quotas at whole SMs.
    fn partitioned() -> serde_json::Value {
        let mut v = valid();
        v["device"]["partition"] = serde_json::json!({"min_sms": 8, "step_sms": 8});
        v["modules"][0]["samples"][0]["sm"] = 0.4848.into(); // 64 / 132, as files round it
        v
    }

    #[test]
    fn a_partition_rule_parses_and_needs_whole_sm_quotas() {
        let p = parse(&partitioned().to_string(), "ok.json").unwrap();
        assert_eq!(
            p.device.partition,
            Some(crate::SmGranularity {
                min_sms: 8,
                step_sms: 8
            })
        );
        // 0.5 of 132 is 66 SMs: a whole number, accepted (the planner interpolates from it).
        let mut v = partitioned();
        v["modules"][0]["samples"][0]["sm"] = 0.5.into();
        assert!(parse(&v.to_string(), "ok.json").is_ok());
        // 0.1 of 132 is 13.2 SMs: refused, naming the field.
        let mut v = partitioned();
        v["modules"][0]["samples"][0]["sm"] = 0.1.into();
        let (field, text) = error_of(v);
        assert_eq!(field, "modules[0].samples[0].sm");
        assert!(text.contains("13.200 SMs"), "{text}");
        // 16/132 written twice, rounded differently, is one sample point.
        let mut v = partitioned();
        v["modules"][0]["samples"][0]["sm"] = 0.1212.into();
        v["modules"][0]["samples"][1]["sm"] = (16.0 / 132.0).into();
        assert_eq!(error_of(v).0, "modules[0].samples[1]");
    }

    #[test]
    fn a_bad_partition_rule_is_refused() {
        for bad in [
            serde_json::json!({"min_sms": 0, "step_sms": 8}),
            serde_json::json!({"min_sms": 8, "step_sms": 0}),
            serde_json::json!({"min_sms": 256, "step_sms": 8}),
        ] {
            let mut v = partitioned();
            v["device"]["partition"] = bad;
            assert_eq!(error_of(v).0, "device.partition");
        }
        let mut v = partitioned();
        v["device"]["partition"] = serde_json::json!({"min_sms": 8, "step": 8});
        let (field, text) = error_of(v);
        assert!(field.starts_with("device.partition"), "{field}");
        assert!(text.contains("unknown field `step`"), "{text}");
    }

    /// `valid()` on nodes of 8 GPUs, with both modules' gradient sizes.
    fn with_nodes() -> serde_json::Value {
        let mut v = valid();
        v["nodes"] =
            serde_json::json!({"gpus_per_node": 8, "intra_gbps": 360.0, "inter_gbps": 40.0});
        v["modules"][0]["grad_gib"] = 0.5.into();
        v["modules"][1]["grad_gib"] = 0.0.into();
        v
    }

    #[test]
    fn nodes_and_gradient_sizes_parse_and_are_optional() {
        let p = parse(&with_nodes().to_string(), "ok.json").unwrap();
        assert_eq!(
            p.nodes,
            Some(Nodes {
                gpus_per_node: 8,
                intra_gbps: 360.0,
                inter_gbps: 40.0
            })
        );
        assert_eq!(p.modules[0].grad_gib, Some(0.5));
        // A file without them reads as one node, and writes back without them.
        let p = parse(&valid().to_string(), "old.json").unwrap();
        assert_eq!((p.nodes, p.modules[0].grad_gib), (None, None));
        let text = serde_json::to_string(&p).unwrap();
        assert!(
            !text.contains("nodes") && !text.contains("grad_gib"),
            "{text}"
        );
        assert_eq!(parse(&text, "again.json").unwrap(), p);
    }

    #[test]
    fn bad_nodes_are_refused_naming_the_field() {
        let cases: [(&str, serde_json::Value); 9] = [
            ("gpus_per_node", 0.into()),
            ("gpus_per_node", (crate::MAX_GPUS + 1).into()),
            ("intra_gbps", 0.0.into()),
            ("intra_gbps", (-1.0).into()),
            ("intra_gbps", 1e6.into()),
            ("inter_gbps", 0.0.into()),
            ("inter_gbps", (-40.0).into()),
            ("inter_gbps", 2e5.into()),
            ("inter_gbps", 1e300.into()),
        ];
        for (name, bad) in cases {
            let mut v = with_nodes();
            v["nodes"][name] = bad.clone();
            let (field, text) = error_of(v);
            assert_eq!(field, format!("nodes.{name}"), "{bad}: {text}");
        }
        // Missing, unknown and mistyped fields are named too.
        let mut v = with_nodes();
        v["nodes"].as_object_mut().unwrap().remove("inter_gbps");
        let (field, text) = error_of(v);
        assert_eq!(field, "nodes");
        assert!(text.contains("inter_gbps"), "{text}");
        let mut v = with_nodes();
        v["nodes"]["ib_gbps"] = 50.0.into();
        assert!(error_of(v).1.contains("unknown field `ib_gbps`"));
        let mut v = with_nodes();
        v["nodes"]["gpus_per_node"] = 2.5.into();
        assert_eq!(error_of(v).0, "nodes.gpus_per_node");
        // JSON has no NaN or infinity: `null` is a type error on the field.
        let mut v = with_nodes();
        v["nodes"]["intra_gbps"] = serde_json::Value::Null;
        assert_eq!(error_of(v).0, "nodes.intra_gbps");
    }

    #[test]
    fn bad_gradient_sizes_are_refused_naming_the_module() {
        for bad in [-0.5, -1e-9, 1e7, 1e300] {
            let mut v = with_nodes();
            v["modules"][1]["grad_gib"] = bad.into();
            let (field, text) = error_of(v);
            assert_eq!(field, "modules[1].grad_gib", "{bad}: {text}");
            assert!(text.contains("GiB"), "{text}");
        }
        let mut v = with_nodes();
        v["modules"][0]["grad_gib"] = "big".into();
        assert_eq!(error_of(v).0, "modules[0].grad_gib");
    }

    #[test]
    fn not_json_at_all() {
        let e = parse("{not json", "garbage.json").unwrap_err();
        assert!(e.to_string().starts_with("garbage.json: "), "{e}");
    }

    #[test]
    fn unreadable_file() {
        let e = load("/nonexistent/profiles.json").unwrap_err();
        assert!(e.to_string().contains("/nonexistent/profiles.json"), "{e}");
    }
}
