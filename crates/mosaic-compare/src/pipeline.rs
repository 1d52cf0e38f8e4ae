//! The disaggregated strategies: module groups on disjoint sets of whole GPUs, running at the
//! same time on different data — DistTrain (a 1F1B pipeline over microbatches) and FlowTrain
//! (decoupled producers and consumers).
//!
//! Their shared conventions are in the crate docs ("Disaggregated strategies").

use mosaic_profile::{ModuleSet, PerfModel, QuotaOption};

use crate::common::{round_ms, whole_gpu_all, Ledger};
use crate::roles::roles;
use crate::{CompareError, CompareOptions, Shape, Strategy, StrategyResult};

/// Microbatch counts DistTrain may use when the global batch is unknown: 1, 2, 4, 8.
pub const DEFAULT_MAX_MICROBATCHES: u32 = 8;

/// A group's modules in topological order.
fn ordered(model: &PerfModel, set: ModuleSet) -> Vec<usize> {
    model
        .topo_order
        .iter()
        .copied()
        .filter(|&m| set.contains(m))
        .collect()
}

/// One group on `x` GPUs: per module its chosen option, and the group's time.
#[derive(Debug, Clone)]
struct GroupRun {
    modules: Vec<(usize, QuotaOption)>,
    gpus: u32,
    time_ms: f64,
}

/// The best time of a group on 1..=gpus GPUs (index x − 1), each module at its fastest
/// dp ≤ min(x, cap) under `cost`; `None` where some module has no such option.
fn group_table(
    modules: &[usize],
    whole: &[Vec<QuotaOption>],
    gpus: u32,
    cap: u32,
    cost: &dyn Fn(&QuotaOption) -> f64,
) -> Vec<Option<GroupRun>> {
    (1..=gpus)
        .map(|x| {
            let limit = x.min(cap);
            let mut time = 0.0;
            let mut chosen = Vec::with_capacity(modules.len());
            for &m in modules {
                let best = whole[m]
                    .iter()
                    .filter(|o| o.dp <= limit)
                    .min_by(|a, b| cost(a).total_cmp(&cost(b)).then(a.dp.cmp(&b.dp)))?;
                time += cost(best);
                chosen.push((m, *best));
            }
            Some(GroupRun {
                modules: chosen,
                gpus: x,
                time_ms: time,
            })
        })
        .collect()
}

/// The fewest GPUs giving the same time as `x` GPUs (tables are non-increasing in x).
fn shrink(table: &[Option<GroupRun>], x: u32) -> Option<&GroupRun> {
    let t = table[x as usize - 1].as_ref()?.time_ms;
    table[..x as usize]
        .iter()
        .flatten()
        .find(|r| r.time_ms <= t)
}

/// All splits of `gpus` over `tables.len()` groups as described in the module docs.
fn splits(tables: &[Vec<Option<GroupRun>>], gpus: u32) -> Vec<Vec<&GroupRun>> {
    fn go<'t>(
        tables: &'t [Vec<Option<GroupRun>>],
        left: u32,
        acc: &mut Vec<&'t GroupRun>,
        out: &mut Vec<Vec<&'t GroupRun>>,
    ) {
        let k = acc.len();
        let groups_after = (tables.len() - k - 1) as u32;
        if groups_after == 0 {
            if let Some(r) = shrink(&tables[k], left) {
                acc.push(r);
                out.push(acc.clone());
                acc.pop();
            }
            return;
        }
        for x in 1..=left.saturating_sub(groups_after) {
            // Only the fewest GPUs per time: a larger x with the same time takes GPUs from the
            // later groups for nothing.
            if let Some(r) = shrink(&tables[k], x).filter(|r| r.gpus == x) {
                acc.push(r);
                go(tables, left - x, acc, out);
                acc.pop();
            }
        }
    }
    let mut out = Vec::new();
    if tables.is_empty() || (tables.len() as u32) > gpus {
        return out;
    }
    go(tables, gpus, &mut Vec::new(), &mut out);
    out
}

