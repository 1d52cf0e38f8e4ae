//! Spindle's wavefront schedule: see [`spindle`](crate::spindle).

use mosaic_plan::Plan;
use mosaic_profile::{ModuleSet, PerfModel, QuotaOption};

use crate::common::{round_ms, whole_gpu_all, Ledger};
use crate::{CompareError, CompareOptions, Strategy, StrategyResult};

/// One slice of a module: its dp, GPUs and the fraction of the module's work it did.
#[derive(Debug, Clone)]
struct Slice {
    dp: u32,
    gpus: Vec<u32>,
    fraction: f64,
}

/// A started module of the stage being scheduled.
#[derive(Debug)]
struct Run {
    module: usize,
    /// When it started, ms after the stage's start.
    start: f64,
    /// Fraction of the module's work left.
    left: f64,
    /// Synchronisation time the current slice still has to pay before it progresses.
    sync: f64,
    /// Whole-GPU time of the current slice's dp (the whole module's work).
    time_ms: f64,
    slices: Vec<Slice>,
}

impl Run {
    fn current(&self) -> &Slice {
        self.slices.last().expect("a run has a slice")
    }
    /// Time until it finishes at its current allocation.
    fn remaining(&self) -> f64 {
        if self.left > 0.0 {
            self.sync + self.left * self.time_ms
        } else {
            0.0
        }
    }
}

/// Whole-GPU time of module `m` at `dp`.
fn time_at(whole: &[Vec<QuotaOption>], m: usize, dp: u32) -> f64 {
    whole[m]
        .iter()
        .find(|o| o.dp == dp)
        .map(|o| o.time_ms)
        .expect("a whole-GPU option of the module")
}

/// A stage to schedule: its first wave and the modules waiting in it, by priority.
#[derive(Debug, Clone)]
struct StageSpec {
    set: ModuleSet,
    /// (module, dp, GPUs) started at the stage's start: a DistMM stage's allocation.
    first: Vec<(usize, u32, Vec<u32>)>,
    /// The DistMM time of the stage `first` comes from (decides which wave leads a merge).
    lead_ms: f64,
    /// Modules that start when GPUs free up, longest first.
    waiting: Vec<usize>,
}

/// A scheduled stage.
struct Scheduled {
    time_ms: f64,
    runs: Vec<Run>,
}

/// Schedules one stage (see the module docs).
fn schedule_stage(
    spec: &StageSpec,
    whole: &[Vec<QuotaOption>],
    gpus: u32,
    sync_ms: f64,
) -> Scheduled {
    let mut runs: Vec<Run> = spec
        .first
        .iter()
        .map(|(m, dp, g)| Run {
            module: *m,
            start: 0.0,
            left: 1.0,
            sync: 0.0,
            time_ms: time_at(whole, *m, *dp),
            slices: vec![Slice {
                dp: *dp,
                gpus: g.clone(),
                fraction: 0.0,
            }],
        })
        .collect();
    let mut waiting = spec.waiting.clone();
    let mut now = 0.0;
    start_waiting(&mut runs, &mut waiting, now, whole, gpus);
    loop {
        let dt = runs
            .iter()
            .filter(|r| r.left > 0.0)
            .map(Run::remaining)
            .fold(f64::INFINITY, f64::min);
        if !dt.is_finite() {
            if waiting.is_empty() {
                break; // every module is done
            }
            start_waiting(&mut runs, &mut waiting, now, whole, gpus);
            continue;
        }
        for r in runs.iter_mut().filter(|r| r.left > 0.0) {
            let rem = r.remaining();
            let slice = r.slices.last_mut().expect("a run has a slice");
            if rem - dt <= 1e-9 * rem.max(1.0) {
                slice.fraction += r.left;
                r.left = 0.0;
                r.sync = 0.0;
            } else {
                let paid = dt.min(r.sync);
                r.sync -= paid;
                let progress = (dt - paid) / r.time_ms;
                r.left -= progress;
                slice.fraction += progress;
            }
        }
        now += dt;
        rebalance(&mut runs, whole, gpus, sync_ms);
        start_waiting(&mut runs, &mut waiting, now, whole, gpus);
    }
    Scheduled { time_ms: now, runs }
}

