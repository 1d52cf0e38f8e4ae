//! Measured profiles (Mosaic §3.3 and §4, "Performance Model"): `mosaic profile --engine`.
//!
//! The planner reads, per module and per grid point (data-parallel degree `dp`, SM quota `sm`),
//! an iteration time, a memory footprint, an achieved SM utilisation and a memory-bandwidth
//! utilisation `B(m, a)`. Mosaic's profiler runs each module's training iteration at every grid
//! point on a GPU and reads them off the device. Here the *device* is this machine: its cores
//! play the SMs (a quota `a` is a slot of `round(a × cores)` threads, see [`crate::slot`]) and its
//! RAM the device memory. [`Profiler::sweep`] measures all four on real training iterations of a
//! built-in engine model's modules; [`Profiler::colocations`] runs modules side by side in their
//! own slots and measures how much they slow each other down, the data the interference
//! coefficients of Eq. 8 are fitted to (`mosaic fit`).
//!
//! # The grid
//! - Quotas: `k / cores` for `k = 1..=cores` on a machine of at most [`MAX_QUOTA_STEPS`] cores
//!   (every distinct slot size), else the paper's deciles `0.1, …, 1.0`; rounded to 0.01 so
//!   that they lie on `mosaic fit`'s 1 % lookup grid (the rounding never changes the slot's
//!   thread count, `round(quota × cores)`). See [`quota_grid`].
//! - Data-parallel degrees: the powers of two up to [`ProfileConfig::max_dp`] and at most the
//!   batch, so that every replica gets at least one sample. See [`dp_grid`].
//!
//! # What one grid point measures
//! A sample at `(dp, sm)` is what **one data-parallel replica on its own device** sees: the
//! replica's iteration on its share of the batch (shard 0 of [`crate::model::shards`], the
//! largest when `dp` does not divide the batch) in a slot of `round(sm × cores)` threads. The
//! iteration is what [`crate::trainer`] does for one replica of one module:
//! 1. **forward**: the module's inputs for the shard (outputs of earlier modules wrapped in
//!    fresh leaf variables, as the trainer does at a module boundary) and its net's forward;
//! 2. **backward**: back-propagation from the replica's loss share (the loss module) or from
//!    `Σ y ⊙ g` with a fixed stand-in `g` for ∂loss/∂output (the other modules; the values of
//!    `g` do not change the work), then every parameter's and input's gradient read out;
//! 3. **all-reduce**: the gradient sum of `dp` replicas as the engine does it for replicas in
//!    one process: `dp` gradient sets (this replica's and `dp − 1` stand-in copies made before
//!    timing) added up in replica order, one tensor addition per parameter and replica. A
//!    collective between processes or devices (MPI, NCCL) costs something else and is not
//!    measured here; [`Point::parts`] keeps this phase separate. Zero at `dp = 1`;
//! 4. **optimizer**: the module's AdamW step.
//!
//! The activations and gradients that cross module boundaries (the trainer gathers and
//! redistributes them) are communication between modules, not part of a module's iteration, and are not timed; neither
//! is drawing the batch. Inputs from earlier modules are computed once, before the sweep.
//! Each point runs [`ProfileConfig::warmup`] untimed iterations, then
//! [`ProfileConfig::reps`] timed ones, and keeps the median iteration (the upper middle one for
//! an even count).
//!
//! # Memory (`mem_gib`)
//! Counted, not sampled from the allocator: parameters, one gradient per parameter, AdamW's two
//! moments (all from the tensors' sizes), and the activations the autograd tape keeps for the
//! backward pass: every distinct storage among the tensors between the variables and the
//! module's output ([`Tensor::sorted_nodes`], so views that share a storage count once and the
//! parameters are not counted twice), plus the replica's data inputs. Not counted: tensors the
//! graph keeps that lead to no parameter (copies of data inputs, attention masks, one-hot
//! targets, all small here) and the backward pass's transient gradients, so this is the
//! footprint at the end of the forward pass, not the peak during backward.
//!
//! # SM utilisation (`sm_util`)
//! The CPU time of the slot's threads over the timed iterations (each thread's
//! `CLOCK_THREAD_CPUTIME_ID`, read on every thread of the slot before and after) divided by
//! `threads × wall time`: the fraction of the quota's core-time that ran. It counts rayon's
//! brief spinning between tasks as busy, so it is an upper bound on useful work; a module whose
//! replica is one sequential task shows about `1 / threads`. Time the OS gave to other
//! processes is not counted, so a busy machine lowers it.
//!
//! # Bandwidth utilisation (`bw_util`)
//! There are no memory-traffic counters to read here, so the traffic is estimated and the
//! machine's peak measured. With `A` the activation bytes and `P` the parameter bytes counted
//! above, one iteration moves at least (every tensor touched the fewest times possible):
//! - forward: read the parameters, write every activation and read it once: `P + 2A`;
//! - backward: read the saved activations, write and read one gradient per activation, read
//!   the parameters, write their gradients: `3A + 2P`;
//! - AdamW: read θ, g, m, v and write θ, m, v: `7P`;
//! - all-reduce: `dp − 1` additions, each reading two gradient sets and writing one:
//!   `3(dp − 1)P`.
//!
//! That is `5A + 10P + 3(dp − 1)P` bytes ([`bytes_moved`]). `bw_util` is those bytes over the
//! iteration time over the machine's peak bandwidth, measured with a STREAM triad (McCalpin,
//! `a[i] = b[i] + s·c[i]` on f64, 24 bytes per element, best of several runs, run again while
//! other processes take the slot's cores) on every slot size; the peak is the best slot's, since co-located slots share the machine's memory. The
//! estimate is a lower bound on traffic (candle's unfused element-wise ops touch tensors more
//! often), while a tiny module's working set may stay in cache and never reach DRAM; the
//! number is a consistent proxy across modules and quotas, not a counter reading.
//!
//! # Co-located runs
//! [`Profiler::colocations`] draws random sets of 2 or more modules (at most
//! [`MAX_COLOCATED`], the number of quota steps and the model's modules) with quotas on the
//! grid adding up to at most one machine and a `dp` each from the grid, and measures each
//! module alone and then all of them at once, each in its own slot, each one replica of
//! `batch / dp` samples: the machine plays GPU 0 of the colocation, which hosts replica 0 of
//! every module. Together, every module iterates until all of them have done `warmup + reps`
//! iterations; a module's time is the median of its iterations after the warm-up that ended
//! before the first module stopped, so every kept iteration ran while all others were running.
//! The slots' busy shares alone and together are measured too: a slot that gets clearly less
//! core time together than alone lost it to other processes (on up to [`MAX_QUOTA_STEPS`] cores
//! the slots' threads never outnumber the cores), so such a colocation is measured again and the least disturbed attempt kept
//! (see [`MeasuredColocation::undisturbed`]).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Mutex;
use std::time::Instant;

