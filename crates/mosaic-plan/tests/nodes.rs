//! Placement that knows nodes: [`embed`] relabels a stage's GPUs so that modules keep to as few
//! nodes as they can, charges what spanning still costs, and the plan file says which nodes.

use std::path::Path;
use std::rc::Rc;
use std::time::Instant;

use mosaic_plan::nodes::{cross_node_ms, embed, nodes_of, Spread};
use mosaic_plan::{parse_plan, Candidate, Placement, Plan, PlanFileError, StageAlloc};
use mosaic_profile::{parse, ModuleSet, PerfModel};
use proptest::prelude::*;

/// A model of `grads.len()` independent modules `m0, m1, …` with those gradient sizes (GiB),
/// on nodes of `gpus_per_node` GPUs (360 GB/s inside, 40 GB/s per NIC across) or on one node.
fn model(gpus_per_node: Option<u32>, grads: &[f64]) -> PerfModel {
    let modules: Vec<String> = grads
        .iter()
        .enumerate()
        .map(|(i, g)| {
            format!(
                r#"{{"name": "m{i}", "after": [], "grad_gib": {g}, "samples": [
                    {{"dp": 1, "sm": 1.0, "time_ms": 100.0, "mem_gib": 1.0, "sm_util": 0.5,
                      "bw_util": 0.2}}]}}"#
            )
        })
        .collect();
    let nodes = gpus_per_node.map_or(String::new(), |n| {
        format!(r#""nodes": {{"gpus_per_node": {n}, "intra_gbps": 360.0, "inter_gbps": 40.0}},"#)
    });
    let text = format!(
        r#"{{"format": "mosaic-profiles/1",
            "device": {{"name": "gpu", "sm_count": 100, "memory_gib": 80.0}}, {nodes}
            "modules": [{}],
            "interference": {{"e1": 0.0, "e2": 0.0, "e3": 0.0}}}}"#,
        modules.join(", ")
    );
    PerfModel::new(&parse(&text, "nodes.json").unwrap(), 0.1, "nodes.json").unwrap()
}

/// Module `module` on `gpus` at `units` tenths of a GPU, `mem_gib` each, taking `time_ms`.
fn placement(module: usize, units: u32, mem_gib: f64, time_ms: f64, gpus: Vec<u32>) -> Placement {
    let dp = gpus.len() as u32;
    Placement {
        module,
        choice: Candidate {
            dp,
            units,
            time_ms,
            mem_gib,
            bw_util: 0.2,
            area: dp * units,
        },
        gpus,
        time_ms,
    }
}

/// The stage of `placements` (module indices must be distinct).
fn stage(placements: Vec<Placement>) -> StageAlloc {
    StageAlloc {
        set: ModuleSet(placements.iter().fold(0, |m, p| m | 1 << p.module)),
        time_ms: placements.iter().map(|p| p.time_ms).fold(0.0, f64::max),
        placements,
    }
}

fn range(r: std::ops::Range<u32>) -> Vec<u32> {
    r.collect()
}

fn spans(p: &Placement, gpus_per_node: u32) -> u32 {
    Spread::of(&p.gpus, gpus_per_node).nodes
}

