//! The `mosaic-plan/1` file's owner: reading it names the file and the field, and resolving it
//! against a model refuses every broken rule at the field that breaks it.

use std::path::Path;

use mosaic_plan::{
    load_plan, parse_plan, solve, ModuleGraph, Plan, PlanFileError as E, Search, SolveOptions,
};
use mosaic_profile::{parse, PerfModel};
use proptest::prelude::*;

/// Two encoders and a head after both, each profiled at dp 1 and 2, quotas 0.5 and 1.0.
fn model() -> PerfModel {
    let sample = |dp: u32, sm: f64| {
        format!(
            r#"{{"dp": {dp}, "sm": {sm}, "time_ms": {}, "mem_gib": 1.0, "sm_util": 0.5, "bw_util": 0.2}}"#,
            100.0 / dp as f64
        )
    };
    let samples = [(1, 0.5), (1, 1.0), (2, 0.5), (2, 1.0)]
        .map(|(d, a)| sample(d, a))
        .join(", ");
    let module = |name: &str, after: &str| {
        format!(r#"{{"name": "{name}", "after": [{after}], "samples": [{samples}]}}"#)
    };
    let text = format!(
        r#"{{"format": "mosaic-profiles/1",
            "device": {{"name": "gpu", "sm_count": 100, "memory_gib": 80.0}},
            "modules": [{}, {}, {}],
            "interference": {{"e1": 0.0, "e2": 0.0, "e3": 0.0}}}}"#,
        module("a", ""),
        module("b", ""),
        module("head", r#""a", "b""#)
    );
    PerfModel::new(&parse(&text, "m.json").unwrap(), 0.1, "m.json").unwrap()
}

fn plan(gpus: u32) -> Plan {
    let opts = SolveOptions {
        search: Search::Exact,
        ..Default::default()
    };
    solve(&model(), gpus, &opts).unwrap()
}

fn graph() -> ModuleGraph {
    ModuleGraph::of(&model())
}

/// Resolves `plan` after `edit`, expecting a refusal.
fn refuse(edit: impl FnOnce(&mut Plan)) -> E {
    let mut p = plan(2);
    edit(&mut p);
    p.resolve(Path::new("p.json"), &graph()).unwrap_err()
}

#[test]
fn a_written_plan_reads_back_and_resolves() {
    let p = plan(2);
    let text = serde_json::to_string_pretty(&p).unwrap();
    assert_eq!(parse_plan(&text, "p.json").unwrap(), p);
    let stages = p.resolve(Path::new("p.json"), &graph()).unwrap();
    assert_eq!(stages.len(), p.stages.len());
    for (s, ps) in stages.iter().zip(&p.stages) {
        for (a, m) in s.iter().zip(&ps.modules) {
            assert_eq!(graph().names[a.module], m.name);
            assert_eq!((a.dp, a.sm, &a.gpus), (m.dp, m.sm, &m.gpus));
        }
    }
}

