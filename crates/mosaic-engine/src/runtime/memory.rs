//! What a run needs of a GPU's memory, checked before step 1: the weights, gradients and AdamW
//! moments against the device's free memory ([`weights_fit`]), then a trial step, after which
//! activation recomputation is turned on where it can help ([`fit_or_recompute`]). A plan that
//! still does not fit is refused with [`EngineError::DeviceMemory`] (exit code 2).

use crate::error::EngineError;
use crate::models::Model;

/// Fails, saying by how much, when the model's parameters, gradients and AdamW moments alone
/// (every module's, resident for the whole run) exceed the free memory of CUDA device
/// `ordinal`.
#[cfg(all(feature = "cuda", mosaic_gpu))]
pub(crate) fn weights_fit(model: &Model, ordinal: usize) -> Result<(), EngineError> {
    // Bytes a parameter holds on the GPU for the whole run: its f32 value, gradient and two
    // AdamW moments.
    const BYTES_PER_PARAM: u64 = 16;
    use cudarc::driver::result::{device::get_default_mem_pool, mem_pool::trim_to};
    // What the default pool keeps of earlier runs in this process (`GpuDevice::open` has it
    // keep everything freed) is free for this one: hand it back to the driver first.
    // SAFETY: the device comes from the context, the pool from the device.
    let (free, total) = cudarc::driver::CudaContext::new(ordinal)
        .and_then(|ctx| {
            unsafe { trim_to(get_default_mem_pool(ctx.cu_device())?, 0)? };
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

/// Runs `trial_step` (one step's forward and backward passes on the GPU, nothing updated) so
/// that a plan whose activations do not fit fails before step 1, naming the module and what to
/// change, instead of in the middle of training; `ranks` processes train, `batch` samples a
/// step, on CUDA device `ordinal`. When the step runs out of memory, every
/// module that can turns activation recomputation on ([`crate::models::recompute`]; a frozen
/// one then holds one block's activations at a time in its forward pass too) and the step is
/// tried again; returns the modules that recompute.
pub(crate) fn fit_or_recompute(
    model: &Model,
    ranks: usize,
    batch: usize,
    ordinal: usize,
    trial_step: impl Fn() -> Result<(), EngineError>,
) -> Result<Vec<&'static str>, EngineError> {
    let first = match trial_step() {
        Err(e) if e.is_out_of_memory() => e,
        other => return other.map(|_| Vec::new()),
    };
    // Another rank may be waiting in a collective of the failed step, which a second try
    // would answer out of order: with several ranks the run stops (and mpirun stops them all).
    let recomputing: Vec<&'static str> = (model.modules.iter())
        .filter(|m| ranks == 1 && m.net.set_recompute(true))
        .map(|m| m.name)
        .collect();
    let e = if recomputing.is_empty() {
        first
    } else {
        match trial_step() {
            Err(e) if e.is_out_of_memory() => e,
            other => return other.map(|_| recomputing),
        }
    };
    let module = match &e {
        EngineError::Tensor { module, .. } => format!("module \"{module}\""),
        _ => "a module".to_string(),
    };
    let recomputed = if recomputing.is_empty() {
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

    use candle_core::Tensor;

    use super::*;
    use crate::models::model::{shards, Net, Shard};
    use candle_core::Device;

    /// A net that runs out of GPU memory (as candle reports it) unless it recomputes, or
    /// always.
    struct Tight {
        inner: Box<dyn Net>,
        recomputing: AtomicBool,
        always: bool,
    }

    impl Net for Tight {
        fn forward(&self, inputs: &[Tensor], shard: &Shard) -> candle_core::Result<Tensor> {
            if self.always || !self.recomputing.load(Relaxed) {
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

    /// clip-tiny with its vision tower `Tight`, and a trial step that runs it forward.
    fn trial(always: bool) -> (Model, impl Fn(&Model) -> Result<(), EngineError>) {
        let mut model = crate::models::build("clip-tiny", 0, &Device::Cpu).unwrap();
        let vision = &mut model.modules[0];
        let inner = std::mem::replace(&mut vision.net, Box::new(Nothing));
        vision.net = Box::new(Tight {
            inner,
            recomputing: AtomicBool::new(false),
            always,
        });
        let image = model.data.batch(0, 4, &Device::Cpu).unwrap().tensors["image"].clone();
        let step = move |m: &Model| {
            let forward = m.modules[0]
                .net
                .forward(std::slice::from_ref(&image), &shards(4, 1)[0]);
            forward.map(drop).map_err(EngineError::tensor("vision"))
        };
        (model, step)
    }

    #[test]
    fn a_step_that_runs_out_of_memory_recomputes_or_names_the_module() {
        let (model, step) = trial(false);
        let fits = fit_or_recompute(&model, 1, 4, 0, || step(&model)).unwrap();
        assert_eq!(fits, ["vision"], "the net that can recompute does");
        let (model, step) = trial(false);
        let e = fit_or_recompute(&model, 2, 4, 0, || step(&model)).unwrap_err();
        assert!(
            e.to_string().contains("module \"vision\""),
            "two ranks never retry: {e}"
        );
        let (model, step) = trial(true);
        let e = fit_or_recompute(&model, 1, 16, 3, || step(&model)).unwrap_err();
        assert!(e.is_bad_input() && e.is_out_of_memory(), "{e}");
        let text = e.to_string();
        assert!(
            text.starts_with("CUDA device 3: out of memory: module \"vision\""),
            "{text}"
        );
        assert!(
            text.contains("even with vision recomputing") && text.contains("--batch"),
            "{text}"
        );
    }
}
