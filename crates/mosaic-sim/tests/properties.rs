//! Property tests of the simulator's ground-truth model (crate docs of `mosaic_sim`) on random
//! plans of the zoo's models: random stage splits (producers in earlier stages), dp, quotas and
//! GPU sets, on one node and across two.
//!
//! - A replica alone on its GPUs takes exactly the device model's time `L`; a module alone in
//!   its stage takes `L` plus its ring all-reduce alone, which is what the report calls
//!   `alone_ms`.
//! - Co-location only slows: no module beats its time alone, a stage is a barrier lasting as
//!   long as its slowest module, the iteration is the sum of the stages.
//! - Without bandwidth pressure (quotas on a GPU within the HBM saturation quota) and without
//!   compute contention, co-located replicas do not slow each other; compute contention acts
//!   only between replicas sharing a GPU; max-min fairness and the `1 + κ·A` rule bound every
//!   slowdown; identical twins share fairly. (An iteration is not monotone in κ — raising it
//!   reshuffles which segments meet — so that is not asserted.)
//! - Determinism and symmetry: the same plan gives the same report; the order of a stage's
//!   modules changes nothing but the drawing.
//! - Reports and traces are consistent: slices of one GPU slot never overlap and lie within the
//!   iteration, utilisations are fractions.
//!
//! The whole file runs in a few seconds; raise the case counts with `PROPTEST_CASES`.

use std::collections::HashMap;

use mosaic_plan::{Plan, PlanModule, PlanStage, PLAN_FORMAT};
use mosaic_sim::{chrome_trace, colocate, simulate_with, SimOptions, SimReport};
use mosaic_zoo::{Calibration, ClusterSpec, ModelSpec};
use proptest::prelude::*;

mod common;
use common::check_report;

/// `default` cases, or `PROPTEST_CASES` when set; failures print the shrunk input and write no
/// regression file. Some drawn plans do not fit in memory and are rejected.
fn config(default: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    ProptestConfig {
        cases,
        max_global_rejects: cases.max(1024),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Relative tolerance of times that the model makes equal: events closer than `1e-9` of their
/// distance are merged (`fluid::stage::due`).
const TOL: f64 = 1e-6;

/// Clusters drawn: one node of H100 (4 and 8 GPUs), one of A100, and two H100 nodes, where
/// rings cross InfiniBand.
const CLUSTERS: &[&str] = &["h100x4", "h100x8", "a100x8", "h100x16"];

/// `a ≈ b` within [`TOL`] of the larger.
fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= TOL * a.abs().max(b.abs()).max(1e-3)
}

// ---------------------------------------------------------------------------------------------
// Random plans
// ---------------------------------------------------------------------------------------------

/// One module's draw: pushed one stage later than its producers allow, its dp (a power of two),
/// its quota in tenths and where on the pool its GPUs start.
#[derive(Debug, Clone, Copy)]
struct Draw {
    later: bool,
    dp_log2: u32,
    tenths: u32,
    first_gpu: u32,
}

fn draw() -> impl Strategy<Value = Draw> {
    (prop::bool::weighted(0.3), 0u32..=4, 1u32..=10, 0u32..16).prop_map(
        |(later, dp_log2, tenths, first_gpu)| Draw {
            later,
            dp_log2,
            tenths,
            first_gpu,
        },
    )
}

/// How a plan may share GPUs.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Sharing {
    /// Quotas on a GPU add up to at most 1.
    Full,
    /// Quotas on a GPU add up to at most this (and each is at most this).
    Within(f64),
    /// No GPU holds two modules of one stage.
    Exclusive,
}

/// A zoo model, a cluster and a plan of the model on the first GPUs of the cluster.
#[derive(Clone)]
struct Case {
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: Plan,
}