use candle_core::{CpuStorage, Device, Storage, Tensor, Var};
use rayon::prelude::*;
use serde::Serialize;

use crate::error::EngineError;
use crate::model::{shards, Input, Model, Output, Shard};
use crate::models;
use crate::nn::Params;
use crate::optim::{AdamW, AdamWConfig};
use crate::rng::Rng;
use crate::slot::{available_cores, run_in_slots, threads_for, Job, Slot};

/// Most quota steps of the grid: machines with more cores are profiled at the deciles.
pub const MAX_QUOTA_STEPS: usize = 10;

/// Most modules in one random colocation (the paper's Fig. 12a goes up to 8).
pub const MAX_COLOCATED: usize = 8;

/// Settings of a profiling sweep.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProfileConfig {
    /// The global batch: a replica at data-parallel degree `dp` runs `batch / dp` samples.
    pub batch: usize,
    /// The largest data-parallel degree profiled (powers of two up to it).
    pub max_dp: usize,
    /// Untimed iterations before the timed ones at every grid point (at least one is run: the
    /// first iteration is where memory is counted).
    pub warmup: usize,
    /// Timed iterations per grid point; the median is kept.
    pub reps: usize,
    /// Seed of the model's parameters, its data and the stand-in gradients.
    pub seed: u64,
}

impl Default for ProfileConfig {
    /// Batch 16 (as `mosaic train`), dp up to 8, 2 warm-up and 21 timed iterations, seed 0.
    fn default() -> Self {
        ProfileConfig {
            batch: 16,
            max_dp: 8,
            warmup: 2,
            reps: 21,
            seed: 0,
        }
    }
}

/// The quotas profiled on a machine of `cores` cores: `k / cores` for `k = 1..=cores` up to
/// [`MAX_QUOTA_STEPS`] cores, else the deciles; rounded to 0.01 (which keeps
/// `round(quota × cores)` equal to `k` below 50 cores).
pub fn quota_grid(cores: usize) -> Vec<f64> {
    let steps = if cores <= MAX_QUOTA_STEPS {
        cores.max(1)
    } else {
        MAX_QUOTA_STEPS
    };
    (1..=steps)
        .map(|k| (k as f64 / steps as f64 * 100.0).round() / 100.0)
        .collect()
}

/// The data-parallel degrees profiled: powers of two up to `max_dp` and at most `batch`.
pub fn dp_grid(batch: usize, max_dp: usize) -> Vec<usize> {
    std::iter::successors(Some(1usize), |d| d.checked_mul(2))
        .take_while(|&d| d <= max_dp && d <= batch)
        .collect()
}

/// The machine the profile is taken on: the "device" of the profile file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Machine {
    /// The device name the files carry: the CPU model and the core count, e.g.
    /// `Intel(R) Xeon(R) Processor (2 cores)`.
    pub name: String,
    /// The CPU model from `/proc/cpuinfo`, if it names one.
    pub cpu: Option<String>,
    /// Cores this process may use (`std::thread::available_parallelism`): the "SMs".
    pub cores: usize,
    /// Physical memory (`MemTotal` of `/proc/meminfo`), in GiB: the "device memory".
    pub memory_gib: f64,
    /// Size of each of the three STREAM-triad arrays, in MiB.
    pub stream_array_mib: usize,
    /// The triad's bandwidth in a slot of every profiled size.
    pub stream: Vec<StreamPoint>,
    /// The best of them, in GB/s (10⁹ bytes per second): the peak `bw_util` is relative to.
    pub peak_gbps: f64,
}

/// The STREAM-triad bandwidth reached by a slot of some size.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StreamPoint {
    /// Threads of the slot.
    pub threads: usize,
    /// Best bandwidth over the runs, GB/s (24 bytes per element, STREAM's convention: the
    /// write-allocate read of `a` is not counted).
    pub gbps: f64,
    /// The slot's busy share while streaming, in [0, 1] (the best of the attempts): below
    /// [`UNDISTURBED`], other processes had some of its cores, and the bandwidth is low.
    pub busy: f64,
}