/// The issue's case: 16 GPUs in nodes of 8, a dp-8 module that StageEval numbered across the
/// node boundary between two dp-4 modules. The embedding puts it in one node, charges
/// nothing, and the plan says which node each module is on.
#[test]
fn a_module_split_across_the_node_boundary_is_moved_into_one_node() {
    let model = model(Some(8), &[1.0, 0.5, 0.5]);
    let split = stage(vec![
        placement(0, 10, 20.0, 100.0, range(4..12)),
        placement(1, 10, 10.0, 80.0, range(0..4)),
        placement(2, 10, 10.0, 90.0, range(12..16)),
    ]);
    // As numbered, the dp-8 module pays for two rings of 4 NICs.
    let charged = cross_node_ms(
        model.nodes.as_ref().unwrap(),
        1.0,
        &split.placements[0].gpus,
    );
    assert!(charged > 5.0, "{charged}");

    let e = embed(&split, &model, 16);
    for p in &e.placements {
        assert_eq!(spans(p, 8), 1, "{p:?}");
        assert_eq!(
            p.time_ms, split.placements[p.module].time_ms,
            "nothing is charged"
        );
    }
    assert_eq!(e.time_ms, 100.0);
    assert_eq!(e.placements[1].gpus.len(), 4);
    assert_eq!(e.set, split.set);

    // The plan lists each module's node; it checks against the model, and a wrong node list
    // is refused naming the field.
    let plan = Plan::new(&model, 16, &[Rc::new(e.clone())], "test", 0.0);
    let listed: Vec<&[u32]> = plan.stages[0]
        .modules
        .iter()
        .map(|m| m.nodes.as_slice())
        .collect();
    assert_eq!(listed.len(), 3);
    assert!(listed.iter().all(|n| n.len() == 1), "{listed:?}");
    assert_ne!(listed[0], listed[1], "the dp-8 module has a node to itself");
    assert_eq!(plan.check(&model), Ok(()));
    let text = serde_json::to_string(&plan).unwrap();
    assert!(text.contains(r#""nodes":["#), "{text}");
    let mut bad = plan.clone();
    bad.stages[0].modules[0].nodes = vec![0, 1];
    let e = bad.check_nodes(Path::new("p.json"), Some(8)).unwrap_err();
    assert_eq!(e.field(), Some("stages[0].modules[0].nodes"));
    assert!(e.to_string().contains("8 GPUs per node"), "{e}");
    assert!(bad.check(&model).unwrap_err().contains("nodes"));
    // Without node information, no node may be listed.
    assert!(bad.check_nodes(Path::new("p.json"), None).is_err());
}

#[test]
fn without_node_information_or_within_one_node_nothing_moves() {
    let split = stage(vec![
        placement(0, 5, 20.0, 100.0, range(4..12)),
        placement(1, 5, 10.0, 80.0, vec![0, 3, 9, 15]),
    ]);
    assert_eq!(embed(&split, &model(None, &[1.0, 1.0]), 16), split);
    assert_eq!(embed(&split, &model(Some(16), &[1.0, 1.0]), 16), split);
    // A plan of such a model lists no nodes, and its file is as before.
    let plan = Plan::new(&model(None, &[1.0, 1.0]), 16, &[Rc::new(split)], "t", 0.0);
    assert!(plan.stages[0].modules.iter().all(|m| m.nodes.is_empty()));
    assert!(!serde_json::to_string(&plan).unwrap().contains("nodes"));
}

#[test]
fn a_placement_already_on_its_nodes_keeps_its_numbers() {
    let model = model(Some(4), &[1.0, 1.0, 0.0]);
    let good = stage(vec![
        placement(0, 5, 1.0, 50.0, range(0..4)),
        placement(1, 5, 1.0, 60.0, range(4..12)),
        placement(2, 5, 1.0, 70.0, vec![4, 6, 7]),
    ]);
    assert_eq!(embed(&good, &model, 12), good);
    // A module without gradient spanning more nodes than it needs is gathered as far as the
    // others allow: on one GPU of each of the other two, it can leave only one of them.
    let mut spread = good.clone();
    spread.placements[2].gpus = vec![1, 6, 11];
    let e = embed(&spread, &model, 12);
    assert_eq!(spans(&e.placements[2], 4), 2, "{e:?}");
    assert_eq!(
        (spans(&e.placements[0], 4), spans(&e.placements[1], 4)),
        (1, 2)
    );
    assert_eq!(e.time_ms, 70.0);
}

/// Three dp-8 modules on 16 GPUs, pairwise overlapping: only one can have a node to itself;
/// it is the one whose spanning costs the most.
#[test]
fn the_costliest_module_wins_when_not_all_fit() {
    // Halves: a = {A, C}, b = {A, B}, c = {B}, d = {C}, 4 GPUs each.
    let (a, b, c, d) = (range(0..4), range(4..8), range(8..12), range(12..16));
    let join = |x: &[u32], y: &[u32]| [x, y].concat();
    for heavy in 0..3 {
        let mut grads = [0.1; 3];
        grads[heavy] = 2.0;
        let model = model(Some(8), &grads);
        let s = stage(vec![
            placement(0, 5, 1.0, 100.0, join(&a, &d)), // A on a + d, split as numbered
            placement(1, 5, 1.0, 100.0, join(&b, &c)), // B on b + c
            placement(2, 5, 1.0, 100.0, join(&a, &c)), // C on a + c... overlaps both
        ]);
        let e = embed(&s, &model, 16);
        assert_eq!(spans(&e.placements[heavy], 8), 1, "heavy {heavy}: {e:?}");
        assert_eq!(e.placements[heavy].time_ms, 100.0);
        assert!(e.time_ms > 100.0, "the others pay for the NICs");
    }
}

/// Two dp-16 modules on 32 GPUs, each shared with four dp-4 modules: the large ones keep to
/// two nodes each, the small ones to one.
#[test]
fn large_modules_keep_to_their_packed_nodes_around_small_ones() {
    let model = model(Some(8), &[4.0, 4.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]);
    // StageEval's numbering, interleaved: L on the even GPUs, M on the odd ones.
    let even: Vec<u32> = (0..16).map(|k| 2 * k).collect();
    let odd: Vec<u32> = (0..16).map(|k| 2 * k + 1).collect();
    let mut ps = vec![
        placement(0, 5, 1.0, 200.0, even.clone()),
        placement(1, 5, 1.0, 200.0, odd.clone()),
    ];
    for k in 0..4 {
        ps.push(placement(
            2 + k,
            5,
            1.0,
            150.0,
            even[4 * k..4 * k + 4].to_vec(),
        ));
        ps.push(placement(
            6 + k,
            5,
            1.0,
            150.0,
            odd[4 * k..4 * k + 4].to_vec(),
        ));
    }
    ps.sort_by_key(|p| p.module);
    let s = stage(ps);
    let e = embed(&s, &model, 32);
    assert_eq!(spans(&e.placements[0], 8), 2);
    assert_eq!(spans(&e.placements[1], 8), 2);
    for p in &e.placements[2..] {
        assert_eq!(spans(p, 8), 1, "{p:?}");
    }
    assert_eq!(e.time_ms, 200.0);
}

#[test]
fn a_thousand_gpus_embed_fast() {
    // 1,024 GPUs, 32 modules of dp 1 to 512 placed pseudo-randomly at a tenth of a GPU each.
    let n = 1024u32;
    let grads: Vec<f64> = (0..32).map(|i| 0.1 * (i % 7) as f64).collect();
    let model = model(Some(8), &grads);
    let mut state = 12345u64;
    let mut next = |k: u32| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 33) % k as u64) as u32
    };
    let ps: Vec<Placement> = (0..32)
        .map(|i| {
            let dp: usize = 1 << (i % 10);
            let mut gpus: Vec<u32> = (0..n).collect();
            for k in 0..dp {
                let j = k + next(n - k as u32) as usize;
                gpus.swap(k, j);
            }
            gpus.truncate(dp);
            gpus.sort_unstable();
            placement(i, 1, 1.0, 100.0 + i as f64, gpus)
        })
        .collect();
    let s = stage(ps);
    let start = Instant::now();
    let e = embed(&s, &model, n);
    let took = start.elapsed();
    assert!(took.as_millis() < 2000, "{took:?}");
    assert_relabelled(&s, &e, n);
}

