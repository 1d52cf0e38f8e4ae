//! What a run needs of a GPU's memory: the weights against the free memory before anything
//! is placed ([`weights_fit`]), a trial step after which modules recompute their activations
//! where they must ([`fit_or_recompute`]), and a later step's running out said as such
//! ([`in_step`]).

use crate::error::EngineError;
use crate::models::model::Module;
use crate::models::Model;

/// Fails, saying by how much, when the model's parameters, gradients and AdamW moments alone
/// (every module's, resident for the whole run) exceed the free memory of CUDA device
/// `ordinal`.
#[cfg(all(feature = "cuda", mosaic_gpu))]
pub(crate) fn weights_fit(model: &Model, ordinal: usize) -> Result<(), EngineError> {
    // Bytes a parameter holds on the GPU for the whole run: its f32 value, gradient and two
    // AdamW moments.
    const BYTES_PER_PARAM: u64 = 16;
    // What the default pool keeps of earlier runs in this process (`GpuDevice::open` has it
    // keep everything freed) is free for this one: hand it back to the driver first.
    let (free, total) = cudarc::driver::CudaContext::new(ordinal)
        .and_then(|ctx| {
            trim_pool(&ctx)?;
            ctx.mem_get_info()
        })
        .map_err(|e| EngineError::Cuda {
            what: format!("cuMemGetInfo (device {ordinal})"),
            message: e.to_string(),
        })?;
    let params: u64 = model.modules.iter().map(|m| m.params.count() as u64).sum();
    let need = params * BYTES_PER_PARAM;
    if need <= free as u64 {
        return Ok(());
    }
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    Err(EngineError::DeviceMemory {
        device: ordinal,
        message: format!(
            "{}'s {:.1} M parameters need {:.1} GiB for values, gradients and AdamW moments \
             ({BYTES_PER_PARAM} bytes each), and {:.1} of the device's {:.1} GiB are free; \
             train a smaller model (--size)",
            model.name,
            params as f64 / 1e6,
            gib(need),
            gib(free as u64),
            gib(total as u64)
        ),
    })
}

/// Hands back to the driver what the default memory pool of `ctx`'s device keeps, and what
/// its CUDA graphs' pool keeps of graph memory no longer allocated (the graphs of an earlier
/// trainer's launch-bound modules, `super::graphed`).
#[cfg(all(feature = "cuda", mosaic_gpu))]
fn trim_pool(ctx: &cudarc::driver::CudaContext) -> Result<(), cudarc::driver::DriverError> {
    use cudarc::driver::result::{device::get_default_mem_pool, mem_pool::trim_to};
    use cudarc::driver::sys;
    let device = ctx.cu_device();
    // SAFETY: the device comes from the context, the pool from the device.
    unsafe {
        trim_to(get_default_mem_pool(device)?, 0)?;
        sys::cuDeviceGraphMemTrim(device).result()
    }
}

/// Waits for `devices` (a failed step returns without waiting for its streams), then hands
/// back to the driver what the default pool of CUDA device `ordinal` keeps of freed tensors
/// (`GpuDevice::open` has it keep everything): after a step that ran out of memory, and between
/// a sweep's runs, so that what allocates outside the pool later — a new device's cuBLAS
/// handle, kernel images a thread loads, NCCL — finds the memory free. Best effort: a failure
/// here shows again in what comes next.
pub(crate) fn release_pool(devices: &[candle_core::Device], ordinal: usize) {
    for device in devices {
        let _ = device.synchronize();
    }
    #[cfg(all(feature = "cuda", mosaic_gpu))]
    if let Ok(ctx) = cudarc::driver::CudaContext::new(ordinal) {
        let _ = trim_pool(&ctx);
    }
    #[cfg(not(all(feature = "cuda", mosaic_gpu)))]
    let _ = ordinal;
}