/// Measures this machine: CPU model, cores, memory, and a STREAM triad over three arrays of
/// `array_mib` MiB (choose them well above the last-level cache to measure DRAM; 64 MiB is
/// the CLI's default) in a slot of every size of [`quota_grid`], best of `reps` runs each
/// (measured again, up to [`MAX_ATTEMPTS`] times, while other processes take the slot's cores).
pub fn measure_machine(array_mib: usize, reps: usize) -> Result<Machine, EngineError> {
    let cores = available_cores();
    let memory_gib = read_mem_total_gib()?;
    let cpu = read_cpu_model();
    let name = format!(
        "{} ({cores} core{})",
        cpu.as_deref().unwrap_or("unknown CPU"),
        if cores == 1 { "" } else { "s" }
    );
    let elems = (array_mib.max(1) << 20) / std::mem::size_of::<f64>();
    let mut stream = Vec::new();
    for q in quota_grid(cores) {
        let threads = threads_for(q, cores);
        let slot = Slot::cpu("stream", q, threads)?;
        // Every thread of the slot streams, so it should be busy all the time; a slot that is
        // not lost its cores to other processes, and is measured again (the best run is kept).
        let mut point = StreamPoint {
            threads,
            gbps: 0.0,
            busy: 0.0,
        };
        for _ in 0..MAX_ATTEMPTS {
            let (gbps, busy) = slot.run(|| busy_share(|| Ok(stream_triad(elems, reps.max(1)))))?;
            if gbps > point.gbps {
                point.gbps = gbps;
            }
            point.busy = point.busy.max(busy);
            if busy >= UNDISTURBED {
                break;
            }
        }
        stream.push(point);
    }
    let peak_gbps = stream.iter().map(|s| s.gbps).fold(0.0, f64::max);
    Ok(Machine {
        name,
        cpu,
        cores,
        memory_gib,
        stream_array_mib: array_mib.max(1),
        stream,
        peak_gbps,
    })
}

/// The STREAM triad `a = b + 3·c` over `elems` f64 on the current rayon pool (the slot it is
/// run in), one chunk per thread; the best of `reps` runs, in GB/s.
fn stream_triad(elems: usize, reps: usize) -> f64 {
    let chunk = elems.div_ceil(rayon::current_num_threads()).max(1);
    // Zeroed allocations are mapped lazily: the first touch, in parallel, places the pages.
    let (mut a, mut b, mut c) = (vec![0f64; elems], vec![0f64; elems], vec![0f64; elems]);
    a.par_chunks_mut(chunk).for_each(|s| s.fill(0.0));
    b.par_chunks_mut(chunk).for_each(|s| s.fill(1.0));
    c.par_chunks_mut(chunk).for_each(|s| s.fill(2.0));
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t0 = Instant::now();
        a.par_chunks_mut(chunk)
            .zip(b.par_chunks(chunk))
            .zip(c.par_chunks(chunk))
            .for_each(|((a, b), c)| {
                for ((x, y), z) in a.iter_mut().zip(b).zip(c) {
                    *x = y + 3.0 * z;
                }
            });
        best = best.min(t0.elapsed().as_secs_f64());
        std::hint::black_box(&mut a);
    }
    24.0 * elems as f64 / best / 1e9
}

fn machine_error(message: String) -> EngineError {
    EngineError::Machine { message }
}

fn read_mem_total_gib() -> Result<f64, EngineError> {
    let text = std::fs::read_to_string("/proc/meminfo").map_err(|e| {
        machine_error(format!(
            "cannot read /proc/meminfo for the machine's memory: {e}"
        ))
    })?;
    text.lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .filter(|kib| *kib > 0.0)
        .map(|kib| kib / (1024.0 * 1024.0))
        .ok_or_else(|| machine_error("/proc/meminfo has no MemTotal line".into()))
}

fn read_cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|v| !v.is_empty())
}

/// This thread's CPU time in ns: `clock_gettime(CLOCK_THREAD_CPUTIME_ID)`, which the kernel
/// brings up to date when called. (The `/proc` counters of a running thread are only updated
/// at scheduler ticks, several ms apart: longer than a tiny module's whole iteration.)
#[cfg(unix)]
fn thread_cpu_ns() -> Result<u64, String> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through the valid pointer it is given.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Err(format!(
            "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// Thread CPU time is read the POSIX way only.
#[cfg(not(unix))]
fn thread_cpu_ns() -> Result<u64, String> {
    Err(
        "the slot threads' CPU time (sm_util) is read with POSIX clock_gettime(\
         CLOCK_THREAD_CPUTIME_ID); this platform has none"
            .into(),
    )
}

/// The on-CPU time of every thread of the current rayon pool, in ns.
fn pool_cpu_ns() -> Result<Vec<u64>, EngineError> {
    rayon::broadcast(|_| thread_cpu_ns())
        .into_iter()
        .collect::<Result<_, _>>()
        .map_err(machine_error)
}

/// Measures the share of the current rayon pool's core-time that ran while `f` ran:
/// `CPU time of its threads / (threads × wall time)`, in [0, 1].
fn busy_share<T>(f: impl FnOnce() -> Result<T, EngineError>) -> Result<(T, f64), EngineError> {
    let threads = rayon::current_num_threads();
    let before = pool_cpu_ns()?;
    let t0 = Instant::now();
    let out = f()?;
    let wall_ns = t0.elapsed().as_nanos() as f64;
    let after = pool_cpu_ns()?;
    let busy: u64 = after
        .iter()
        .zip(&before)
        .map(|(a, b)| a.saturating_sub(*b))
        .sum();
    let share = busy as f64 / (threads as f64 * wall_ns).max(1.0);
    Ok((out, share.clamp(0.0, 1.0)))
}

/// The bytes a replica holds: what `mem_gib` reports (see the module documentation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Memory {
    /// Parameters.
    pub params: u64,
    /// One gradient per parameter.
    pub grads: u64,
    /// AdamW's first and second moments.
    pub optimizer: u64,
    /// Activations kept for the backward pass (the autograd tape) and the data inputs.
    pub activations: u64,
}

impl Memory {
    /// All of it, in bytes.
    pub fn total(&self) -> u64 {
        self.params + self.grads + self.optimizer + self.activations
    }

    /// All of it, in GiB.
    pub fn gib(&self) -> f64 {
        self.total() as f64 / (1u64 << 30) as f64
    }
}

/// The estimated bytes one iteration moves: `5A + 10P + 3(dp − 1)P` with `A` the activation
/// and `P` the parameter bytes of `memory` (the model is in the module documentation).
pub fn bytes_moved(memory: &Memory, dp: usize) -> u64 {
    let (a, p) = (memory.activations, memory.params);
    5 * a + 10 * p + 3 * (dp.max(1) as u64 - 1) * p
}

/// One iteration's phases, in ms.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Timing {
    /// Forward pass.
    pub forward_ms: f64,
    /// Backward pass (with reading out the gradients).
    pub backward_ms: f64,
    /// Gradient all-reduce of the `dp` replicas (0 at dp 1).
    pub allreduce_ms: f64,
    /// AdamW step.
    pub optimizer_ms: f64,
}

