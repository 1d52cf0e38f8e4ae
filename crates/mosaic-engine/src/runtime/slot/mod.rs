//! Execution slots and the slot pool (Mosaic §3.2).
//!
//! On a GPU, Mosaic runs each module of a stage on a green-context stream holding its SM
//! quota; since a green context's quota cannot change, a new quota needs a new context, and
//! creating one costs tens of milliseconds (Fig. 11a: ~37 ms on demand against 0.013 ms from a
//! pool), so every stream a plan needs is created before training starts and reused at every
//! stage transition.
//!
//! On a CPU a slot is a rayon thread pool of `max(1, round(quota × cores))` threads (cores from
//! `std::thread::available_parallelism`). What runs on it: the module's data-parallel
//! replicas (one rayon task each), the optimizer step, and the candle kernels they call. What
//! candle 0.11.1 does with threads, read from its source and measured here:
//! - **Matmul** asks gemm for `Parallelism::Rayon(n)`, `n` the machine's core count, and gemm
//!   runs its `n` tasks on the rayon pool it is called from, i.e. the slot: a one-thread slot
//!   runs its matmuls on that one thread ([`crate::measure::matmul_in_slots`]: a 512³ product
//!   takes ~6.1 ms in a one-thread slot, ~3.3 ms in a two-thread one, on the 2-core machine
//!   this was written on). The split into tasks, and so the result, does not depend on the
//!   slot's size. gemm threads a product only above 48·48·256 multiply-adds per depth block.
//! - **Elementwise ops on 65,536 elements or more** (`unary_map_vec_par`,
//!   `binary_map_vec_par`) do *not* use rayon: they run on candle's process-wide "barrier
//!   pool" of `CANDLE_NUM_THREADS − 1` threads (default: the core count) plus the caller, and
//!   concurrent callers take turns on its lock. A slot does not bound those. With
//!   `CANDLE_NUM_THREADS=1` set before candle's first such op, the pool has no threads and the
//!   op runs on the calling slot thread; `mosaic train` sets it (unless the user did) so that a
//!   slot owns all of its module's compute. Results are identical either way (an elementwise
//!   op does not depend on how it is chunked).
//! - Smaller elementwise ops and reductions run on the calling thread.
//!
//! For the tiny built-in models most products are below gemm's threshold, so a module's
//! parallelism inside its slot comes mostly from its replicas.
//!
//! # GPU slots (feature `cuda`)
//! [`cuda`] holds the paper's GPU slot: a green context holding the module's SMs
//! (`round(quota × SMs)` to the architecture's partition granularity; the slots of a stage on
//! disjoint SMs) and a non-blocking stream in it, created before training by `GpuSlotPool` or
//! per stage on demand; [`crate::measure::bench_gpu_slots`] measures the two on a real GPU. It
//! is the [`Slot::Gpu`] variant; [`Slot::run`] on it runs the closure on the calling thread
//! with the green context current. In the GPU build (`--cfg mosaic_gpu`, `scripts/cuda-cargo`)
//! a module's tensors live on a candle CUDA device bound to its slot's stream
//! (`GpuSlot::candle_device`, `crate::runtime::on_gpu`), so its kernels run on the slot's SMs;
//! candle 0.11 keeps the constructor that needs private (`CudaDevice::from_context_and_stream`,
//! upstream PR #3777), which the script makes public in a copy of candle at build time. Other
//! builds train on CPU slots. The slots build without CUDA (cudarc loads `libcuda` at run time)
//! and report, rather than panic, when there is no driver or GPU
//! ([`cuda::driver_unavailable`]). Built without the
//! `cuda` feature, [`GpuSlot`] is a type with no values and `driver_unavailable` says so, so
//! callers need no `cfg`.

use std::ops::Deref;

use rayon::ThreadPool;

use crate::error::EngineError;

pub mod cuda;
pub use cuda::GpuSlot;

/// Threads a slot of `quota` gets on a machine of `cores` cores: `round(quota × cores)`, at
/// least one.
pub fn threads_for(quota: f64, cores: usize) -> usize {
    ((quota * cores as f64).round() as usize).max(1)
}

/// Where a module runs: the execution resources of its quota.
#[derive(Debug)]
pub enum Slot {
    /// A CPU thread pool.
    Cpu(CpuSlot),
    /// A CUDA green context and its stream (none without the `cuda` feature).
    Gpu(GpuSlot),
}

/// A CPU slot: a rayon thread pool of a fixed number of threads.
#[derive(Debug)]
pub struct CpuSlot {
    pool: ThreadPool,
    threads: usize,
    quota: f64,
}

