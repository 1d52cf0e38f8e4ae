//! AdamW on a GPU as one kernel per parameter tensor (`kernels/adamw.cu`, compiled by the
//! build script): one launch and one pass over memory where the composed update
//! ([`super::AdamW::step`] on the CPU) takes 16 of each. The parameter and both moments are
//! updated in place, on the stream of the parameter's device (its slot's), after the work that
//! made the gradient.

use candle_core::cuda_backend::WrapErr;
use candle_core::{bail, DType, Result, Tensor};
use cudarc::driver::{LaunchConfig, PushKernelArg};

use crate::kernels::{address, cuda_device, kernel, ADAMW};
/// Threads per block.
const THREADS: u32 = 256;
/// At most this many blocks (a grid-stride loop covers the rest).
const MAX_BLOCKS: u32 = 1 << 16;

/// One step's scalars, as the kernel takes them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Scalars {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    /// `1 − β₁`, from f64 (in f32, `1 − 0.999` is off by 1.3e-5 relative).
    pub one_minus_beta1: f32,
    /// `1 − β₂`, likewise.
    pub one_minus_beta2: f32,
    pub eps: f32,
    /// `1 − lr·λ`.
    pub decay: f32,
    /// `1 − β₁ᵗ`.
    pub bias1: f32,
    /// `1 − β₂ᵗ`.
    pub bias2: f32,
}

/// Updates `theta`, `m` and `v` (f32, contiguous, one shape, on one CUDA device) in place from
/// the gradient `g`.
pub(super) fn step(theta: &Tensor, m: &Tensor, v: &Tensor, g: &Tensor, s: Scalars) -> Result<()> {
    let dev = cuda_device(theta, "the fused AdamW")?;
    let g = g.to_dtype(DType::F32)?.contiguous()?;
    for (what, t) in [("moment m", m), ("moment v", v), ("gradient", &g)] {
        if t.shape() != theta.shape() {
            bail!(
                "AdamW: the {what} has shape {:?}, the parameter {:?}",
                t.shape(),
                theta.shape()
            )
        }
        if !t.device().same_device(theta.device()) {
            bail!("AdamW: the {what} is not on the parameter's device")
        }
    }
    for (what, t) in [("parameter", theta), ("moment m", m), ("moment v", v)] {
        if t.dtype() != DType::F32 || !t.is_contiguous() {
            bail!("AdamW: the {what} must be a contiguous f32 tensor")
        }
    }
    let n = theta.elem_count();
    if n == 0 {
        return Ok(());
    }
    let func = kernel(dev, &ADAMW, "mosaic_adamw_f32", 0)?;
    let stream = dev.cuda_stream();
    // The kernel writes through the first three addresses: the optimizer owns the moments, and
    // a parameter is written in place just as `Var::set` does. Every tensor outlives this call.
    let at = |t: &Tensor| address(t, &stream);
    let (theta_at, m_at, v_at, g_at) = (at(theta)?, at(m)?, at(v)?, at(&g)?);
    let blocks = n.div_ceil(THREADS as usize).min(MAX_BLOCKS as usize) as u32;
    let config = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let n = n as u64;
    let mut launch = stream.launch_builder(&func);
    launch
        .arg(&theta_at)
        .arg(&m_at)
        .arg(&v_at)
        .arg(&g_at)
        .arg(&n)
        .arg(&s.lr)
        .arg(&s.beta1)
        .arg(&s.beta2)
        .arg(&s.one_minus_beta1)
        .arg(&s.one_minus_beta2)
        .arg(&s.eps)
        .arg(&s.decay)
        .arg(&s.bias1)
        .arg(&s.bias2);
    // SAFETY: the arguments match the kernel's parameters in number, order and size (four
    // device addresses, an unsigned 64-bit count, nine f32 scalars); each address points at
    // `n` f32s of a live allocation of this device.
    unsafe { launch.launch(config) }.w()?;
    Ok(())
}
