//! A pass captured once as a CUDA graph and replayed (issue 11, item 2): the host then launches
//! one graph where it launched every op, which is what a module pays where its host time
//! rivals its GPU time (small modules at small batches; `bench block` measured ImageBind imu's
//! block at batch 2 spending 52 % of its step on launches on an H200).
//!
//! `capture` runs the pass once op by op (the warm-up: it loads kernels and leaves candle's
//! shape uploads on the device, under `CudaDevice::enable_cuda_graph_htod_cache`, so that the
//! capture reads them there), captures it on its device's stream, replays the graph twice and
//! compares the replay's result with the warm-up's: a graph that does not reproduce the pass is
//! refused, and the warm-up's result, a correct one, is what the caller uses. So is it when the
//! pass cannot be captured at all (it reads a tensor back to the host, for instance, which a
//! capture refuses). The tensors the capture returns live in the graph's own memory
//! (allocation nodes, freed before each replay by `AUTO_FREE_ON_LAUNCH`, at addresses fixed for
//! the graph's life): every replay rewrites them in place. What the pass reads from outside must
//! stay where it was at capture: parameters (updated in place), and inputs the caller copies
//! into fixed buffers before each replay.

use candle_core::{Result, Tensor};
use mosaic_kit::stats::relative_error;

use crate::models::nn::to_f32s;
use crate::switch::EnvSwitch;

/// `MOSAIC_GRAPHS`: unset or `on`, launch-bound modules replay CUDA graphs; `off`, every module
/// launches op by op.
pub static GRAPHS: EnvSwitch = EnvSwitch::new("MOSAIC_GRAPHS", "on", "off");

/// The share of a module's forward and backward passes the host spends issuing their work at
/// or above which they are replayed from CUDA graphs (by the trainer, and by the GPU profile
/// sweep, which measures what the trainer runs). At half, the GPU idles for launches at least
/// as long as the launches the host issues ahead of it; the H200 put ImageBind imu's block at
/// batch 2 at 52 % and real-size blocks at batch 16 at 1–2 % (`mosaic bench block`, README
/// "Measured on an H200 (2026-11-28)").
pub const LAUNCH_BOUND: f64 = 0.5;

/// Whether passes that took `ms`, of which the host spent `host_ms` issuing them, are
/// launch-bound ([`LAUNCH_BOUND`]).
pub(crate) fn launch_bound(host_ms: f64, ms: f64) -> bool {
    host_ms / ms.max(1e-9) >= LAUNCH_BOUND
}

/// Why passes that are not [`launch_bound`] stay op by op, in words.
pub(crate) fn gpu_bound(host_ms: f64, ms: f64) -> String {
    format!(
        "GPU-bound: the host issued its work in {:.0} % of its time (graphs from {:.0} %)",
        100.0 * host_ms / ms.max(1e-9),
        100.0 * LAUNCH_BOUND
    )
}

/// Largest difference, relative to a tensor's largest magnitude, between a replayed pass and
/// the same pass launched op by op. Both run the same kernels on the same values, except that
/// the fused attention's backward pass adds dQ with atomics in no fixed order (`check gpu`:
/// real-size CLIP's losses 6e-4 apart over six steps); a replay that reads or writes the wrong
/// memory is off by the order of the values themselves.
pub(crate) const REPLAY_BOUND: f32 = 2e-2;

/// The largest [`relative_error`] of paired tensors (infinite where one is missing).
pub(crate) fn differ(a: &[Option<Tensor>], b: &[Option<Tensor>]) -> Result<f32> {
    if a.len() != b.len() {
        return Ok(f32::INFINITY);
    }
    let mut worst = 0f32;
    for (x, y) in a.iter().zip(b) {
        let e = match (x, y) {
            (Some(x), Some(y)) => relative_error(&to_f32s(x)?, &to_f32s(y)?),
            (None, None) => 0.0,
            _ => f32::INFINITY,
        };
        // NaN stays (a replay that made one is refused).
        worst = if e.is_nan() { e } else { worst.max(e) };
    }
    Ok(worst)
}

/// `work` on a thread of its own, which ends with it: what candle and the engine keep per
/// thread for the devices `work` used — candle's uploads cached for CUDA graphs
/// (`enable_cuda_graph_htod_cache`: each holds its device's stream, and none is ever evicted),
/// the engine's loaded kernels — goes with that thread, while those devices' green-context
/// slots still exist. Kept by a thread that outlives the slots (the main thread of a profile
/// sweep, partition after partition), they would be freed at exit on streams destroyed long
/// before. A panic in `work` is an error saying what it said.
#[cfg_attr(not(all(feature = "cuda", mosaic_gpu)), allow(dead_code))] // the GPU sweeps'
pub(crate) fn on_own_thread<T: Send>(
    what: &str,
    work: impl FnOnce() -> std::result::Result<T, crate::EngineError> + Send,
) -> std::result::Result<T, crate::EngineError> {
    std::thread::scope(|scope| {
        scope.spawn(work).join().unwrap_or_else(|panic| {
            let said = crate::error::panic_text(&*panic).unwrap_or_default();
            Err(crate::EngineError::Cuda {
                what: what.to_string(),
                message: format!("its thread panicked: {said}"),
            })
        })
    })
}

