//! Timings on slots: SM confinement, cuBLAS told a slot's SMs, two slots overlapping,
//! ImageBind's six-way stage running products at once, and what launching costs a block.

use std::sync::Barrier;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use mosaic_kit::stats::median;

use super::{slot, tensor, Res};
use crate::measure::Pass;
use crate::runtime::graphed::Captured;
use crate::runtime::slot::cuda::{target_sms, Binding, GpuDevice, GpuSlot};

/// `n` bf16 matmuls of 4096² on a device, warmed up, ready to run: launched op by op, or
/// replayed from a CUDA graph captured on the device's stream (a slot's), as the trainer
/// replays launch-bound modules.
struct Products {
    // Dropped first: the graph reads the operands.
    graph: Option<Captured<Tensor>>,
    a: Tensor,
    b: Tensor,
    n: usize,
}

impl Products {
    /// The products on `dev`, run once; captured (and the graph launched once) where `graphed`.
    /// A capture that fails, or holds no node, says so.
    fn new(dev: &Device, n: usize, graphed: bool) -> Res<Products> {
        let a = Tensor::ones((4096, 4096), DType::BF16, dev).map_err(tensor)?;
        let b = (Tensor::ones((4096, 4096), DType::BF16, dev).map_err(tensor)? * 1e-3)
            .map_err(tensor)?;
        let mut products = Products {
            graph: None,
            a,
            b,
            n,
        };
        drop(products.launch().map_err(tensor)?);
        if graphed {
            let Device::Cuda(cuda) = dev else {
                return Err(tensor(candle_core::Error::Msg("a CUDA device".into())));
            };
            let captured = crate::runtime::graphed::record(cuda, &|| products.launch())
                .and_then(|c| match c.nodes()? {
                    0 => candle_core::bail!("a graph of no node"),
                    _ => Ok(c),
                })
                .map_err(|e| tensor(candle_core::Error::Msg(format!("capture failed: {e}"))))?;
            products.graph = Some(captured);
        }
        dev.synchronize().map_err(tensor)?;
        Ok(products)
    }

    /// The products launched op by op: the last one.
    fn launch(&self) -> candle_core::Result<Tensor> {
        let mut last = self.a.matmul(&self.b)?;
        for _ in 1..self.n {
            last = self.a.matmul(&self.b)?;
        }
        Ok(last)
    }

    /// One run, queued on the stream: op by op, or the graph replayed.
    fn run(&self) -> candle_core::Result<()> {
        match &self.graph {
            Some(graph) => graph.replay().map(drop),
            None => self.launch().map(drop),
        }
    }
}

/// `n` bf16 matmuls of 4096² on `dev` ([`Products`]), timed to the stream's end, in ms.
fn matmuls(dev: &Device, n: usize, graphed: bool) -> Res<f64> {
    let (start, end) = matmul_span(dev, n, graphed, None)?;
    Ok((end - start).as_secs_f64() * 1e3)
}

/// When `n` bf16 matmuls of 4096² on `dev` ([`Products`]) started and when the stream had done
/// them, once warm and, where `ready`, after a wait there (every thread of a co-located run
/// waits, failed or not, so that none is left waiting).
fn matmul_span(
    dev: &Device,
    n: usize,
    graphed: bool,
    ready: Option<&Barrier>,
) -> Res<(Instant, Instant)> {
    // A panic (candle and cudarc panic on some CUDA failures) must not leave the others
    // waiting at `ready`.
    let warm = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Products::new(dev, n, graphed)
    }))
    .unwrap_or_else(|p| {
        let why = crate::error::panic_text(&*p).unwrap_or_else(|| "a panic".into());
        Err(tensor(candle_core::Error::Msg(format!(
            "warming up panicked: {why}"
        ))))
    });
    if let Some(ready) = ready {
        ready.wait();
    }
    let products = warm?;
    let start = Instant::now();
    products.run().map_err(tensor)?;
    dev.synchronize().map_err(tensor)?;
    Ok((start, Instant::now()))
}

/// Matmuls per timing: 4096³ × 2 × 40 = 5.5 TFLOP, ~8 ms on a whole H100.
const MATMULS: usize = 40;