#[test]
fn reading_names_the_file_and_the_field() {
    let e = load_plan("/nonexistent/plan.json").unwrap_err();
    assert!(matches!(e, E::Io { .. }) && e.field().is_none(), "{e}");
    assert_eq!(e.file(), Path::new("/nonexistent/plan.json"));
    assert!(e.to_string().contains("/nonexistent/plan.json"), "{e}");

    let e = parse_plan(r#"{"format": "mosaic-profiles/1"}"#, "p.json").unwrap_err();
    assert!(matches!(e, E::Format { .. }), "{e}");
    assert!(e.to_string().starts_with("p.json: field `format`"), "{e}");
    assert!(e.to_string().contains("mosaic-profiles/1"), "{e}");
    let e = parse_plan(r#"{"stages": []}"#, "p.json").unwrap_err();
    assert!(matches!(e, E::Format { .. }), "{e}");

    let mut v = serde_json::to_value(plan(2)).unwrap();
    v["stages"][0]["modules"][0]["dp"] = "two".into();
    let e = parse_plan(&v.to_string(), "p.json").unwrap_err();
    assert!(matches!(e, E::Syntax { .. }), "{e}");
    assert_eq!(e.field(), Some("stages[0].modules[0].dp"));
    let e = parse_plan("{not json", "p.json").unwrap_err();
    assert!(matches!(e, E::Syntax { .. }), "{e}");
    assert!(e.to_string().starts_with("p.json: "), "{e}");
}

#[test]
fn every_broken_rule_is_refused_at_its_field() {
    let p = plan(2);
    // The exact plan: a and b share the GPUs, then the head.
    assert_eq!(p.stages.len(), 2, "{p:?}");
    let field = |e: &E| e.field().unwrap().to_string();

    let e = refuse(|p| p.format = "mosaic-plan/0".into());
    assert!(
        matches!(e, E::Format { .. }) && field(&e) == "format",
        "{e}"
    );

    let e = refuse(|p| p.stages[0].modules[0].name = "c".into());
    assert!(matches!(e, E::UnknownModule { .. }), "{e}");
    assert_eq!(field(&e), "stages[0].modules[0].name");
    assert!(
        e.to_string().contains("the profiled model has a, b, head"),
        "{e}"
    );

    let e = refuse(|p| {
        let head = p.stages[1].modules[0].clone();
        p.stages[1].modules.push(head);
    });
    assert!(matches!(e, E::DuplicateModule { .. }), "{e}");
    assert_eq!(field(&e), "stages[1].modules[1].name");

    let e = refuse(|p| drop(p.stages.pop()));
    assert!(
        matches!(e, E::MissingModule { ref name, .. } if name == "head"),
        "{e}"
    );
    assert_eq!(field(&e), "stages");

    let e = refuse(|p| p.stages.swap(0, 1));
    assert!(
        matches!(e, E::Order { ref name, .. } if name == "head"),
        "{e}"
    );
    assert_eq!(field(&e), "stages[0].modules[0].name");

    for bad in [0.0, -0.5, 1.5, f64::NAN, 1e-320, 0.0009] {
        let e = refuse(|p| p.stages[1].modules[0].sm = bad);
        assert!(matches!(e, E::BadQuota { .. }), "{e}");
        assert_eq!(field(&e), "stages[1].modules[0].sm");
    }

    let e = refuse(|p| p.stages[1].modules[0].gpus[0] = 2);
    assert!(
        matches!(
            e,
            E::GpuOutOfRange {
                gpu: 2,
                pool: 2,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(field(&e), "stages[1].modules[0].gpus[0]");

    let e = refuse(|p| {
        let m = &mut p.stages[1].modules[0];
        (m.dp, m.gpus) = (2, vec![1, 1]);
    });
    assert!(matches!(e, E::RepeatedGpu { gpu: 1, .. }), "{e}");
    assert_eq!(field(&e), "stages[1].modules[0].gpus[1]");

    let e = refuse(|p| p.stages[1].modules[0].dp += 1);
    assert!(matches!(e, E::DpMismatch { .. }), "{e}");
    assert_eq!(field(&e), "stages[1].modules[0].dp");
    let e = refuse(|p| {
        let m = &mut p.stages[1].modules[0];
        (m.dp, m.gpus) = (0, vec![]);
    });
    assert!(matches!(e, E::DpMismatch { dp: 0, .. }), "{e}");

    for gpus in [0, 4_000_000_000] {
        let e = refuse(|p| p.gpus = gpus);
        assert!(
            matches!(e, E::PoolSize { .. }) && field(&e) == "gpus",
            "{e}"
        );
    }

    // Times and memory that would make the plan's totals infinite or negative.
    for (edit, at) in [
        (
            (|p: &mut Plan| p.stages[1].modules[0].time_ms = f64::MAX) as fn(&mut Plan),
            "stages[1].modules[0].time_ms",
        ),
        (|p| p.stages[0].time_ms = -1.0, "stages[0].time_ms"),
        (|p| p.iteration_ms = f64::INFINITY, "iteration_ms"),
        (
            |p| p.stages[0].modules[1].mem_gib = 1e300,
            "stages[0].modules[1].mem_gib",
        ),
        (|p| p.stages[0].gpu_quota[0] = 2.0, "stages[0].gpu_quota[0]"),
    ] {
        let e = refuse(edit);
        assert!(matches!(e, E::BadNumber { .. }), "{e}");
        assert_eq!(field(&e), at, "{e}");
    }

    // Both encoders on GPU 0 at a whole GPU each.
    let e = refuse(|p| {
        for m in &mut p.stages[0].modules {
            (m.dp, m.sm, m.gpus) = (1, 1.0, vec![0]);
        }
    });
    assert!(matches!(e, E::Oversubscribed { gpu: 0, .. }), "{e}");
    assert_eq!(field(&e), "stages[0].modules[1].gpus[0]");
}

#[test]
fn a_plan_on_a_partitioned_device_counts_whole_sms() {
    // The H100's rule: quotas are 8-SM partitions of its 132 SMs, or all 132 alone.
    let sample = |dp: u32, sms: u32| {
        format!(
            r#"{{"dp": {dp}, "sm": {}, "time_ms": {}, "mem_gib": 1.0, "sm_util": 0.5, "bw_util": 0.2}}"#,
            sms as f64 / 132.0,
            1000.0 / (dp * sms) as f64
        )
    };
    let samples = [(1, 16), (1, 64), (1, 132), (2, 16), (2, 132)]
        .map(|(d, n)| sample(d, n))
        .join(", ");
    let text = format!(
        r#"{{"format": "mosaic-profiles/1",
            "device": {{"name": "H100", "sm_count": 132, "memory_gib": 80.0,
                        "partition": {{"min_sms": 8, "step_sms": 8}}}},
            "modules": [{{"name": "a", "after": [], "samples": [{samples}]}},
                        {{"name": "b", "after": [], "samples": [{samples}]}}],
            "interference": {{"e1": 0.0, "e2": 0.0, "e3": 0.0}}}}"#
    );
    let model = PerfModel::new(&parse(&text, "h.json").unwrap(), 0.1, "h.json").unwrap();
    let p = solve(&model, 2, &SolveOptions::default()).unwrap();
    assert_eq!(p.sm_count, Some(132));
    let read = parse_plan(&serde_json::to_string(&p).unwrap(), "p.json").unwrap();
    assert_eq!(read.sm_count, Some(132));
    read.resolve(Path::new("p.json"), &ModuleGraph::of(&model))
        .unwrap();
    let table = mosaic_plan::render::plan_table(&p, "h");
    assert!(
        table.contains("132 SMs each, quotas in 8-SM partitions"),
        "{table}"
    );
    assert!(table.contains("SMs per GPU: "), "{table}");
    for m in p.stages.iter().flat_map(|s| &s.modules) {
        let sms = m.sm * 132.0;
        assert!((sms - sms.round()).abs() < 1e-4, "{} at {sms} SMs", m.name);
    }
}

#[test]
fn an_sm_count_needs_whole_sms() {
    let field = |e: &E| e.field().unwrap_or("").to_string();
    // The test model's quotas, 0.5 and 1.0, are 50 and 100 of 100 SMs.
    let mut p = plan(2);
    p.sm_count = Some(100);
    p.resolve(Path::new("p.json"), &graph()).unwrap();
    for sm_count in [0, 1_000_000] {
        let e = refuse(|p| p.sm_count = Some(sm_count));
        assert!(matches!(e, E::BadSms { .. }), "{e}");
        assert_eq!(field(&e), "sm_count");
    }
    let e = refuse(|p| {
        p.sm_count = Some(100);
        p.stages[1].modules[0].sm = 0.495;
    });
    assert!(matches!(e, E::BadSms { .. }), "{e}");
    assert_eq!(field(&e), "stages[1].modules[0].sm");
    assert!(e.to_string().contains("49.500 SMs"), "{e}");
}

#[test]
fn check_adds_the_planned_memory() {
    let mut p = plan(2);
    assert_eq!(p.check(&model()), Ok(()));
    p.stages[1].modules[0].mem_gib = 81.0;
    let e = p.check(&model()).unwrap_err();
    assert!(e.contains("needs 81.00 GiB > 80"), "{e}");
}

proptest! {
    /// Whatever the pool, the solver's plans resolve, and every module is assigned once.
    #[test]
    fn solved_plans_resolve(gpus in 1u32..=6) {
        let p = plan(gpus);
        let stages = p.resolve(Path::new("p.json"), &graph()).unwrap();
        let mut seen: Vec<usize> = stages.iter().flatten().map(|a| a.module).collect();
        seen.sort();
        prop_assert_eq!(seen, vec![0, 1, 2]);
    }

    /// Moving one module to a GPU beyond the pool is always refused at that GPU's field.
    #[test]
    fn gpus_beyond_the_pool_are_refused(gpus in 1u32..=6, beyond in 0u32..4) {
        let mut p = plan(gpus);
        p.stages[0].modules[0].gpus[0] = gpus + beyond;
        let e = p.resolve(Path::new("p.json"), &graph()).unwrap_err();
        prop_assert!(matches!(e, E::GpuOutOfRange { .. }), "{}", e);
        prop_assert_eq!(e.field(), Some("stages[0].modules[0].gpus[0]"));
    }
}
