//! Collectives among the processes (ranks) of a data-parallel run.
//!
//! A module with `dp = d` has `d` replicas; replica `k` runs on the rank its plan GPU maps to
//! (see [`crate::Schedule::ranks`]) with shard `k` of the batch. Replicas on the same rank
//! share one copy of the module's parameters, and the trainer sums their tensors itself, in
//! replica order; what crosses ranks goes through a [`Collective`]:
//! - **gradients**, summed over the ranks holding the module's replicas, on a communication
//!   group created once per module before the first step and reused at every step (§4);
//! - **boundary redistribution**: a module's output rows, and the gradients flowing back to
//!   it, gathered from the ranks that computed them to every rank, so that a consumer placed
//!   with another `dp` on other ranks can cut its own shards.
//!
//! [`InProcess`] is the one-rank case (every call is the identity); `Mpi` (feature `mpi`) runs
//! the ranks as processes started by `mpirun`; `Nccl` (features `mpi` and `cuda`) wraps an
//! `Mpi` and sums gradients with NCCL on each rank's GPU, where the GPU build computed them
//! (not yet run on two GPUs).
//!
//! Gradient semantics: each replica computes the gradient of *its share* of the batch loss
//! (the loss is a mean over the whole batch, and a replica's share is the sum of its samples'
//! terms divided by the whole batch size), so the sum over replicas is the gradient of the
//! batch loss. That is the same as data-parallel training's "average the gradients of each
//! replica's mean loss" (a replica's mean loss is `d ×` its share), without the scaling back
//! and forth, and it keeps the gradient that crosses a module boundary the true ∂loss/∂x.

pub(crate) mod buffers;
#[cfg(all(feature = "cuda", mosaic_gpu))]
pub(crate) mod device_sum;
#[cfg(feature = "mpi")]
mod mpi;
mod turns;

#[cfg(feature = "mpi")]
pub use self::mpi::Mpi;

#[cfg(all(feature = "mpi", feature = "cuda"))]
mod nccl;

#[cfg(all(feature = "mpi", feature = "cuda"))]
pub use self::nccl::Nccl;

pub(crate) use self::turns::{Turn, Turns};

use candle_core::Tensor;

use crate::error::EngineError;
use crate::models::nn::to_f32s;

/// How the ranks of a run exchange data. Every rank calls [`Collective::all_gather`] and
/// [`Collective::broadcast`] in the same order, from the trainer's thread;
/// [`Collective::all_reduce_module`] is called only by the ranks of the module's group, from
/// the module's slot, possibly at the same time as other modules' calls.
pub trait Collective: Send + Sync {
    /// A short name for logs (`in-process`, `mpi`, `nccl`).
    fn name(&self) -> &'static str;

    /// This process's rank, `0..world()`.
    fn rank(&self) -> usize;

    /// The number of ranks.
    fn world(&self) -> usize;

    /// This rank's place on its machine: its index among the ranks there, and their count. A
    /// GPU run trains on the GPU of that index. One process: (0, 1).
    fn node(&self) -> (usize, usize) {
        (0, 1)
    }

    /// Creates one communication group per module: `groups[m]` lists, ascending, the ranks
    /// holding replicas of module `m`. Called once, by every rank, before the first step.
    fn create_groups(&mut self, groups: &[Vec<usize>]) -> Result<(), EngineError>;

    /// Whether the sums a stage's modules start at once must start in one order on every rank
    /// (`Turns`): NCCL's must, since its kernels wait on the GPU for their peers; MPI's
    /// progress on the host and need not.
    fn sums_in_order(&self) -> bool {
        false
    }

    /// Sums `buf` element-wise over the ranks of module `module`'s group; each of them
    /// receives the sum in `buf`.
    fn all_reduce_module(&self, module: usize, buf: &mut [f32]) -> Result<(), EngineError>;

    /// [`Collective::all_reduce_module`] of a gradient bucket (a flat f32 tensor,
    /// `buffers::bucket`): the sum, on the bucket's device. This one moves it through the
    /// host; `Nccl` sums a bucket on a GPU where it is.
    fn all_reduce_bucket(&self, module: usize, bucket: &Tensor) -> Result<Tensor, EngineError> {
        all_reduce_through_host(self, module, bucket)
    }