/// The groupings to try, by level: the full disaggregation, then merges.
fn groupings(model: &PerfModel) -> Vec<Vec<Vec<ModuleSet>>> {
    let r = roles(model);
    let (e, b, h) = (r.encoders, r.backbone, r.heads);
    let clean =
        |g: Vec<ModuleSet>| -> Vec<ModuleSet> { g.into_iter().filter(|s| !s.is_empty()).collect() };
    vec![
        vec![clean(vec![e, b, h])],
        vec![clean(vec![e.union(b), h]), clean(vec![e, b.union(h)])],
        vec![clean(vec![e.union(b).union(h)])],
    ]
}

/// A group as text: `[vision dp4, text dp4 on 6 GPUs]`.
fn group_text(model: &PerfModel, g: &GroupRun) -> String {
    let mods: Vec<String> = g
        .modules
        .iter()
        .map(|(m, o)| format!("{} dp{}", model.modules[*m].name, o.dp))
        .collect();
    format!(
        "[{} on {} GPU{}]",
        mods.join(", "),
        g.gpus,
        if g.gpus == 1 { "" } else { "s" }
    )
}

/// Lays the groups out on consecutive GPUs and books each module's profiled whole-batch work.
fn ledger_of(groups: &[&GroupRun], gpus: u32) -> Ledger {
    let mut ledger = Ledger::new(gpus);
    let mut first = 0u32;
    for g in groups {
        for (_, o) in &g.modules {
            let on: Vec<u32> = (first..first + o.dp).collect();
            ledger.add(&on, 1.0, o.time_ms, o.sm_util);
        }
        first += g.gpus;
    }
    ledger
}

/// Per-microbatch time of a module whose whole-batch step takes `T`: linear in the batch with
/// a fixed part `o = min(overhead, T)` that every microbatch pays: `(T − o)/n + o`.
fn microbatch_ms(o: &QuotaOption, n: u32, overhead_ms: f64) -> f64 {
    let fixed = overhead_ms.min(o.time_ms);
    (o.time_ms - fixed) / n as f64 + fixed
}

