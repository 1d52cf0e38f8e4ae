//! Co-located runs: modules measured side by side, each in its own slot, and how much they slow
//! each other down; the data the interference coefficients of Eq. 8 are fitted to
//! (`mosaic fit`).
//!
//! [`Profiler::colocations`] draws random sets of 2 or more modules (at most
//! [`MAX_COLOCATED`], the number of quota steps and the model's modules) with quotas on the
//! grid adding up to at most one machine and a `dp` each from the grid, and measures each
//! module alone and then all of them at once, each in its own slot, each one replica of
//! `batch / dp` samples: the machine plays GPU 0 of the colocation, which hosts replica 0 of
//! every module. Together, every module iterates until all of them have done `warmup + reps`
//! iterations; a module's time is the median of its iterations after the warm-up that ended
//! by the time the last module had done its `warmup + reps`, so every kept iteration ran while
//! all others were running.
//! The slots' busy shares alone and together are measured too: a slot that gets clearly less
//! core time together than alone lost it to other processes (on up to
//! [`super::MAX_QUOTA_STEPS`] cores the slots' threads never outnumber the cores), so such a
//! colocation is measured again and the least disturbed attempt kept (see
//! [`MeasuredColocation::undisturbed`]).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::time::Instant;

use mosaic_kit::rng::SplitMix64;
use mosaic_kit::stats::median_high;
use serde::Serialize;

use super::machine::{busy_share, MAX_ATTEMPTS, UNDISTURBED};
use super::profiler::{Profiler, Timing};
use super::sweep::{Launch, Run};
use crate::error::EngineError;
use crate::runtime::slot::{run_in_slots, threads_for, Job, Slot};

/// Most modules in one random colocation (the paper's Fig. 12a goes up to 8).
pub const MAX_COLOCATED: usize = 8;

/// Settings of the co-located runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ColocationConfig {
    /// Colocations to draw and measure.
    pub samples: usize,
    /// Seed of the draws (the same seed draws the same colocations).
    pub seed: u64,
}

/// One module of a measured colocation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ColocatedRun {
    /// The module.
    pub module: String,
    /// Data-parallel degree.
    pub dp: usize,
    /// Quota.
    pub sm: f64,
    /// The slot's cores: threads on the CPU, SMs on a GPU.
    pub cores: usize,
    /// Median iteration alone in its slot, measured just before, in ms.
    pub alone_ms: f64,
    /// Median iteration while all others ran, in ms: the colocation file's `time_ms`.
    pub colocated_ms: f64,
    /// Iterations kept for `colocated_ms`.
    pub iterations: usize,
    /// Busy share of the slot's core-time during the timed iterations alone, in [0, 1] (as
    /// [`super::Point::sm_util`]).
    pub alone_busy: f64,
    /// Busy share of the slot's core-time during the run together, in [0, 1]. Well below
    /// `alone_busy`, the OS gave the slot's cores to other threads: with no more slot threads
    /// than cores, to other processes on the machine, whose load the time then includes.
    pub together_busy: f64,
}

impl ColocatedRun {
    /// `colocated / alone − 1`.
    pub fn slowdown(&self) -> f64 {
        self.colocated_ms / self.alone_ms - 1.0
    }
}

/// Modules measured side by side, each in its own slot.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MeasuredColocation {
    /// The modules, in model order.
    pub modules: Vec<ColocatedRun>,
    /// Times it was measured (see [`MeasuredColocation::undisturbed`]).
    pub attempts: usize,
}

impl MeasuredColocation {
    /// The smallest ratio, over its modules, of the slot's busy share together to alone.
    pub fn busy_ratio(&self) -> f64 {
        self.modules
            .iter()
            .map(|m| m.together_busy / m.alone_busy.max(1e-9))
            .fold(f64::INFINITY, f64::min)
    }

    /// Whether every slot got at least [`UNDISTURBED`] of the core time together that it had
    /// alone. A colocation that was not is measured again, up to [`MAX_ATTEMPTS`] times in all,
    /// and the least disturbed attempt kept: with no more slot threads than cores, a slot that
    /// loses core time loses it to other processes, whose load its time would include.
    pub fn undisturbed(&self) -> bool {
        self.busy_ratio() >= UNDISTURBED
    }
}