/// Runs `trial_step` (one step's forward and backward passes on the GPU, nothing updated) so
/// that a plan whose activations do not fit fails before step 1, naming the module and what to
/// change, instead of in the middle of training; `ranks` processes train, `batch` samples a
/// step, on CUDA device `ordinal`. While the step runs out of memory, activation
/// recomputation ([`crate::models::recompute`]; a frozen module then holds one block's
/// activations at a time in its forward pass too) is turned on for one more module that can,
/// the one that ran out first, and the step is tried again: recomputing costs a module one
/// more forward pass, so only the modules that must. Returns the modules that recompute.
pub(crate) fn fit_or_recompute(
    model: &Model,
    ranks: usize,
    batch: usize,
    ordinal: usize,
    trial_step: impl Fn() -> Result<(), EngineError>,
) -> Result<Vec<&'static str>, EngineError> {
    let mut e = match trial_step() {
        Err(e) if e.is_out_of_memory() => e,
        other => return other.map(|_| Vec::new()),
    };
    let mut recomputing = Vec::new();
    // Another rank may be waiting in a collective of the failed step, which a second try
    // would answer out of order: with several ranks the run stops (and its error ends every rank:
    // `Mpi::end`).
    let mut untried: Vec<&Module> = if ranks == 1 {
        model.modules.iter().collect()
    } else {
        Vec::new()
    };
    while !untried.is_empty() {
        // The module that ran out, else the next in the model's order.
        let at = (untried.iter())
            .position(|m| failed_module(&e) == Some(m.name))
            .unwrap_or(0);
        let module = untried.remove(at);
        if !module.net.set_recompute(true) {
            continue;
        }
        recomputing.push(module.name);
        match trial_step() {
            Err(again) if again.is_out_of_memory() => e = again,
            other => return other.map(|_| recomputing),
        }
    }
    let module = match failed_module(&e) {
        Some(module) => format!("module \"{module}\""),
        None => "a module".to_string(),
    };
    let recomputed = if ranks > 1 {
        // Said, since the planner's memory model has modules recompute at any dp.
        format!(
            " (with {ranks} ranks no module is made to recompute: a second try would meet \
             the other ranks' collectives out of order)"
        )
    } else if recomputing.is_empty() {
        String::new()
    } else {
        format!(
            " even with {} recomputing activations",
            recomputing.join(", ")
        )
    };
    Err(EngineError::DeviceMemory {
        device: ordinal,
        message: format!(
            "{module} ran out of memory in a trial step at batch {} by this plan{recomputed} \
             (every module's weights, gradients and AdamW moments stay on the GPU, and a \
             stage's modules hold their activations at once): lower --batch, train a smaller \
             model (--size), or plan fewer modules per stage; {e}",
            batch
        ),
    })
}

/// `e`, the error of step `step` on CUDA device `ordinal`, as [`EngineError::DeviceMemory`]
/// where the GPU ran out of memory although the trial step before step 1 fit (with
/// `recomputing` recomputing activations): what may take more than that step did, and what to
/// change. Any other error as it is.
pub(crate) fn in_step(
    e: EngineError,
    ordinal: usize,
    step: u64,
    recomputing: &[&str],
) -> EngineError {
    if matches!(e, EngineError::DeviceMemory { .. }) || !e.is_out_of_memory() {
        return e;
    }
    let recomputing = match recomputing {
        [] => String::new(),
        modules => format!(" with {} recomputing activations", modules.join(", ")),
    };
    EngineError::DeviceMemory {
        device: ordinal,
        message: format!(
            "step {step} ran out of memory, though a trial step before step 1 fit{recomputing} \
             (co-located modules' allocations interleave differently from step to step, and \
             capturing a launch-bound module's CUDA graphs at step 2 holds its passes' memory \
             twice): lower --batch, plan fewer modules per stage, or launch op by op \
             (MOSAIC_GRAPHS=off); {e}"
        ),
    }
}

