//! The simulator's physics, its report and drawings, and its refusals of bad plans.

use std::collections::HashMap;

use mosaic_plan::{Plan, PlanModule, PlanStage, Search, SolveOptions};
use serde_json::Value;

use super::*;
use crate::engine::{run, Placement, StageSpec};

fn zoo(model: &str, cluster: &str) -> (ModelSpec, ClusterSpec) {
    (
        mosaic_zoo::model(model).unwrap(),
        mosaic_zoo::cluster(cluster).unwrap(),
    )
}

fn index(model: &ModelSpec, name: &str) -> usize {
    model.modules.iter().position(|m| m.name == name).unwrap()
}

/// One module of a hand-made plan: name, dp, quota, GPUs.
type Row<'a> = (&'a str, u32, f64, &'a [u32]);

/// A plan of `stages` of (module, dp, sm, GPUs), predicted with the device model alone.
fn hand_plan(model: &ModelSpec, cluster: &ClusterSpec, stages: &[&[Row]]) -> Plan {
    let cal = Calibration::default();
    let stages: Vec<PlanStage> = stages
        .iter()
        .map(|mods| {
            let modules: Vec<PlanModule> = mods
                .iter()
                .map(|&(name, dp, sm, gpus)| {
                    let e = cal.estimate(model, index(model, name), cluster, dp, sm);
                    PlanModule {
                        name: name.into(),
                        dp,
                        sm,
                        gpus: gpus.to_vec(),
                        time_ms: e.time_ms,
                        base_ms: e.time_ms,
                        mem_gib: e.mem_gib,
                    }
                })
                .collect();
            PlanStage {
                time_ms: modules.iter().map(|m| m.time_ms).fold(0.0, f64::max),
                modules,
                gpu_quota: Vec::new(),
            }
        })
        .collect();
    Plan {
        format: mosaic_plan::PLAN_FORMAT.into(),
        iteration_ms: stages.iter().map(|s| s.time_ms).sum(),
        search: "hand".into(),
        solve_ms: 0.0,
        gpus: cluster.gpus(),
        device: cluster.device.name.clone(),
        granularity: 0.1,
        model: Some(model.name.clone()),
        cluster: Some(cluster.name.clone()),
        stages,
    }
}

/// The planner's plan of a zoo model (exact search).
fn planned(model: &ModelSpec, cluster: &ClusterSpec) -> Plan {
    let file = mosaic_zoo::profile(model, cluster);
    let perf = mosaic_profile::PerfModel::new(&file, 0.1, "zoo").unwrap();
    let opts = SolveOptions {
        search: Search::Exact,
        budget: std::time::Duration::from_secs(600),
    };
    mosaic_plan::solve(&perf, cluster.gpus(), &opts).unwrap()
}

const ALL8: &[u32] = &[0, 1, 2, 3, 4, 5, 6, 7];

/// CLIP on one node: both encoders on every GPU, then the head.
fn clip_plan() -> (Plan, ModelSpec, ClusterSpec) {
    let (m, c) = zoo("clip", "h100x8");
    let plan = hand_plan(
        &m,
        &c,
        &[
            &[("vision", 8, 0.7, ALL8), ("text", 8, 0.3, ALL8)],
            &[("align", 1, 0.1, &[0])],
        ],
    );
    (plan, m, c)
}