impl Slot {
    /// A CPU slot of `threads` threads for `module` at `quota`.
    pub fn cpu(module: &str, quota: f64, threads: usize) -> Result<Slot, EngineError> {
        let name = module.to_string();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(move |i| format!("slot-{name}-{i}"))
            .build()
            .map_err(|e| EngineError::Slot {
                module: module.to_string(),
                threads,
                message: e.to_string(),
            })?;
        Ok(Slot::Cpu(CpuSlot {
            pool,
            threads,
            quota,
        }))
    }

    /// Threads (CPU) the slot owns; 0 for a GPU slot, which owns SMs ([`Slot::sms`]) and runs
    /// host code on the caller's thread.
    pub fn threads(&self) -> usize {
        match self {
            Slot::Cpu(s) => s.threads,
            Slot::Gpu(_) => 0,
        }
    }

    /// SMs (GPU) the slot's green context holds; `None` for a CPU slot.
    pub fn sms(&self) -> Option<u32> {
        match self {
            Slot::Cpu(_) => None,
            Slot::Gpu(s) => Some(s.sms()),
        }
    }

    /// How a GPU slot's SMs were carved from its device; `None` for a CPU slot.
    pub fn carving(&self) -> Option<cuda::Carving> {
        self.as_gpu().map(GpuSlot::carving)
    }

    /// The GPU slot, if this is one.
    pub fn as_gpu(&self) -> Option<&GpuSlot> {
        match self {
            Slot::Gpu(s) => Some(s),
            Slot::Cpu(_) => None,
        }
    }

    /// The quota it was created for.
    pub fn quota(&self) -> f64 {
        match self {
            Slot::Cpu(s) => s.quota,
            Slot::Gpu(s) => s.quota(),
        }
    }

    /// Runs `f` inside the slot and waits for it: on a CPU slot in its thread pool, on a GPU
    /// slot on the calling thread with the slot's green context current
    /// (`GpuSlot::run`).
    ///
    /// # Panics
    /// If a GPU slot's context cannot be made current (a driver failure).
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        match self {
            Slot::Cpu(s) => s.pool.install(f),
            Slot::Gpu(s) => s.run(f).unwrap_or_else(|e| panic!("{e}")),
        }
    }
}

/// When slots are created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SlotMode {
    /// Every slot the plan needs is created before the first step and reused (Mosaic's pool).
    #[default]
    Pooled,
    /// A stage creates its modules' slots when it starts and drops them when it ends (the
    /// create-and-destroy baseline of the paper's Fig. 11).
    OnDemand,
}

/// What one module's slot must be.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotSpec {
    /// The module.
    pub module: String,
    /// Its quota.
    pub quota: f64,
    /// Its threads.
    pub threads: usize,
}

/// The slots of a plan, one per module (a plan places each module once).
#[derive(Debug)]
pub struct SlotPool {
    mode: SlotMode,
    specs: Vec<SlotSpec>,
    slots: Vec<Slot>,
}

/// A slot lent to a stage: from the pool, or created for the stage alone.
pub enum Lease<'a> {
    /// Borrowed from the pool.
    Pooled(&'a Slot),
    /// Created on demand; dropped (its threads told to exit) when the stage ends.
    Fresh(Slot),
}

impl Deref for Lease<'_> {
    type Target = Slot;
    fn deref(&self) -> &Slot {
        match self {
            Lease::Pooled(s) => s,
            Lease::Fresh(s) => s,
        }
    }
}

impl SlotPool {
    /// The pool for `specs` (indexed by module); in [`SlotMode::Pooled`] every slot is created
    /// now.
    pub fn new(specs: Vec<SlotSpec>, mode: SlotMode) -> Result<SlotPool, EngineError> {
        let slots = match mode {
            SlotMode::Pooled => specs
                .iter()
                .map(|s| Slot::cpu(&s.module, s.quota, s.threads))
                .collect::<Result<_, _>>()?,
            SlotMode::OnDemand => Vec::new(),
        };
        Ok(SlotPool { mode, specs, slots })
    }

    /// A pooled pool of slots made elsewhere (a GPU's green-context slots), `slots[i]` for
    /// `specs[i]`.
    pub fn from_slots(specs: Vec<SlotSpec>, slots: Vec<Slot>) -> SlotPool {
        assert_eq!(specs.len(), slots.len(), "a slot per spec");
        SlotPool {
            mode: SlotMode::Pooled,
            specs,
            slots,
        }
    }