/// **DistTrain** (Zhang et al., SIGCOMM'25, §5): disaggregated module groups — encoders,
/// backbone, heads (DistTrain's modality encoder, LLM backbone and modality generator) — on
/// disjoint GPU sets, training as a 1F1B pipeline over `n` microbatches.
///
/// - Per-microbatch time of a module at dp `d`: `(T(d, 1.0) − o)/n + o`, i.e. linear in the
///   batch (assumption) with a fixed part `o` = [`CompareOptions::step_overhead_ms`] (kernel
///   launches and the like, default 2 ms) that every microbatch pays again; a group's time is
///   the sum over its modules.
/// - Time per global batch, DistTrain Eqs. (1)–(2) with one pipeline stage per group:
///   `T_iter = Σ_g t_g + (n − 1) · max_g t_g` (warm-up/drain + 1F1B steady state; the paper's
///   formulation holds for GPipe and 1F1B with forward+backward times).
/// - Orchestration search (its Alg. 1 enumerates parallelism and then solves the resource
///   split): every split of the pool, each module's dp, and n ∈ {1, 2, 4, …}; with a known
///   global batch `B` every replica gets at least one sample per microbatch (`n · d ≤ B`,
///   DistTrain uses microbatches of one sample), else n ≤ [`DEFAULT_MAX_MICROBATCHES`].
/// - Memory: the profiled (dp, 1.0) sample fits, which holds the whole per-replica batch, so
///   microbatches only lower it.
pub fn disttrain(
    model: &PerfModel,
    gpus: u32,
    opts: &CompareOptions,
) -> Result<StrategyResult, CompareError> {
    let whole = whole_gpu_all(model, gpus)?;
    let max_n = opts.global_batch.unwrap_or(DEFAULT_MAX_MICROBATCHES).max(1);
    let ns: Vec<u32> = (0..32)
        .map(|k| 1u32 << k)
        .take_while(|&n| n <= max_n)
        .collect();
    // (time, GPUs used, n, groups, grouping level)
    type Best = (f64, u32, u32, Vec<GroupRun>, usize);
    let mut best: Option<Best> = None;
    for (level, options) in groupings(model).into_iter().enumerate() {
        for grouping in options {
            let sets: Vec<Vec<usize>> = grouping.iter().map(|&s| ordered(model, s)).collect();
            for &n in &ns {
                let cap = opts.global_batch.map_or(u32::MAX, |b| b / n);
                if cap == 0 {
                    continue;
                }
                let cost = |o: &QuotaOption| microbatch_ms(o, n, opts.step_overhead_ms);
                let tables: Vec<Vec<Option<GroupRun>>> = sets
                    .iter()
                    .map(|s| group_table(s, &whole, gpus, cap, &cost))
                    .collect();
                for split in splits(&tables, gpus) {
                    let sum: f64 = split.iter().map(|g| g.time_ms).sum();
                    let max = split.iter().map(|g| g.time_ms).fold(0.0, f64::max);
                    let t = sum + (n - 1) as f64 * max;
                    let used: u32 = split.iter().map(|g| g.gpus).sum();
                    let better = match &best {
                        None => true,
                        Some((bt, bu, bn, _, _)) => {
                            t < bt * (1.0 - 1e-12)
                                || (t <= bt * (1.0 + 1e-12) && (used, n) < (*bu, *bn))
                        }
                    };
                    if better {
                        best = Some((t, used, n, split.into_iter().cloned().collect(), level));
                    }
                }
            }
        }
        if best.is_some() {
            break; // the least-merged grouping that fits
        }
    }
    let Some((t, _, n, groups, level)) = best else {
        return Err(CompareError::NoFit {
            strategy: "DistTrain",
            reason: format!(
                "no grouping of the modules fits {gpus} GPU(s) when every replica needs a sample \
                 of every microbatch of the global batch of {}; raise --global-batch",
                opts.global_batch.map_or("?".into(), |b| b.to_string())
            ),
        });
    };
    let iteration_ms = round_ms(t);
    let refs: Vec<&GroupRun> = groups.iter().collect();
    let util = ledger_of(&refs, gpus).utilisation(iteration_ms);
    let text: Vec<String> = groups.iter().map(|g| group_text(model, g)).collect();
    let mut note = "time per global batch: 1F1B fill, steady state and drain".to_string();
    if level > 0 {
        note.push_str("; groups merged to fit the pool");
    }
    Ok(StrategyResult {
        strategy: Strategy::DistTrain,
        name: Strategy::DistTrain.name().to_string(),
        iteration_ms,
        pipelined: true,
        mean_util: util.mean,
        min_util: util.min,
        gpu_util: util.per_gpu,
        description: format!(
            "{} × {n} microbatch{}",
            text.join(" ⇒ "),
            if n == 1 { "" } else { "es" }
        ),
        note: Some(note),
        plan: None,
        shape: Shape::Pipeline {
            group_ms: groups.iter().map(|g| g.time_ms).collect(),
            microbatches: n,
            dp: largest_dp(&groups),
        },
    })
}

/// The largest data-parallel degree among the modules of `groups`.
fn largest_dp(groups: &[GroupRun]) -> u32 {
    groups
        .iter()
        .flat_map(|g| g.modules.iter().map(|(_, o)| o.dp))
        .max()
        .unwrap_or(1)
}

