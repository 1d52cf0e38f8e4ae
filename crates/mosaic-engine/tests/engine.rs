//! The engine's promises: every parameter learns, the loss falls, the plan does not change the
//! trajectory, a run repeats bit for bit, checkpoints restore it exactly, and bad plans are
//! refused naming the field.

use std::path::Path;

use candle_core::Device;
use mosaic_engine::models::{self, nn::to_f32s};
use mosaic_engine::runtime::checkpoint;
use mosaic_engine::{sequential_plan, EngineError, Model, Schedule, TrainConfig, Trainer};
use mosaic_plan::{Plan, PlanModule, PlanStage};

const CORES: usize = 2;

fn model(name: &str) -> Model {
    models::build(name, 7, &Device::Cpu).unwrap()
}

/// A plan of `stages`, each a list of `(module, dp, sm)`.
fn plan(stages: &[&[(&str, u32, f64)]]) -> Plan {
    let mut p = sequential_plan(&model("clip-tiny"), 1);
    p.stages = stages
        .iter()
        .map(|s| PlanStage {
            time_ms: 0.0,
            gpu_quota: vec![],
            modules: s
                .iter()
                .map(|&(name, dp, sm)| PlanModule {
                    name: name.into(),
                    dp,
                    sm,
                    gpus: (0..dp).collect(),
                    nodes: Vec::new(),
                    time_ms: 0.0,
                    base_ms: 0.0,
                    mem_gib: 0.0,
                })
                .collect(),
        })
        .collect();
    p.gpus = stages
        .iter()
        .flat_map(|s| s.iter().map(|m| m.1))
        .max()
        .unwrap_or(1);
    p
}

fn trainer(name: &str, plan: Option<&Plan>) -> Trainer {
    let m = model(name);
    let schedule = match plan {
        Some(p) => Schedule::from_plan(p, Path::new("test.json"), &m, 16, CORES).unwrap(),
        None => Schedule::sequential(&m, CORES),
    };
    Trainer::new(m, schedule, TrainConfig::default()).unwrap()
}

fn losses(t: &mut Trainer, steps: usize) -> Vec<f32> {
    (0..steps).map(|_| t.step().unwrap().loss).collect()
}

/// A plan with stages, dp 2 and 3, and quotas below 1, for each model.
fn staged(name: &str) -> Plan {
    match name {
        "clip-tiny" => plan(&[
            &[("vision", 2, 0.5), ("text", 2, 0.5)],
            &[("align", 2, 1.0)],
        ]),
        _ => plan(&[
            &[("vision", 2, 0.5), ("audio", 1, 0.3)],
            &[("text", 3, 0.2)],
            &[("backbone", 2, 1.0)],
        ]),
    }
}

#[test]
fn every_parameter_of_every_module_receives_a_gradient() {
    for name in ["clip-tiny", "omni-tiny"] {
        for p in [None, Some(staged(name))] {
            let t = trainer(name, p.as_ref());
            let (loss, grads) = t.gradients().unwrap();
            assert!(loss.is_finite());
            let total: usize = t.model().modules.iter().map(|m| m.params.len()).sum();
            assert_eq!(grads.len(), total);
            for m in &t.model().modules {
                assert!(
                    grads.iter().any(|g| g.module == m.name),
                    "{name}: {}",
                    m.name
                );
            }
            for g in &grads {
                let v = to_f32s(&g.grad).unwrap();
                let norm = v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
                assert!(
                    norm.is_finite() && norm > 0.0,
                    "{name} ({}): {}.{} has gradient norm {norm}",
                    t.schedule().describe(),
                    g.module,
                    g.name
                );
            }
        }
    }
}

#[test]
fn the_loss_falls_on_both_models() {
    let mut bad = vec![];
    for name in ["clip-tiny", "omni-tiny"] {
        let mut t = trainer(name, None);
        let l = losses(&mut t, 40);
        let first = l[..5].iter().sum::<f32>() / 5.0;
        let last = l[35..].iter().sum::<f32>() / 5.0;
        eprintln!("{name}: {:?}", l);
        if last >= 0.6 * first {
            bad.push(format!("{name}: {first} → {last}"));
        }
    }
    assert!(bad.is_empty(), "{bad:?}");
}

#[test]
fn two_plans_give_the_same_trajectory() {
    for name in ["clip-tiny", "omni-tiny"] {
        let a = losses(&mut trainer(name, None), 20);
        let p = staged(name);
        let mut tb = trainer(name, Some(&p));
        assert!(tb.schedule().stages.iter().flatten().any(|x| x.dp() > 1));
        let b = losses(&mut tb, 20);
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            let tol = 1e-4 * x.abs().max(1.0);
            assert!(
                (x - y).abs() <= tol,
                "{name} step {}: {x} by sequential, {y} by {}",
                i + 1,
                tb.schedule().describe()
            );
        }
        eprintln!(
            "{name}: max |Δloss| = {:e}",
            a.iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max)
        );
    }
}

