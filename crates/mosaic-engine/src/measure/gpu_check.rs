//! `mosaic check gpu`: every GPU path of the engine, run on the GPU present, each ending in
//! pass or fail with the figure it rests on — what a session lent a GPU runs first, since the
//! GPU code is written without one. A path this build lacks is skipped, saying why.
//!
//! In order: the driver; green-context slots (SMs granted as asked, work on each stream); NVML
//! (the device found, its memory, bandwidth and busy fractions read);
//! then, in the GPU build only (`--cfg mosaic_gpu`, `scripts/cuda-cargo`), candle's ops on a
//! slot against the CPU through either [`Binding`](crate::runtime::slot::cuda) (a transformer
//! block's forward and backward in f32, a matmul in bf16); the fused AdamW kernel against the
//! composed update and its time on CLIP ViT-L's vision tower; one training step of every engine
//! model on the GPU against the CPU (loss and every gradient), modules one after another and
//! the encoders co-located, and ten steps whose loss must fall; SM confinement by timing (the
//! same bf16 matmuls on 16 SMs and on 128); and co-location (two 64-SM slots launched from two
//! threads at once against each alone); a small GPU profile sweep and colocations (`mosaic
//! measure profile|colocations --device cuda`); the fused attention kernels against composed
//! attention, both timed (`models::flash::check`); and last ImageBind's six-way stage carved
//! each way (`Carving`), its six slots running products at once. The block and the training steps
//! run through the engine's LayerNorm, GELU and bias kernels (`kernels/elementwise.cu`).

use serde::Serialize;

use crate::runtime::slot::cuda::driver_unavailable;

/// How a check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// It ran and met its bound.
    Pass,
    /// It ran and missed its bound, or failed.
    Fail,
    /// It could not run here (the figure says why).
    Skip,
}

/// One check: what was checked, how it ended and the figure behind it.
#[derive(Debug, Clone, Serialize)]
pub struct GpuCheck {
    /// What was checked.
    pub name: String,
    /// How it ended.
    pub outcome: Outcome,
    /// The measured figure, the error, or why it was skipped.
    pub figure: String,
}

impl GpuCheck {
    fn new(name: &str, outcome: Outcome, figure: impl Into<String>) -> GpuCheck {
        GpuCheck {
            name: name.to_string(),
            outcome,
            figure: figure.into(),
        }
    }

    /// Pass when `pass`, else fail.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn judged(name: &str, pass: bool, figure: impl Into<String>) -> GpuCheck {
        let outcome = if pass { Outcome::Pass } else { Outcome::Fail };
        GpuCheck::new(name, outcome, figure)
    }
}

/// The checks so far, each handed to a callback as it ends (so that a check that hangs still
/// leaves the rows before it on screen).
struct Checks<'a> {
    done: Vec<GpuCheck>,
    each: &'a mut dyn FnMut(&GpuCheck),
}

impl Checks<'_> {
    fn push(&mut self, check: GpuCheck) {
        (self.each)(&check);
        self.done.push(check);
    }
}

/// Every check on CUDA device `ordinal`, in order; `each` sees every check as it ends.
pub fn check_gpu(ordinal: usize, each: &mut dyn FnMut(&GpuCheck)) -> Vec<GpuCheck> {
    let mut out = Checks {
        done: Vec::new(),
        each,
    };
    if let Some(why) = driver_unavailable() {
        out.push(GpuCheck::new("driver", Outcome::Skip, why));
        return out.done;
    }
    #[cfg(feature = "cuda")]
    on_device::run(ordinal, &mut out);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = ordinal;
        out.push(GpuCheck::new(
            "driver",
            Outcome::Skip,
            "built without the `cuda` feature",
        ));
    }
    out.done
}

#[cfg(feature = "cuda")]
mod on_device {
    use super::{Checks, GpuCheck, Outcome};
    use crate::runtime::slot::cuda::{Carving, GpuDevice};

    /// The checks that need only the driver, then those of the GPU build.
    pub(super) fn run(ordinal: usize, out: &mut Checks) {
        let device = match GpuDevice::open(ordinal) {
            Ok(d) => d,
            Err(e) => return out.push(GpuCheck::new("driver", Outcome::Fail, e.to_string())),
        };
        let (major, minor) = device.compute_capability();
        let reported = match device.reported_granularity() {
            Some(g) => format!("the driver reports {g}"),
            None => "the driver reports none".to_string(),
        };
        out.push(GpuCheck::new(
            "driver",
            Outcome::Pass,
            format!(
                "device {ordinal}: {} ({} SMs, compute capability {major}.{minor}); partitions: \
                 {} by the guideline, {reported}",
                device.name(),
                device.sms(),
                device.granularity(),
            ),
        ));
        out.push(slots(&device));
        out.push(nvml(&device));
        #[cfg(mosaic_gpu)]
        super::compute::run(&device, out);
        #[cfg(not(mosaic_gpu))]
        out.push(GpuCheck::new(
            "module compute",
            Outcome::Skip,
            "this build has no GPU compute: build mosaic with scripts/cuda-cargo",
        ));
    }

