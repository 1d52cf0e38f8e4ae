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
    /// Module `m` started at `start` on `gpus` (`dp` of them), with all its work left.
    fn new(m: usize, dp: u32, gpus: Vec<u32>, start: f64, whole: &[Vec<QuotaOption>]) -> Self {
        Run {
            module: m,
            start,
            left: 1.0,
            sync: 0.0,
            time_ms: time_at(whole, m, dp),
            slices: vec![Slice {
                dp,
                gpus,
                fraction: 0.0,
            }],
        }
    }
    /// The slice it is running now.
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
    /// Lets `dt` ms pass: pays the slice's sync first, then progresses (finishes if within
    /// rounding of its end).
    fn advance(&mut self, dt: f64) {
        let rem = self.remaining();
        let slice = self.slices.last_mut().expect("a run has a slice");
        if rem - dt <= 1e-9 * rem.max(1.0) {
            slice.fraction += self.left;
            self.left = 0.0;
            self.sync = 0.0;
        } else {
            let paid = dt.min(self.sync);
            self.sync -= paid;
            let progress = (dt - paid) / self.time_ms;
            self.left -= progress;
            slice.fraction += progress;
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

/// Marks `on` as held in `held`.
fn hold(held: &mut [bool], on: &[u32]) {
    for &g in on {
        held[g as usize] = true;
    }
}

/// The smallest of `taus` at which the modules' GPU counts `dps(tau)` (`None` where a module
/// has no choice within `tau`) add up to at most `gpus`.
fn smallest_fitting<I: Iterator<Item = Option<u32>>>(
    mut taus: Vec<f64>,
    gpus: u32,
    dps: impl Fn(f64) -> I,
) -> Option<f64> {
    taus.sort_by(f64::total_cmp);
    taus.into_iter().find(|&tau| {
        dps(tau)
            .try_fold(0u32, |acc, d| d.map(|d| acc + d))
            .is_some_and(|need| need <= gpus)
    })
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
        .map(|(m, dp, g)| Run::new(*m, *dp, g.clone(), 0.0, whole))
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
            r.advance(dt);
        }
        now += dt;
        rebalance(&mut runs, whole, gpus, sync_ms);
        start_waiting(&mut runs, &mut waiting, now, whole, gpus);
    }
    Scheduled { time_ms: now, runs }
}

/// The stage's GPUs at one instant, as waiting modules start on the free ones.
struct Launch<'a> {
    runs: &'a mut Vec<Run>,
    held: Vec<bool>,
    now: f64,
    whole: &'a [Vec<QuotaOption>],
    gpus: u32,
}

impl<'a> Launch<'a> {
    /// The pool at `now`, with the GPUs of the unfinished runs held.
    fn new(runs: &'a mut Vec<Run>, now: f64, whole: &'a [Vec<QuotaOption>], gpus: u32) -> Self {
        let mut held = vec![false; gpus as usize];
        for r in runs.iter().filter(|r| r.left > 0.0) {
            hold(&mut held, &r.current().gpus);
        }
        Launch {
            runs,
            held,
            now,
            whole,
            gpus,
        }
    }

    /// Starts module `m` on the `dp` lowest free GPUs.
    fn start(&mut self, m: usize, dp: u32) {
        let on: Vec<u32> = (0..self.gpus)
            .filter(|&g| !self.held[g as usize])
            .take(dp as usize)
            .collect();
        debug_assert_eq!(on.len(), dp as usize);
        hold(&mut self.held, &on);
        self.runs.push(Run::new(m, dp, on, self.now, self.whole));
    }

    /// The fewest GPUs on which module `m` takes at most `tau`.
    fn fewest(&self, m: usize, tau: f64) -> Option<u32> {
        self.whole[m]
            .iter()
            .filter(|o| o.time_ms <= tau)
            .map(|o| o.dp)
            .min()
    }