/// **FlowTrain** (Jiang et al. 2026, §3.3): decoupled producers (the encoders) and consumers
/// (backbone and heads) on two disjoint pools exchanging embeddings through a memory pool, so
/// that each side runs at its own rate. Its heterogeneous parallel allocator sizes the pools to
/// maximise the steady-state throughput — the smaller of the production and consumption rates
/// — and then minimises the imbalance between them (its Eq. 2, lexicographically); we
/// enumerate the splits exactly instead of its MILP.
///
/// - A pool's time per global batch: the sum of its modules' profiled whole-GPU times (each
///   module at its fastest dp ≤ the pool's GPUs; no microbatching inside a pool).
/// - Time per global batch in the steady state: `max(t_producers, t_consumers)`; ties go to
///   the smaller `|t_producers − t_consumers|`, then fewer GPUs.
/// - Assumption: decoupling is exact for frozen encoders, FlowTrain's setting. For trainable
///   encoders their backward pass needs the backbone's gradients, so this is an optimistic
///   bound on what a synchronous implementation can reach.
/// - With no encoder or a single GPU there is nothing to decouple: one pool runs everything.
pub fn flowtrain(model: &PerfModel, gpus: u32) -> Result<StrategyResult, CompareError> {
    let whole = whole_gpu_all(model, gpus)?;
    let r = roles(model);
    let producers = ordered(model, r.encoders);
    let consumers = ordered(model, r.backbone.union(r.heads));
    let cost = |o: &QuotaOption| o.time_ms;
    let mut best: Option<(f64, f64, u32, Vec<GroupRun>)> = None;
    if !producers.is_empty() && gpus >= 2 {
        let tp = group_table(&producers, &whole, gpus, u32::MAX, &cost);
        let tc = group_table(&consumers, &whole, gpus, u32::MAX, &cost);
        for x in 1..gpus {
            let Some(p) = shrink(&tp, x).filter(|p| p.gpus == x) else {
                continue; // the same producers on fewer GPUs: tried already
            };
            for y in 1..=gpus - x {
                let Some(c) = tc[y as usize - 1].as_ref() else {
                    continue;
                };
                let t = p.time_ms.max(c.time_ms);
                let imbalance = (p.time_ms - c.time_ms).abs();
                let used = x + y;
                let better = match &best {
                    None => true,
                    Some((bt, bi, bu, _)) => {
                        t < bt * (1.0 - 1e-12)
                            || (t <= bt * (1.0 + 1e-12)
                                && (imbalance < bi - 1e-9
                                    || (imbalance <= bi + 1e-9 && used < *bu)))
                    }
                };
                if better {
                    best = Some((t, imbalance, used, vec![p.clone(), c.clone()]));
                }
            }
        }
    }
    let decoupled = best.is_some();
    let (t, groups) = match best {
        Some((t, _, _, g)) => (t, g),
        None => {
            let all = ordered(model, ModuleSet::all(model.modules.len()));
            let table = group_table(&all, &whole, gpus, u32::MAX, &cost);
            let g = shrink(&table, gpus)
                .expect("every module has a whole-GPU option")
                .clone();
            (g.time_ms, vec![g])
        }
    };
    let shape = if decoupled {
        Shape::Decoupled {
            producer_ms: groups[0].time_ms,
            consumer_ms: groups[1].time_ms,
            dp: largest_dp(&groups[1..]),
        }
    } else {
        // One pool: its modules one after another on it.
        Shape::Staged(
            groups[0]
                .modules
                .iter()
                .map(|(_, o)| vec![(o.dp, o.time_ms)])
                .collect(),
        )
    };
    let iteration_ms = round_ms(t);
    let refs: Vec<&GroupRun> = groups.iter().collect();
    let util = ledger_of(&refs, gpus).utilisation(iteration_ms);
    let description = if decoupled {
        format!(
            "producers {} ⇄ consumers {}",
            group_text(model, &groups[0]),
            group_text(model, &groups[1])
        )
    } else {
        format!("one pool {}", group_text(model, &groups[0]))
    };
    Ok(StrategyResult {
        strategy: Strategy::FlowTrain,
        name: Strategy::FlowTrain.name().to_string(),
        iteration_ms,
        pipelined: true,
        mean_util: util.mean,
        min_util: util.min,
        gpu_util: util.per_gpu,
        description,
        note: Some(if decoupled {
            "time per global batch in the steady state; optimistic for trainable encoders"
                .to_string()
        } else {
            "nothing to decouple on this pool: one pool runs every module".to_string()
        }),
        plan: None,
        shape,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{close, model, module};

    /// e → l → h with dp 1 and 2 profiled.
    fn chain() -> PerfModel {
        model(
            vec![
                module("e", &[], &[(1, 40.0), (2, 22.0)]),
                module("l", &["e"], &[(1, 100.0), (2, 52.0)]),
                module("h", &["l"], &[(1, 10.0), (2, 6.0)]),
            ],
            80.0,
        )
    }

    fn opts(global_batch: Option<u32>) -> CompareOptions {
        CompareOptions {
            global_batch,
            ..CompareOptions::default()
        }
    }

    #[test]
    fn disttrain_by_hand() {
        // 4 GPUs, o = 2 ms, n ≤ 8. Split (e 1, l 2, h 1) with n = 8: per microbatch
        // e 38/8 + 2 = 6.75, l 50/8 + 2 = 8.25, h 8/8 + 2 = 3: 18 + 7 × 8.25 = 75.75.
        // n = 4: 11.5, 14.5, 4: 30 + 3 × 14.5 = 73.5 (best); n = 2: 21, 27, 6: 54 + 27 = 81;
        // n = 1: 102. Other splits at n = 4: (2, 1, 1): 7, 26.5, 4 → 117; (1, 1, 2): worse.
        let m = chain();
        let r = disttrain(&m, 4, &opts(None)).unwrap();
        assert!(close(r.iteration_ms, 73.5), "{}", r.iteration_ms);
        assert_eq!(
            r.description,
            "[e dp1 on 1 GPU] ⇒ [l dp2 on 2 GPUs] ⇒ [h dp1 on 1 GPU] × 4 microbatches"
        );
        // Work (sm_util 0.5): GPU 0: e 40 × 0.5; GPUs 1, 2: l 52 × 0.5; GPU 3: h 10 × 0.5.
        assert!(close(r.mean_util, (20.0 + 52.0 + 5.0) / (4.0 * 73.5)));
        assert!(close(r.min_util, 5.0 / 73.5));
        assert!(r.pipelined && r.plan.is_none());

        // A global batch of 4 allows n · dp ≤ 4: n = 4 needs dp 1 everywhere:
        // 11.5 + 26.5 + 4 = 42 + 3 × 26.5 = 121.5; n = 2 (dp ≤ 2) gives 81, the best.
        let r = disttrain(&m, 4, &opts(Some(4))).unwrap();
        assert!(close(r.iteration_ms, 81.0), "{}", r.iteration_ms);
    }

    #[test]
    fn disttrain_merges_groups_on_a_small_pool() {
        let m = chain();
        // 2 GPUs cannot hold three groups: e+l | h or e | l+h. With n = 4:
        // [e, l on 1] 11.5 + 26.5 = 38, [h on 1] 4 → 42 + 3 × 38 = 156;
        // [e on 1] 11.5, [l, h on 1] 26.5 + 4 = 30.5 → 42 + 3 × 30.5 = 133.5; n = 8:
        // 6.75 and 14.25 + 3 = 17.25 → 24 + 7 × 17.25 = 144.75; n = 2: 21 and 51 + 6 = 57 →
        // 78 + 57 = 135. Best 133.5.
        let r = disttrain(&m, 2, &opts(None)).unwrap();
        assert!(close(r.iteration_ms, 133.5), "{}", r.iteration_ms);
        assert!(r.note.as_deref().unwrap().contains("merged"));
        // One GPU: everything in one group; n = 1 is best (no pipeline to fill).
        let r = disttrain(&m, 1, &opts(None)).unwrap();
        assert!(close(r.iteration_ms, 150.0), "{}", r.iteration_ms);
    }

    #[test]
    fn flowtrain_by_hand() {
        // Producers {e}, consumers {l, h} on 4 GPUs: x = 1: 40 vs y = 2: 52 + 6 = 58 → 58
        // (imbalance 18); x = 2: 22 vs 58 → 58 (imbalance 36); y = 1: 110. Best: 1 + 2 GPUs.
        let m = chain();
        let r = flowtrain(&m, 4).unwrap();
        assert!(close(r.iteration_ms, 58.0), "{}", r.iteration_ms);
        assert_eq!(
            r.description,
            "producers [e dp1 on 1 GPU] ⇄ consumers [l dp2, h dp2 on 2 GPUs]"
        );
        // GPU 0: 20; GPUs 1, 2: (52 + 6) × 0.5 = 29; GPU 3 idle.
        assert!(close(r.mean_util, (20.0 + 58.0) / (4.0 * 58.0)));
        assert_eq!(r.min_util, 0.0);
        // One GPU: one pool, 40 + 100 + 10.
        let r = flowtrain(&m, 1).unwrap();
        assert!(close(r.iteration_ms, 150.0));
    }
}