    /// A stage of quotas [0.25, 0.5, 0.25], then a module alone at quota 1 (the last figure,
    /// every SM): SMs granted as asked, and a fill on each stream.
    fn slots(device: &GpuDevice) -> GpuCheck {
        let name = "green-context slots";
        let quotas = [0.25, 0.5, 0.25];
        let run = || -> Result<(Vec<u32>, Vec<u32>, bool, Carving), crate::EngineError> {
            let asked = device.stage_sms(&quotas)?;
            let slots =
                device.create_stage(&[("a", quotas[0]), ("b", quotas[1]), ("c", quotas[2])])?;
            let carving = slots[0].carving();
            let granted: Vec<u32> = slots.iter().map(|s| s.sms()).collect();
            let mut filled = true;
            for (i, slot) in slots.iter().enumerate() {
                let value = 0x5107_0000 + i as u32;
                filled &= slot.fill(4096, value)?.iter().all(|&w| w == value);
            }
            // A module alone at quota 1 holds every SM.
            let alone = device.create_slot("alone", 1.0)?;
            filled &= alone.fill(16, 9)?.iter().all(|&w| w == 9);
            let mut asked = asked;
            asked.push(device.sms());
            let mut granted = granted;
            granted.push(alone.sms());
            Ok((asked, granted, filled, carving))
        };
        match run() {
            Ok((asked, granted, filled, carving)) => GpuCheck::judged(
                name,
                asked == granted && filled,
                format!(
                    "quotas {quotas:?}: asked {asked:?} SMs, granted {granted:?} (carved \
                     {carving:?}); fill on every stream {}",
                    if filled { "ok" } else { "WRONG" }
                ),
            ),
            Err(e) => GpuCheck::new(name, Outcome::Fail, e.to_string()),
        }
    }

    /// NVML finds the device by its PCI bus id and reads what a GPU profile takes from it:
    /// memory, a peak bandwidth between 0.1 and 20 TB/s (an H100 SXM's datasheet says 3.35)
    /// and busy fractions in [0, 1] over the last second.
    fn nvml(device: &GpuDevice) -> GpuCheck {
        use crate::measure::nvml::{now_us, Nvml};
        let name = "NVML";
        let run = || -> Result<(bool, String), crate::EngineError> {
            let nvml = Nvml::open(device.pci_bus_id())?;
            let (memory, peak) = (nvml.memory_gib()?, nvml.peak_gbps()?);
            let busy = nvml.busy_since(now_us().saturating_sub(1_000_000))?;
            let figure = format!(
                "PCI bus {}: {memory:.1} GiB, peak {peak:.0} GB/s; busy over the last second: \
                 kernels {:.2}, memory {:.2} ({} samples)",
                device.pci_bus_id(),
                busy.kernels,
                busy.memory,
                busy.samples
            );
            let fractions = [busy.kernels, busy.memory];
            let pass = memory > 0.0
                && (100.0..20_000.0).contains(&peak)
                && fractions.iter().all(|f| (0.0..=1.0).contains(f));
            Ok((pass, figure))
        };
        match run() {
            Ok((pass, figure)) => GpuCheck::judged(name, pass, figure),
            Err(e) => GpuCheck::new(name, Outcome::Fail, e.to_string()),
        }
    }
}

#[cfg(all(feature = "cuda", mosaic_gpu))]
mod compute {
    use std::time::Instant;

    use candle_core::{DType, Device, Tensor};
    use mosaic_kit::rng::SplitMix64;
    use mosaic_kit::stats::relative_error as rel_err;

    use super::{Checks, GpuCheck, Outcome};
    use crate::models::nn::{to_f32s, Block, BlockDims, ParamBuilder};
    use crate::models::{self, Model};
    use crate::runtime::slot::cuda::{Binding, Carving, GpuDevice, GpuSlot};
    use crate::runtime::trainer::{Compute, TrainConfig, Trainer};
    use crate::EngineError;
    use crate::Schedule;

    type Res<T> = Result<T, EngineError>;

    fn tensor(e: candle_core::Error) -> EngineError {
        EngineError::tensor("check")(e)
    }

    pub(super) fn run(device: &GpuDevice, out: &mut Checks) {
        for binding in Binding::ALL {
            let name = format!("candle ops ({})", binding.name());
            out.push(outcome(&name, || ops(device, binding)));
        }
        // Tiny models in f32 on both devices; zoo-built ones at a small size, bf16 products
        // on the GPU against f32 on the CPU, so within bf16's tolerance.
        let models = [
            ("clip-tiny", 1.0, F32_BOUNDS),
            ("omni-tiny", 1.0, F32_BOUNDS),
            ("clip", 0.05, BF16_BOUNDS),
            ("imagebind", 0.05, BF16_BOUNDS),
        ];
        for (model, size, bounds) in models {
            for colocated in [false, true] {
                let name = format!(
                    "train {model}{} ({})",
                    if size < 1.0 {
                        format!(" ×{size}")
                    } else {
                        String::new()
                    },
                    if colocated {
                        "encoders co-located"
                    } else {
                        "one after another"
                    }
                );
                let run = || train(device.ordinal(), model, size, colocated, bounds);
                out.push(outcome(&name, run));
            }
        }
        out.push(outcome("fused AdamW", || adamw(device)));
        out.push(outcome("SM confinement", || confinement(device)));
        out.push(outcome("co-location", || colocation(device)));
        out.push(outcome("profile sweep", || sweep(device)));
        out.push(outcome("measured colocations", || colocations(device)));
        // A faulting kernel ends the CUDA context, and every check after it. The fused
        // attention kernels have passed the CPU emulation only; the six-way stage split in turn
        // failed in cuBLAS on the H200, whether leaving the context usable or not is unknown:
        // so the kernels first, then the stage in one split, and last split in turn.
        out.push(outcome("fused attention", || attention(device)));
        for how in [Carving::OneSplit, Carving::InTurn] {
            let name = format!("six slots at once ({how:?})");
            out.push(match device.create_stage_by(&SIX, how) {
                Ok(slots) => outcome(&name, || six_slots(device, &slots)),
                // A stage the driver will not carve in one split is split in turn.
                Err(e) if how == Carving::OneSplit => GpuCheck::new(
                    &name,
                    Outcome::Skip,
                    format!("the driver refused it ({e}); stages are split in turn"),
                ),
                Err(e) => GpuCheck::new(&name, Outcome::Fail, e.to_string()),
            });
        }
        // Last: NCCL's start-up opens a bootstrap socket, the one step here that could wait
        // on something other than the GPU.
        out.push(outcome("NCCL bucket (one rank)", || nccl_bucket(device)));
    }