impl Timing {
    /// The whole iteration, in ms.
    pub fn total_ms(&self) -> f64 {
        self.forward_ms + self.backward_ms + self.allreduce_ms + self.optimizer_ms
    }
}

/// One grid point of one module.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Point {
    /// The module.
    pub module: String,
    /// Data-parallel degree.
    pub dp: usize,
    /// Quota.
    pub sm: f64,
    /// Threads of the slot.
    pub threads: usize,
    /// Samples of the replica (shard 0 of the batch).
    pub rows: usize,
    /// The median iteration, in ms: the profile's `time_ms`.
    pub time_ms: f64,
    /// The fastest timed iteration, in ms.
    pub min_ms: f64,
    /// The slowest timed iteration, in ms.
    pub max_ms: f64,
    /// The median iteration's phases (they add up to `time_ms`).
    pub parts: Timing,
    /// What the replica holds.
    pub memory: Memory,
    /// Estimated bytes the iteration moves ([`bytes_moved`]).
    pub bytes_moved: u64,
    /// `bytes_moved` over `time_ms`, in GB/s.
    pub achieved_gbps: f64,
    /// `achieved_gbps` over the machine's peak, in [0, 1]: the profile's `bw_util`.
    pub bw_util: f64,
    /// Busy fraction of the slot's core-time, in [0, 1]: the profile's `sm_util`.
    pub sm_util: f64,
}

/// A module as the profile file lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModuleInfo {
    /// Its name.
    pub name: String,
    /// The modules it reads from (the profile's `after`).
    pub after: Vec<String>,
    /// Scalar parameters.
    pub params: usize,
}

/// The result of a sweep: everything a `mosaic-profiles/1` file holds, and more.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EngineProfile {
    /// The engine model.
    pub model: String,
    /// The sweep's settings.
    pub config: ProfileConfig,
    /// The machine.
    pub machine: Machine,
    /// The modules in model order.
    pub modules: Vec<ModuleInfo>,
    /// Every grid point, by module, then dp, then quota.
    pub points: Vec<Point>,
}

impl EngineProfile {
    /// The grid points of `module`.
    pub fn points_of<'a>(&'a self, module: &'a str) -> impl Iterator<Item = &'a Point> + 'a {
        self.points.iter().filter(move |p| p.module == module)
    }

    /// One paragraph on what the numbers are, for the profile file's `source` field.
    pub fn source(&self) -> String {
        let m = &self.machine;
        let c = &self.config;
        format!(
            "mosaic-engine: {} (seed {}, batch {}) measured on {} ({:.1} GiB RAM, STREAM-triad \
             peak {:.1} GB/s with {} MiB arrays). A sample is one data-parallel replica's \
             iteration on batch/dp samples in a slot of round(sm x cores) threads: forward, \
             backward, in-process gradient all-reduce of dp replicas, AdamW step; median of {} \
             after {} warm-up. mem_gib: parameters, gradients, AdamW moments and the \
             activations on the autograd tape. sm_util: on-CPU time of the slot's threads / \
             (threads x wall time). bw_util: estimated bytes (5 x activations + 10 x parameters \
             + 3(dp-1) x parameters) / time / peak. Interference not fitted (mosaic fit --out).",
            self.model,
            c.seed,
            c.batch,
            m.name,
            m.memory_gib,
            m.peak_gbps,
            m.stream_array_mib,
            c.reps,
            c.warmup.max(1)
        )
    }
}

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
    /// Threads of its slot.
    pub threads: usize,
    /// Median iteration alone in its slot, measured just before, in ms.
    pub alone_ms: f64,
    /// Median iteration while all others ran, in ms: the colocation file's `time_ms`.
    pub colocated_ms: f64,
    /// Iterations kept for `colocated_ms`.
    pub iterations: usize,
    /// Busy share of the slot's core-time during the timed iterations alone, in [0, 1] (as
    /// [`Point::sm_util`]).
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

/// The busy-share ratio (together / alone) below which a colocation counts as disturbed by
/// other processes.
pub const UNDISTURBED: f64 = 0.9;

/// Most measurements of one colocation.
pub const MAX_ATTEMPTS: usize = 3;

/// What a module's timed iterations read: its whole-batch inputs and output-gradient stand-in.
struct Prepared {
    /// Whole-batch inputs in [`crate::Module::inputs`] order: data tensors, earlier modules' outputs.
    inputs: Vec<Tensor>,
    /// A stand-in for ∂loss/∂output over the whole batch (activation modules).
    out_grad: Option<Tensor>,
}

/// Measures an engine model's modules on this machine.
pub struct Profiler {
    model: Model,
    config: ProfileConfig,
    machine: Machine,
    prepared: Vec<Prepared>,
    optimizers: Vec<Mutex<AdamW>>,
}