/// A module of a colocation: `(module index, dp, quota)`.
pub(super) type Pick = (usize, usize, f64);

/// What a module's run together gave: the end (ns since the start) and length (ms) of each of
/// its iterations, and its slot's busy share.
pub(super) type Ends = Result<(Vec<(u64, f64)>, f64), EngineError>;

impl Profiler {
    /// Draws `config.samples` random colocations (see the module documentation) and measures
    /// each, calling `on_sample` with its index after each. Fails when this machine cannot
    /// host two slots at once (one core) or the model has one module.
    pub fn colocations(
        &self,
        config: &ColocationConfig,
        mut on_sample: impl FnMut(usize, &MeasuredColocation),
    ) -> Result<Vec<MeasuredColocation>, EngineError> {
        let quotas = self.quotas();
        let n = self.model.modules.len();
        let k_max = MAX_COLOCATED.min(n).min(quotas.len());
        if k_max < 2 {
            return Err(EngineError::BadSetting {
                setting: "mosaic measure colocations".into(),
                message: format!(
                    "no two modules can share this machine: {} has {} quota step(s) and {} has \
                     {n} module(s)",
                    self.machine.name,
                    quotas.len(),
                    self.model.name
                ),
            });
        }
        let mut out = Vec::with_capacity(config.samples);
        for s in 0..config.samples {
            let mut rng = SplitMix64::stream(config.seed, "profile/colocations", s as u64);
            let picks = draw(&mut rng, n, &self.dps(), k_max, &quotas, 1);
            // Measured again while another process took the slots' cores, keeping the
            // least disturbed attempt.
            let mut sample = self.measure_colocation(&picks)?;
            while !sample.undisturbed() && sample.attempts < MAX_ATTEMPTS {
                let again = self.measure_colocation(&picks)?;
                let attempts = sample.attempts + 1;
                if again.busy_ratio() > sample.busy_ratio() {
                    sample = again;
                }
                sample.attempts = attempts;
            }
            on_sample(s, &sample);
            out.push(sample);
        }
        Ok(out)
    }

    /// Measures `picks` alone and together, each in its own slot.
    fn measure_colocation(&self, picks: &[Pick]) -> Result<MeasuredColocation, EngineError> {
        let cores = self.machine.cores;
        let slots = picks
            .iter()
            .map(|&(m, _, q)| Slot::cpu(self.model.modules[m].name, q, threads_for(q, cores)))
            .collect::<Result<Vec<_>, _>>()?;
        let alone = picks
            .iter()
            .zip(&slots)
            .map(|(&(m, dp, _), slot)| slot.run(|| self.alone(m, dp)))
            .collect::<Result<Vec<_>, _>>()?;
        let (results, stop_at) = self.together(picks, &slots);
        let cores = slots.iter().map(Slot::threads).collect();
        self.assemble(picks, cores, alone, results, stop_at)
    }

    /// The colocation of `picks` from what they did alone (median ms, busy share) and together
    /// (each module's iterations, those ending by `stop_at` kept: see [`Race::stop_at`]), in
    /// slots of `cores`.
    pub(super) fn assemble(
        &self,
        picks: &[Pick],
        cores: Vec<usize>,
        alone: Vec<(f64, f64)>,
        together: Vec<Ends>,
        stop_at: u64,
    ) -> Result<MeasuredColocation, EngineError> {
        let mut modules = Vec::with_capacity(picks.len());
        for (((&(m, dp, q), cores), result), (alone_ms, alone_busy)) in
            picks.iter().zip(cores).zip(together).zip(alone)
        {
            let (its, together_busy) = result?;
            let kept: Vec<f64> = its
                .into_iter()
                .skip(self.config.warmup)
                .filter(|&(end, _)| end <= stop_at)
                .map(|(_, ms)| ms)
                .collect();
            modules.push(ColocatedRun {
                module: self.model.modules[m].name.to_string(),
                dp,
                sm: q,
                cores,
                alone_ms,
                alone_busy,
                together_busy,
                iterations: kept.len(),
                colocated_ms: median_high(&kept).unwrap_or(0.0),
            });
        }
        Ok(MeasuredColocation {
            modules,
            attempts: 1,
        })
    }