/// The plan alone: proptest prints failing inputs with it.
impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl Case {
    /// The plan, one stage a line: `name dp×sm on GPUs` for each module.
    fn describe(&self) -> String {
        let mut s = format!(
            "{} on {} ({} GPUs):",
            self.model.name, self.cluster.name, self.plan.gpus
        );
        for (i, st) in self.plan.stages.iter().enumerate() {
            s += &format!("\n  stage {i}:");
            for m in &st.modules {
                s += &format!(" {} {}×{} on {:?};", m.name, m.dp, m.sm, m.gpus);
            }
        }
        s
    }

    fn simulate(&self, kappa: f64) -> SimReport {
        let opts = SimOptions {
            compute_contention: kappa,
            ..SimOptions::default()
        };
        simulate_with(&self.plan, "prop.json", &self.model, &self.cluster, &opts)
            .unwrap_or_else(|e| panic!("{e}\n{}", self.describe()))
    }
}

/// The modules of `model` in an order where every producer comes before its consumers.
fn topological(model: &ModelSpec) -> Vec<usize> {
    let n = model.modules.len();
    let index = |name: &String| model.modules.iter().position(|m| &m.name == name);
    let mut order = Vec::with_capacity(n);
    while order.len() < n {
        let next = (0..n)
            .find(|&i| {
                !order.contains(&i)
                    && model.modules[i]
                        .after
                        .iter()
                        .filter_map(index)
                        .all(|p| order.contains(&p))
            })
            .expect("the zoo's models are DAGs");
        order.push(next);
    }
    order
}

/// A valid plan of `model` on the first `pool` GPUs of `cluster` from one draw per module
/// (cycled): each module goes to the first stage after its producers' (one later when drawn so)
/// where `dp` GPUs, taken in order from its first GPU round the pool, have the quota and the
/// memory left; `None` when a module does not fit a GPU's memory even alone.
fn build(
    model: &ModelSpec,
    cluster: &ClusterSpec,
    pool: u32,
    draws: &[Draw],
    sharing: Sharing,
) -> Option<Plan> {
    let cal = Calibration::default();
    let max_quota = match sharing {
        Sharing::Within(q) => q,
        _ => 1.0,
    };
    let capacity = cluster.device.memory_gib;
    let mut stage_of: HashMap<&str, usize> = HashMap::new();
    // Per stage: its modules, and per GPU the quota and memory left.
    let mut stages: Vec<(Vec<PlanModule>, Vec<f64>, Vec<f64>)> = Vec::new();
    for (k, &i) in topological(model).iter().enumerate() {
        let d = draws[k % draws.len()];
        let spec = &model.modules[i];
        let dp = (1u32 << d.dp_log2).min(pool);
        let sm = (d.tenths.min((max_quota * 10.0 + 1e-9) as u32).max(1)) as f64 / 10.0;
        let e = cal.estimate(model, i, cluster, dp, sm);
        if e.mem_gib > capacity {
            return None;
        }
        let earliest = spec
            .after
            .iter()
            .map(|p| stage_of[p.as_str()] + 1)
            .max()
            .unwrap_or(0)
            + d.later as usize;
        let mut s = earliest;
        let gpus = loop {
            while stages.len() <= s {
                stages.push((
                    Vec::new(),
                    vec![max_quota; pool as usize],
                    vec![capacity; pool as usize],
                ));
            }
            let (_, quota, mem) = &stages[s];
            let fits: Vec<u32> = (0..pool)
                .map(|j| (d.first_gpu + j) % pool)
                .filter(|&g| quota[g as usize] >= sm - 1e-9 && mem[g as usize] >= e.mem_gib)
                .take(dp as usize)
                .collect();
            if fits.len() == dp as usize {
                break fits;
            }
            s += 1;
        };
        let (modules, quota, mem) = &mut stages[s];
        for &g in &gpus {
            quota[g as usize] = if sharing == Sharing::Exclusive {
                0.0
            } else {
                quota[g as usize] - sm
            };
            mem[g as usize] -= e.mem_gib;
        }
        modules.push(PlanModule {
            name: spec.name.clone(),
            dp,
            sm,
            gpus,
            nodes: Vec::new(),
            time_ms: e.time_ms,
            base_ms: e.time_ms,
            mem_gib: e.mem_gib,
        });
        stage_of.insert(&spec.name, s);
    }
    let stages: Vec<PlanStage> = stages
        .into_iter()
        .filter(|(m, _, _)| !m.is_empty())
        .map(|(modules, _, _)| PlanStage {
            time_ms: modules.iter().map(|m| m.time_ms).fold(0.0, f64::max),
            modules,
            gpu_quota: Vec::new(),
        })
        .collect();
    Some(Plan {
        format: PLAN_FORMAT.into(),
        iteration_ms: stages.iter().map(|s| s.time_ms).sum(),
        search: "hand".into(),
        optimal: false,
        lower_bound_ms: None,
        solve_ms: 0.0,
        gpus: pool,
        device: cluster.device.name.clone(),
        granularity: 0.1,
        sm_count: None,
        model: Some(model.name.clone()),
        cluster: Some(cluster.name.clone()),
        stages,
    })
}