#[test]
fn node_lists_of_the_wrong_shape_are_refused_when_read() {
    let text = |nodes: &str| {
        format!(
            r#"{{"format": "mosaic-plan/1", "iteration_ms": 10.0, "search": "hand",
                "solve_ms": 0.0, "gpus": 16, "device": "gpu", "granularity": 0.1,
                "stages": [{{"time_ms": 10.0, "gpu_quota": [], "modules": [
                  {{"name": "m0", "dp": 2, "sm": 0.5, "gpus": [3, 12], "nodes": {nodes},
                    "time_ms": 10.0, "base_ms": 10.0, "mem_gib": 1.0}}]}}]}}"#
        )
    };
    let graph = mosaic_plan::ModuleGraph::of(&model(Some(8), &[1.0]));
    let resolve = |nodes: &str| {
        parse_plan(&text(nodes), "p.json")
            .unwrap()
            .resolve(Path::new("p.json"), &graph)
    };
    assert!(resolve("[0, 1]").is_ok());
    assert!(resolve("[]").is_ok());
    for bad in ["[1, 0]", "[0, 0]", "[0, 1, 2]", "[13]"] {
        let e = resolve(bad).unwrap_err();
        assert!(matches!(e, PlanFileError::BadNodes { .. }), "{bad}: {e}");
        assert_eq!(e.field(), Some("stages[0].modules[0].nodes"), "{bad}");
    }
    // Right in shape, wrong for the node size.
    let plan = parse_plan(&text("[0, 3]"), "p.json").unwrap();
    assert!(plan.resolve(Path::new("p.json"), &graph).is_ok());
    assert!(plan.check_nodes(Path::new("p.json"), Some(4)).is_ok());
    assert!(plan.check_nodes(Path::new("p.json"), Some(8)).is_err());
}

