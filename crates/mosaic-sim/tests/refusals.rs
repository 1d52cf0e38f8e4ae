//! Refusals of bad plans: every violation is named with its file and field.

use mosaic_plan::{Plan, PlanFileError, PlanFileError as P};
use mosaic_sim::{simulate, SimError};

mod common;
use common::{check_report, hand_plan, zoo, ALL8};

/// Simulates a variant of the OFASys plan and returns its error.
fn refuse(edit: impl FnOnce(&mut Plan), cluster: &str) -> SimError {
    let (m, _) = zoo("ofasys", "h100x8");
    let c = mosaic_zoo::cluster(cluster).unwrap();
    let mut plan = ofasys_plan();
    edit(&mut plan);
    let e = simulate(&plan, "bad.json", &m, &c).unwrap_err();
    assert!(e.to_string().starts_with("bad.json: "), "{e}");
    e
}

/// A fixed OFASys plan on 8 GPUs (the planner's shape).
fn ofasys_plan() -> Plan {
    let (m, c) = zoo("ofasys", "h100x8");
    hand_plan(
        &m,
        &c,
        &[
            &[
                ("text", 4, 0.4, &[0, 1, 2, 3]),
                ("vision", 4, 0.3, &[4, 5, 6, 7]),
                ("video", 8, 0.5, ALL8),
                ("audio", 2, 0.2, &[4, 5]),
                ("depth", 1, 0.1, &[6]),
                ("thermal", 1, 0.1, &[7]),
                ("imu", 1, 0.1, &[6]),
                ("action", 1, 0.1, &[7]),
                ("box", 4, 0.1, &[0, 1, 2, 3]),
            ],
            &[("llm", 8, 1.0, ALL8)],
            &[
                ("speech-decoder", 1, 0.3, &[0]),
                ("motion-decoder", 1, 0.1, &[1]),
            ],
        ],
    )
}

#[test]
fn the_good_plan_runs() {
    let (m, c) = zoo("ofasys", "h100x8");
    let r = simulate(&ofasys_plan(), "good.json", &m, &c).unwrap();
    check_report(&r);
}

/// A plan's `nodes` must be the nodes of its GPUs on the cluster it runs on: a plan made for
/// another node size is refused, naming the field.
#[test]
fn node_lists_must_match_the_clusters_nodes() {
    let (m, c) = zoo("ofasys", "h100x8");
    let mut plan = ofasys_plan();
    plan.stages[0].modules[0].nodes = vec![0];
    assert!(simulate(&plan, "good.json", &m, &c).is_ok());
    let e = refuse(|p| p.stages[0].modules[0].nodes = vec![1], "h100x8");
    assert!(matches!(&e, SimError::Plan(P::BadNodes { .. })), "{e}");
    assert_eq!(e.field(), Some("stages[0].modules[0].nodes"));
    assert!(e.to_string().contains("8 GPUs per node"), "{e}");
}

#[test]
fn plans_for_another_cluster_are_refused_with_the_field() {
    let e = refuse(|_| {}, "a100x8");
    assert!(matches!(e, SimError::DeviceMismatch { .. }), "{e}");
    assert_eq!(e.field(), Some("device"));

    let e = refuse(|p| p.gpus = 16, "h100x8");
    assert!(matches!(e, SimError::TooManyGpus { .. }), "{e}");
    assert_eq!(e.field(), Some("gpus"));
}

/// The plan file's own rules are `mosaic_plan`'s (its tests check each one); the simulator
/// passes their errors on, with the file and the field, on a real model.
#[test]
fn plan_file_refusals_surface_with_the_field() {
    type Edit = fn(&mut Plan);
    type Expected = fn(&PlanFileError) -> bool;
    let cases: [(Edit, &str, Expected); 9] = [
        (
            |p| p.format = "mosaic-plan/0".into(),
            "format",
            |e| matches!(e, P::Format { .. }),
        ),
        (
            |p| p.stages[0].modules[2].name = "videoo".into(),
            "stages[0].modules[2].name",
            |e| matches!(e, P::UnknownModule { known, .. } if known.contains("video, audio")),
        ),
        (
            |p| drop(p.stages[2].modules.pop()),
            "stages",
            |e| matches!(e, P::MissingModule { name, .. } if name == "motion-decoder"),
        ),
        (
            |p| {
                let m = p.stages[2].modules[1].clone();
                p.stages[2].modules.push(m);
            },
            "stages[2].modules[2].name",
            |e| matches!(e, P::DuplicateModule { .. }),
        ),
        (
            |p| p.stages[1].modules[0].gpus[3] = 8,
            "stages[1].modules[0].gpus[3]",
            |e| {
                matches!(
                    e,
                    P::GpuOutOfRange {
                        gpu: 8,
                        pool: 8,
                        ..
                    }
                )
            },
        ),
        // A plan for a smaller pool than the cluster may not use GPUs beyond it.
        (
            |p| p.gpus = 4,
            "stages[0].modules[1].gpus[0]",
            |e| matches!(e, P::GpuOutOfRange { pool: 4, .. }),
        ),
        // text 0.4 + video 0.5 + box 0.1 = 1.0 on GPUs 0-3; 0.2 more for box breaks GPU 0.
        (
            |p| p.stages[0].modules[8].sm = 0.3,
            "stages[0].modules[8].gpus[0]",
            |e| matches!(e, P::Oversubscribed { gpu: 0, .. }),
        ),
        (
            |p| p.stages[0].modules[3].dp = 4,
            "stages[0].modules[3].dp",
            |e| matches!(e, P::DpMismatch { dp: 4, gpus: 2, .. }),
        ),
        // The LLM consumes the encoders: it cannot run first.
        (
            |p| p.stages.swap(0, 1),
            "stages[0].modules[0].name",
            |e| matches!(e, P::Order { name, .. } if name == "llm"),
        ),
    ];
    for (edit, field, expected) in cases {
        let e = refuse(edit, "h100x8");
        assert!(matches!(&e, SimError::Plan(p) if expected(p)), "{e}");
        assert_eq!(e.field(), Some(field), "{e}");
    }
}

#[test]
fn a_plan_that_does_not_fit_in_memory_is_refused() {
    let (m, c) = zoo("qwen3-vl", "h100x8");
    // The 8B LLM with its optimizer state on one GPU.
    let plan = hand_plan(
        &m,
        &c,
        &[
            &[("vision", 8, 0.5, ALL8), ("text", 8, 0.5, ALL8)],
            &[("llm", 1, 1.0, &[0])],
        ],
    );
    let e = simulate(&plan, "big.json", &m, &c).unwrap_err();
    assert!(matches!(e, SimError::OutOfMemory { gpu: 0, .. }), "{e}");
    assert_eq!(e.field(), Some("stages[1]"));
}