/// Random cases sharing GPUs as `sharing` allows; rejected (by the caller's `prop_assume`)
/// when `None`.
fn cases(sharing: Sharing) -> impl Strategy<Value = Option<Case>> {
    let models = mosaic_zoo::models().len();
    (
        0..models,
        0..CLUSTERS.len(),
        1u32..=16,
        prop::collection::vec(draw(), 12),
    )
        .prop_map(move |(m, c, pool, draws)| {
            let model = mosaic_zoo::models().swap_remove(m);
            let cluster = mosaic_zoo::cluster(CLUSTERS[c]).unwrap();
            let pool = pool.min(cluster.gpus());
            let plan = build(&model, &cluster, pool, &draws, sharing)?;
            Some(Case {
                model,
                cluster,
                plan,
            })
        })
}

// ---------------------------------------------------------------------------------------------
// Oracles written from the crate documentation
// ---------------------------------------------------------------------------------------------

/// The device model's step of `m` alone, `L` (its time without the exposed all-reduce), ms.
fn step_alone_ms(case: &Case, m: &PlanModule) -> f64 {
    let i = case
        .model
        .modules
        .iter()
        .position(|s| s.name == m.name)
        .unwrap();
    let e = Calibration::default().estimate(&case.model, i, &case.cluster, m.dp, m.sm);
    e.time_ms - e.comm_ms
}

/// The ring all-reduce of `m` alone on idle links, ms: `2(d−1)` hops, then `2(d−1)/d × 2 ×
/// params` bytes at NVLink's bus bandwidth, or across nodes at most the InfiniBand of the
/// ring's sparsest node; 0 for a frozen module, one without parameters or one replica.
fn ring_alone_ms(case: &Case, m: &PlanModule) -> f64 {
    let spec = case.model.module(&m.name).unwrap();
    if !spec.trainable || spec.params == 0 || m.dp <= 1 {
        return 0.0;
    }
    let cal = Calibration::default();
    let c = &case.cluster;
    let d = m.dp as f64;
    let bytes = 2.0 * (d - 1.0) / d * 2.0 * spec.params as f64;
    let mut per_node: HashMap<u32, u32> = HashMap::new();
    for &g in &m.gpus {
        *per_node.entry(g / c.gpus_per_node).or_default() += 1;
    }
    let nvlink = c.nvlink_gbps / 2.0 * 1e9 * cal.link_efficiency;
    let (bus, hop_us) = if per_node.len() > 1 {
        let sparsest = *per_node.values().min().unwrap() as f64;
        (
            nvlink.min(c.ib_gbps * 1e9 * cal.link_efficiency * sparsest),
            cal.ib_hop_us,
        )
    } else {
        (nvlink, cal.nvlink_hop_us)
    };
    (bytes / bus + 2.0 * (d - 1.0) * hop_us * 1e-6) * 1e3
}