/// Starts waiting modules on the free GPUs (see the module docs).
fn start_waiting(
    runs: &mut Vec<Run>,
    waiting: &mut Vec<usize>,
    now: f64,
    whole: &[Vec<QuotaOption>],
    gpus: u32,
) {
    if waiting.is_empty() {
        return;
    }
    let mut held = vec![false; gpus as usize];
    for r in runs.iter().filter(|r| r.left > 0.0) {
        for &g in &r.current().gpus {
            held[g as usize] = true;
        }
    }
    let start = |m: usize, dp: u32, held: &mut Vec<bool>, runs: &mut Vec<Run>| {
        let on: Vec<u32> = (0..gpus)
            .filter(|&g| !held[g as usize])
            .take(dp as usize)
            .collect();
        debug_assert_eq!(on.len(), dp as usize);
        for &g in &on {
            held[g as usize] = true;
        }
        runs.push(Run {
            module: m,
            start: now,
            left: 1.0,
            sync: 0.0,
            time_ms: time_at(whole, m, dp),
            slices: vec![Slice {
                dp,
                gpus: on,
                fraction: 0.0,
            }],
        });
    };
    let mut horizon = runs.iter().map(Run::remaining).fold(0.0, f64::max);
    if horizon == 0.0 {
        // A fresh wave: the min–max allocation of all waiting modules if they fit together,
        // else the longest one on its fastest GPU count (the others fill in below).
        let fewest = |m: usize, tau: f64| {
            whole[m]
                .iter()
                .filter(|o| o.time_ms <= tau)
                .map(|o| o.dp)
                .min()
        };
        let mut taus: Vec<f64> = waiting
            .iter()
            .flat_map(|&m| whole[m].iter().map(|o| o.time_ms))
            .collect();
        taus.sort_by(f64::total_cmp);
        let fit = taus.into_iter().find(|&tau| {
            waiting
                .iter()
                .map(|&m| fewest(m, tau))
                .try_fold(0u32, |acc, d| d.map(|d| acc + d))
                .is_some_and(|need| need <= gpus)
        });
        match fit {
            Some(tau) => {
                for m in waiting.drain(..) {
                    let dp = fewest(m, tau).expect("fits");
                    start(m, dp, &mut held, runs);
                }
                return;
            }
            None => {
                let m = waiting.remove(0);
                let best = whole[m]
                    .iter()
                    .min_by(|a, b| a.time_ms.total_cmp(&b.time_ms))
                    .expect("a whole-GPU option");
                start(m, best.dp, &mut held, runs);
                horizon = best.time_ms;
            }
        }
    }
    // Fill the free GPUs with modules that end before the stage's current end.
    let mut k = 0;
    while k < waiting.len() {
        let free = held.iter().filter(|&&h| !h).count() as u32;
        let m = waiting[k];
        let pick = whole[m]
            .iter()
            .filter(|o| o.dp <= free && o.time_ms <= horizon)
            .map(|o| o.dp)
            .min();
        match pick {
            Some(dp) => {
                waiting.remove(k);
                start(m, dp, &mut held, runs);
            }
            None => k += 1,
        }
    }
}