    /// The smallest time at which all `waiting` modules fit the pool together, if any.
    fn min_max_target(&self, waiting: &[usize]) -> Option<f64> {
        let taus: Vec<f64> = waiting
            .iter()
            .flat_map(|&m| self.whole[m].iter().map(|o| o.time_ms))
            .collect();
        smallest_fitting(taus, self.gpus, |tau| {
            waiting.iter().map(move |&m| self.fewest(m, tau))
        })
    }

    /// Starts module `m` on its fastest GPU count; returns its time.
    fn start_fastest(&mut self, m: usize) -> f64 {
        let best = self.whole[m]
            .iter()
            .min_by(|a, b| a.time_ms.total_cmp(&b.time_ms))
            .expect("a whole-GPU option");
        let (dp, time_ms) = (best.dp, best.time_ms);
        self.start(m, dp);
        time_ms
    }

    /// Starts, in order, each waiting module that fits the free GPUs and ends by `horizon`,
    /// on the fewest GPUs that do.
    fn fill(&mut self, waiting: &mut Vec<usize>, horizon: f64) {
        let mut k = 0;
        while k < waiting.len() {
            let free = self.held.iter().filter(|&&h| !h).count() as u32;
            let m = waiting[k];
            let pick = self.whole[m]
                .iter()
                .filter(|o| o.dp <= free && o.time_ms <= horizon)
                .map(|o| o.dp)
                .min();
            match pick {
                Some(dp) => {
                    waiting.remove(k);
                    self.start(m, dp);
                }
                None => k += 1,
            }
        }
    }
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
    let mut launch = Launch::new(runs, now, whole, gpus);
    let mut horizon = launch.runs.iter().map(Run::remaining).fold(0.0, f64::max);
    if horizon == 0.0 {
        // A fresh wave: the min–max allocation of all waiting modules if they fit together,
        // else the longest one on its fastest GPU count (the others fill in below).
        match launch.min_max_target(waiting) {
            Some(tau) => {
                for m in waiting.drain(..) {
                    let dp = launch.fewest(m, tau).expect("fits");
                    launch.start(m, dp);
                }
                return;
            }
            None => horizon = launch.start_fastest(waiting.remove(0)),
        }
    }
    // Fill the free GPUs with modules that end before the stage's current end.
    launch.fill(waiting, horizon);
}

/// A re-allocation choice of an active run: (dp, time to finish, keeps its GPUs).
type Choice = (u32, f64, bool);

/// The choices of run `r`: keeping its GPUs first, then moving to each other dp.
fn choices_of(r: &Run, whole: &[Vec<QuotaOption>], sync_ms: f64) -> Vec<Choice> {
    let dp = r.current().dp;
    let mut c = vec![(dp, r.remaining(), true)];
    c.extend(
        whole[r.module]
            .iter()
            .filter(|o| o.dp != dp)
            .map(|o| (o.dp, sync_ms + r.left * o.time_ms, false)),
    );
    c
}

/// The choice within `tau` on the fewest GPUs, keeping the GPUs on a tie.
fn fewest_choice(c: &[Choice], tau: f64) -> Option<Choice> {
    c.iter()
        .filter(|x| x.1 <= tau)
        .min_by_key(|x| (x.0, !x.2))
        .copied()
}

/// The smallest target strictly below `current` at which every run has a choice and their
/// GPUs fit the pool, if any.
fn rebalance_target(choices: &[Vec<Choice>], current: f64, gpus: u32) -> Option<f64> {
    let taus: Vec<f64> = choices
        .iter()
        .flatten()
        .map(|c| c.1)
        .filter(|&t| t < current * (1.0 - 1e-9))
        .collect();
    smallest_fitting(taus, gpus, |tau| {
        choices
            .iter()
            .map(move |c| fewest_choice(c, tau).map(|x| x.0))
    })
}

/// The fewest-GPU pick within `tau` of every run, switched back to keeping its GPUs where
/// `tau` and the pool allow.
fn picks_for(choices: &[Vec<Choice>], tau: f64, gpus: u32) -> Vec<Choice> {
    let mut picks: Vec<Choice> = choices
        .iter()
        .map(|c| fewest_choice(c, tau).expect("feasible target"))
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
    picks
}

