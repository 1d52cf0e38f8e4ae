//! A pass captured once as a CUDA graph and replayed (issue 11, item 2): the host then launches
//! one graph where it launched every op, which is what a module pays where its host time
//! rivals its GPU time (small modules at small batches; `bench block` measured ImageBind imu's
//! block at batch 2 spending 52 % of its step on launches on an H200).
//!
//! [`capture`] runs the pass once op by op (the warm-up: it loads kernels and leaves candle's
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

use candle_core::Result;

use crate::switch::EnvSwitch;

/// `MOSAIC_GRAPHS`: unset or `on`, launch-bound modules replay CUDA graphs; `off`, every module
/// launches op by op.
pub static GRAPHS: EnvSwitch = EnvSwitch::new("MOSAIC_GRAPHS", "on", "off");

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
        let warm = run()?;
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
        let graphed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(attempt))
            .unwrap_or_else(|panic| {
                let what = (panic.downcast_ref::<String>().cloned())
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                Err(Error::Msg(format!("it panicked: {what}")))
            });
        Ok(match graphed {
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
        pending.w()?;
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
        // Launched before anything else can fail, for the same reason.
        if let Err(e) = graph.launch() {
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
    use candle_core::{Device, Tensor};

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