/// The wavefront step: re-allocates the unfinished modules over the pool when that finishes
/// the stage strictly earlier.
fn rebalance(runs: &mut [Run], whole: &[Vec<QuotaOption>], gpus: u32, sync_ms: f64) {
    let active: Vec<usize> = (0..runs.len()).filter(|&i| runs[i].left > 0.0).collect();
    if active.is_empty() {
        return;
    }
    let current = active
        .iter()
        .map(|&i| runs[i].remaining())
        .fold(0.0, f64::max);
    // Per active run: (dp, time to finish, keeps its GPUs).
    let choices: Vec<Vec<(u32, f64, bool)>> = active
        .iter()
        .map(|&i| {
            let r = &runs[i];
            let dp = r.current().dp;
            let mut c = vec![(dp, r.remaining(), true)];
            c.extend(
                whole[r.module]
                    .iter()
                    .filter(|o| o.dp != dp)
                    .map(|o| (o.dp, sync_ms + r.left * o.time_ms, false)),
            );
            c
        })
        .collect();
    let fewest = |c: &[(u32, f64, bool)], tau: f64| {
        c.iter()
            .filter(|x| x.1 <= tau)
            .min_by_key(|x| (x.0, !x.2))
            .copied()
    };
    let mut taus: Vec<f64> = choices
        .iter()
        .flatten()
        .map(|c| c.1)
        .filter(|&t| t < current * (1.0 - 1e-9))
        .collect();
    taus.sort_by(f64::total_cmp);
    let target = taus.into_iter().find(|&tau| {
        choices
            .iter()
            .map(|c| fewest(c, tau).map(|x| x.0))
            .try_fold(0u32, |acc, d| d.map(|d| acc + d))
            .is_some_and(|need| need <= gpus)
    });
    let Some(tau) = target else { return };
    let mut picks: Vec<(u32, f64, bool)> = choices
        .iter()
        .map(|c| fewest(c, tau).expect("feasible target"))
        .collect();
    // Keep modules on their GPUs where the target and the pool allow: fewer slices.
    let mut used: u32 = picks.iter().map(|p| p.0).sum();
    for (k, c) in choices.iter().enumerate() {
        let keep = c[0];
        if !picks[k].2 && keep.1 <= tau && used - picks[k].0 + keep.0 <= gpus {
            used = used - picks[k].0 + keep.0;
            picks[k] = keep;
        }
    }
    // Kept modules hold their GPUs; moved ones take free GPUs, lowest first.
    let mut held = vec![false; gpus as usize];
    for (k, &i) in active.iter().enumerate() {
        if picks[k].2 {
            for &g in &runs[i].current().gpus {
                held[g as usize] = true;
            }
        }
    }
    let mut free = (0..gpus).filter(|&g| !held[g as usize]);
    for (k, &i) in active.iter().enumerate() {
        let (dp, _, keep) = picks[k];
        if keep {
            continue;
        }
        let r = &mut runs[i];
        let slice = Slice {
            dp,
            gpus: free.by_ref().take(dp as usize).collect(),
            fraction: 0.0,
        };
        debug_assert_eq!(slice.gpus.len(), dp as usize);
        if r.current().fraction > 0.0 {
            r.slices.push(slice);
        } else {
            *r.slices.last_mut().expect("a run has a slice") = slice; // it did no work yet
        }
        r.sync = sync_ms;
        r.time_ms = whole[r.module]
            .iter()
            .find(|o| o.dp == dp)
            .expect("a whole-GPU option")
            .time_ms;
    }
}

/// Two stages as one: the longer stage's first wave leads, the other's modules wait.
fn merge(a: &StageSpec, b: &StageSpec, whole: &[Vec<QuotaOption>]) -> StageSpec {
    let (lead, other) = if a.lead_ms >= b.lead_ms {
        (a, b)
    } else {
        (b, a)
    };
    let mut waiting: Vec<usize> = lead
        .waiting
        .iter()
        .chain(other.first.iter().map(|(m, _, _)| m))
        .chain(other.waiting.iter())
        .copied()
        .collect();
    let fastest = |m: usize| {
        whole[m]
            .iter()
            .map(|o| o.time_ms)
            .fold(f64::INFINITY, f64::min)
    };
    waiting.sort_by(|&x, &y| fastest(y).total_cmp(&fastest(x)).then(x.cmp(&y)));
    StageSpec {
        set: a.set.union(b.set),
        first: lead.first.clone(),
        lead_ms: lead.lead_ms,
        waiting,
    }
}