#[test]
fn a_module_alone_takes_the_device_models_time() {
    let (m, c) = zoo("ofasys", "h100x8");
    let cal = Calibration::default();
    for i in 0..m.modules.len() {
        for sm in [0.1, 0.3, 0.5, 1.0] {
            // One replica: no all-reduce, the device model's time exactly.
            let e = cal.estimate(&m, i, &c, 1, sm);
            let got = colocate(&m, &c, &[(i, 1, sm)])[0];
            assert!(
                (got - e.time_ms).abs() <= 0.01 * e.time_ms,
                "{} at {sm}: simulated {got} vs estimate {}",
                m.modules[i].name,
                e.time_ms
            );
            // Eight replicas: the same step, then the whole ring (the device model hides half
            // of it behind the backward pass).
            let e = cal.estimate(&m, i, &c, 8, sm);
            let got = colocate(&m, &c, &[(i, 8, sm)])[0];
            let compute = e.time_ms - e.comm_ms;
            let ring = if m.modules[i].trainable {
                let bytes = 2.0 * 7.0 / 8.0 * 2.0 * m.modules[i].params as f64;
                let bus = c.nvlink_gbps / 2.0 * 1e9 * cal.link_efficiency;
                (bytes / bus + 14.0 * cal.nvlink_hop_us * 1e-6) * 1e3
            } else {
                0.0
            };
            assert!(
                (got - compute - ring).abs() <= 0.01 * (compute + ring),
                "{} dp 8 at {sm}: {got} vs {compute} + {ring}",
                m.modules[i].name
            );
            assert!(e.comm_ms <= ring + 1e-9);
        }
    }
}

#[test]
fn bandwidth_heavy_modules_slow_each_other_down_compute_bound_ones_barely() {
    let slowdown = |model: &str, a: &str, b: &str| {
        let (m, c) = zoo(model, "h100x8");
        let (a, b) = (index(&m, a), index(&m, b));
        let both = colocate(&m, &c, &[(a, 1, 0.5), (b, 1, 0.5)]);
        let alone = [
            colocate(&m, &c, &[(a, 1, 0.5)])[0],
            colocate(&m, &c, &[(b, 1, 0.5)])[0],
        ];
        assert!(both[0] >= alone[0] * (1.0 - 1e-9) && both[1] >= alone[1] * (1.0 - 1e-9));
        (both[0] / alone[0] - 1.0).max(both[1] / alone[1] - 1.0)
    };
    // OFASys' video and text encoders spend half their time in memory-bound kernels.
    let heavy = slowdown("ofasys", "video", "text");
    // Qwen3-VL's LLM and ViT are matmul-bound.
    let light = slowdown("qwen3-vl", "llm", "vision");
    assert!(heavy > 0.2, "bandwidth-heavy pair: +{:.1}%", 100.0 * heavy);
    assert!(light < 0.06, "compute-bound pair: +{:.1}%", 100.0 * light);
    assert!(heavy > 4.0 * light);
    // A purely memory-bound embedding next to itself: exactly half the bandwidth each.
    let twin = slowdown("qwen3-vl", "text", "text");
    assert!((twin - 1.0).abs() < 0.02, "{twin}");
}

#[test]
fn launch_bound_modules_take_their_launch_floor() {
    let (m, c) = zoo("ofasys", "h100x8");
    let i = index(&m, "box");
    let e = Calibration::default().estimate(&m, i, &c, 1, 0.1);
    assert!(e.launch_ms > e.gemm_ms + e.memory_ms);
    let t = colocate(&m, &c, &[(i, 1, 0.1)])[0];
    assert!((t - e.launch_ms).abs() < 1e-6, "{t} vs {}", e.launch_ms);
}

/// The all-reduce time of `module` on `gpus` of `cluster`, alone or twice (two placements
/// of it sharing the GPUs at half a quota each).
fn allreduce_ms(cluster: &str, module: &str, gpus: &[u32], twice: bool) -> Vec<f64> {
    let (m, c) = zoo("ofasys", cluster);
    let i = index(&m, module);
    let p = Placement {
        module: i,
        dp: gpus.len() as u32,
        sm: 0.5,
        gpus: gpus.to_vec(),
    };
    let placements = if twice { vec![p.clone(), p] } else { vec![p] };
    let out = run(
        &Calibration::default(),
        &m,
        &c,
        &[StageSpec { placements }],
        c.gpus(),
    );
    out.stages[0]
        .modules
        .iter()
        .map(|o| (o.done - o.compute_end) * 1e3)
        .collect()
}