    /// The mode.
    pub fn mode(&self) -> SlotMode {
        self.mode
    }

    /// Slots created ahead of training (0 on demand).
    pub fn created(&self) -> usize {
        self.slots.len()
    }

    /// Module `module`'s slot, if it was made before training.
    pub fn pooled(&self, module: usize) -> Option<&Slot> {
        self.slots.get(module)
    }

    /// The slot of module `module` for one stage.
    pub fn lease(&self, module: usize) -> Result<Lease<'_>, EngineError> {
        match self.mode {
            SlotMode::Pooled => Ok(Lease::Pooled(&self.slots[module])),
            SlotMode::OnDemand => {
                let s = &self.specs[module];
                Ok(Lease::Fresh(Slot::cpu(&s.module, s.quota, s.threads)?))
            }
        }
    }
}

/// A job for [`run_in_slots`].
pub(crate) type Job<'a, T> = Box<dyn FnOnce() -> T + Send + 'a>;

/// Runs every job in its slot, all at the same time, and returns their results in order once
/// the slowest has finished (a stage ends when its slowest module ends). No thread is created:
/// the caller nests one rayon scope per slot and blocks until all jobs are done (a GPU slot's
/// job runs in the caller's rayon pool, see `nest`).
pub(crate) fn run_in_slots<'a, T: Send + 'a>(jobs: Vec<(&'a Slot, Job<'a, T>)>) -> Vec<T> {
    let mut cells: Vec<Option<T>> = jobs.iter().map(|_| None).collect();
    let work: Vec<_> = jobs
        .into_iter()
        .zip(cells.iter_mut())
        .map(|((slot, job), cell)| (slot, job, cell))
        .collect();
    nest(work);
    cells
        .into_iter()
        .map(|c| c.expect("every job ran"))
        .collect()
}

fn nest<'a, 'c, T: Send + 'a>(mut work: Vec<(&'a Slot, Job<'a, T>, &'c mut Option<T>)>) {
    let Some((slot, job, cell)) = work.pop() else {
        return;
    };
    match slot {
        Slot::Cpu(s) => s.pool.in_place_scope(move |scope| {
            scope.spawn(move |_| *cell = Some(job()));
            nest(work);
        }),
        // A GPU slot has no threads: its job is a task of the caller's rayon pool, run with the
        // slot's green context current.
        Slot::Gpu(_) => rayon::in_place_scope(move |scope| {
            scope.spawn(move |_| *cell = Some(slot.run(job)));
            nest(work);
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    #[test]
    fn quota_to_threads() {
        assert_eq!(threads_for(1.0, 2), 2);
        assert_eq!(threads_for(0.5, 2), 1);
        assert_eq!(threads_for(0.1, 2), 1);
        assert_eq!(threads_for(0.3, 16), 5);
        assert_eq!(threads_for(1.0, 1), 1);
    }

    #[test]
    fn jobs_run_concurrently_in_their_own_slots() {
        let a = Slot::cpu("a", 0.5, 1).unwrap();
        let b = Slot::cpu("b", 0.5, 1).unwrap();
        // Both jobs must be running at once to pass the barrier.
        let barrier = Arc::new(Barrier::new(2));
        let job = |bar: Arc<Barrier>| -> Job<'_, String> {
            Box::new(move || {
                bar.wait();
                std::thread::current().name().unwrap_or("").to_string()
            })
        };
        let names = run_in_slots(vec![(&a, job(barrier.clone())), (&b, job(barrier.clone()))]);
        assert_eq!(names, ["slot-a-0", "slot-b-0"]);
    }

    #[test]
    fn pooled_slots_are_made_once_on_demand_slots_per_lease() {
        let specs = vec![
            SlotSpec {
                module: "x".into(),
                quota: 1.0,
                threads: 2,
            },
            SlotSpec {
                module: "y".into(),
                quota: 0.5,
                threads: 1,
            },
        ];
        let pooled = SlotPool::new(specs.clone(), SlotMode::Pooled).unwrap();
        assert_eq!(pooled.created(), 2);
        assert!(matches!(pooled.lease(1).unwrap(), Lease::Pooled(s) if s.threads() == 1));
        let on_demand = SlotPool::new(specs, SlotMode::OnDemand).unwrap();
        assert_eq!(on_demand.created(), 0);
        assert!(matches!(on_demand.lease(0).unwrap(), Lease::Fresh(ref s) if s.threads() == 2));
        assert_eq!(
            on_demand.lease(0).unwrap().run(rayon::current_num_threads),
            2
        );
    }
}