/// **Spindle** (Wang et al., ASPLOS'25, "Efficient distributed training of multi-task large
/// models via wavefront scheduling"; Mosaic §2.2, Fig. 3c): whole GPUs only, but a module may
/// be cut into slices of its layers that run in different *waves* on different numbers of
/// GPUs, and waves need not wait for a whole stage, so that the GPUs stay busy despite integer
/// GPU counts.
///
/// # The model
/// A schedule is a sequence of stages of independent modules, each scheduled as waves:
/// - **Start**: DistMM's plan ([`crate::distmm`]: the same stage search as Mosaic, exact where
///   it finishes, over whole-GPU candidates); each stage's first wave is DistMM's allocation of
///   it (each module on its own whole GPUs, the stage's min–max optimum).
/// - **Wavefront inside a stage**: whenever a module finishes and frees its GPUs,
///   1. the unfinished modules may be re-allocated over the pool. A module with remaining
///      fraction `r` of its work that moves to `d` GPUs starts a new slice and needs
///      `σ + r · T(d, 1.0)` more, where `T` is its profiled whole-GPU time (the work splits
///      linearly over its layers) and `σ` the slice's synchronisation cost; a module that keeps
///      its GPUs goes on at no cost. The re-allocation minimises the stage's remaining time
///      exactly (the smallest target τ at which every module has a choice within τ whose GPUs
///      fit the pool), is applied only when it ends the stage strictly earlier, and keeps
///      modules on their GPUs where the target allows;
///   2. modules waiting in the stage (below) start on the free GPUs, longest first, each on
///      the fewest GPUs that finish it before the stage's current end; with nothing running,
///      the waiting modules that fit start together at their min–max allocation.
/// - **Waves across stages**: stages are merged greedily, as GAHC merges (Mosaic Alg. 1: the
///   pair with the largest gain, only pairs without a dependency path between them, stages
///   re-sorted topologically), while a merge shortens the schedule: the merged stage's first
///   wave is the longer stage's, and the other stage's modules wait in it and start in a later
///   wave as GPUs free up — a module no longer waits for a barrier it does not depend on.
/// - **σ, the cost of a slice** (default 2 ms, [`crate::CompareOptions::slice_sync_ms`]): a
///   slice is a separate step on its own group of GPUs, so it pays a step's fixed host-side cost
///   again (loss/optimizer launches, stream and communicator switches — 2 ms is the analytical
///   device model's `launch_step_ms` for eager PyTorch) plus the point-to-point hand-over of
///   the boundary activations and their gradients between the two GPU groups, well below a
///   millisecond on NVLink for these modules. Mosaic §2.2 names exactly this "coordination
///   overhead due to the frequent synchronization required between slices". A module starting
///   late in a merged stage is not sliced and pays no σ.
/// - Dependencies hold because a stage's modules are independent and stages keep a
///   topological order; memory holds because every slice runs alone on whole GPUs with a
///   profiled (dp, 1.0) sample that fits.
///
/// # Guarantees (tested)
/// - Never worse than DistMM on the same stage partition: a re-allocation is applied only when
///   it ends the stage earlier and the first wave *is* DistMM's stage, so each stage ends no
///   later than DistMM's; merges are applied only when they shorten the schedule.
/// - Never better than the trivial bound Σ_m min_d d·T_m(d, 1.0) / G: slices of one module add
///   up to its whole work, each slice costs at least its share of the module's least GPU-time,
///   and slices running at the same time hold disjoint GPUs.
pub fn spindle(
    model: &PerfModel,
    gpus: u32,
    opts: &CompareOptions,
) -> Result<StrategyResult, CompareError> {
    let dist = crate::distmm(model, gpus, opts.budget)?;
    spindle_on(
        model,
        dist.plan.as_ref().expect("DistMM has a plan"),
        opts.slice_sync_ms,
    )
}