#[test]
fn allreduce_across_nodes_is_slower_than_inside_one() {
    let inside = allreduce_ms("h100x16", "llm", &[0, 1, 2, 3, 4, 5, 6, 7], false)[0];
    let across = allreduce_ms("h100x16", "llm", &[4, 5, 6, 7, 8, 9, 10, 11], false)[0];
    assert!(
        across > 1.5 * inside,
        "inside {inside} ms, across {across} ms"
    );
    // Two nodes of four GPUs: 4 NICs of 50 GB/s × 0.8 = 160 GB/s of bus bandwidth.
    let (m, _) = zoo("ofasys", "h100x16");
    let bytes = 2.0 * 7.0 / 8.0 * 2.0 * m.modules[index(&m, "llm")].params as f64;
    let want = (bytes / 160e9 + 14.0 * 15e-6) * 1e3;
    assert!((across - want).abs() < 1e-3 * want, "{across} vs {want}");
}

#[test]
fn concurrent_allreduces_share_the_links() {
    let all16: Vec<u32> = (0..16).collect();
    let one = allreduce_ms("h100x16", "llm", &all16, false)[0];
    let two = allreduce_ms("h100x16", "llm", &all16, true);
    // Identical modules finish together and split the InfiniBand: about twice as long.
    for t in two {
        assert!(
            (t / one - 2.0).abs() < 0.05,
            "alone {one} ms, shared {t} ms"
        );
    }
    let one = allreduce_ms("h100x8", "llm", ALL8, false)[0];
    let two = allreduce_ms("h100x8", "llm", ALL8, true);
    for t in two {
        assert!(
            (t / one - 2.0).abs() < 0.05,
            "NVLink: alone {one} ms, shared {t} ms"
        );
    }
}

#[test]
fn stages_are_barriers() {
    let (plan, m, c) = clip_plan();
    let r = simulate(&plan, "clip.json", &m, &c).unwrap();
    assert_eq!(r.stages.len(), 2);
    let s0 = &r.stages[0];
    let slowest = s0.modules.iter().map(|m| m.time_ms).fold(0.0, f64::max);
    assert!((s0.time_ms - slowest).abs() < 1e-9);
    assert!((r.stages[1].start_ms - s0.time_ms).abs() < 1e-9);
    assert!((r.iteration_ms - s0.time_ms - r.stages[1].time_ms).abs() < 1e-9);
    // The head starts when the slower encoder's all-reduce ends, not when its GPU is free.
    let head = r.slices.iter().find(|s| s.module == "align").unwrap();
    assert!((head.start_ms - s0.time_ms).abs() < 1e-9);
    let faster = s0
        .modules
        .iter()
        .map(|m| m.time_ms)
        .fold(f64::MAX, f64::min);
    assert!(faster < slowest);
    for s in r.slices.iter().filter(|s| s.stage == 0) {
        assert!(s.end_ms <= s0.time_ms + 1e-9);
    }
}

/// Checks the invariants every report keeps.
fn check_report(r: &SimReport) {
    assert_eq!(r.format, REPORT_FORMAT);
    let sum: f64 = r.stages.iter().map(|s| s.time_ms).sum();
    assert!((sum - r.iteration_ms).abs() < 1e-6 * r.iteration_ms.max(1.0));
    assert!(
        (r.prediction_error - (r.iteration_ms - r.predicted_ms) / r.predicted_ms).abs() < 1e-12
    );
    assert_eq!(r.gpu_utilisation.len(), r.gpus as usize);
    for g in &r.gpu_utilisation {
        assert!(g.utilisation >= 0.0 && g.utilisation <= g.occupancy + 1e-9);
        assert!(g.occupancy <= 1.0 + 1e-9, "{g:?}");
    }
    assert!(r.min_utilisation <= r.mean_utilisation + 1e-12);
    // The timeline averages to the mean utilisation.
    let mean: f64 = r
        .timeline
        .iter()
        .map(|p| p.utilisation * (p.end_ms - p.start_ms))
        .sum::<f64>()
        / r.iteration_ms;
    assert!(
        (mean - r.mean_utilisation).abs() < 1e-6,
        "{mean} vs {}",
        r.mean_utilisation
    );
    // Slices inside the iteration; one lane of one GPU never runs two at once.
    let mut lanes: HashMap<(u32, usize), Vec<(f64, f64)>> = HashMap::new();
    for s in &r.slices {
        assert!(s.start_ms >= -1e-9 && s.end_ms <= r.iteration_ms + 1e-9 && s.start_ms <= s.end_ms);
        assert!(s.offset + s.quota <= 1.0 + 1e-6);
        lanes
            .entry((s.gpu, s.lane))
            .or_default()
            .push((s.start_ms, s.end_ms));
    }
    for v in lanes.values_mut() {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        for w in v.windows(2) {
            assert!(w[0].1 <= w[1].0 + 1e-9, "overlap {w:?}");
        }
    }
    // Every replica has a compute slice; trainable multi-replica modules an all-reduce too.
    for st in &r.stages {
        for m in &st.modules {
            let n = |phase| {
                r.slices
                    .iter()
                    .filter(|s| s.module == m.name && s.phase == phase)
                    .count()
            };
            assert_eq!(n(Phase::Compute), m.dp as usize);
            assert!(n(Phase::Allreduce) == 0 || n(Phase::Allreduce) == m.dp as usize);
            assert!(m.time_ms >= m.alone_ms * (1.0 - 1e-6), "{m:?}");
        }
    }
}