#[test]
fn the_same_plan_repeats_bit_for_bit() {
    for name in ["clip-tiny", "omni-tiny"] {
        let p = staged(name);
        let a = losses(&mut trainer(name, Some(&p)), 5);
        let b = losses(&mut trainer(name, Some(&p)), 5);
        assert_eq!(
            a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            b.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }
}

/// CUDA graphs are a GPU's: on the CPU every module says it launches op by op, and no step
/// reports a replay.
#[test]
fn on_the_cpu_every_module_launches_op_by_op() {
    let mut t = trainer("clip-tiny", Some(&staged("clip-tiny")));
    for _ in 0..3 {
        let r = t.step().unwrap();
        assert!(r.stages.iter().flat_map(|s| &s.modules).all(|m| !m.graphed));
    }
    let launches = t.launches();
    assert_eq!(launches.len(), 3);
    for l in launches {
        assert!(!l.graphed, "{}", l.module);
        assert_eq!(l.how, "op by op: on the CPU", "{}", l.module);
    }
}

#[test]
fn a_checkpoint_restores_the_run_exactly() {
    let dir = std::env::temp_dir().join(format!("mosaic-engine-ckpt-{}", std::process::id()));
    let p = staged("omni-tiny");
    let full = losses(&mut trainer("omni-tiny", Some(&p)), 8);

    let mut first = trainer("omni-tiny", Some(&p));
    losses(&mut first, 5);
    let path = checkpoint::save(&first, &dir).unwrap();
    assert!(!dir.join("checkpoint.safetensors.tmp").exists());
    drop(first);

    let mut resumed = trainer("omni-tiny", Some(&p));
    let meta = checkpoint::load(&mut resumed, &path).unwrap();
    assert_eq!((meta.step, resumed.step_count()), (5, 5));
    let rest = losses(&mut resumed, 3);
    assert_eq!(
        full[5..].iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        rest.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );

    // A checkpoint of another model is refused, naming the field, and changes nothing.
    let mut other = trainer("clip-tiny", None);
    let e = checkpoint::load(&mut other, &path).unwrap_err();
    assert!(
        matches!(&e, EngineError::Checkpoint { field, .. } if field == "model"),
        "{e}"
    );
    assert!(e.is_bad_input());
    assert_eq!(other.step_count(), 0);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_plans_are_refused_naming_the_field() {
    let m = model("clip-tiny");
    let check = |p: Plan, field: &str, words: &str| {
        let e = Schedule::from_plan(&p, Path::new("p.json"), &m, 16, CORES).unwrap_err();
        let text = e.to_string();
        assert!(e.is_bad_input());
        assert!(text.starts_with("p.json: field `"), "{text}");
        assert!(text.contains(&format!("`{field}`")), "{field}: {text}");
        assert!(text.contains(words), "{words}: {text}");
    };
    check(
        plan(&[&[("vision", 1, 0.5), ("txt", 1, 0.5)], &[("align", 1, 1.0)]]),
        "stages[0].modules[1].name",
        "unknown module \"txt\"; engine model clip-tiny has vision, text, align",
    );
    check(
        plan(&[&[("vision", 1, 1.0)], &[("align", 1, 1.0)]]),
        "stages",
        "\"text\" of engine model clip-tiny is not placed",
    );
    check(
        plan(&[&[("vision", 1, 0.3), ("text", 1, 0.3), ("align", 1, 0.3)]]),
        "stages[0].modules[2].name",
        "producers must run in earlier stages",
    );
    check(
        plan(&[
            &[("vision", 1, 0.5), ("text", 1, 0.5)],
            &[("align", 1, 0.5), ("text", 1, 0.5)],
        ]),
        "stages[1].modules[1].name",
        "placed twice",
    );
    check(
        plan(&[
            &[("vision", 1, 0.0), ("text", 1, 0.5)],
            &[("align", 1, 1.0)],
        ]),
        "stages[0].modules[0].sm",
        "outside (0, 1]",
    );
    check(
        plan(&[
            &[("vision", 17, 0.5), ("text", 1, 0.5)],
            &[("align", 1, 1.0)],
        ]),
        "stages[0].modules[0].dp",
        "more replicas than the 16 samples",
    );
    let mut p = plan(&[
        &[("vision", 2, 0.5), ("text", 1, 0.5)],
        &[("align", 1, 1.0)],
    ]);
    p.stages[0].modules[0].gpus = vec![0];
    check(p, "stages[0].modules[0].dp", "dp 2 but 1 GPU(s) listed");
}

#[test]
fn quotas_become_slot_threads() {
    let t = trainer(
        "clip-tiny",
        Some(&plan(&[
            &[("vision", 2, 0.5), ("text", 1, 0.5)],
            &[("align", 1, 1.0)],
        ])),
    );
    let threads: Vec<usize> = t
        .schedule()
        .stages
        .iter()
        .flatten()
        .map(|p| p.threads)
        .collect();
    assert_eq!(threads, [1, 1, 2]);
    assert_eq!(t.slots_created(), 3);
    assert_eq!(
        t.schedule().describe(),
        "[vision×2@1t text@1t] → [align@2t]"
    );
}
