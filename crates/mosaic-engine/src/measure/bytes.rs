//! What a replica holds and moves, counted from its tensors: the profile's `mem_gib` and the
//! traffic estimate behind its `bw_util`.
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
//! # Traffic (`bw_util`)
//! There are no memory-traffic counters to read here, so the traffic is estimated. With `A` the
//! activation bytes and `P` the parameter bytes counted above, one iteration moves at least
//! (every tensor touched the fewest times possible):
//! - forward: read the parameters, write every activation and read it once: `P + 2A`;
//! - backward: read the saved activations, write and read one gradient per activation, read
//!   the parameters, write their gradients: `3A + 2P`;
//! - AdamW: read θ, g, m, v and write θ, m, v: `7P`;
//! - all-reduce: `dp − 1` additions, each reading two gradient sets and writing one:
//!   `3(dp − 1)P`.
//!
//! That is `5A + 10P + 3(dp − 1)P` bytes ([`bytes_moved`]). `bw_util` is those bytes over the
//! iteration time over the machine's peak bandwidth (see [`super::machine`]). The estimate is
//! a lower bound on traffic (candle's unfused element-wise ops touch tensors more often), while
//! a tiny module's working set may stay in cache and never reach DRAM; the number is a
//! consistent proxy across modules and quotas, not a counter reading.

use std::collections::HashSet;

use candle_core::{CpuStorage, Storage, Tensor};
use serde::Serialize;

use crate::models::nn::Params;

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

/// Bytes of the tensors' elements (views counted at their own size).
pub(crate) fn tensor_bytes<'a>(ts: impl IntoIterator<Item = &'a Tensor>) -> u64 {
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
        #[cfg(mosaic_gpu)]
        Storage::Cuda(c) => cuda_storage_bytes(c),
        // The view's own size, where the storage's is not known to this build.
        _ => layout.shape().elem_count() * t.dtype().size_in_bytes(),
    };
    (key, bytes as u64)
}

#[cfg(mosaic_gpu)]
fn cuda_storage_bytes(c: &candle_core::CudaStorage) -> usize {
    use candle_core::cuda_backend::CudaStorageSlice as S;
    match &c.slice {
        S::U8(s) | S::F6E2M3(s) | S::F6E3M2(s) | S::F4(s) | S::F8E8M0(s) => s.num_bytes(),
        S::U32(s) => s.num_bytes(),
        S::I16(s) => s.num_bytes(),
        S::I32(s) => s.num_bytes(),
        S::I64(s) => s.num_bytes(),
        S::BF16(s) => s.num_bytes(),
        S::F16(s) => s.num_bytes(),
        S::F32(s) => s.num_bytes(),
        S::F64(s) => s.num_bytes(),
        S::F8E4M3(s) => s.num_bytes(),
    }
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
pub(crate) fn tape_bytes(out: &Tensor, params: &Params) -> u64 {
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
}