#[test]
fn planner_plans_run_and_reports_are_consistent() {
    for (model, cluster) in [
        ("ofasys", "h100x8"),
        ("clip", "h100x8"),
        ("imagebind", "h100x16"),
    ] {
        let (m, c) = zoo(model, cluster);
        let plan = planned(&m, &c);
        let r = simulate(&plan, "plan.json", &m, &c).unwrap();
        check_report(&r);
        assert!(
            r.mean_utilisation > 0.1 && r.mean_utilisation < 1.0,
            "{model}"
        );
        // The ground truth differs from the planner's formula, but not wildly.
        assert!(
            r.prediction_error.abs() < 0.5,
            "{model}: {}",
            r.prediction_error
        );
        // The report survives JSON.
        let back: SimReport = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back.slices.len(), r.slices.len());
    }
}

#[test]
fn chrome_trace_has_the_event_format() {
    let (plan, m, c) = clip_plan();
    check_trace(&simulate(&plan, "clip.json", &m, &c).unwrap());
    let (m, c) = zoo("ofasys", "h100x32");
    check_trace(&simulate(&planned(&m, &c), "plan.json", &m, &c).unwrap());
}

fn check_trace(r: &SimReport) {
    let t = chrome_trace(r);
    assert_eq!(t["displayTimeUnit"], "ms");
    let events = t["traceEvents"].as_array().unwrap();
    let mut names = HashMap::new();
    let mut busy: HashMap<(u64, u64), Vec<(f64, f64)>> = HashMap::new();
    let mut complete = 0;
    for e in events {
        let ph = e["ph"].as_str().unwrap();
        assert!(e["name"].is_string() && e["pid"].is_u64());
        match ph {
            "M" => {
                if e["name"] == "thread_name" {
                    names.insert(
                        e["tid"].as_u64().unwrap(),
                        e["args"]["name"].as_str().unwrap().to_string(),
                    );
                }
            }
            "X" => {
                complete += 1;
                let (ts, dur) = (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
                assert!(ts >= 0.0 && dur >= 0.0);
                // Viewers keep integer nanoseconds: compare there.
                let (ts, dur) = ((ts * 1e3).round(), (dur * 1e3).round());
                assert!(e["args"]["quota"].is_f64() && e["args"]["stage"].is_u64());
                let phase = e["args"]["phase"].as_str().unwrap();
                assert!(phase == "compute" || phase == "allreduce");
                let key = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
                busy.entry(key).or_default().push((ts, ts + dur));
            }
            "C" | "i" => assert!(e["ts"].is_f64() || e["ts"].is_u64()),
            other => panic!("unexpected phase {other}"),
        }
    }
    assert_eq!(complete, r.slices.len());
    // One named track per GPU; complete events on a track never overlap (the format
    // requires them to nest).
    for g in 0..r.gpus {
        assert!(names.values().any(|n| n == &format!("GPU {g}")), "GPU {g}");
    }
    for ((_, tid), v) in busy.iter_mut() {
        assert!(names.contains_key(tid));
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        for w in v.windows(2) {
            assert!(w[0].1 <= w[1].0, "{w:?}");
        }
    }
    // ts in µs: the iteration's last event ends at iteration_ms × 1000 (here in ns).
    let end = busy.values().flatten().map(|x| x.1).fold(0.0, f64::max);
    assert!((end - r.iteration_ms * 1e6).abs() <= 1.0);
    let text = serde_json::to_string(&t).unwrap();
    let _: Value = serde_json::from_str(&text).unwrap();
}

/// Checks that every tag of an XML document is closed in order (no DTD, no CDATA).
fn assert_balanced(xml: &str) {
    let mut stack: Vec<String> = Vec::new();
    let mut rest = xml;
    while let Some(open) = rest.find('<') {
        let close = rest[open..].find('>').expect("a tag ends") + open;
        let tag = &rest[open + 1..close];
        assert!(!tag.contains('<'), "a '<' inside a tag: {tag}");
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(stack.pop().as_deref(), Some(name.trim()), "close {name}");
        } else if !tag.ends_with('/') {
            let name = tag.split_whitespace().next().unwrap();
            stack.push(name.to_string());
        }
        rest = &rest[close + 1..];
    }
    assert!(stack.is_empty(), "unclosed: {stack:?}");
}

