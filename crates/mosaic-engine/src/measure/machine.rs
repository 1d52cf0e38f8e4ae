//! What this machine is, as the "device" of a measured profile: its cores (the "SMs"), its
//! memory, its peak memory bandwidth, and how busy a slot's threads are.
//!
//! # SM utilisation (`sm_util`)
//! The CPU time of the slot's threads over the timed iterations (each thread's
//! `CLOCK_THREAD_CPUTIME_ID`, read on every thread of the slot before and after) divided by
//! `threads × wall time`: the fraction of the quota's core-time that ran ([`busy_share`]). It
//! counts rayon's brief spinning between tasks as busy, so it is an upper bound on useful
//! work; a module whose replica is one sequential task shows about `1 / threads`. Time the OS
//! gave to other processes is not counted, so a busy machine lowers it.
//!
//! # Peak bandwidth
//! There are no memory-traffic counters to read here, so the machine's peak is measured with a
//! STREAM triad (McCalpin, `a[i] = b[i] + s·c[i]` on f64, 24 bytes per element, best of
//! several runs, run again while other processes take the slot's cores) on every slot size;
//! the peak is the best slot's, since co-located slots share the machine's memory.

use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

use crate::error::EngineError;
use crate::runtime::slot::{threads_for, Slot};

/// Most quota steps of the grid: machines with more cores are profiled at the deciles.
pub const MAX_QUOTA_STEPS: usize = 10;

/// The quotas profiled on a machine of `cores` cores: `k / cores` for `k = 1..=cores` up to
/// [`MAX_QUOTA_STEPS`] cores, else the deciles; rounded to 0.01 (which keeps
/// `round(quota × cores)` equal to `k` below 50 cores).
pub fn quota_grid(cores: usize) -> Vec<f64> {
    // Written as a clamp: rustc 1.95.0 at opt-level 1 (the `ci` profile) miscompiles the
    // equivalent `if cores <= MAX { cores.max(1) } else { MAX }` into `cores.max(1)`.
    let steps = cores.clamp(1, MAX_QUOTA_STEPS);
    (1..=steps)
        .map(|k| (k as f64 / steps as f64 * 100.0).round() / 100.0)
        .collect()
}

/// The busy-share ratio (together / alone) below which a colocation counts as disturbed by
/// other processes (and the busy share below which a STREAM run does).
pub const UNDISTURBED: f64 = 0.9;

/// Most measurements of one colocation (or of one STREAM slot size).
pub const MAX_ATTEMPTS: usize = 3;

/// The cores the machine offers this process (`std::thread::available_parallelism`, 1 if
/// unknown).
pub fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
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

/// This machine's physical memory (`MemTotal` of `/proc/meminfo`), in GiB.
pub(crate) fn read_mem_total_gib() -> Result<f64, EngineError> {
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
pub(crate) fn busy_share<T>(
    f: impl FnOnce() -> Result<T, EngineError>,
) -> Result<(T, f64), EngineError> {
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

/// Measures the share of the wall time the current thread ran on a CPU while `f` ran, in
/// [0, 1]: a GPU slot's launching thread, which has no pool of its own.
#[cfg_attr(not(all(feature = "cuda", mosaic_gpu)), allow(dead_code))]
pub(crate) fn thread_busy<T>(
    f: impl FnOnce() -> Result<T, EngineError>,
) -> Result<(T, f64), EngineError> {
    let before = thread_cpu_ns().map_err(machine_error)?;
    let t0 = Instant::now();
    let out = f()?;
    let wall_ns = t0.elapsed().as_nanos() as f64;
    let busy = thread_cpu_ns()
        .map_err(machine_error)?
        .saturating_sub(before);
    Ok((out, (busy as f64 / wall_ns.max(1.0)).clamp(0.0, 1.0)))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A machine description without the STREAM run (tests do not measure bandwidth).
    pub(crate) fn machine(cores: usize) -> Machine {
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
    fn a_thread_is_busy_while_it_spins_and_idle_while_it_sleeps() {
        let (_, spinning) = thread_busy(|| {
            let t0 = Instant::now();
            while t0.elapsed().as_millis() < 60 {
                std::hint::black_box(0u64);
            }
            Ok(())
        })
        .unwrap();
        let (_, sleeping) = thread_busy(|| {
            std::thread::sleep(std::time::Duration::from_millis(60));
            Ok(())
        })
        .unwrap();
        assert!(
            sleeping < 0.5 && sleeping < spinning,
            "{sleeping} {spinning}"
        );
    }
}