/// The module a step's error names, if it names one.
fn failed_module(e: &EngineError) -> Option<&str> {
    match e {
        EngineError::Tensor { module, .. } => Some(module),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

    use candle_core::{Device, Tensor};

    use super::*;
    use crate::models::model::{shards, Net, Shard};

    /// When a net runs out of GPU memory.
    #[derive(Debug, Clone, Copy)]
    enum Need {
        /// Never: it fits.
        Never,
        /// Unless it recomputes.
        UnlessRecomputing,
        /// Always.
        Always,
    }

    /// A net that runs out of GPU memory (as candle reports it) as `need` says.
    struct Tight {
        inner: Box<dyn Net>,
        recomputing: AtomicBool,
        need: Need,
    }

    impl Net for Tight {
        fn forward(&self, inputs: &[Tensor], shard: &Shard) -> candle_core::Result<Tensor> {
            let out = match self.need {
                Need::Never => false,
                Need::UnlessRecomputing => !self.recomputing.load(Relaxed),
                Need::Always => true,
            };
            if out {
                return Err(candle_core::Error::Cuda(
                    "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")".into(),
                ));
            }
            self.inner.forward(inputs, shard)
        }

        fn set_recompute(&self, on: bool) -> bool {
            self.recomputing.store(on, Relaxed);
            true
        }
    }

    /// A net that is never run: what stands in while the real one is wrapped.
    struct Nothing;

    impl Net for Nothing {
        fn forward(&self, _: &[Tensor], _: &Shard) -> candle_core::Result<Tensor> {
            unreachable!("a placeholder")
        }
    }

    /// clip-tiny with its vision and text towers `Tight` as `vision` and `text` say, and a
    /// trial step that runs them forward, vision first.
    fn trial(vision: Need, text: Need) -> (Model, impl Fn(&Model) -> Result<(), EngineError>) {
        let mut model = crate::models::build("clip-tiny", 0, &Device::Cpu).unwrap();
        for (module, need) in model.modules.iter_mut().zip([vision, text]) {
            let inner = std::mem::replace(&mut module.net, Box::new(Nothing));
            module.net = Box::new(Tight {
                inner,
                recomputing: AtomicBool::new(false),
                need,
            });
        }
        let batch = model.data.batch(0, 4, &Device::Cpu).unwrap().tensors;
        let inputs = [
            vec![batch["image"].clone()],
            vec![batch["text"].clone(), batch["text_len"].clone()],
        ];
        let step = move |m: &Model| {
            for (module, inputs) in m.modules.iter().zip(&inputs) {
                (module.net.forward(inputs, &shards(4, 1)[0]))
                    .map_err(EngineError::tensor(module.name))?;
            }
            Ok(())
        };
        (model, step)
    }

    #[test]
    fn a_step_that_runs_out_of_memory_recomputes_or_names_the_module() {
        use Need::*;
        let (model, step) = trial(UnlessRecomputing, Never);
        let fits = fit_or_recompute(&model, 1, 4, 0, || step(&model)).unwrap();
        assert_eq!(fits, ["vision"], "the net that must recompute does");
        let (model, step) = trial(UnlessRecomputing, Never);
        let e = fit_or_recompute(&model, 2, 4, 0, || step(&model)).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("module \"vision\"") && text.contains("with 2 ranks no module"),
            "two ranks never retry, and say so: {text}"
        );
        let (model, step) = trial(Always, Never);
        let e = fit_or_recompute(&model, 1, 16, 3, || step(&model)).unwrap_err();
        assert!(e.is_bad_input() && e.is_out_of_memory(), "{e}");
        let text = e.to_string();
        assert!(
            text.starts_with("CUDA device 3: out of memory: module \"vision\""),
            "{text}"
        );
        assert!(
            text.contains("even with vision, text recomputing") && text.contains("--batch"),
            "{text}"
        );
    }

    #[test]
    fn a_step_past_the_trial_that_runs_out_of_memory_says_what_to_change() {
        let oom = || {
            EngineError::tensor("vision")(candle_core::Error::Msg(
                "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")".into(),
            ))
        };
        let e = in_step(oom(), 1, 2, &["text"]);
        let text = e.to_string();
        assert!(e.is_bad_input(), "{text}");
        assert!(
            text.starts_with("CUDA device 1: out of memory: step 2 ran out of memory")
                && text.contains("with text recomputing")
                && text.contains("MOSAIC_GRAPHS=off")
                && text.contains("CUDA_ERROR_OUT_OF_MEMORY"),
            "{text}"
        );
        // Any other error stays as it is.
        let other = EngineError::tensor("vision")(candle_core::Error::Msg("shape".into()));
        assert!(!in_step(other, 1, 2, &[]).is_bad_input());
    }

    #[test]
    fn only_the_modules_that_run_out_recompute_the_one_that_ran_out_first() {
        use Need::*;
        // Text runs out (vision fits): text alone recomputes, though vision comes first.
        let (model, step) = trial(Never, UnlessRecomputing);
        let fits = fit_or_recompute(&model, 1, 4, 0, || step(&model)).unwrap();
        assert_eq!(fits, ["text"]);
        // Both run out: vision (which runs first) recomputes, then text.
        let (model, step) = trial(UnlessRecomputing, UnlessRecomputing);
        let fits = fit_or_recompute(&model, 1, 4, 0, || step(&model)).unwrap();
        assert_eq!(fits, ["vision", "text"]);
        // A step that fits recomputes nothing.
        let (model, step) = trial(Never, Never);
        assert!(fit_or_recompute(&model, 1, 4, 0, || step(&model))
            .unwrap()
            .is_empty());
    }
}