#[test]
fn svg_is_a_well_formed_picture_of_the_plan() {
    let (m, c) = zoo("ofasys", "h100x8");
    let plan = planned(&m, &c);
    let r = simulate(&plan, "plan.json", &m, &c).unwrap();
    let svg = svg(&r);
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert!(svg.trim_end().ends_with("</svg>"));
    assert_balanced(&svg);
    for module in &m.modules {
        assert!(
            svg.contains(&format!(">{}</text>", module.name)),
            "{}",
            module.name
        );
    }
    assert!(svg.contains("stage 1") && svg.contains("GPU 7") && svg.contains("time (ms)"));
    assert!(svg.contains(&format!("{:.1} ms", r.iteration_ms)));
    // One block per slice, each with its tooltip.
    assert_eq!(svg.matches("<title>").count(), r.slices.len());
    // A name that needs escaping stays well formed.
    let mut odd = r.clone();
    odd.model = "a<b&c".into();
    assert_balanced(&super::svg(&odd));
}

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

#[test]
fn bad_plans_are_refused_with_the_field() {
    use SimError as E;
    let field = |e: &SimError| e.field().unwrap().to_string();

    let e = refuse(|p| p.format = "mosaic-plan/0".into(), "h100x8");
    assert!(
        matches!(e, E::Format { .. }) && field(&e) == "format",
        "{e}"
    );

    let e = refuse(|_| {}, "a100x8");
    assert!(
        matches!(e, E::DeviceMismatch { .. }) && field(&e) == "device",
        "{e}"
    );

    let e = refuse(|p| p.gpus = 16, "h100x8");
    assert!(
        matches!(e, E::TooManyGpus { .. }) && field(&e) == "gpus",
        "{e}"
    );

    let e = refuse(|p| p.stages[0].modules[2].name = "videoo".into(), "h100x8");
    assert!(matches!(e, E::UnknownModule { .. }), "{e}");
    assert_eq!(field(&e), "stages[0].modules[2].name");
    assert!(e.to_string().contains("video, audio"), "{e}");

    let e = refuse(|p| drop(p.stages[2].modules.pop()), "h100x8");
    assert!(
        matches!(e, E::MissingModule { ref name, .. } if name == "motion-decoder"),
        "{e}"
    );
    assert_eq!(field(&e), "stages");

    let e = refuse(
        |p| {
            let m = p.stages[2].modules[1].clone();
            p.stages[2].modules.push(m);
        },
        "h100x8",
    );
    assert!(matches!(e, E::DuplicateModule { .. }), "{e}");
    assert_eq!(field(&e), "stages[2].modules[2].name");

    let e = refuse(|p| p.stages[1].modules[0].gpus[3] = 8, "h100x8");
    assert!(
        matches!(
            e,
            E::GpuOutOfRange {
                gpu: 8,
                pool: 8,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(field(&e), "stages[1].modules[0].gpus[3]");

    // A plan for a smaller pool may not use GPUs beyond it.
    let e = refuse(|p| p.gpus = 4, "h100x8");
    assert!(matches!(e, E::GpuOutOfRange { pool: 4, .. }), "{e}");
    assert_eq!(field(&e), "stages[0].modules[1].gpus[0]");

    let e = refuse(|p| p.stages[0].modules[0].gpus[1] = 0, "h100x8");
    assert!(matches!(e, E::RepeatedGpu { gpu: 0, .. }), "{e}");
    assert_eq!(field(&e), "stages[0].modules[0].gpus[1]");

    for bad in [0.0, -0.5, 1.5] {
        let e = refuse(|p| p.stages[2].modules[1].sm = bad, "h100x8");
        assert!(matches!(e, E::BadQuota { .. }), "{e}");
        assert_eq!(field(&e), "stages[2].modules[1].sm");
    }

    // text 0.4 + video 0.5 + box 0.1 = 1.0 on GPUs 0-3; 0.2 more for box breaks GPU 0.
    let e = refuse(|p| p.stages[0].modules[8].sm = 0.3, "h100x8");
    assert!(matches!(e, E::Oversubscribed { gpu: 0, .. }), "{e}");
    assert_eq!(field(&e), "stages[0].modules[8].gpus[0]");

    let e = refuse(|p| p.stages[0].modules[3].dp = 4, "h100x8");
    assert!(matches!(e, E::DpMismatch { dp: 4, gpus: 2, .. }), "{e}");
    assert_eq!(field(&e), "stages[0].modules[3].dp");
    let e = refuse(
        |p| {
            p.stages[0].modules[3].dp = 0;
            p.stages[0].modules[3].gpus.clear();
        },
        "h100x8",
    );
    assert!(matches!(e, E::DpMismatch { dp: 0, .. }), "{e}");

    // The LLM consumes the encoders: it cannot run first.
    let e = refuse(|p| p.stages.swap(0, 1), "h100x8");
    assert!(
        matches!(e, E::Order { ref name, .. } if name == "llm"),
        "{e}"
    );
    assert_eq!(field(&e), "stages[0].modules[0].name");
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

#[test]
fn plan_files_are_read_with_their_name_in_errors() {
    let e = load_plan("/nonexistent/plan.json").unwrap_err();
    assert!(matches!(e, SimError::Io { .. }));
    assert!(e.to_string().contains("/nonexistent/plan.json"), "{e}");

    let e = parse_plan(r#"{"format": "mosaic-profiles/1"}"#, "p.json").unwrap_err();
    assert!(matches!(e, SimError::Format { .. }), "{e}");
    assert!(e.to_string().contains("mosaic-profiles/1"), "{e}");
    let e = parse_plan(r#"{"stages": []}"#, "p.json").unwrap_err();
    assert!(matches!(e, SimError::Format { .. }), "{e}");

    let mut v = serde_json::to_value(ofasys_plan()).unwrap();
    v["stages"][1]["modules"][0]["dp"] = "eight".into();
    let e = parse_plan(&v.to_string(), "p.json").unwrap_err();
    assert!(matches!(e, SimError::Syntax { .. }), "{e}");
    assert_eq!(e.field(), Some("stages[1].modules[0].dp"));
    let e = parse_plan("{not json", "p.json").unwrap_err();
    assert!(matches!(e, SimError::Syntax { .. }), "{e}");
    assert!(e.to_string().starts_with("p.json: "));

    // A good file round-trips.
    let text = serde_json::to_string(&ofasys_plan()).unwrap();
    assert_eq!(parse_plan(&text, "p.json").unwrap(), ofasys_plan());
}

#[test]
#[should_panic(expected = "quotas add up")]
fn colocate_refuses_more_than_a_gpu() {
    let (m, c) = zoo("clip", "h100x8");
    colocate(&m, &c, &[(0, 1, 0.7), (1, 1, 0.7)]);
}