    /// `warmup` then `reps` iterations of module `m` at `dp` in the current slot: the median
    /// iteration in ms and the slot's busy share during the timed ones.
    fn alone(&self, m: usize, dp: usize) -> Result<(f64, f64), EngineError> {
        let run = Run::new(self, m, dp)?;
        for _ in 0..self.config.warmup {
            run.once()?;
        }
        let (times, share) = busy_share(|| run.timed(self.config.reps))?;
        let times: Vec<f64> = times.iter().map(Timing::total_ms).collect();
        Ok((median_high(&times).unwrap_or(0.0), share))
    }

    /// Every pick iterating in its slot at the same time until all have done `warmup + reps`
    /// iterations: each module's iterations and busy share, and [`Race::stop_at`].
    fn together(&self, picks: &[Pick], slots: &[Slot]) -> (Vec<Ends>, u64) {
        let target = self.config.warmup + self.config.reps;
        let race = &Race::new(picks.len());
        let jobs: Vec<(&Slot, Job<'_, Ends>)> = picks
            .iter()
            .zip(slots)
            .enumerate()
            .map(|(j, (&(m, dp, _), slot))| {
                let job: Job<'_, Ends> = Box::new(move || {
                    let _leaving = race.leaving();
                    Run::new(self, m, dp).and_then(|run| {
                        busy_share(|| run.until_all_done(j, target, race, &Launch::op_by_op()))
                    })
                });
                (slot, job)
            })
            .collect();
        let results = run_in_slots(jobs);
        (results, race.stop_at.load(SeqCst))
    }

    /// One paragraph on what colocation samples are, for the colocations file's `source`.
    pub fn colocation_source(&self, config: &ColocationConfig) -> String {
        format!(
            "mosaic-engine: {} random colocations of {} modules (seed {}, batch {}) on {}: every \
             module in its own slot at the same time, each one data-parallel replica of \
             batch/dp samples (the machine plays GPU 0 of the colocation); time_ms is the median \
             of a module's iterations after {} warm-up that ran while all the others were \
             running (at least {} each).",
            config.samples,
            self.model.name,
            config.seed,
            self.config.batch,
            self.machine.name,
            self.config.warmup,
            self.config.reps
        )
    }
}

/// The modules of a colocation iterating together: who has done how many iterations, and
/// until when all of them were.
pub(super) struct Race {
    stop: AtomicBool,
    /// When the last module to get there ended its `target`-th iteration, in ns since `base`:
    /// no module stops before every one has, so until then all of them were iterating.
    pub(super) stop_at: AtomicU64,
    done: Vec<AtomicUsize>,
    base: Instant,
}

impl Race {
    /// A race of `modules` modules, starting now.
    pub(super) fn new(modules: usize) -> Race {
        Race {
            stop: AtomicBool::new(false),
            stop_at: AtomicU64::new(0),
            done: (0..modules).map(|_| AtomicUsize::new(0)).collect(),
            base: Instant::now(),
        }
    }

    /// Held by a module's thread for as long as it takes part: when it lets go (done, failed,
    /// or panicking), every module stops, so that none is left iterating forever.
    pub(super) fn leaving(&self) -> Leaving<'_> {
        Leaving(self)
    }

    /// Module `j` iterating (`iteration` returns each iteration's ms) until every module has
    /// done `target` iterations, or one has left: the end (ns since the race began) and
    /// length (ms) of each iteration.
    fn iterate<E>(
        &self,
        j: usize,
        target: usize,
        mut iteration: impl FnMut() -> Result<f64, E>,
    ) -> Result<Vec<(u64, f64)>, E> {
        let mut its = Vec::new();
        while !self.stop.load(SeqCst) {
            let ms = iteration()?;
            let end = self.base.elapsed().as_nanos() as u64;
            its.push((end, ms));
            // Before counting it, so that whoever sees every count at `target` sees this too.
            if its.len() == target {
                self.stop_at.fetch_max(end, SeqCst);
            }
            self.done[j].fetch_add(1, SeqCst);
            if self.done.iter().all(|d| d.load(SeqCst) >= target) {
                self.stop.store(true, SeqCst);
            }
        }
        Ok(its)
    }
}