/// The same matmuls on 16 SMs and on 128: the 16-SM slot must be at least 3× slower (an
/// H100 ran CLIP's vision tower 5.7× slower on 16 SMs than on 132), or its kernels ran
/// outside its SMs. `graphed`: replayed from a CUDA graph captured on each slot's stream (how
/// the trainer replays launch-bound modules) rather than launched op by op.
pub(super) fn confinement(device: &GpuDevice, graphed: bool) -> Res<(bool, String)> {
    let sms = device.sms() as f64;
    let small = slot(device, "small", 16.0 / sms)?;
    let large = slot(device, "large", 128.0 / sms)?;
    let time = |s: &GpuSlot| -> Res<f64> {
        // SAFETY: dropped at the end of this closure, before the slot, on this thread.
        let dev = unsafe { s.candle_device(Binding::Primary)? };
        matmuls(&dev, MATMULS, graphed)
    };
    let (t_small, t_large) = (time(&small)?, time(&large)?);
    let ratio = t_small / t_large;
    Ok((
        ratio >= 3.0,
        format!(
            "{MATMULS} bf16 4096³ matmuls{}: {t_small:.1} ms on {} SMs, {t_large:.1} ms on {} \
             SMs: {ratio:.2}× (bound ≥ 3)",
            if graphed {
                " replayed from a CUDA graph"
            } else {
                ""
            },
            small.sms(),
            large.sms()
        ),
    ))
}

/// Products timed by [`blas_target`]: 512 × 16384 by 16384 × 512 in bf16, 16 output tiles of
/// 128² over a long k, which cuBLAS may split along k to fill a whole GPU; 8.6 GFLOP each, tens
/// of microseconds on 16 SMs, so that the GPU and not the host sets the pace.
const SMALL: (usize, usize, usize) = (512, 16384, 512);
/// How many of them a timing runs.
const SMALL_PRODUCTS: usize = 100;
/// Timings of each handle, taken in turn; the medians count.
const ROUNDS: usize = 5;

/// [`SMALL_PRODUCTS`] products of [`SMALL`] on a 16-SM slot with a cuBLAS handle told the
/// slot's SMs, as the engine tells every slot's ([`target_sms`]), against one told nothing (the
/// whole GPU, cuBLAS's default), each timed [`ROUNDS`] times in turn: the target must be taken,
/// as read back, and its median cost no more than 10 % over the other's. Its figure says what
/// the target gains a small slot.
pub(super) fn blas_target(device: &GpuDevice) -> Res<(bool, String)> {
    let small = slot(device, "blas", 16.0 / device.sms() as f64)?;
    let (m, k, n) = SMALL;
    // The products on a device of the slot whose cuBLAS handle is told `sms` (0: the whole
    // GPU), warm: whether cuBLAS took it, and the run.
    let on = |sms: u32| -> Res<(bool, Device, Tensor, Tensor)> {
        // SAFETY: every device and tensor here is dropped at the end of this function, before
        // the slot, on this thread.
        let dev = unsafe { small.candle_device(Binding::Primary)? };
        let Device::Cuda(cuda) = &dev else {
            return Err(tensor(candle_core::Error::Msg("a CUDA device".into())));
        };
        let taken = target_sms(cuda, sms);
        let a = Tensor::ones((m, k), DType::BF16, &dev).map_err(tensor)?;
        let b = (Tensor::ones((k, n), DType::BF16, &dev).and_then(|b| b * 1e-3)).map_err(tensor)?;
        Ok((taken, dev, a, b))
    };
    let timed = |(_, dev, a, b): &(bool, Device, Tensor, Tensor)| -> Res<f64> {
        let start = Instant::now();
        for _ in 0..SMALL_PRODUCTS {
            a.matmul(b).map_err(tensor)?;
        }
        dev.synchronize().map_err(tensor)?;
        Ok(start.elapsed().as_secs_f64() * 1e3)
    };
    let told = on(small.sms())?;
    let whole = on(0)?;
    timed(&told)?;
    timed(&whole)?;
    let (mut t_told, mut t_whole) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        t_told.push(timed(&told)?);
        t_whole.push(timed(&whole)?);
    }
    let middle = |xs: &[f64]| median(xs).unwrap_or(f64::NAN);
    let (t_told, t_whole) = (middle(&t_told), middle(&t_whole));
    let taken = told.0 && whole.0;
    Ok((
        taken && t_told <= 1.1 * t_whole,
        format!(
            "{SMALL_PRODUCTS} bf16 {m}×{k}×{n} products on {} SMs, median of {ROUNDS}: {t_told:.2} \
             ms with cuBLAS told the slot's SMs, {t_whole:.2} ms told the whole GPU{}: {:.2}× \
             (bound ≤ 1.1)",
            small.sms(),
            if taken { "" } else { " (a target REFUSED)" },
            t_told / t_whole
        ),
    ))
}