impl Profiler {
    /// A profiler of the built-in model `model` on `machine` (from [`measure_machine`]). Fails
    /// on an unknown model or a setting that makes no sense (batch, reps or max dp of 0).
    /// Runs every module's forward pass once on the whole batch, for the inputs of the modules
    /// after it.
    pub fn new(
        model: &str,
        config: ProfileConfig,
        machine: Machine,
    ) -> Result<Profiler, EngineError> {
        for (setting, value) in [
            ("--batch", config.batch),
            ("--reps", config.reps),
            ("--max-dp", config.max_dp),
        ] {
            if value == 0 {
                return Err(EngineError::BadSetting {
                    setting: setting.into(),
                    message: "expected at least 1".into(),
                });
            }
        }
        let device = Device::Cpu;
        let model = models::build(model, config.seed, &device)?;
        let batch = model
            .data
            .batch(0, config.batch, &device)
            .map_err(EngineError::tensor("data"))?;
        let mut outputs: Vec<Option<Tensor>> = vec![None; model.modules.len()];
        let mut prepared = Vec::with_capacity(model.modules.len());
        for (i, m) in model.modules.iter().enumerate() {
            let err = EngineError::tensor(m.name);
            let inputs: Vec<Tensor> = m
                .inputs
                .iter()
                .map(|input| match input {
                    Input::Data(key) => batch.tensors[key].clone(),
                    Input::Module(p) => outputs[*p].clone().expect("producers come earlier"),
                })
                .collect();
            let out_grad = match m.output {
                Output::Loss => None,
                Output::Activation => {
                    let whole = Shard {
                        index: 0,
                        count: 1,
                        rows: 0..config.batch,
                        batch: config.batch,
                    };
                    let out = m.net.forward(&inputs, &whole).map_err(err)?.detach();
                    let values = Rng::stream(config.seed, "profile/out-grad", i as u64)
                        .normals(out.elem_count(), 0.01);
                    let g = Tensor::from_vec(values, out.shape(), &device)
                        .map_err(EngineError::tensor(m.name))?;
                    outputs[i] = Some(out);
                    Some(g)
                }
            };
            prepared.push(Prepared { inputs, out_grad });
        }
        let optimizers = model
            .modules
            .iter()
            .map(|m| {
                AdamW::new(&m.params, AdamWConfig::default())
                    .map(Mutex::new)
                    .map_err(EngineError::tensor(m.name))
            })
            .collect::<Result<_, _>>()?;
        Ok(Profiler {
            model,
            config,
            machine,
            prepared,
            optimizers,
        })
    }

    /// The model being profiled.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The machine.
    pub fn machine(&self) -> &Machine {
        &self.machine
    }

    /// The settings.
    pub fn config(&self) -> &ProfileConfig {
        &self.config
    }

    /// The quotas of the sweep ([`quota_grid`] of the machine's cores).
    pub fn quotas(&self) -> Vec<f64> {
        quota_grid(self.machine.cores)
    }

    /// The data-parallel degrees of the sweep ([`dp_grid`]).
    pub fn dps(&self) -> Vec<usize> {
        dp_grid(self.config.batch, self.config.max_dp)
    }

    /// Grid points of the whole sweep.
    pub fn grid_points(&self) -> usize {
        self.model.modules.len() * self.dps().len() * self.quotas().len()
    }

    /// Measures every module at every grid point (module by module, then dp, then quota),
    /// calling `on_point` after each, and returns them all.
    pub fn sweep(&self, mut on_point: impl FnMut(&Point)) -> Result<EngineProfile, EngineError> {
        let cores = self.machine.cores;
        let slots = self
            .quotas()
            .into_iter()
            .map(|q| Slot::cpu("profile", q, threads_for(q, cores)))
            .collect::<Result<Vec<_>, _>>()?;
        let mut points = Vec::with_capacity(self.grid_points());
        for m in 0..self.model.modules.len() {
            for dp in self.dps() {
                for slot in &slots {
                    let point = self.measure_point(m, dp, slot)?;
                    on_point(&point);
                    points.push(point);
                }
            }
        }
        let modules = (0..self.model.modules.len())
            .map(|i| ModuleInfo {
                name: self.model.modules[i].name.to_string(),
                after: self
                    .model
                    .producers(i)
                    .map(|p| self.model.modules[p].name.to_string())
                    .collect(),
                params: self.model.modules[i].params.count(),
            })
            .collect();
        Ok(EngineProfile {
            model: self.model.name.to_string(),
            config: self.config.clone(),
            machine: self.machine.clone(),
            modules,
            points,
        })
    }

    /// Module `m` at data-parallel degree `dp` in `slot`.
    fn measure_point(&self, m: usize, dp: usize, slot: &Slot) -> Result<Point, EngineError> {
        let module = &self.model.modules[m];
        let shard = shards(self.config.batch, dp).swap_remove(0);
        let others =
            stand_in_grads(&module.params, dp).map_err(EngineError::tensor(module.name))?;
        let threads = slot.threads();
        let (memory, (mut runs, sm_util)) = slot.run(|| -> Result<_, EngineError> {
            let err = || EngineError::tensor(module.name);
            let mut memory = Memory::default();
            for w in 0..self.config.warmup.max(1) {
                let (_, counted) = self.iterate(m, &shard, &others, w == 0).map_err(err())?;
                if let Some(c) = counted {
                    memory = c;
                }
            }
            let timed = busy_share(|| {
                (0..self.config.reps)
                    .map(|_| Ok(self.iterate(m, &shard, &others, false)?.0))
                    .collect::<candle_core::Result<Vec<Timing>>>()
                    .map_err(err())
            })?;
            Ok((memory, timed))
        })?;
        runs.sort_by(|a, b| a.total_ms().total_cmp(&b.total_ms()));
        let parts = runs[runs.len() / 2];
        let time_ms = parts.total_ms();
        let bytes = bytes_moved(&memory, dp);
        let achieved_gbps = bytes as f64 / (time_ms * 1e6);
        Ok(Point {
            module: module.name.to_string(),
            dp,
            sm: slot.quota(),
            threads,
            rows: shard.rows.len(),
            time_ms,
            min_ms: runs[0].total_ms(),
            max_ms: runs[runs.len() - 1].total_ms(),
            parts,
            memory,
            bytes_moved: bytes,
            achieved_gbps,
            bw_util: (achieved_gbps / self.machine.peak_gbps).clamp(0.0, 1.0),
            sm_util,
        })
    }