/// A module's part in a [`Race`]; dropping it stops the race.
pub(super) struct Leaving<'a>(&'a Race);

impl Drop for Leaving<'_> {
    fn drop(&mut self) {
        self.0.stop.store(true, SeqCst);
    }
}

impl Run<'_> {
    /// Iterates as module `j` of `race`, launched as `launch` says, until every module has
    /// done `target` iterations: the end (ns since the race began) and length (ms) of each
    /// iteration.
    pub(super) fn until_all_done(
        &self,
        j: usize,
        target: usize,
        race: &Race,
        launch: &Launch,
    ) -> Result<Vec<(u64, f64)>, EngineError> {
        race.iterate(j, target, || self.once_as(launch).map(|t| t.total_ms()))
    }
}

/// One random colocation of a model of `n` modules: 2 to `k_max` distinct modules in model
/// order, whose quotas (at least `least` of `quotas`' steps each, `quotas[s − 1]` being `s`
/// steps) add up to at most `quotas.len()` steps, each with a data-parallel degree of `dps`.
/// `k_max · least` must be at most `quotas.len()`.
pub(super) fn draw(
    rng: &mut SplitMix64,
    n: usize,
    dps: &[usize],
    k_max: usize,
    quotas: &[f64],
    least: usize,
) -> Vec<Pick> {
    let k = 2 + rng.below((k_max - 1) as u64) as usize;
    let mut modules: Vec<usize> = (0..n).collect();
    rng.shuffle(&mut modules);
    modules.truncate(k);
    modules.sort_unstable();
    // k positive parts of a total of k..=spare steps (k − 1 distinct cuts), each then raised
    // by least − 1 steps.
    let spare = quotas.len() - k * (least - 1);
    let total = k + rng.below((spare - k + 1) as u64) as usize;
    let mut cuts: Vec<usize> = (1..total).collect();
    rng.shuffle(&mut cuts);
    cuts.truncate(k - 1);
    cuts.sort_unstable();
    cuts.insert(0, 0);
    cuts.push(total);
    modules
        .iter()
        .enumerate()
        .map(|(j, &m)| {
            let steps = cuts[j + 1] - cuts[j] + least - 1;
            let dp = dps[rng.below(dps.len() as u64) as usize];
            (m, dp, quotas[steps - 1])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::machine::tests::machine;
    use crate::measure::profiler::tests::quick;

    #[test]
    fn colocations_pair_modules_within_one_machine() {
        let p = Profiler::new("omni-tiny", quick(4, 2), machine(2)).unwrap();
        let config = ColocationConfig {
            samples: 3,
            seed: 9,
        };
        let mut calls = 0;
        let samples = p.colocations(&config, |_, _| calls += 1).unwrap();
        assert_eq!((samples.len(), calls), (3, 3));
        for s in &samples {
            assert_eq!(s.modules.len(), 2, "two half-machine slots on 2 cores");
            let total: f64 = s.modules.iter().map(|m| m.sm).sum();
            assert!(total <= 1.0 + 1e-9);
            assert_ne!(s.modules[0].module, s.modules[1].module);
            for m in &s.modules {
                assert!(m.alone_ms > 0.0 && m.colocated_ms > 0.0, "{m:?}");
                assert!(m.iterations >= 2, "{m:?}");
                assert!([1, 2].contains(&m.dp));
                assert_eq!(m.cores, 1);
            }
        }
        // One core cannot host two slots.
        let one = Profiler::new("clip-tiny", quick(4, 2), machine(1)).unwrap();
        let e = one.colocations(&config, |_, _| {}).unwrap_err();
        assert!(
            e.to_string().starts_with("mosaic measure colocations: "),
            "{e}"
        );
    }

    proptest::proptest! {
        /// Every draw: 2 to k_max distinct modules in model order, each at least `least` steps,
        /// all within the machine, each dp from the grid.
        #[test]
        fn draws_fit_the_machine(
            seed in 0u64..1000,
            n in 2usize..10,
            steps in 2usize..17,
            least in 1usize..4,
        ) {
            let k_max = MAX_COLOCATED.min(n).min(steps / least);
            proptest::prop_assume!(k_max >= 2);
            let quotas: Vec<f64> = (1..=steps).map(|s| s as f64 / steps as f64).collect();
            let dps = [1, 2, 4];
            let mut rng = SplitMix64::new(seed);
            let picks = draw(&mut rng, n, &dps, k_max, &quotas, least);
            proptest::prop_assert!((2..=k_max).contains(&picks.len()));
            proptest::prop_assert!(picks.windows(2).all(|w| w[0].0 < w[1].0 && w[1].0 < n));
            let used: f64 = picks.iter().map(|p| p.2).sum();
            proptest::prop_assert!(used <= 1.0 + 1e-9, "{picks:?}");
            for &(_, dp, q) in &picks {
                proptest::prop_assert!(q >= quotas[least - 1] - 1e-12 && dps.contains(&dp));
            }
        }
    }

    /// Modules of unequal speeds racing to `target` iterations: each keeps at least `target`
    /// iterations ending by `stop_at`, so a slow module's last one is never cut (a `stop_at`
    /// taken when the first module got there would cut the slowest's every time).
    #[test]
    fn every_module_keeps_its_target_iterations_whatever_the_speeds() {
        let target = 3;
        for round in 0..20u64 {
            let race = Race::new(3);
            let ends: Vec<Vec<(u64, f64)>> = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..3usize)
                    .map(|j| {
                        let race = &race;
                        scope.spawn(move || {
                            let _leaving = race.leaving();
                            let pause = std::time::Duration::from_micros(
                                50 * (j as u64 + 1) * (round % 4 + 1),
                            );
                            race.iterate(j, target, || {
                                std::thread::sleep(pause);
                                Ok::<_, ()>(1.0)
                            })
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap().unwrap())
                    .collect()
            });
            let stop_at = race.stop_at.load(SeqCst);
            for (j, its) in ends.iter().enumerate() {
                let kept = its.iter().filter(|&&(end, _)| end <= stop_at).count();
                assert!(
                    kept >= target,
                    "round {round}: module {j} kept {kept} of {its:?}"
                );
            }
        }
    }

    /// A module that fails, or panics, stops the others (else they would iterate forever,
    /// here until their 100,000-iteration cap fails them).
    #[test]
    fn a_module_that_fails_or_panics_stops_the_race() {
        for panics in [false, true] {
            let race = Race::new(2);
            let (steady, failing) = std::thread::scope(|scope| {
                let steady = scope.spawn(|| {
                    let _leaving = race.leaving();
                    let mut n = 0;
                    race.iterate(0, 5, || {
                        n += 1;
                        std::thread::sleep(std::time::Duration::from_micros(20));
                        if n > 100_000 {
                            Err("never stopped")
                        } else {
                            Ok(1.0)
                        }
                    })
                });
                let failing = scope.spawn(|| {
                    let _leaving = race.leaving();
                    race.iterate(1, 5, || {
                        std::thread::sleep(std::time::Duration::from_millis(2));
                        if panics {
                            panic!("a CUDA failure cudarc panics on");
                        }
                        Err("a failed launch")
                    })
                });
                (steady.join(), failing.join())
            });
            let steady = steady.unwrap().unwrap();
            // Stopped by the other's leaving (perhaps before its first iteration, on a busy
            // machine), not by its cap.
            assert!(steady.len() < 100_000, "{}", steady.len());
            match failing {
                Ok(r) => assert!(!panics && r.is_err()),
                Err(_) => assert!(panics),
            }
        }
    }
}