    /// The fused attention kernels against composed attention, and both timed
    /// ([`crate::models::flash::check`]), on the whole GPU.
    fn attention(device: &GpuDevice) -> Res<(bool, String)> {
        let slot = slot(device, "attention", 1.0)?;
        // SAFETY: the device and its tensors are dropped at the end of this function, before
        // the slot, all on this thread.
        let dev = unsafe { slot.candle_device(Binding::Primary)? };
        crate::models::flash::check::check(&dev).map_err(tensor)
    }

    /// `mosaic measure colocations --device cuda` in small: two colocations of clip-tiny at
    /// batch 4; the file must validate, every module have kept iterations and finite times.
    fn colocations(device: &GpuDevice) -> Res<(bool, String)> {
        use crate::measure::{
            colocation_file, colocations_gpu, gpu_colocation_source, ColocationConfig,
            ProfileConfig,
        };
        let config = ProfileConfig {
            batch: 4,
            max_dp: 2,
            warmup: 1,
            reps: 3,
            ..ProfileConfig::default()
        };
        let draws = ColocationConfig {
            samples: 2,
            seed: 0,
        };
        let host = crate::measure::measure_machine(1, 1)?;
        let (gpu, measured) = colocations_gpu(
            "clip-tiny",
            config.clone(),
            host,
            device.ordinal(),
            &draws,
            |_, _| {},
        )?;
        let source = gpu_colocation_source(&gpu, "clip-tiny", &config, &draws);
        let file = colocation_file(&gpu.name, &measured, source);
        let text = serde_json::to_string(&file).map_err(|e| EngineError::BadSetting {
            setting: "colocations".into(),
            message: e.to_string(),
        })?;
        let parsed = mosaic_profile::parse_colocations(&text, "the GPU colocations");
        let runs: Vec<&crate::measure::ColocatedRun> =
            measured.iter().flat_map(|s| &s.modules).collect();
        let sane = runs.iter().all(|m| {
            m.iterations >= 1 && m.alone_ms > 0.0 && m.colocated_ms.is_finite() && m.cores > 0
        });
        let figure = runs
            .iter()
            .map(|m| {
                format!(
                    "{} on {} SMs {:.2} → {:.2} ms",
                    m.module, m.cores, m.alone_ms, m.colocated_ms
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        let valid = parsed
            .as_ref()
            .map_or_else(|e| e.to_string(), |_| "valid".into());
        Ok((parsed.is_ok() && sane, format!("{figure}; file {valid}")))
    }

    /// `mosaic measure profile --device cuda` in small: clip-tiny at batch 4, dp 1, on every
    /// partition of the grid; the file must validate and plan, every figure be finite, and
    /// vision on the fewest SMs be no faster than on the whole GPU (within 10 %).
    fn sweep(device: &GpuDevice) -> Res<(bool, String)> {
        use crate::measure::{gpu_sm_grid, profile_file, sweep_gpu, ProfileConfig};
        let config = ProfileConfig {
            batch: 4,
            max_dp: 1,
            warmup: 1,
            reps: 3,
            ..ProfileConfig::default()
        };
        let host = crate::measure::measure_machine(1, 1)?;
        let profile = sweep_gpu("clip-tiny", config, host, device.ordinal(), |_| {})?;
        let file = profile_file(&profile);
        let text = serde_json::to_string(&file).map_err(|e| EngineError::BadSetting {
            setting: "profile".into(),
            message: e.to_string(),
        })?;
        let parsed = mosaic_profile::parse(&text, "the GPU profile");
        let plans = parsed.as_ref().ok().and_then(|p| {
            let perf = mosaic_profile::PerfModel::new(p, 0.1, "the GPU profile").ok()?;
            mosaic_plan::solve(&perf, 1, &mosaic_plan::SolveOptions::default()).ok()
        });
        let grid = gpu_sm_grid(device.sms(), device.granularity());
        let finite = profile.points.iter().all(|p| {
            p.time_ms.is_finite()
                && p.time_ms > 0.0
                && (0.0..=1.0).contains(&p.sm_util)
                && (0.0..=1.0).contains(&p.bw_util)
        });
        let vision: Vec<&crate::measure::Point> = profile.points_of("vision").collect();
        let (fewest, whole) = (vision[0], vision[vision.len() - 1]);
        let pass = parsed.is_ok()
            && plans.is_some()
            && finite
            && profile.points.len() == 3 * grid.len()
            && fewest.time_ms >= 0.9 * whole.time_ms;
        Ok((
            pass,
            format!(
                "{} points on SMs {grid:?}; vision {:.2} ms on {} SMs, {:.2} ms on {} (sm_util \
                 {:.2}, bw_util {:.2}); file {}; plan {}",
                profile.points.len(),
                fewest.time_ms,
                fewest.cores,
                whole.time_ms,
                whole.cores,
                whole.sm_util,
                whole.bw_util,
                parsed.map_or_else(|e| e.to_string(), |_| "valid".into()),
                plans.map_or("none".to_string(), |p| format!("{:.2} ms", p.iteration_ms)),
            ),
        ))
    }

    /// Runs one check; a panic inside it (candle and cudarc panic on some CUDA failures) fails
    /// that check only, so the checks after it still run.
    fn outcome(name: &str, check: impl FnOnce() -> Res<(bool, String)>) -> GpuCheck {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(check)) {
            Ok(Ok((pass, figure))) => GpuCheck::judged(name, pass, figure),
            Ok(Err(e)) => GpuCheck::new(name, Outcome::Fail, e.to_string()),
            Err(panic) => {
                let why = (panic.downcast_ref::<String>().cloned())
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "a panic".into());
                GpuCheck::new(name, Outcome::Fail, format!("panicked: {why}"))
            }
        }
    }

    /// A gradient bucket summed by NCCL where it lies, on a half-GPU slot
    /// ([`crate::runtime::collective::device_sum`], what `--collective nccl` does on GPUs):
    /// with one rank the sum is the bucket, and the slot's next op must see it. NCCL across
    /// GPUs needs two.
    fn nccl_bucket(device: &GpuDevice) -> Res<(bool, String)> {
        use crate::runtime::collective::device_sum::sum_on_device;
        use cudarc::driver::CudaContext;
        use cudarc::nccl::{Comm, Id};
        let nccl = |message: String| EngineError::Collective {
            collective: "nccl",
            message,
        };
        let ctx = CudaContext::new(device.ordinal())
            .map_err(|e| nccl(format!("opening the primary context: {e}")))?;
        let stream = (ctx.new_stream()).map_err(|e| nccl(format!("creating a stream: {e}")))?;
        let id = Id::new().map_err(|e| nccl(format!("ncclGetUniqueId: {:?}", e.0)))?;
        let comm = (Comm::from_rank(stream, 0, 1, id))
            .map_err(|e| nccl(format!("ncclCommInitRank (one rank): {:?}", e.0)))?;
        let slot = slot(device, "nccl", 0.5)?;
        // SAFETY: the device and its tensors are dropped at the end of this function, before
        // the slot, all on this thread.
        let dev = unsafe { slot.candle_device(Binding::Primary)? };
        // Whole numbers below 2²⁴: exact in f32, doubled too.
        let n = 1usize << 22;
        let bucket = Tensor::arange(0f32, n as f32, &dev).map_err(tensor)?;
        dev.synchronize().map_err(tensor)?;
        let start = Instant::now();
        let doubled = (sum_on_device(&comm, &bucket).map_err(tensor)? * 2.0).map_err(tensor)?;
        dev.synchronize().map_err(tensor)?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        let got = doubled.to_vec1::<f32>().map_err(tensor)?;
        let wrong = (got.iter().enumerate())
            .filter(|&(i, &v)| v != 2.0 * i as f32)
            .count();
        Ok((
            wrong == 0,
            format!(
                "{n} floats on {} SMs: summed and doubled in {ms:.2} ms, {wrong} wrong; across \
                 GPUs needs two",
                slot.sms()
            ),
        ))
    }

    /// One slot of `quota` for `module`, alone in its stage.
    fn slot(device: &GpuDevice, module: &str, quota: f64) -> Res<GpuSlot> {
        device.create_slot(module, quota)
    }

    /// A transformer block's output and every gradient of Σy², on `dev`, from seed 7.
    fn block(dev: &Device, x: &[f32], shape: (usize, usize, usize)) -> Res<Vec<Vec<f32>>> {
        let dims = BlockDims {
            dim: shape.2,
            heads: 4,
            mlp: 4 * shape.2,
            layers: 1,
        };
        let mut pb = ParamBuilder::new(SplitMix64::new(7), dev);
        let b = Block::new(&mut pb, "b", dims, true).map_err(tensor)?;
        let params = pb.finish();
        let x = Tensor::from_slice(x, shape, dev).map_err(tensor)?;
        let y = b.forward(&x).map_err(tensor)?;
        let grads = y
            .sqr()
            .and_then(|s| s.sum_all())
            .and_then(|l| l.backward())
            .map_err(tensor)?;
        let mut out = vec![to_f32s(&y).map_err(tensor)?];
        for (_, v) in params.iter() {
            let g = grads
                .get(v.as_tensor())
                .ok_or_else(|| EngineError::BadSetting {
                    setting: "check".into(),
                    message: "a block parameter got no gradient".into(),
                })?;
            out.push(to_f32s(g).map_err(tensor)?);
        }
        Ok(out)
    }

    /// candle's ops on a 64-SM slot bound by `binding` against the CPU: a causal transformer
    /// block (LayerNorm, attention with softmax, GELU MLP) forward and backward in f32, and a
    /// 512³ matmul in bf16 against f32.
    fn ops(device: &GpuDevice, binding: Binding) -> Res<(bool, String)> {
        let slot = slot(device, "ops", 0.5)?;
        let shape = (4, 32, 64);
        let x = SplitMix64::new(3).normals(shape.0 * shape.1 * shape.2, 1.0);
        let cpu = block(&Device::Cpu, &x, shape)?;
        let (gpu, bf16) = {
            // SAFETY: the device and its tensors are dropped at the end of this block, before
            // the slot, all on this thread.
            let dev = unsafe { slot.candle_device(binding)? };
            let gpu = block(&dev, &x, shape)?;
            let a = SplitMix64::new(5).normals(512 * 512, 1.0);
            let b = SplitMix64::new(6).normals(512 * 512, 1.0);
            let exact = {
                let a = Tensor::from_slice(&a, (512, 512), &Device::Cpu).map_err(tensor)?;
                let b = Tensor::from_slice(&b, (512, 512), &Device::Cpu).map_err(tensor)?;
                to_f32s(&a.matmul(&b).map_err(tensor)?).map_err(tensor)?
            };
            let on_gpu = (|| {
                let a = Tensor::from_slice(&a, (512, 512), &dev)?.to_dtype(DType::BF16)?;
                let b = Tensor::from_slice(&b, (512, 512), &dev)?.to_dtype(DType::BF16)?;
                to_f32s(&a.matmul(&b)?)
            })()
            .map_err(tensor)?;
            dev.synchronize().map_err(tensor)?;
            (gpu, rel_err(&on_gpu, &exact))
        };
        let f32_err = cpu
            .iter()
            .zip(&gpu)
            .map(|(c, g)| rel_err(g, c))
            .fold(0f32, f32::max);
        Ok((
            f32_err < 1e-3 && bf16 < 2e-2,
            format!(
                "{} SMs: block fwd+bwd f32 max rel err {f32_err:.1e} (bound 1e-3), matmul bf16 \
                 {bf16:.1e} (bound 2e-2)",
                slot.sms()
            ),
        ))
    }

    /// The encoders in one stage at equal quotas, the loss module after them.
    fn colocated_schedule(model: &Model) -> Schedule {
        let mut s = Schedule::sequential(model, 1);
        let last = s.stages.pop().expect("a model has modules");
        let encoders: Vec<_> = s.stages.drain(..).flatten().collect();
        let quota = 1.0 / encoders.len() as f64;
        let encoders = encoders
            .into_iter()
            .map(|mut p| {
                p.assignment.sm = quota;
                p
            })
            .collect();
        s.stages = vec![encoders, last];
        s
    }

    /// Largest relative error of the loss and of any gradient, GPU against CPU.
    type Bounds = (f32, f32);
    /// f32 on both devices.
    const F32_BOUNDS: Bounds = (1e-4, 1e-2);
    /// bf16 products on the GPU against f32 on the CPU (bf16 keeps 8 bits of mantissa).
    const BF16_BOUNDS: Bounds = (2e-2, 2e-1);

    /// Loss and every gradient on the GPU against the CPU (same seed, batch 16), then ten
    /// steps on the GPU whose loss must fall.
    fn train(
        ordinal: usize,
        name: &str,
        size: f64,
        colocated: bool,
        (loss_bound, grad_bound): Bounds,
    ) -> Res<(bool, String)> {
        let trainer = |compute: Compute| -> Res<Trainer> {
            let recipe = models::Recipe {
                size,
                ..models::Recipe::new(name, 0)
            };
            let model = models::build_placed(&recipe, &|_| Device::Cpu)?;
            let schedule = if colocated {
                colocated_schedule(&model)
            } else {
                Schedule::sequential(&model, 1)
            };
            let config = TrainConfig {
                compute,
                ..TrainConfig::default()
            };
            Trainer::new(model, schedule, config)
        };
        let (cpu_loss, cpu_grads) = trainer(Compute::Cpu)?.gradients()?;
        let mut gpu = trainer(Compute::Cuda(ordinal))?;
        let (gpu_loss, gpu_grads) = gpu.gradients()?;
        let mut grad_err = 0f32;
        for (c, g) in cpu_grads.iter().zip(&gpu_grads) {
            let c = to_f32s(&c.grad).map_err(tensor)?;
            let g = to_f32s(&g.grad).map_err(tensor)?;
            grad_err = grad_err.max(rel_err(&g, &c));
        }
        let loss_err = (gpu_loss - cpu_loss).abs() / cpu_loss.abs().max(1e-30);
        // Recomputing the encoders' activations on the GPU changes nothing (zoo-built models).
        let mut recompute_err = 0f32;
        if gpu
            .model()
            .modules
            .iter()
            .any(|m| m.net.set_recompute(true))
        {
            let (_, again) = gpu.gradients()?;
            for (a, b) in gpu_grads.iter().zip(&again) {
                let a = to_f32s(&a.grad).map_err(tensor)?;
                let b = to_f32s(&b.grad).map_err(tensor)?;
                recompute_err = recompute_err.max(rel_err(&b, &a));
            }
            gpu.model().modules.iter().for_each(|m| {
                m.net.set_recompute(false);
            });
        }
        let first = gpu.step()?;
        let mut last = first.clone();
        for _ in 0..9 {
            last = gpu.step()?;
        }
        let started = Instant::now();
        let timed = gpu.step()?;
        let wall = started.elapsed().as_secs_f64() * 1e3;
        // How much of each module's time the host spent issuing its work (launch-bound near 1).
        let launch: Vec<String> = (timed.stages.iter().flat_map(|s| &s.modules))
            .map(|t| {
                let share = (t.forward_host_ms + t.backward_host_ms)
                    / (t.forward_ms + t.backward_ms).max(1e-9);
                format!("{} {:.0}%", t.name, 100.0 * share)
            })
            .collect();
        Ok((
            loss_err < loss_bound
                && grad_err < grad_bound
                && recompute_err < 1e-3
                && last.loss < first.loss,
            format!(
                "loss {gpu_loss:.5} vs CPU {cpu_loss:.5} (rel {loss_err:.1e}, bound \
                 {loss_bound:.0e}), gradients max rel err {grad_err:.1e} (bound \
                 {grad_bound:.0e}), recomputed {recompute_err:.1e} (bound 1e-3); 10 steps \
                 {:.3} → {:.3}; a step {:.2} ms ({wall:.2} ms wall); host launch share {}",
                first.loss,
                last.loss,
                timed.step_ms,
                launch.join(", ")
            ),
        ))
    }

    /// Parameter shapes of one CLIP ViT-L/14 vision block (width 1024, MLP 4096): the
    /// attention's qkv and output projections, the MLP's two layers and two LayerNorms.
    const VISION_BLOCK: [&[usize]; 12] = [
        &[3072, 1024],
        &[3072],
        &[1024, 1024],
        &[1024],
        &[4096, 1024],
        &[4096],
        &[1024, 4096],
        &[1024],
        &[1024],
        &[1024],
        &[1024],
        &[1024],
    ];

    /// The fused AdamW kernel against the composed update on a 64-SM slot: three steps on
    /// small tensors (one gradient a transposed view) must leave the same parameters and
    /// moments within 1e-5; then one step of each over 24 vision blocks' parameters (302 M),
    /// timed, host launch time beside the stream's.
    fn adamw(device: &GpuDevice) -> Res<(bool, String)> {
        use crate::runtime::optim::{AdamW, AdamWConfig};
        let slot = slot(device, "adamw", 0.5)?;
        // SAFETY: the device and its tensors are dropped at the end of this function, before
        // the slot, all on this thread.
        let dev = unsafe { slot.candle_device(Binding::Primary)? };
        let shapes: [&[usize]; 3] = [&[1000], &[37, 129], &[129, 37]];
        let build = |seed: u64| -> Res<_> {
            let mut pb = ParamBuilder::new(SplitMix64::new(seed), &dev);
            for (i, shape) in shapes.iter().enumerate() {
                pb.normal(&format!("p{i}"), shape, 1.0).map_err(tensor)?;
            }
            Ok(pb.finish())
        };
        let (fused_params, composed_params) = (build(11)?, build(11)?);
        let config = AdamWConfig::default();
        let mut fused = AdamW::new(&fused_params, config).map_err(tensor)?;
        let mut composed = AdamW::new(&composed_params, config).map_err(tensor)?;
        let mut rng = SplitMix64::new(12);
        for _ in 0..3 {
            let grads = shapes
                .iter()
                .enumerate()
                .map(|(i, shape)| {
                    let n = shape.iter().product();
                    let g = Tensor::from_vec(rng.normals(n, 1.0), shape.to_vec(), &dev)?;
                    // The last gradient as a transposed view, as a Linear weight's arrives.
                    if i == 2 {
                        let t: Vec<usize> = shape.iter().rev().copied().collect();
                        Tensor::from_vec(rng.normals(n, 1.0), t, &dev)?.t()
                    } else {
                        Ok(g)
                    }
                })
                .collect::<candle_core::Result<Vec<_>>>()
                .map_err(tensor)?;
            fused.step_fused(&fused_params, &grads).map_err(tensor)?;
            composed
                .step_composed(&composed_params, &grads)
                .map_err(tensor)?;
        }
        let mut err = 0f32;
        for (i, ((_, a), (_, b))) in fused_params.iter().zip(composed_params.iter()).enumerate() {
            let pairs = [
                (a.as_tensor(), b.as_tensor()),
                (&fused.m[i], &composed.m[i]),
                (&fused.v[i], &composed.v[i]),
            ];
            for (x, y) in pairs {
                err = err.max(rel_err(
                    &to_f32s(x).map_err(tensor)?,
                    &to_f32s(y).map_err(tensor)?,
                ));
            }
        }
        // One step over a vision tower's parameters, each way, timed after a warm-up step.
        let mut pb = ParamBuilder::new(SplitMix64::new(13), &dev);
        // Constants, not draws: 302 M normals would take the host seconds.
        for layer in 0..24 {
            for (i, shape) in VISION_BLOCK.iter().enumerate() {
                pb.constant(&format!("b{layer}.p{i}"), shape, 0.0)
                    .map_err(tensor)?;
            }
        }
        let tower = pb.finish();
        let grads = tower
            .iter()
            .map(|(_, v)| v.as_tensor().ones_like())
            .collect::<candle_core::Result<Vec<_>>>()
            .map_err(tensor)?;
        let mut opt = AdamW::new(&tower, config).map_err(tensor)?;
        let mut time = |fused: bool| -> Res<(f64, f64)> {
            let step = |opt: &mut AdamW| {
                if fused {
                    opt.step_fused(&tower, &grads)
                } else {
                    opt.step_composed(&tower, &grads)
                }
            };
            step(&mut opt).map_err(tensor)?;
            dev.synchronize().map_err(tensor)?;
            let began = Instant::now();
            step(&mut opt).map_err(tensor)?;
            let host = began.elapsed().as_secs_f64() * 1e3;
            dev.synchronize().map_err(tensor)?;
            Ok((host, began.elapsed().as_secs_f64() * 1e3))
        };
        let (fused_host, fused_ms) = time(true)?;
        let (composed_host, composed_ms) = time(false)?;
        Ok((
            err < 1e-5,
            format!(
                "{} SMs: 3 steps max rel err {err:.1e} (bound 1e-5); {} tensors, {:.0} M \
                 parameters: fused {fused_ms:.2} ms ({fused_host:.2} ms host), composed \
                 {composed_ms:.2} ms ({composed_host:.2} ms host): {:.1}×",
                slot.sms(),
                tower.len(),
                tower.count() as f64 / 1e6,
                composed_ms / fused_ms
            ),
        ))
    }

    /// `n` bf16 matmuls of 4096² on `dev`, timed to the stream's end, in ms.
    fn matmuls(dev: &Device, n: usize) -> Res<f64> {
        let a = Tensor::ones((4096, 4096), DType::BF16, dev).map_err(tensor)?;
        let b = (Tensor::ones((4096, 4096), DType::BF16, dev).map_err(tensor)? * 1e-3)
            .map_err(tensor)?;
        let _warm = a.matmul(&b).map_err(tensor)?;
        dev.synchronize().map_err(tensor)?;
        let t = Instant::now();
        for _ in 0..n {
            let _ = a.matmul(&b).map_err(tensor)?;
        }
        dev.synchronize().map_err(tensor)?;
        Ok(t.elapsed().as_secs_f64() * 1e3)
    }

    /// Matmuls per timing: 4096³ × 2 × 40 = 5.5 TFLOP, ~8 ms on a whole H100.
    const MATMULS: usize = 40;

    /// The same matmuls on 16 SMs and on 128: the 16-SM slot must be at least 3× slower (an
    /// H100 ran CLIP's vision tower 5.7× slower on 16 SMs than on 132), or its kernels ran
    /// outside its SMs.
    fn confinement(device: &GpuDevice) -> Res<(bool, String)> {
        let sms = device.sms() as f64;
        let small = slot(device, "small", 16.0 / sms)?;
        let large = slot(device, "large", 128.0 / sms)?;
        let time = |s: &GpuSlot| -> Res<f64> {
            // SAFETY: dropped at the end of this closure, before the slot, on this thread.
            let dev = unsafe { s.candle_device(Binding::Primary)? };
            matmuls(&dev, MATMULS)
        };
        let (t_small, t_large) = (time(&small)?, time(&large)?);
        let ratio = t_small / t_large;
        Ok((
            ratio >= 3.0,
            format!(
                "{MATMULS} bf16 4096³ matmuls: {t_small:.1} ms on {} SMs, {t_large:.1} ms on {} \
                 SMs: {ratio:.2}× (bound ≥ 3)",
                small.sms(),
                large.sms()
            ),
        ))
    }

    /// Two 64-SM slots of one stage, each running the matmuls from its own thread at once,
    /// against each alone: they overlap if together they take under 0.8 of the two alone
    /// (an H100 ran two such GEMM loops in 67 ms together, 53 ms each alone).
    fn colocation(device: &GpuDevice) -> Res<(bool, String)> {
        let slots = device.create_stage(&[("a", 0.5), ("b", 0.5)])?;
        // SAFETY: the devices are dropped at the end of this function, before the slots.
        let devs = slots
            .iter()
            .map(|s| unsafe { s.candle_device(Binding::Primary) })
            .collect::<Res<Vec<_>>>()?;
        let alone = devs
            .iter()
            .map(|d| matmuls(d, MATMULS))
            .collect::<Res<Vec<_>>>()?;
        let t = Instant::now();
        let together = at_once(&devs, |_, d| matmuls(d, MATMULS))?;
        let wall = t.elapsed().as_secs_f64() * 1e3;
        let sum: f64 = alone.iter().sum();
        Ok((
            wall < 0.8 * sum,
            format!(
                "{} + {} SMs: together {wall:.1} ms (each {:.1}, {:.1}), alone {:.1} + {:.1} = \
                 {sum:.1} ms: {:.2} of the sum (bound < 0.8)",
                slots[0].sms(),
                slots[1].sms(),
                together[0],
                together[1],
                alone[0],
                alone[1],
                wall / sum
            ),
        ))
    }

    /// `f(i, device)` for every device, each from its own thread, all at once; a thread's
    /// panic goes on in the caller.
    fn at_once<T: Send>(
        devs: &[Device],
        f: impl Fn(usize, &Device) -> Res<T> + Sync,
    ) -> Res<Vec<T>> {
        std::thread::scope(|scope| {
            let f = &f;
            let runs: Vec<_> = devs
                .iter()
                .enumerate()
                .map(|(i, d)| scope.spawn(move || f(i, d)))
                .collect();
            runs.into_iter()
                .map(|r| r.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        })
    }

    /// ImageBind's stage of six encoders on an H100 or H200, in SMs of 132 (as quotas): the
    /// plan whose last 8-SM slot's cuBLAS call failed on an H200, its slots split in turn in
    /// the plan's order.
    const SIX: [(&str, f64); 6] = [
        ("vision", 48.0 / 132.0),
        ("text", 24.0 / 132.0),
        ("audio", 32.0 / 132.0),
        ("depth", 8.0 / 132.0),
        ("thermal", 8.0 / 132.0),
        ("imu", 8.0 / 132.0),
    ];

    /// [`SIX`]'s `slots`, each running a linear layer's products from its own thread, all at
    /// once: every slot must hold the SMs asked and every product be exact (the operands are
    /// chosen so that bf16 holds every result exactly).
    fn six_slots(device: &GpuDevice, slots: &[GpuSlot]) -> Res<(bool, String)> {
        let quotas: Vec<f64> = SIX.iter().map(|m| m.1).collect();
        let asked = device.stage_sms(&quotas)?;
        let granted: Vec<u32> = slots.iter().map(GpuSlot::sms).collect();
        // What the driver says of each slot's SMs: co-scheduled in groups of how many.
        let aligned: Vec<String> = (slots.iter())
            .map(|s| match s.reported_granularity() {
                Some(g) => g.step_sms.to_string(),
                None => "?".to_string(),
            })
            .collect();
        // SAFETY: the devices are dropped at the end of this function, before the slots.
        let devs = slots
            .iter()
            .map(|s| unsafe { s.candle_device(Binding::Primary) })
            .collect::<Res<Vec<_>>>()?;
        let carved = format!(
            "asked {asked:?} SMs, granted {granted:?} (co-scheduled in {})",
            aligned.join("/")
        );
        let t = Instant::now();
        // A failure is this row's figure, with how the slots were carved and which slots fail
        // alone too (the carving's fault) or only together (concurrency's).
        let wrong = match at_once(&devs, |i, d| linear_products(d, i).map_err(tensor)) {
            Ok(wrong) => wrong,
            Err(e) => {
                let alone: Vec<String> = (devs.iter().enumerate())
                    .map(|(i, d)| match linear_products(d, i) {
                        Ok(0) => "ok".to_string(),
                        Ok(n) => format!("{n} wrong"),
                        Err(e) => format!("failed ({e})"),
                    })
                    .collect();
                return Ok((
                    false,
                    format!(
                        "{carved}; at once: {e}; then each alone: {}",
                        alone.join(", ")
                    ),
                ));
            }
        };
        let wall = t.elapsed().as_secs_f64() * 1e3;
        let wrong: usize = wrong.iter().sum();
        Ok((
            granted == asked && wrong == 0,
            format!(
                "{carved}; {PRODUCT_ROUNDS} rounds of x·w, dy·wᵀ and xᵀ·dy per slot, six threads \
                 at once, {wall:.1} ms from the threads' start; {wrong} elements not exact \
                 (bound 0)"
            ),
        ))
    }

    /// Rounds of [`linear_products`].
    const PRODUCT_ROUNDS: usize = 10;

    /// A linear layer's forward and backward products in bf16 on `dev` (y = x·w, dx = dy·wᵀ,
    /// dw = xᵀ·dy), shapes varying with `i`, [`PRODUCT_ROUNDS`] times: how many elements of all
    /// rounds' results differ from their exact values (constant operands, so every element is
    /// k·0.5, n·0.125 or rows·0.25, each exact in bf16, and every partial sum exact in f32).
    fn linear_products(dev: &Device, i: usize) -> candle_core::Result<usize> {
        let (rows, k, n) = (1024 + 256 * i, 512 + 128 * i, 1536);
        let full =
            |v: f32, shape: (usize, usize)| Tensor::full(v, shape, dev)?.to_dtype(DType::BF16);
        let (x, w, dy) = (
            full(1.0, (rows, k))?,
            full(0.5, (k, n))?,
            full(0.25, (rows, n))?,
        );
        let mut results = Vec::new();
        for _ in 0..PRODUCT_ROUNDS {
            results.push((x.matmul(&w)?, k as f32 * 0.5));
            results.push((dy.matmul(&w.t()?)?, n as f32 * 0.125));
            results.push((x.t()?.matmul(&dy)?, rows as f32 * 0.25));
        }
        dev.synchronize()?;
        let mut wrong = 0;
        for (t, want) in results {
            let got: Vec<f32> = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
            // NaN compares unequal, so a garbage result counts.
            wrong += got.iter().filter(|&&g| g != want).count();
        }
        Ok(wrong)
    }
}