/// A pass captured as a CUDA graph, with what its capture returned: tensors every
/// [`Captured::replay`] rewrites in place.
pub(crate) struct Captured<T> {
    // Dropped first: the graph's allocations outlive it and are freed by `out`'s drop.
    graph: on_device::Graph,
    out: T,
}

impl<T> Captured<T> {
    /// Launches the graph on the stream it was captured on (asynchronously) and returns its
    /// result, which holds this replay's values once the stream gets there.
    pub(crate) fn replay(&self) -> Result<&T> {
        self.graph.launch()?;
        Ok(&self.out)
    }

    /// The result of the last replay, without launching.
    pub(crate) fn last(&self) -> &T {
        &self.out
    }
}

/// What [`capture`] made of a pass.
#[cfg_attr(not(all(feature = "cuda", mosaic_gpu)), allow(dead_code))]
pub(crate) enum Capture<T> {
    /// Captured, replayed and reproduced: replay from now on.
    Graphed(Captured<T>),
    /// Not graphed, and why; `warm` is the pass launched op by op.
    Refused { why: String, warm: T },
}

pub(crate) use on_device::capture;

#[cfg(all(feature = "cuda", mosaic_gpu))]
mod on_device {
    use candle_core::backend::BackendDevice;
    use candle_core::cuda_backend::cudarc::driver::{sys, CudaGraph};
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{bail, CudaDevice, Device, Error, Result};

    use super::{Capture, Captured};

    /// A CUDA graph, instantiated.
    pub(super) struct Graph(CudaGraph);

    // SAFETY: an executable graph and its stream may be launched from any thread (the driver
    // API is thread-safe); the owner launches it from one thread at a time (a module's passes
    // run one after another) and never while its capture is open.
    unsafe impl Send for Graph {}
    unsafe impl Sync for Graph {}

    impl Graph {
        pub(super) fn launch(&self) -> Result<()> {
            self.0.launch().w()
        }

        /// Nodes of the graph: kernels, copies, memsets, allocations and frees.
        pub(super) fn nodes(&self) -> Result<usize> {
            let mut nodes = 0usize;
            // SAFETY: a live graph owned by `self`; a null node array asks for the count.
            unsafe { sys::cuGraphGetNodes(self.0.cu_graph(), std::ptr::null_mut(), &mut nodes) }
                .result()
                .w()?;
            Ok(nodes)
        }
    }

    /// `run`, a pass that launches its work on `device`'s stream, warmed up, captured and
    /// replayed twice; the replay's result is set against the warm-up's by `differ` (a
    /// relative difference) and kept within `bound`. Fails only where the warm-up itself fails:
    /// a capture that fails, or panics (candle and cudarc panic on some CUDA failures), is a
    /// refusal, so training goes on op by op.
    pub(crate) fn capture<T>(
        device: &Device,
        run: &dyn Fn() -> Result<T>,
        differ: &dyn Fn(&T, &T) -> Result<f32>,
        bound: f32,
    ) -> Result<Capture<T>> {
        let Device::Cuda(cuda) = device else {
            let warm = run()?;
            return Ok(Capture::Refused {
                why: "CUDA graphs need a CUDA device".into(),
                warm,
            });
        };
        let _cached = cuda.enable_cuda_graph_htod_cache();
        // Under the cache, candle hands out cached uploads by a clone that panics where the
        // device cannot allocate: an error here, as the pass would fail without graphs.
        let warm = caught(run)?;
        let attempt = || {
            let captured = record(cuda, run)?;
            for _ in 0..2 {
                captured.replay()?;
            }
            let d = differ(captured.last(), &warm)?;
            // NaN included: a replay that made one is refused.
            if d.is_nan() || d > bound {
                bail!(
                    "replayed, it differs from the pass launched op by op by {d:.1e} (bound \
                     {bound:.0e})"
                )
            }
            Ok(captured)
        };
        Ok(match caught(attempt) {
            Ok(c) => Capture::Graphed(c),
            Err(e) => {
                // An error a failed capture left behind for cudarc's next call, reported here
                // rather than by the op-by-op pass after it.
                let left = cuda.cuda_stream().context().check_err().err();
                let left = left.map_or(String::new(), |e| format!(" (and then: {e})"));
                Capture::Refused {
                    why: format!("not captured as a CUDA graph: {e}{left}"),
                    warm,
                }
            }
        })
    }