/// Spindle on DistMM's plan `partition` (whole GPUs), with slice cost `sync_ms`.
pub(crate) fn spindle_on(
    model: &PerfModel,
    partition: &Plan,
    sync_ms: f64,
) -> Result<StrategyResult, CompareError> {
    let gpus = partition.gpus;
    let whole = whole_gpu_all(model, gpus)?;
    let mut stages: Vec<StageSpec> = partition
        .stages
        .iter()
        .map(|stage| {
            let first: Vec<(usize, u32, Vec<u32>)> = stage
                .modules
                .iter()
                .map(|pm| {
                    let m = model
                        .index_of(&pm.name)
                        .expect("DistMM plans the model's modules");
                    (m, pm.dp, pm.gpus.clone())
                })
                .collect();
            let lead_ms = first
                .iter()
                .map(|(m, dp, _)| time_at(&whole, *m, *dp))
                .fold(0.0, f64::max);
            StageSpec {
                set: first.iter().fold(ModuleSet::EMPTY, |s, (m, _, _)| {
                    s.union(ModuleSet::single(*m))
                }),
                first,
                lead_ms,
                waiting: Vec::new(),
            }
        })
        .collect();
    let time = |spec: &StageSpec| schedule_stage(spec, &whole, gpus, sync_ms).time_ms;
    let mut times: Vec<f64> = stages.iter().map(time).collect();
    for (s, t) in stages.iter().zip(&times) {
        debug_assert!(
            *t <= s.lead_ms * (1.0 + 1e-9) + 1e-9,
            "a Spindle stage is slower than DistMM's"
        );
    }
    // Waves across stages: GAHC-style merging while it gains.
    let mut merges = 0;
    while stages.len() > 1 {
        let reach = mosaic_plan::order::reachability(model, &stages, |s| s.set);
        let mut best: Option<(f64, usize, usize, StageSpec)> = None;
        for x in 0..stages.len() {
            for y in x + 1..stages.len() {
                if reach[x] >> y & 1 == 1 {
                    continue;
                }
                let merged = merge(&stages[x], &stages[y], &whole);
                let t = time(&merged);
                let gain = times[x] + times[y] - t;
                let threshold = best.as_ref().map_or(0.0, |b| b.0);
                if gain > threshold + 1e-9 * (times[x] + times[y]).max(1.0) {
                    best = Some((gain, x, y, merged));
                }
            }
        }
        let Some((_, x, y, merged)) = best else {
            break;
        };
        merges += 1;
        stages[x] = merged;
        stages.remove(y);
        stages = mosaic_plan::order::topological(model, stages, |s| s.set);
        times = stages.iter().map(time).collect();
    }

    let mut ledger = Ledger::new(gpus);
    let mut total = 0.0;
    let mut stages_text = Vec::new();
    let (mut sliced_modules, mut extra_slices, mut late) = (0, 0, 0);
    for spec in &stages {
        let sched = schedule_stage(spec, &whole, gpus, sync_ms);
        total += sched.time_ms;
        let mut parts = Vec::new();
        for r in &sched.runs {
            let slices: Vec<&Slice> = r.slices.iter().filter(|s| s.fraction > 0.0).collect();
            for s in &slices {
                let o = whole[r.module]
                    .iter()
                    .find(|o| o.dp == s.dp)
                    .expect("option");
                ledger.add(&s.gpus, 1.0, s.fraction * o.time_ms, o.sm_util);
            }
            if slices.len() > 1 {
                sliced_modules += 1;
                extra_slices += slices.len() - 1;
            }
            let dps: Vec<String> = slices.iter().map(|s| format!("dp{}", s.dp)).collect();
            let mut text = format!("{} {}", model.modules[r.module].name, dps.join("→"));
            if r.start > 0.0 {
                late += 1;
                text.push_str(&format!(" (from {:.1} ms)", r.start));
            }
            parts.push(text);
        }
        stages_text.push(parts.join(" ∥ "));
    }
    let iteration_ms = round_ms(total);
    let util = ledger.utilisation(iteration_ms);
    let mut notes = Vec::new();
    if sliced_modules > 0 {
        notes.push(format!(
            "{sliced_modules} module(s) sliced across waves ({extra_slices} extra slice(s), \
             {sync_ms} ms sync each; → marks a slice moving to another GPU count)"
        ));
    }
    if late > 0 {
        notes.push(format!(
            "{merges} stage merge(s): {late} module(s) start in a later wave of a stage"
        ));
    }
    let unchanged = sliced_modules == 0 && merges == 0;
    if unchanged {
        notes.push("neither slicing nor merging waves pays off: DistMM's schedule".to_string());
    }
    Ok(StrategyResult {
        strategy: Strategy::Spindle,
        name: Strategy::Spindle.name().to_string(),
        iteration_ms,
        pipelined: false,
        mean_util: util.mean,
        min_util: util.min,
        gpu_util: util.per_gpu,
        description: stages_text.join(" | "),
        note: Some(notes.join("; ")),
        // Without slices or merges the schedule is DistMM's plan; waves are not a staged plan.
        plan: unchanged.then(|| partition.clone()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{close, model, module};
    use crate::{distmm, whole_gpu_lower_bound};
    use std::time::Duration;

    #[test]
    fn the_long_module_finishes_on_the_freed_gpus() {
        // a ∥ b on 4 GPUs, with poor scaling at dp 4. DistMM: one stage {a dp2, b dp2} = 55
        // (separately: 45 + 18 = 63; b dp1 = 60 is too slow). Spindle: b ends at 22; a has done
        // 22/55 = 0.4 and moves its last 0.6 to all 4 GPUs: 2 + 0.6 × 45 = 29 < 33 left at dp 2.
        let m = model(
            vec![
                module("a", &[], &[(1, 100.0), (2, 55.0), (4, 45.0)]),
                module("b", &[], &[(1, 60.0), (2, 22.0), (4, 18.0)]),
            ],
            80.0,
        );
        let dist = distmm(&m, 4, Duration::from_secs(10)).unwrap();
        assert!(close(dist.iteration_ms, 55.0));
        let s = spindle_on(&m, dist.plan.as_ref().unwrap(), 2.0).unwrap();
        assert!(close(s.iteration_ms, 51.0), "{}", s.iteration_ms);
        assert_eq!(s.description, "a dp2→dp4 ∥ b dp2");
        assert!(s.plan.is_none());
        // Work (sm_util 0.5): a 0.4 × 55 × 0.5 = 11 on its two GPUs, then 0.6 × 45 × 0.5 = 13.5
        // on all four; b 22 × 0.5 = 11 on its two: 24.5 ms on every GPU in 51 ms.
        assert!(close(s.mean_util, 24.5 / 51.0) && close(s.min_util, 24.5 / 51.0));
        assert!(s.iteration_ms >= whole_gpu_lower_bound(&m, 4));

        // A high sync cost makes slicing pointless: DistMM's schedule and plan.
        let s = spindle_on(&m, dist.plan.as_ref().unwrap(), 10.0).unwrap();
        assert!(close(s.iteration_ms, 55.0));
        assert_eq!(s.plan.as_ref(), dist.plan.as_ref());
    }

    #[test]
    fn a_module_of_a_later_stage_starts_on_a_freed_gpu() {
        // Independent x, y, z on 2 GPUs. DistMM: {x dp1 ∥ y dp1} | {z dp2} = 10 + 3 = 13
        // ({x, z} | {y} = 14, {y, z} | {x dp2} = 14.5). Spindle merges the stages: z waits in
        // the first one and starts on y's GPU when y ends at 4, ending at 9 before x at 10.
        let m = model(
            vec![
                module("x", &[], &[(1, 10.0), (2, 9.5)]),
                module("y", &[], &[(1, 4.0)]),
                module("z", &[], &[(1, 5.0), (2, 3.0)]),
            ],
            80.0,
        );
        let dist = distmm(&m, 2, Duration::from_secs(10)).unwrap();
        assert!(close(dist.iteration_ms, 13.0), "{}", dist.iteration_ms);
        let s = spindle_on(&m, dist.plan.as_ref().unwrap(), 2.0).unwrap();
        assert!(close(s.iteration_ms, 10.0), "{}", s.iteration_ms);
        assert_eq!(s.description, "x dp1 ∥ y dp1 ∥ z dp1 (from 4.0 ms)");
        assert!(s.plan.is_none());
        // x's GPU works 10 × 0.5, the other (4 + 5) × 0.5, in 10 ms.
        assert!(close(s.mean_util, 0.475) && close(s.min_util, 0.45));
        assert!(s.iteration_ms >= whole_gpu_lower_bound(&m, 2));
    }

    #[test]
    fn a_slice_waits_for_enough_free_gpus() {
        // DistMM: {a dp2, b dp1, c dp1} = 64. c ends at 20, but a's dp 4 needs b's GPU too
        // (and moving b cannot shorten a's 44 left). b ends at 40: a has done 40/64 and
        // moves its last 0.375 to 4 GPUs: 1 + 0.375 × 40 = 16 < 24 left at dp 2. 40 + 16 = 56.
        let m = model(
            vec![
                module("a", &[], &[(1, 120.0), (2, 64.0), (4, 40.0)]),
                module("b", &[], &[(1, 40.0), (2, 30.0), (4, 26.0)]),
                module("c", &[], &[(1, 20.0), (2, 12.0), (4, 10.0)]),
            ],
            80.0,
        );
        let dist = distmm(&m, 4, Duration::from_secs(10)).unwrap();
        assert!(close(dist.iteration_ms, 64.0), "{}", dist.iteration_ms);
        let s = spindle_on(&m, dist.plan.as_ref().unwrap(), 1.0).unwrap();
        assert!(close(s.iteration_ms, 56.0), "{}", s.iteration_ms);
        assert_eq!(s.description, "a dp2→dp4 ∥ b dp1 ∥ c dp1");
        assert!(s.iteration_ms >= whole_gpu_lower_bound(&m, 4));
        assert!((0.0..=1.0).contains(&s.min_util) && s.mean_util <= 1.0);
    }
}