    /// Every rank contributes `local` (lengths may differ) and receives every rank's
    /// contribution, in rank order.
    fn all_gather(&self, local: &[f32]) -> Result<Vec<Vec<f32>>, EngineError>;

    /// Every rank receives rank `root`'s `buf` in its own `buf` (of the same length).
    fn broadcast(&self, root: usize, buf: &mut [f32]) -> Result<(), EngineError>;
}

/// The GPU of the rank at `node` ([`Collective::node`]) on a machine where it sees `devices`:
/// the one it sees where it sees one (a launcher gave each rank its own through
/// `CUDA_VISIBLE_DEVICES`, as SLURM's `--gpus-per-task=1` does; where ranks do share it, NCCL
/// says so), else the rank's index there, which needs a GPU per rank.
pub fn gpu_of((rank, ranks): (usize, usize), devices: usize) -> Result<usize, String> {
    let ranks = ranks.max(rank + 1);
    match devices {
        0 => Err("the CUDA driver reports no device".into()),
        1 => Ok(0),
        _ if ranks > devices => Err(format!(
            "{ranks} rank(s) on this node share {devices} GPU(s): start at most {devices} \
             rank(s) per node, or give each rank one GPU of its own (CUDA_VISIBLE_DEVICES)"
        )),
        _ => Ok(rank),
    }
}

/// [`Collective::all_reduce_bucket`] through the host: the bucket copied out, summed by
/// [`Collective::all_reduce_module`], copied back to its device.
fn all_reduce_through_host<C: Collective + ?Sized>(
    collective: &C,
    module: usize,
    bucket: &Tensor,
) -> Result<Tensor, EngineError> {
    let err = || EngineError::tensor("gradient bucket");
    let mut host = to_f32s(bucket).map_err(err())?;
    collective.all_reduce_module(module, &mut host)?;
    Tensor::from_vec(host, bucket.elem_count(), bucket.device()).map_err(err())
}

/// One rank holding every replica: nothing crosses a process, every call is the identity.
#[derive(Debug, Clone, Copy, Default)]
pub struct InProcess;

impl Collective for InProcess {
    fn name(&self) -> &'static str {
        "in-process"
    }

    fn rank(&self) -> usize {
        0
    }

    fn world(&self) -> usize {
        1
    }

    fn create_groups(&mut self, _groups: &[Vec<usize>]) -> Result<(), EngineError> {
        Ok(())
    }

    fn all_reduce_module(&self, _module: usize, _buf: &mut [f32]) -> Result<(), EngineError> {
        Ok(())
    }

    fn all_gather(&self, local: &[f32]) -> Result<Vec<Vec<f32>>, EngineError> {
        Ok(vec![local.to_vec()])
    }

    fn broadcast(&self, _root: usize, _buf: &mut [f32]) -> Result<(), EngineError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_trains_on_the_gpu_of_its_index_or_the_one_it_sees() {
        assert_eq!(gpu_of((1, 2), 4), Ok(1));
        assert_eq!(gpu_of((0, 1), 1), Ok(0));
        // Each rank given its own (CUDA_VISIBLE_DEVICES per rank).
        assert_eq!(gpu_of((3, 4), 1), Ok(0));
    }

    #[test]
    fn more_ranks_than_gpus_or_no_gpu_are_errors() {
        assert!(gpu_of((0, 1), 0).unwrap_err().contains("no device"));
        let e = gpu_of((0, 3), 2).unwrap_err();
        assert!(e.contains("3 rank(s) on this node share 2 GPU(s)"), "{e}");
        let e = gpu_of((4, 1), 4).unwrap_err();
        assert!(e.contains("5 rank(s)"), "{e}");
    }

    #[test]
    fn one_rank_is_the_identity() {
        let mut c = InProcess;
        c.create_groups(&[vec![0]]).unwrap();
        let mut buf = [1.0, 2.0];
        c.all_reduce_module(0, &mut buf).unwrap();
        c.broadcast(0, &mut buf).unwrap();
        assert_eq!(buf, [1.0, 2.0]);
        assert_eq!(c.all_gather(&buf).unwrap(), vec![vec![1.0, 2.0]]);
        assert_eq!((c.rank(), c.world()), (0, 1));
    }
}