/// `after` is `before` relabelled: same modules, candidates and dp; ascending GPUs in the
/// pool; the GPUs' hosted sets, quotas and memory the same multisets; times charged exactly
/// [`cross_node_ms`] and the stage time their largest.
fn assert_relabelled(before: &StageAlloc, after: &StageAlloc, gpus: u32) -> Vec<f64> {
    assert_eq!(before.set, after.set);
    assert_eq!(before.placements.len(), after.placements.len());
    let g = gpus as usize;
    let profile = |s: &StageAlloc| {
        let mut hosts = vec![(0u64, 0u32, 0u64); g];
        for (i, p) in s.placements.iter().enumerate() {
            for &x in &p.gpus {
                let h = &mut hosts[x as usize];
                h.0 |= 1 << i;
                h.1 += p.choice.units;
                h.2 += (p.choice.mem_gib * 1e6).round() as u64;
            }
        }
        hosts.sort_unstable();
        hosts
    };
    assert_eq!(profile(before), profile(after));
    let mut extras = Vec::new();
    for (b, a) in before.placements.iter().zip(&after.placements) {
        assert_eq!((b.module, b.choice), (a.module, a.choice));
        assert_eq!(a.gpus.len(), b.gpus.len());
        assert!(a.gpus.windows(2).all(|w| w[0] < w[1]), "{:?}", a.gpus);
        assert!(a.gpus.iter().all(|&x| x < gpus));
        assert!(a.time_ms >= b.time_ms);
        extras.push(a.time_ms - b.time_ms);
    }
    let stage = after
        .placements
        .iter()
        .map(|p| p.time_ms)
        .fold(0.0, f64::max);
    assert_eq!(after.time_ms, stage);
    extras
}

/// A random stage: `pool` GPUs, modules of random dp, quota, memory and gradient placed on
/// GPUs with quota left (as StageEval would), numbered at random.
#[derive(Debug, Clone)]
struct Case {
    pool: u32,
    gpus_per_node: u32,
    grads: Vec<f64>,
    stage: StageAlloc,
}