/// Applies `picks` to the `active` runs: moved runs start a new slice on free GPUs.
fn reallocate(
    runs: &mut [Run],
    active: &[usize],
    picks: &[Choice],
    whole: &[Vec<QuotaOption>],
    gpus: u32,
    sync_ms: f64,
) {
    // Kept modules hold their GPUs; moved ones take free GPUs, lowest first.
    let mut held = vec![false; gpus as usize];
    for (k, &i) in active.iter().enumerate() {
        if picks[k].2 {
            hold(&mut held, &runs[i].current().gpus);
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
    let choices: Vec<Vec<Choice>> = active
        .iter()
        .map(|&i| choices_of(&runs[i], whole, sync_ms))
        .collect();
    let Some(tau) = rebalance_target(&choices, current, gpus) else {
        return;
    };
    let picks = picks_for(&choices, tau, gpus);
    reallocate(runs, &active, &picks, whole, gpus, sync_ms);
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
///   again (loss/optimizer launches, stream and communicator switches — 2 ms is assumed; the
///   device model's per-step launch cost fitted to an H100 is 1.25 ms) plus the point-to-point
///   hand-over of the boundary activations and their gradients between the two GPU groups, well
///   below a millisecond on NVLink for these modules. Mosaic §2.2 names exactly this "coordination
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
    let stages = distmm_stages(model, partition, &whole);
    let (stages, merges) = merge_waves(model, stages, &whole, gpus, sync_ms);
    let mut tally = Tally::new(gpus);
    for spec in &stages {
        let sched = schedule_stage(spec, &whole, gpus, sync_ms);
        tally.add_stage(model, &whole, &sched);
    }
    Ok(tally.result(partition, sync_ms, merges))
}

/// DistMM's stages as stage specs: each stage's allocation is its first wave, nothing waits.
fn distmm_stages(
    model: &PerfModel,
    partition: &Plan,
    whole: &[Vec<QuotaOption>],
) -> Vec<StageSpec> {
    partition
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
                .map(|(m, dp, _)| time_at(whole, *m, *dp))
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
        .collect()
}

/// Waves across stages: merges stages GAHC-style while it gains; returns the stages and the
/// number of merges.
fn merge_waves(
    model: &PerfModel,
    mut stages: Vec<StageSpec>,
    whole: &[Vec<QuotaOption>],
    gpus: u32,
    sync_ms: f64,
) -> (Vec<StageSpec>, usize) {
    let time = |spec: &StageSpec| schedule_stage(spec, whole, gpus, sync_ms).time_ms;
    let mut times: Vec<f64> = stages.iter().map(time).collect();
    for (s, t) in stages.iter().zip(&times) {
        debug_assert!(
            *t <= s.lead_ms * (1.0 + 1e-9) + 1e-9,
            "a Spindle stage is slower than DistMM's"
        );
    }
    let mut merges = 0;
    while stages.len() > 1 {
        let Some((x, y, merged)) = best_merge(model, &stages, &times, whole, time) else {
            break;
        };
        merges += 1;
        stages[x] = merged;
        stages.remove(y);
        stages = mosaic_plan::order::topological(model, stages, |s| s.set);
        times = stages.iter().map(time).collect();
    }
    (stages, merges)
}

/// The independent pair of stages whose merge (timed by `time`) gains the most, if any gains.
fn best_merge(
    model: &PerfModel,
    stages: &[StageSpec],
    times: &[f64],
    whole: &[Vec<QuotaOption>],
    time: impl Fn(&StageSpec) -> f64,
) -> Option<(usize, usize, StageSpec)> {
    let reach = mosaic_plan::order::reachability(model, stages, |s| s.set);
    let mut best: Option<(f64, usize, usize, StageSpec)> = None;
    for x in 0..stages.len() {
        for y in x + 1..stages.len() {
            if reach[x] >> y & 1 == 1 {
                continue;
            }
            let merged = merge(&stages[x], &stages[y], whole);
            let t = time(&merged);
            let gain = times[x] + times[y] - t;
            let threshold = best.as_ref().map_or(0.0, |b| b.0);
            if gain > threshold + 1e-9 * (times[x] + times[y]).max(1.0) {
                best = Some((gain, x, y, merged));
            }
        }
    }
    best.map(|(_, x, y, merged)| (x, y, merged))
}

/// What the scheduled stages add up to: GPU work, time, descriptions and counts for the notes.
struct Tally {
    ledger: Ledger,
    total: f64,
    stages_text: Vec<String>,
    sliced_modules: usize,
    extra_slices: usize,
    late: usize,
}

impl Tally {
    /// Nothing scheduled yet on `gpus` GPUs.
    fn new(gpus: u32) -> Self {
        Tally {
            ledger: Ledger::new(gpus),
            total: 0.0,
            stages_text: Vec::new(),
            sliced_modules: 0,
            extra_slices: 0,
            late: 0,
        }
    }

    /// Adds a scheduled stage: its time, its runs' work and its description.
    fn add_stage(&mut self, model: &PerfModel, whole: &[Vec<QuotaOption>], sched: &Scheduled) {
        self.total += sched.time_ms;
        let parts: Vec<String> = sched
            .runs
            .iter()
            .map(|r| self.add_run(model, whole, r))
            .collect();
        self.stages_text.push(parts.join(" ∥ "));
    }

    /// Adds the work of run `r`'s slices, counts its slices and late start; describes it.
    fn add_run(&mut self, model: &PerfModel, whole: &[Vec<QuotaOption>], r: &Run) -> String {
        let slices: Vec<&Slice> = r.slices.iter().filter(|s| s.fraction > 0.0).collect();
        for s in &slices {
            let o = whole[r.module]
                .iter()
                .find(|o| o.dp == s.dp)
                .expect("option");
            self.ledger
                .add(&s.gpus, 1.0, s.fraction * o.time_ms, o.sm_util);
        }
        if slices.len() > 1 {
            self.sliced_modules += 1;
            self.extra_slices += slices.len() - 1;
        }
        let dps: Vec<String> = slices.iter().map(|s| format!("dp{}", s.dp)).collect();
        let mut text = format!("{} {}", model.modules[r.module].name, dps.join("→"));
        if r.start > 0.0 {
            self.late += 1;
            text.push_str(&format!(" (from {:.1} ms)", r.start));
        }
        text
    }

    /// The notes on slicing and merging, given σ and the number of merges.
    fn notes(&self, sync_ms: f64, merges: usize) -> Vec<String> {
        let (sliced_modules, extra_slices, late) =
            (self.sliced_modules, self.extra_slices, self.late);
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
        if self.unchanged(merges) {
            notes.push("neither slicing nor merging waves pays off: DistMM's schedule".to_string());
        }
        notes
    }

    /// Whether the schedule is DistMM's: no slices and no merges.
    fn unchanged(&self, merges: usize) -> bool {
        self.sliced_modules == 0 && merges == 0
    }

    /// The strategy's result on DistMM's plan `partition`.
    fn result(&self, partition: &Plan, sync_ms: f64, merges: usize) -> StrategyResult {
        let iteration_ms = round_ms(self.total);
        let util = self.ledger.utilisation(iteration_ms);
        StrategyResult {
            strategy: Strategy::Spindle,
            name: Strategy::Spindle.name().to_string(),
            iteration_ms,
            pipelined: false,
            mean_util: util.mean,
            min_util: util.min,
            gpu_util: util.per_gpu,
            description: self.stages_text.join(" | "),
            note: Some(self.notes(sync_ms, merges).join("; ")),
            // Without slices or merges the schedule is DistMM's plan; waves are not a staged plan.
            plan: self.unchanged(merges).then(|| partition.clone()),
            // Waves reshuffle DistMM's stages, whose replicas see the same data.
            shape: crate::common::plan_shape(partition),
        }
    }
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