    /// `f`'s result, or its panic as an error saying what it said.
    fn caught<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
            let what = crate::error::panic_text(&*panic).unwrap_or_default();
            Err(Error::Msg(format!("it panicked: {what}")))
        })
    }

    /// `run` captured on `cuda`'s stream (its result in the graph's memory) and launched once;
    /// the capture is ended whatever happens inside it.
    pub(crate) fn record<T>(cuda: &CudaDevice, run: &dyn Fn() -> Result<T>) -> Result<Captured<T>> {
        cuda.synchronize()?;
        let stream = cuda.cuda_stream();
        stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .w()?;
        // A panic inside (candle and cudarc panic on some CUDA failures) is raised again once
        // the capture has ended, so that the thread is not left capturing.
        let captured = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run));
        // cudarc keeps a failed free's error for the next call, which would then return it
        // before ending the capture: taken here, reported after the capture has ended.
        let pending = stream.context().check_err();
        let flags = sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
        let graph = stream.end_capture(flags);
        let captured = captured.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        let out = captured?;
        let graph = match graph.w() {
            Ok(Some(g)) => Graph(g),
            Ok(None) => {
                // Nothing was recorded, so nothing `out` holds is graph memory.
                drop(out);
                bail!("the capture recorded no work")
            }
            Err(e) => {
                // Addresses no launch has reached must not be freed: `out` is let go.
                std::mem::forget(out);
                return Err(e);
            }
        };
        // Launched before anything else can fail, for the same reason; a free that failed
        // inside the capture fails it the same way.
        if let Err(e) = pending.w().and_then(|()| graph.launch()) {
            drop(graph);
            std::mem::forget(out);
            return Err(e);
        }
        Ok(Captured { graph, out })
    }
}

#[cfg(not(all(feature = "cuda", mosaic_gpu)))]
mod on_device {
    use candle_core::{Device, Result};

    use super::Capture;

    /// No graph exists in a build without GPU compute.
    pub(super) enum Graph {}

    impl Graph {
        pub(super) fn launch(&self) -> Result<()> {
            match *self {}
        }
    }

    /// The pass op by op: a build without GPU compute has no graphs.
    pub(crate) fn capture<T>(
        _: &Device,
        run: &dyn Fn() -> Result<T>,
        _: &dyn Fn(&T, &T) -> Result<f32>,
        _: f32,
    ) -> Result<Capture<T>> {
        let warm = run()?;
        Ok(Capture::Refused {
            why: "CUDA graphs need the GPU build".into(),
            warm,
        })
    }
}

#[cfg(all(feature = "cuda", mosaic_gpu))]
pub(crate) use on_device::record;

#[cfg(all(feature = "cuda", mosaic_gpu))]
impl<T> Captured<T> {
    /// Nodes of the graph: the launches one replay stands for.
    pub(crate) fn nodes(&self) -> Result<usize> {
        self.graph.nodes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn passes_are_graphed_when_the_host_takes_at_least_half_of_them() {
        assert!(launch_bound(0.5, 1.0) && launch_bound(2.0, 1.0));
        assert!(!launch_bound(0.49, 1.0));
        assert!(
            gpu_bound(0.1, 1.0).contains("10 %"),
            "{}",
            gpu_bound(0.1, 1.0)
        );
    }

    #[test]
    fn differences_are_relative_per_tensor_and_missing_ones_are_infinite() {
        let t = |v: &[f32]| Some(Tensor::new(v, &Device::Cpu).unwrap());
        let a = [t(&[1.0, 2.0]), t(&[100.0, 0.0])];
        let b = [t(&[1.0, 2.1]), t(&[100.0, 0.0])];
        let d = differ(&a, &b).unwrap();
        assert!((d - 0.1 / 2.1).abs() < 1e-6, "{d}");
        assert_eq!(differ(&[t(&[1.0])], &[None]).unwrap(), f32::INFINITY);
        assert!(differ(&[t(&[f32::NAN])], &[t(&[1.0])]).unwrap().is_nan());
    }

    /// What `work` left in its thread's locals is dropped by the time it returns; a panic
    /// comes back as an error.
    #[test]
    fn work_on_its_own_thread_takes_its_thread_locals_with_it() {
        use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
        static DROPPED: AtomicBool = AtomicBool::new(false);
        struct Cached;
        impl Drop for Cached {
            fn drop(&mut self) {
                DROPPED.store(true, SeqCst);
            }
        }
        thread_local!(static CACHE: std::cell::RefCell<Option<Cached>> = const { std::cell::RefCell::new(None) });
        let n = on_own_thread("caching", || {
            CACHE.with(|c| *c.borrow_mut() = Some(Cached));
            Ok(7)
        })
        .unwrap();
        assert!(n == 7 && DROPPED.load(SeqCst));
        let e = on_own_thread::<()>("a partition", || panic!("CUDA_ERROR_ILLEGAL_ADDRESS"))
            .unwrap_err();
        assert!(
            e.to_string().contains("a partition") && e.to_string().contains("ILLEGAL_ADDRESS"),
            "{e}"
        );
    }

    #[test]
    fn off_a_gpu_the_pass_runs_op_by_op_and_says_why() {
        let x = Tensor::new(&[1f32, 2.0], &Device::Cpu).unwrap();
        let run = || x.sqr();
        let differ = |_: &Tensor, _: &Tensor| Ok(0f32);
        match capture(&Device::Cpu, &run, &differ, 0.0).unwrap() {
            Capture::Refused { why, warm } => {
                assert!(why.contains("CUDA"), "{why}");
                assert_eq!(warm.to_vec1::<f32>().unwrap(), [1.0, 4.0]);
            }
            Capture::Graphed(_) => panic!("a graph on the CPU"),
        }
    }
}