fn case() -> impl Strategy<Value = Case> {
    (1u32..=40, 1u32..=9, any::<u64>(), 1usize..=7).prop_map(|(pool, gpn, seed, modules)| {
        let mut state = seed | 1;
        let mut next = |k: u32| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % k.max(1) as u64) as u32
        };
        let mut room = vec![10u32; pool as usize];
        let mut ps = Vec::new();
        let mut grads = Vec::new();
        for _ in 0..modules {
            let units = 1 + next(6);
            let free: Vec<u32> = (0..pool).filter(|&x| room[x as usize] >= units).collect();
            if free.is_empty() {
                continue;
            }
            let m = ps.len();
            grads.push([0.0, 0.25, 1.0, 3.0][next(4) as usize]);
            let dp = 1 + next(free.len() as u32);
            let mut pick = free.clone();
            for k in 0..dp as usize {
                let j = k + next((pick.len() - k) as u32) as usize;
                pick.swap(k, j);
            }
            pick.truncate(dp as usize);
            pick.sort_unstable();
            for &x in &pick {
                room[x as usize] -= units;
            }
            let time = 10.0 + next(100) as f64;
            ps.push(placement(m, units, 0.5 * (1 + next(8)) as f64, time, pick));
        }
        Case {
            pool,
            gpus_per_node: gpn,
            grads,
            stage: stage(ps),
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The embedding is a relabelling charged exactly `cross_node_ms`, never worse than the
    /// input's own numbering, and the plan's `nodes` are its GPUs' nodes.
    #[test]
    fn the_embedding_is_a_charged_relabelling_never_worse_than_the_input(c in case()) {
        let model = model(Some(c.gpus_per_node), &c.grads);
        let nodes = model.nodes.unwrap();
        let e = embed(&c.stage, &model, c.pool);
        let extras = assert_relabelled(&c.stage, &e, c.pool);
        for (p, extra) in e.placements.iter().zip(extras) {
            let want = cross_node_ms(&nodes, c.grads[p.module], &p.gpus);
            prop_assert!((extra - want).abs() <= 1e-9 * want.max(1.0), "{extra} vs {want}");
        }
        let as_numbered = c
            .stage
            .placements
            .iter()
            .map(|p| p.time_ms + cross_node_ms(&nodes, c.grads[p.module], &p.gpus))
            .fold(0.0, f64::max);
        prop_assert!(e.time_ms <= as_numbered, "{} > {as_numbered}", e.time_ms);
        // Embedding the result again (with StageEval's times, uncharged) never undoes it.
        let mut uncharged = e.clone();
        for (p, b) in uncharged.placements.iter_mut().zip(&c.stage.placements) {
            p.time_ms = b.time_ms;
        }
        uncharged.time_ms = c.stage.time_ms;
        let again = embed(&uncharged, &model, c.pool);
        prop_assert!(again.time_ms <= e.time_ms, "{} > {}", again.time_ms, e.time_ms);
        let plan = Plan::new(&model, c.pool, &[Rc::new(e.clone())], "t", 0.0);
        prop_assert_eq!(plan.check(&model), Ok(()));
        for (m, p) in plan.stages[0].modules.iter().zip(&e.placements) {
            prop_assert_eq!(&m.nodes, &nodes_of(&p.gpus, c.gpus_per_node));
        }
    }

    /// Without node information nothing moves and nothing is charged.
    #[test]
    fn without_nodes_the_stage_is_unchanged(c in case()) {
        prop_assert_eq!(embed(&c.stage, &model(None, &c.grads), c.pool), c.stage);
    }

    /// Disjoint modules of power-of-two dp on whole nodes of a power-of-two size all lie on
    /// their packed nodes, whatever their numbering, and pay nothing.
    #[test]
    fn disjoint_power_of_two_modules_lie_on_their_packed_nodes(
        log_gpn in 0u32..=3,
        nodes in 1u32..=5,
        logs in prop::collection::vec(0u32..=5, 1..=8),
        seed in any::<u64>(),
    ) {
        let gpn = 1 << log_gpn;
        let pool = gpn * nodes;
        // Shuffle the pool, then deal out consecutive runs of it.
        let mut order: Vec<u32> = (0..pool).collect();
        let mut state = seed | 1;
        for k in (1..order.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            order.swap(k, (state % (k as u64 + 1)) as usize);
        }
        let mut ps = Vec::new();
        let mut at = 0usize;
        for (m, &l) in logs.iter().enumerate() {
            // The largest power of two up to 2^l that the GPUs left can hold.
            let left = order.len() - at;
            let Some(dp) = (0..=l).rev().map(|k| 1usize << k).find(|&d| d <= left) else {
                break;
            };
            let mut gpus = order[at..at + dp].to_vec();
            gpus.sort_unstable();
            at += dp;
            ps.push(placement(m, 10, 1.0, 100.0, gpus));
        }
        let model = model(Some(gpn), &vec![1.0; logs.len()]);
        let s = stage(ps);
        let e = embed(&s, &model, pool);
        assert_relabelled(&s, &e, pool);
        for p in &e.placements {
            let dp = p.gpus.len() as u32;
            prop_assert_eq!(Spread::of(&p.gpus, gpn), Spread::packed(dp, gpn), "{:?}", p);
        }
        prop_assert_eq!(e.time_ms, 100.0);
    }
}