/// Whether no other module of `stage` shares a GPU with module `k`.
fn has_gpus_to_itself(stage: &PlanStage, k: usize) -> bool {
    let mine = &stage.modules[k].gpus;
    stage
        .modules
        .iter()
        .enumerate()
        .all(|(j, m)| j == k || m.gpus.iter().all(|g| !mine.contains(g)))
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(128))]

    /// "Alone on its quota a replica takes exactly the device model's time, `L`": a module
    /// with its GPUs to itself computes for exactly `L` (neighbours on other GPUs do not
    /// matter; frozen or single-replica modules end there); alone in its stage it takes `L`
    /// plus its ring alone. The report's `alone_ms` is that sum.
    #[test]
    fn a_module_alone_takes_the_device_models_time(case in cases(Sharing::Full)) {
        prop_assume!(case.is_some());
        let case = case.unwrap();
        let r = case.simulate(mosaic_sim::COMPUTE_CONTENTION);
        let why = case.describe();
        for (ps, st) in case.plan.stages.iter().zip(&r.stages) {
            for (k, (pm, m)) in ps.modules.iter().zip(&st.modules).enumerate() {
                let step = step_alone_ms(&case, pm);
                let ring = ring_alone_ms(&case, pm);
                prop_assert!(close(m.alone_ms, step + ring),
                    "{}: alone {} ms, want L {step} + ring {ring}\n{why}", pm.name, m.alone_ms);
                if has_gpus_to_itself(ps, k) {
                    prop_assert!(close(m.compute_ms, step),
                        "{}: computes {} ms alone on its GPUs, L = {step}\n{why}",
                        pm.name, m.compute_ms);
                    if ring == 0.0 {
                        prop_assert!(close(m.time_ms, step), "{}: {m:?}\n{why}", pm.name);
                    }
                }
                if ps.modules.len() == 1 {
                    prop_assert!(close(m.time_ms, step + ring),
                        "{}: {} ms alone in its stage, want {}\n{why}",
                        pm.name, m.time_ms, step + ring);
                }
            }
        }
    }

    /// "Slowed by its neighbours, the larger of its slowed GPU work and `L`" (links shared too),
    /// and "a stage ends when its slowest module's all-reduce ends; the next stage starts
    /// then": every module computes for at least `L` and takes at least its time alone, a
    /// stage lasts as long as its slowest module (so at least its slowest module alone) and
    /// starts when the previous one ends, and the iteration is the sum of the stages.
    #[test]
    fn co_location_only_slows_and_stages_are_barriers(case in cases(Sharing::Full)) {
        prop_assume!(case.is_some());
        let case = case.unwrap();
        let r = case.simulate(mosaic_sim::COMPUTE_CONTENTION);
        let why = case.describe();
        prop_assert_eq!(r.stages.len(), case.plan.stages.len());
        let mut start = 0.0;
        for (ps, st) in case.plan.stages.iter().zip(&r.stages) {
            prop_assert!(close(st.start_ms, start), "stage {} starts at {} ms, not {start}\n{why}",
                st.index, st.start_ms);
            let mut slowest = 0.0f64;
            let mut slowest_alone = 0.0f64;
            for (pm, m) in ps.modules.iter().zip(&st.modules) {
                let step = step_alone_ms(&case, pm);
                let alone = step + ring_alone_ms(&case, pm);
                prop_assert!(m.compute_ms >= step * (1.0 - TOL),
                    "{} computes {} ms < L {step}\n{why}", pm.name, m.compute_ms);
                prop_assert!(m.time_ms >= alone * (1.0 - TOL),
                    "{} takes {} ms < {alone} alone\n{why}", pm.name, m.time_ms);
                prop_assert!(m.allreduce_ms >= -TOL && m.slowdown >= -TOL, "{m:?}\n{why}");
                prop_assert!(close(m.compute_ms + m.allreduce_ms, m.time_ms), "{m:?}");
                slowest = slowest.max(m.time_ms);
                slowest_alone = slowest_alone.max(alone);
            }
            prop_assert!(close(st.time_ms, slowest),
                "stage {} lasts {} ms, its slowest module {slowest}\n{why}", st.index, st.time_ms);
            prop_assert!(st.time_ms >= slowest_alone * (1.0 - TOL));
            start += st.time_ms;
        }
        prop_assert!(close(r.iteration_ms, start),
            "iteration {} ms, stages add up to {start}\n{why}", r.iteration_ms);
    }

    /// The same input gives the identical report (and trace); no stage's module order matters
    /// to the model: reversing every stage's modules changes no module's times (only lanes).
    #[test]
    fn reports_are_deterministic_and_ignore_module_order(case in cases(Sharing::Full)) {
        prop_assume!(case.is_some());
        let case = case.unwrap();
        let a = case.simulate(mosaic_sim::COMPUTE_CONTENTION);
        let b = case.simulate(mosaic_sim::COMPUTE_CONTENTION);
        prop_assert!(a == b, "two runs differ\n{}", case.describe());
        prop_assert_eq!(chrome_trace(&a), chrome_trace(&b));

        let mut reversed = case.clone();
        for st in &mut reversed.plan.stages {
            st.modules.reverse();
        }
        let c = reversed.simulate(mosaic_sim::COMPUTE_CONTENTION);
        let why = case.describe();
        prop_assert!(close(a.iteration_ms, c.iteration_ms),
            "iteration {} ms, {} with stages reversed\n{why}", a.iteration_ms, c.iteration_ms);
        for (sa, sc) in a.stages.iter().zip(&c.stages) {
            for m in &sa.modules {
                let n = sc.modules.iter().find(|n| n.name == m.name).unwrap();
                prop_assert!(close(m.compute_ms, n.compute_ms) && close(m.time_ms, n.time_ms),
                    "{}: {m:?} vs {n:?} reversed\n{why}", m.name);
            }
        }
    }

    /// Report and trace consistency: the invariants every report keeps (`check_report`:
    /// slices within the iteration, one lane never running two at once, utilisation ≤
    /// occupancy ≤ 1, the timeline averaging to the mean), fractions everywhere, and the
    /// Chrome trace's complete events of one thread (a GPU slot) never overlapping and lying
    /// within the iteration.
    #[test]
    fn reports_and_traces_are_consistent(case in cases(Sharing::Full)) {
        prop_assume!(case.is_some());
        let case = case.unwrap();
        let r = case.simulate(mosaic_sim::COMPUTE_CONTENTION);
        check_report(&r);
        let why = case.describe();
        let fraction = |x: f64| (-1e-9..=1.0 + 1e-9).contains(&x);
        prop_assert!(fraction(r.mean_utilisation) && fraction(r.min_utilisation)
            && fraction(r.mean_occupancy), "{why}");
        for p in &r.timeline {
            prop_assert!(fraction(p.utilisation) && fraction(p.occupancy), "{p:?}\n{why}");
            prop_assert!(p.utilisation <= p.occupancy + 1e-9, "{p:?}\n{why}");
        }
        let replicas: usize = case.plan.stages.iter().flat_map(|s| &s.modules)
            .map(|m| m.dp as usize).sum();
        prop_assert_eq!(
            r.slices.iter().filter(|s| s.phase == mosaic_sim::Phase::Compute).count(), replicas);

        let trace = chrome_trace(&r);
        let end_us = r.iteration_ms * 1e3;
        let mut threads: HashMap<(u64, u64), Vec<(f64, f64)>> = HashMap::new();
        for e in trace["traceEvents"].as_array().unwrap() {
            if e["ph"] != "X" {
                continue;
            }
            let (ts, dur) = (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
            prop_assert!(ts >= 0.0 && dur >= 0.0 && ts + dur <= end_us + 1e-3, "{e}\n{why}");
            threads
                .entry((e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()))
                .or_default()
                .push((ts, ts + dur));
        }
        for (thread, v) in &mut threads {
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            for w in v.windows(2) {
                prop_assert!(w[0].1 <= w[1].0 + 1e-6, "thread {thread:?} overlaps: {w:?}\n{why}");
            }
        }
    }

    /// "κ = 0 turns it off, leaving HBM bandwidth the only shared resource", and max-min fair
    /// sharing gives everyone its demand when the demands fit: with quotas on every GPU adding
    /// up to at most the saturation quota `a_sat` (so the segments' caps `BW × a / a_sat` add
    /// up to at most `BW`), co-located replicas do not slow each other and every module
    /// computes for exactly `L`.
    #[test]
    fn without_contention_or_bandwidth_pressure_co_location_is_free(
        case in cases(Sharing::Within(
            (Calibration::default().bw_saturation * 10.0).floor() / 10.0)),
    ) {
        prop_assume!(case.is_some());
        let case = case.unwrap();
        let r = case.simulate(0.0);
        let why = case.describe();
        for (ps, st) in case.plan.stages.iter().zip(&r.stages) {
            for (pm, m) in ps.modules.iter().zip(&st.modules) {
                let step = step_alone_ms(&case, pm);
                prop_assert!(close(m.compute_ms, step),
                    "{} computes {} ms, L = {step}\n{why}", pm.name, m.compute_ms);
            }
        }
    }

    /// "What green contexts do not partition … slows replicas computing side by side": compute
    /// contention acts only between replicas on one GPU, so a plan that never shares a GPU
    /// gives the same report whatever κ.
    #[test]
    fn contention_needs_a_shared_gpu(
        case in cases(Sharing::Exclusive),
        kappa in 0.0f64..4.0,
    ) {
        prop_assume!(case.is_some());
        let case = case.unwrap();
        let a = case.simulate(0.0);
        let b = case.simulate(kappa);
        prop_assert!(a == b, "κ = {kappa} changes a plan without shared GPUs\n{}", case.describe());
    }

    /// Sharing is bounded by the model's two rules. Max-min fairness gives each of the `k`
    /// segments on a GPU at least `min(demand, BW / k)`, and a matmul segment slows by `1 +
    /// κ·A`, `A` at most the other quotas `Q − a` on its GPU; so every segment takes at most
    /// `F = max(1 + κ·(Q − a), k·min(1, a / a_sat))` times its time alone and, the host
    /// releasing chunk `j` at `j·L/n`, a replica computes for at most `F·L`. (Raising κ is
    /// not monotone: it reshuffles which segments meet, and an iteration can get slightly
    /// faster, so only this bound is asserted.)
    #[test]
    fn contention_is_bounded(case in cases(Sharing::Full), kappa in 0.0f64..2.0) {
        prop_assume!(case.is_some());
        let case = case.unwrap();
        let r = case.simulate(kappa);
        let a_sat = Calibration::default().bw_saturation;
        let why = case.describe();
        for (ps, st) in case.plan.stages.iter().zip(&r.stages) {
            let mut quota = vec![0.0; case.plan.gpus as usize];
            let mut count = vec![0.0; case.plan.gpus as usize];
            for m in &ps.modules {
                for &g in &m.gpus {
                    quota[g as usize] += m.sm;
                    count[g as usize] += 1.0;
                }
            }
            for (pm, m) in ps.modules.iter().zip(&st.modules) {
                let a = pm.sm;
                let f = pm.gpus.iter().map(|&g| {
                    let (q, k) = (quota[g as usize], count[g as usize]);
                    (1.0 + kappa * (q - a)).max(k * (a / a_sat).min(1.0))
                }).fold(1.0, f64::max);
                let step = step_alone_ms(&case, pm);
                prop_assert!(m.compute_ms <= f * step * (1.0 + TOL),
                    "κ {kappa}: {} computes {} ms > {f} × L {step}\n{why}", pm.name, m.compute_ms);
            }
        }
    }

    /// Max-min fairness is symmetric and co-location only slows: two identical replicas side
    /// by side on one GPU (and their rings on the same links) finish together, no sooner than
    /// one alone, and no later than twice that (each gets at least half the bandwidth and its
    /// compute slows by `1 + κ·a` < 2).
    #[test]
    fn identical_twins_share_fairly(
        m in 0..mosaic_zoo::models().len(),
        module in 0usize..16,
        dp_log2 in 0u32..=3,
        tenths in 1u32..=5,
    ) {
        let model = mosaic_zoo::models().swap_remove(m);
        let cluster = mosaic_zoo::cluster("h100x8").unwrap();
        let module = module % model.modules.len();
        let (dp, sm) = (1 << dp_log2, tenths as f64 / 10.0);
        let alone = colocate(&model, &cluster, &[(module, dp, sm)])[0];
        let twins = colocate(&model, &cluster, &[(module, dp, sm), (module, dp, sm)]);
        let what = format!("{} {} × {sm}", model.modules[module].name, dp);
        prop_assert!(close(twins[0], twins[1]), "{what}: twins {twins:?}");
        prop_assert!(twins[0] >= alone * (1.0 - TOL), "{what}: twins {twins:?}, alone {alone}");
        prop_assert!(twins[0] <= 2.0 * alone * (1.0 + TOL), "{what}: twins {twins:?}, alone {alone}");
    }
}