    /// One replica's iteration of module `m` on `shard` (see the module documentation), with
    /// `others` the other replicas' gradients for the all-reduce; counts the memory when
    /// `count` is set (outside the timed phases).
    fn iterate(
        &self,
        m: usize,
        shard: &Shard,
        others: &[Vec<Tensor>],
        count: bool,
    ) -> candle_core::Result<(Timing, Option<Memory>)> {
        let module = &self.model.modules[m];
        let prep = &self.prepared[m];
        let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;

        let t = Instant::now();
        let (xs, vars) = module.replica_inputs(prep.inputs.iter().cloned(), shard)?;
        let out = module.net.forward(&xs, shard)?;
        let forward_ms = ms(t);

        let memory = if count {
            let data: Vec<&Tensor> = xs
                .iter()
                .zip(&vars)
                .filter(|(_, v)| v.is_none())
                .map(|(x, _)| x)
                .collect();
            let opt = self.optimizers[m].lock().expect("optimizer lock");
            let params = tensor_bytes(module.params.iter().map(|(_, v)| v.as_tensor()));
            Some(Memory {
                params,
                grads: params,
                optimizer: tensor_bytes(opt.m.iter().chain(&opt.v)),
                activations: tape_bytes(&out, &module.params) + tensor_bytes(data),
            })
        } else {
            None
        };

        let t = Instant::now();
        let grads = match module.output {
            Output::Loss => out.backward()?,
            Output::Activation => {
                let g = prep
                    .out_grad
                    .as_ref()
                    .expect("activation modules have a stand-in gradient")
                    .narrow(0, shard.rows.start, shard.rows.len())?;
                out.mul(&g)?.sum_all()?.backward()?
            }
        };
        let read = |v: &Var| match grads.get(v.as_tensor()) {
            Some(g) => Ok(g.clone()),
            None => v.as_tensor().zeros_like(),
        };
        let params = module
            .params
            .iter()
            .map(|(_, v)| read(v))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let inputs = vars
            .iter()
            .map(|v| v.as_ref().map(read).transpose())
            .collect::<candle_core::Result<Vec<_>>>()?;
        std::hint::black_box(&inputs);
        let backward_ms = ms(t);

        let t = Instant::now();
        let params = if others.is_empty() {
            params
        } else {
            let mut sum = params;
            for other in others {
                for (acc, g) in sum.iter_mut().zip(other) {
                    *acc = (&*acc + g)?;
                }
            }
            sum
        };
        let allreduce_ms = if others.is_empty() { 0.0 } else { ms(t) };

        let t = Instant::now();
        self.optimizers[m]
            .lock()
            .expect("optimizer lock")
            .step(&module.params, &params)?;
        let optimizer_ms = ms(t);
        Ok((
            Timing {
                forward_ms,
                backward_ms,
                allreduce_ms,
                optimizer_ms,
            },
            memory,
        ))
    }