/// Two 64-SM slots of one stage, each running the matmuls from its own thread at once,
/// against each alone: they overlap if together they take under 0.8 of the two alone
/// (an H100 ran two such GEMM loops in 67 ms together, 53 ms each alone). `graphed`: each
/// replayed from a CUDA graph of its own, as a stage's launch-bound modules are (the graphs
/// share the device's graph memory pool: do their replays still overlap?).
pub(super) fn colocation(device: &GpuDevice, graphed: bool) -> Res<(bool, String)> {
    let slots = device.create_stage(&[("a", 0.5), ("b", 0.5)])?;
    // SAFETY: the devices are dropped at the end of this function, before the slots.
    let devs = slots
        .iter()
        .map(|s| unsafe { s.candle_device(Binding::Primary) })
        .collect::<Res<Vec<_>>>()?;
    let alone = devs
        .iter()
        .map(|d| matmuls(d, MATMULS, graphed))
        .collect::<Res<Vec<_>>>()?;
    // From the first slot's start to the last one's end, both warm.
    let ready = Barrier::new(devs.len());
    let spans = at_once(&devs, |_, d| matmul_span(d, MATMULS, graphed, Some(&ready)))?;
    let ms = |from: Instant, to: Instant| (to - from).as_secs_f64() * 1e3;
    let together: Vec<f64> = spans.iter().map(|&(from, to)| ms(from, to)).collect();
    let (first, last) = (
        spans.iter().map(|s| s.0).min(),
        spans.iter().map(|s| s.1).max(),
    );
    let wall = match (first, last) {
        (Some(first), Some(last)) => ms(first, last),
        _ => f64::NAN,
    };
    let sum: f64 = alone.iter().sum();
    Ok((
        wall < 0.8 * sum,
        format!(
            "{} + {} SMs{}: together {wall:.1} ms (each {:.1}, {:.1}), alone {:.1} + {:.1} = \
             {sum:.1} ms: {:.2} of the sum (bound < 0.8)",
            slots[0].sms(),
            slots[1].sms(),
            if graphed {
                ", each replaying a CUDA graph"
            } else {
                ""
            },
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
fn at_once<T: Send>(devs: &[Device], f: impl Fn(usize, &Device) -> Res<T> + Sync) -> Res<Vec<T>> {
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
pub(super) const SIX: [(&str, f64); 6] = [
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
pub(super) fn six_slots(device: &GpuDevice, slots: &[GpuSlot]) -> Res<(bool, String)> {
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
    let full = |v: f32, shape: (usize, usize)| Tensor::full(v, shape, dev)?.to_dtype(DType::BF16);
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

/// CLIP's text block at batch 2 (real size), its `pass` launched op by op against replayed
/// from a CUDA graph ([`crate::measure::launch_cost`]): the replay must give the same output,
/// or for a step the same gradient of the first parameter (the same kernels on the same
/// inputs, but for the fused attention's dQ, summed with atomics in no fixed order; bound 1e-2
/// for bf16). A step's graph holds the fused attention's backward pass (64 a head), zeroing
/// its dQ accumulator and adding into it, as a launch-bound module's backward graph does.
pub(super) fn launch(device: &GpuDevice, pass: Pass) -> Res<(bool, String)> {
    let block = crate::models::zoo::encoder_block("clip", "text", 1.0).map_err(|message| {
        crate::EngineError::BadSetting {
            setting: "check".into(),
            message,
        }
    })?;
    let c = crate::measure::launch_cost(&block, 2, pass, device.ordinal(), 5)?;
    Ok((
        c.replay_error < 1e-2 && c.nodes > 0,
        format!(
            "clip text block at batch 2: {} {:.3} ms op by op (host {:.3} ms), {:.3} ms from a \
             graph of {} nodes; replay error {:.1e} (bound 1e-2)",
            pass.describe(),
            c.eager_ms,
            c.eager_host_ms,
            c.graph_ms,
            c.nodes,
            c.replay_error
        ),
    ))
}