    /// `warmup` then `reps` iterations of module `m` at `dp` in the current slot: the median
    /// iteration in ms and the slot's busy share during the timed ones.
    fn alone(&self, m: usize, dp: usize) -> Result<(f64, f64), EngineError> {
        let module = &self.model.modules[m];
        let err = || EngineError::tensor(module.name);
        let shard = shards(self.config.batch, dp).swap_remove(0);
        let others = stand_in_grads(&module.params, dp).map_err(err())?;
        for _ in 0..self.config.warmup {
            self.iterate(m, &shard, &others, false).map_err(err())?;
        }
        let (mut times, share) = busy_share(|| {
            (0..self.config.reps)
                .map(|_| Ok(self.iterate(m, &shard, &others, false)?.0.total_ms()))
                .collect::<candle_core::Result<Vec<f64>>>()
                .map_err(err())
        })?;
        Ok((median(&mut times), share))
    }

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
                setting: "--colocations".into(),
                message: format!(
                    "no two modules can share this machine: {} has {} quota step(s) and {} has \
                     {n} module(s)",
                    self.machine.name,
                    quotas.len(),
                    self.model.name
                ),
            });
        }
        let dps = self.dps();
        let mut out = Vec::with_capacity(config.samples);
        for s in 0..config.samples {
            let mut rng = Rng::stream(config.seed, "profile/colocations", s as u64);
            let k = 2 + rng.below((k_max - 1) as u64) as usize;
            let mut modules: Vec<usize> = (0..n).collect();
            shuffle(&mut rng, &mut modules);
            modules.truncate(k);
            modules.sort_unstable();
            // k positive parts of a total of k..=steps quota steps: k − 1 distinct cuts.
            let total = k + rng.below((quotas.len() - k + 1) as u64) as usize;
            let mut cuts: Vec<usize> = (1..total).collect();
            shuffle(&mut rng, &mut cuts);
            cuts.truncate(k - 1);
            cuts.sort_unstable();
            cuts.insert(0, 0);
            cuts.push(total);
            let picks: Vec<(usize, usize, f64)> = modules
                .iter()
                .enumerate()
                .map(|(j, &m)| {
                    let steps = cuts[j + 1] - cuts[j];
                    let dp = dps[rng.below(dps.len() as u64) as usize];
                    (m, dp, quotas[steps - 1])
                })
                .collect();
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

    /// Measures `(module, dp, quota)` picks alone and together, each in its own slot.
    fn measure_colocation(
        &self,
        picks: &[(usize, usize, f64)],
    ) -> Result<MeasuredColocation, EngineError> {
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

        let target = self.config.warmup + self.config.reps;
        let stop = AtomicBool::new(false);
        let stop_at = AtomicU64::new(u64::MAX);
        let done: Vec<AtomicUsize> = picks.iter().map(|_| AtomicUsize::new(0)).collect();
        let base = Instant::now();
        type Ends = Result<(Vec<(u64, f64)>, f64), EngineError>;
        let jobs: Vec<(&Slot, Job<'_, Ends>)> = picks
            .iter()
            .zip(&slots)
            .enumerate()
            .map(|(j, (&(m, dp, _), slot))| {
                let (stop, stop_at, done) = (&stop, &stop_at, &done);
                let job: Job<'_, Ends> = Box::new(move || {
                    let run = || -> Ends {
                        let module = &self.model.modules[m];
                        let err = || EngineError::tensor(module.name);
                        let shard = shards(self.config.batch, dp).swap_remove(0);
                        let others = stand_in_grads(&module.params, dp).map_err(err())?;
                        busy_share(|| {
                            let mut its = Vec::new();
                            while !stop.load(SeqCst) {
                                let (t, _) =
                                    self.iterate(m, &shard, &others, false).map_err(err())?;
                                let end = base.elapsed().as_nanos() as u64;
                                its.push((end, t.total_ms()));
                                done[j].fetch_add(1, SeqCst);
                                if done.iter().all(|d| d.load(SeqCst) >= target) {
                                    stop_at.fetch_min(end, SeqCst);
                                    stop.store(true, SeqCst);
                                }
                            }
                            Ok(its)
                        })
                    };
                    let result = run();
                    // A failed module must not leave the others iterating forever.
                    stop.store(true, SeqCst);
                    result
                });
                (slot, job)
            })
            .collect();
        let results = run_in_slots(jobs);
        let stop_at = stop_at.load(SeqCst);
        let mut modules = Vec::with_capacity(picks.len());
        for (((&(m, dp, q), slot), result), (alone_ms, alone_busy)) in
            picks.iter().zip(&slots).zip(results).zip(alone)
        {
            let (its, together_busy) = result?;
            let mut kept: Vec<f64> = its
                .into_iter()
                .skip(self.config.warmup)
                .filter(|&(end, _)| end <= stop_at)
                .map(|(_, ms)| ms)
                .collect();
            modules.push(ColocatedRun {
                module: self.model.modules[m].name.to_string(),
                dp,
                sm: q,
                threads: slot.threads(),
                alone_ms,
                alone_busy,
                together_busy,
                iterations: kept.len(),
                colocated_ms: median(&mut kept),
            });
        }
        Ok(MeasuredColocation {
            modules,
            attempts: 1,
        })
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

/// `dp − 1` deep copies of `params`: stand-ins for the other replicas' gradients.
fn stand_in_grads(params: &Params, dp: usize) -> candle_core::Result<Vec<Vec<Tensor>>> {
    (1..dp)
        .map(|_| {
            params
                .iter()
                .map(|(_, v)| Ok(v.as_tensor().copy()?.detach()))
                .collect()
        })
        .collect()
}

/// The median (the upper middle value for an even count); 0 for none.
fn median(xs: &mut [f64]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Fisher–Yates.
fn shuffle<T>(rng: &mut Rng, xs: &mut [T]) {
    for i in (1..xs.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        xs.swap(i, j);
    }
}

/// Bytes of the tensors' elements (views counted at their own size).
fn tensor_bytes<'a>(ts: impl IntoIterator<Item = &'a Tensor>) -> u64 {
    ts.into_iter()
        .map(|t| (t.elem_count() * t.dtype().size_in_bytes()) as u64)
        .sum()
}

/// A tensor's storage: an identity shared by the tensors viewing it, and its size in bytes.
fn storage_of(t: &Tensor) -> (usize, u64) {
    let (storage, layout) = t.storage_and_layout();
    let key = &*storage as *const Storage as usize;
    let bytes = match &*storage {
        Storage::Cpu(c) => cpu_storage_bytes(c),
        _ => layout.shape().elem_count() * t.dtype().size_in_bytes(),
    };
    (key, bytes as u64)
}

fn cpu_storage_bytes(c: &CpuStorage) -> usize {
    use std::mem::size_of_val;
    match c {
        CpuStorage::U8(v) => size_of_val(v.as_slice()),
        CpuStorage::U32(v) => size_of_val(v.as_slice()),
        CpuStorage::I16(v) => size_of_val(v.as_slice()),
        CpuStorage::I32(v) => size_of_val(v.as_slice()),
        CpuStorage::I64(v) => size_of_val(v.as_slice()),
        CpuStorage::BF16(v) => size_of_val(v.as_slice()),
        CpuStorage::F16(v) => size_of_val(v.as_slice()),
        CpuStorage::F32(v) => size_of_val(v.as_slice()),
        CpuStorage::F64(v) => size_of_val(v.as_slice()),
        CpuStorage::F8E4M3(v) => size_of_val(v.as_slice()),
        CpuStorage::F6E2M3(v)
        | CpuStorage::F6E3M2(v)
        | CpuStorage::F4(v)
        | CpuStorage::F8E8M0(v) => size_of_val(v.as_slice()),
    }
}

/// Bytes of the distinct storages on `out`'s autograd tape, the parameters' excepted.
fn tape_bytes(out: &Tensor, params: &Params) -> u64 {
    let own: HashSet<usize> = params
        .iter()
        .map(|(_, v)| storage_of(v.as_tensor()).0)
        .collect();
    let mut seen = HashSet::new();
    out.sorted_nodes()
        .into_iter()
        .map(storage_of)
        .filter(|(key, _)| !own.contains(key) && seen.insert(*key))
        .map(|(_, bytes)| bytes)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A machine description without the STREAM run (tests do not measure bandwidth).
    fn machine(cores: usize) -> Machine {
        Machine {
            name: format!("test machine ({cores} cores)"),
            cpu: None,
            cores,
            memory_gib: 8.0,
            stream_array_mib: 0,
            stream: vec![],
            peak_gbps: 10.0,
        }
    }

    fn quick(batch: usize, max_dp: usize) -> ProfileConfig {
        ProfileConfig {
            batch,
            max_dp,
            warmup: 1,
            reps: 2,
            seed: 3,
        }
    }

    #[test]
    fn grids_follow_the_machine_and_the_batch() {
        assert_eq!(quota_grid(1), [1.0]);
        assert_eq!(quota_grid(2), [0.5, 1.0]);
        assert_eq!(quota_grid(3), [0.33, 0.67, 1.0]);
        assert_eq!(quota_grid(64).len(), MAX_QUOTA_STEPS);
        assert_eq!(quota_grid(64)[0], 0.1);
        for cores in 1..=MAX_QUOTA_STEPS {
            let threads: Vec<usize> = quota_grid(cores)
                .iter()
                .map(|&q| threads_for(q, cores))
                .collect();
            assert_eq!(threads, (1..=cores).collect::<Vec<_>>(), "{cores} cores");
        }
        assert_eq!(dp_grid(16, 8), [1, 2, 4, 8]);
        assert_eq!(dp_grid(5, 8), [1, 2, 4]);
        assert_eq!(dp_grid(1, 8), [1]);
        assert_eq!(dp_grid(16, 3), [1, 2]);
    }

    #[test]
    fn byte_model_counts_the_all_reduce() {
        let m = Memory {
            params: 100,
            grads: 100,
            optimizer: 200,
            activations: 40,
        };
        assert_eq!(m.total(), 440);
        assert_eq!(bytes_moved(&m, 1), 5 * 40 + 10 * 100);
        assert_eq!(bytes_moved(&m, 4), 5 * 40 + 10 * 100 + 9 * 100);
    }

    #[test]
    fn machine_is_described() {
        let m = measure_machine(1, 2).unwrap();
        assert_eq!(m.cores, available_cores());
        assert!(m.memory_gib > 0.0);
        assert!(m.name.contains(&format!("({} core", m.cores)), "{}", m.name);
        assert_eq!(m.stream.len(), quota_grid(m.cores).len());
        assert!(m.stream.iter().all(|s| s.gbps > 0.0 && s.gbps.is_finite()));
        assert!(m.stream.iter().all(|s| (0.0..=1.0).contains(&s.busy)));
        assert_eq!(
            m.peak_gbps,
            m.stream.iter().map(|s| s.gbps).fold(0.0, f64::max)
        );
    }

    #[test]
    fn sweep_measures_every_grid_point() {
        let p = Profiler::new("clip-tiny", quick(8, 4), machine(2)).unwrap();
        assert_eq!(p.grid_points(), 3 * 3 * 2);
        let mut seen = 0;
        let profile = p.sweep(|_| seen += 1).unwrap();
        assert_eq!(seen, 18);
        assert_eq!(profile.points.len(), 18);
        let names: Vec<&str> = profile.modules.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["vision", "text", "align"]);
        assert_eq!(profile.modules[2].after, ["vision", "text"]);
        assert!(profile.modules[0].after.is_empty());
        for pt in &profile.points {
            assert!(pt.time_ms > 0.0 && pt.time_ms.is_finite(), "{pt:?}");
            assert!(pt.min_ms <= pt.time_ms && pt.time_ms <= pt.max_ms, "{pt:?}");
            assert!((pt.parts.total_ms() - pt.time_ms).abs() < 1e-9);
            assert_eq!(pt.parts.allreduce_ms == 0.0, pt.dp == 1, "{pt:?}");
            assert!((0.0..=1.0).contains(&pt.sm_util) && (0.0..=1.0).contains(&pt.bw_util));
            assert_eq!(pt.threads, threads_for(pt.sm, 2));
            assert_eq!(pt.rows, 8 / pt.dp);
            assert!(pt.memory.params > 0 && pt.memory.activations > 0);
            assert_eq!(pt.memory.grads, pt.memory.params);
            assert_eq!(pt.memory.optimizer, 2 * pt.memory.params);
            assert_eq!(pt.bytes_moved, bytes_moved(&pt.memory, pt.dp));
            assert!((pt.achieved_gbps - pt.bytes_moved as f64 / (pt.time_ms * 1e6)).abs() < 1e-9);
            let params = profile
                .modules
                .iter()
                .find(|m| m.name == pt.module)
                .unwrap();
            assert_eq!(pt.memory.params, 4 * params.params as u64);
        }
        // A sharded module holds fewer activations per replica as dp grows; the gathered
        // align sees the whole batch at every dp.
        let act = |module: &str, dp: usize| {
            profile
                .points_of(module)
                .find(|p| p.dp == dp)
                .unwrap()
                .memory
                .activations
        };
        for module in ["vision", "text"] {
            assert!(act(module, 1) > act(module, 2) && act(module, 2) > act(module, 4));
        }
        assert!(act("align", 1) >= act("align", 4));
        // Memory does not depend on the quota.
        for pair in profile.points.chunks(2) {
            assert_eq!(pair[0].memory, pair[1].memory);
        }
        assert!(profile.source().contains("clip-tiny"));
    }

    #[test]
    fn bad_settings_and_models_are_named() {
        let e = Profiler::new("clip-huge", quick(8, 4), machine(2))
            .err()
            .unwrap();
        assert!(e.is_bad_input());
        assert!(e.to_string().contains("clip-huge") && e.to_string().contains("omni-tiny"));
        let e = Profiler::new("clip-tiny", quick(0, 4), machine(2))
            .err()
            .unwrap();
        assert!(e.to_string().starts_with("--batch"), "{e}");
    }

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
                assert_eq!(m.threads, 1);
            }
        }
        // One core cannot host two slots.
        let one = Profiler::new("clip-tiny", quick(4, 2), machine(1)).unwrap();
        let e = one.colocations(&config, |_, _| {}).unwrap_err();
        assert!(e.to_string().starts_with("--colocations"), "{e}");
    }
}
