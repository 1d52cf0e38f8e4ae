//! Gradient all-reduces through NCCL, on GPUs, for ranks started by `mpirun` (features `mpi`
//! and `cuda`).
//!
//! **What this is for.** With `--device cuda` (the GPU build), a module's gradients are in its
//! slot's GPU memory: one bucket per module ([`super::buffers::bucket`]) is summed there, by
//! NCCL on the module's communicator, without a copy through the host (`device_sum.rs`). With
//! the compute on CPU threads, the host gradients go through the GPU (host → device, NCCL
//! sum, device → host): correct, no faster than [`Mpi`]'s host all-reduce. Neither has run on
//! two GPUs yet: no machine with two has been lent to this project.
//!
//! **How.** MPI starts the ranks and hands out the NCCL unique ids: for every module group of
//! two or more ranks, the group's lowest rank creates an id and its 128 bytes are broadcast
//! over the MPI world, every rank taking part in every broadcast, in module order; then every
//! member creates the group's NCCL communicator, again in module order, each with its own
//! CUDA stream, once, before the first step (Mosaic §4). Gathers and broadcasts of host
//! tensors between stages go through the wrapped [`Mpi`].
//!
//! **Order.** The modules of a stage all-reduce from their own threads. NCCL allows
//! concurrent operations on different communicators, but where two communicators share GPUs
//! their kernels can wait on each other if the ranks launch them in different orders; so a
//! stage's sums start in the plan's order on every rank ([`Collective::sums_in_order`],
//! `super::turns`). Not yet run on two GPUs.

use std::ffi::c_char;
use std::sync::{Arc, Mutex, MutexGuard};

#[cfg(mosaic_gpu)]
use candle_core::Tensor;

use cudarc::driver::{CudaContext, CudaSlice};
use cudarc::nccl::{Comm, Id, ReduceOp};

use super::{Collective, Mpi};
use crate::error::EngineError;
use crate::runtime::slot::cuda::driver_unavailable;

/// NCCL functions this module calls; all must be in the library before any is called (cudarc
/// panics on a missing symbol). (The GPU build links NCCL, so it reads none.)
#[cfg_attr(mosaic_gpu, allow(dead_code))]
const NCCL_REQUIRED: &[&str] = &[
    "ncclGetUniqueId",
    "ncclCommInitRank",
    "ncclAllReduce",
    "ncclCommAbort",
];

/// Bytes of an NCCL unique id.
const ID_BYTES: usize = 128;

/// NCCL collectives over the ranks of an `mpirun` run, one GPU per rank: gradient all-reduces
/// on one NCCL communicator (and CUDA stream) per module, created once by
/// [`Collective::create_groups`]; gathers and broadcasts of host tensors through the wrapped
/// [`Mpi`].
///
/// A bucket on a GPU is summed where it lies ([`Collective::all_reduce_bucket`]); host
/// gradients go through the GPU ([`Collective::all_reduce_module`]). Not yet run on two GPUs.
///
/// A rank uses the GPU of its local rank (`OMPI_COMM_WORLD_LOCAL_RANK`, else the world rank);
/// a node needs a GPU per rank. Chosen with `mpirun … mosaic train --collective nccl`.
pub struct Nccl {
    // Fields drop in order: the communicators are aborted (and their device buffers freed)
    // before the CUDA context is released and MPI finalised.
    modules: Vec<Group>,
    ctx: Arc<CudaContext>,
    mpi: Mpi,
}

/// This rank's part in one module's group.
enum Group {
    /// Not one of the group's ranks.
    Outside,
    /// The group's only rank: the sum is the rank's own buffer.
    Alone,
    /// One of two or more ranks: the module's communicator, used by its job only.
    Shared(Mutex<ModuleComm>),
}

/// One module's NCCL communicator (with its stream) and device buffer.
struct ModuleComm {
    comm: Comm,
    /// Sized on first use, to the module's gradient length; reused at every step.
    device: Option<CudaSlice<f32>>,
}

// SAFETY: `Comm` holds a raw `ncclComm_t`, which is why it is not `Send`. NCCL lets a
// communicator be used from any thread as long as no two threads use it at once; a
// `ModuleComm` only lives inside a `Mutex` (`Group::Shared`), so one thread at a time uses it.
// Its stream and buffer are cudarc types that are already `Send`.
unsafe impl Send for ModuleComm {}

fn nccl(message: String) -> EngineError {
    EngineError::Collective {
        collective: "nccl",
        message,
    }
}

/// Why NCCL cannot be called here: never, in the GPU build, which links `libnccl` (cudarc's
/// dynamic linking), so a process that started has it.
#[cfg(mosaic_gpu)]
fn nccl_unavailable() -> Option<String> {
    None
}

/// Why NCCL cannot be called here, or `None` if it can: no `libnccl.so`, or one lacking a
/// function this module calls. Never panics.
#[cfg(not(mosaic_gpu))]
fn nccl_unavailable() -> Option<String> {
    // SAFETY: only tries to open the library (dlopen) and drops it.
    if !unsafe { cudarc::nccl::sys::is_culib_present() } {
        return Some(
            "no NCCL library found (cudarc looks for libnccl.so; install NCCL, or link \
             libnccl.so to libnccl.so.2 on the library path)"
                .into(),
        );
    }
    // SAFETY: `culib` cannot panic now that a candidate library opened; `get` only looks a
    // symbol up, the pointer is not called.
    let lib = unsafe { cudarc::nccl::sys::culib() };
    NCCL_REQUIRED
        .iter()
        .find(|name| unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_err())
        .map(|name| format!("the NCCL library lacks {name}"))
}

/// An id's bytes, to send over MPI.
fn id_bytes(id: &Id) -> [u8; ID_BYTES] {
    id.internal().map(|c| c as u8)
}

/// The id whose bytes are `bytes`.
fn id_from_bytes(bytes: &[u8; ID_BYTES]) -> Id {
    Id::uninit(bytes.map(|b| b as c_char))
}

/// Opens the GPU of the rank at `node` ([`Collective::node`]), after checking the driver and
/// NCCL are there.
fn open_device(node: (usize, usize)) -> Result<Arc<CudaContext>, String> {
    if let Some(why) = driver_unavailable() {
        return Err(format!("no usable CUDA driver or GPU: {why}"));
    }
    if let Some(why) = nccl_unavailable() {
        return Err(why);
    }
    let devices = CudaContext::device_count().map_err(|e| format!("cuDeviceGetCount: {e}"))?;
    let ordinal = super::gpu_of(node, usize::try_from(devices).unwrap_or(0))?;
    CudaContext::new(ordinal).map_err(|e| format!("opening CUDA device {ordinal}: {e}"))
}

impl Nccl {
    /// NCCL on this rank's GPU, over the ranks of `mpi`. Collective: every rank calls it, and
    /// all fail together (so that none waits for the others) when any of them has no CUDA
    /// driver (12.5 or later, as for the GPU slots), no GPU, or no `libnccl.so`; the error
    /// names the ranks and this rank's reason.
    pub fn new(mpi: Mpi) -> Result<Nccl, EngineError> {
        let rank = mpi.rank();
        let opened = open_device(mpi.node());
        let ok = mpi.all_gather(&[if opened.is_ok() { 1.0 } else { 0.0 }])?;
        let failed: Vec<usize> = (ok.iter().enumerate())
            .filter(|(_, v)| v.first() != Some(&1.0))
            .map(|(r, _)| r)
            .collect();
        match opened {
            Err(why) => Err(nccl(format!(
                "cannot use NCCL on rank {rank} (failing ranks {failed:?}): {why}"
            ))),
            Ok(_) if !failed.is_empty() => Err(nccl(format!(
                "ranks {failed:?} cannot use NCCL (their errors name why)"
            ))),
            Ok(ctx) => Ok(Nccl {
                modules: Vec::new(),
                ctx,
                mpi,
            }),
        }
    }
}

impl Nccl {
    /// This rank's communicator for `module`, locked; `None` where the rank is the group's
    /// only one (the sum is its own buffer).
    fn shared(&self, module: usize) -> Result<Option<MutexGuard<'_, ModuleComm>>, EngineError> {
        let rank = self.rank();
        match self.modules.get(module) {
            None | Some(Group::Outside) => Err(nccl(format!(
                "rank {rank} has no group for module {module}: not one of its ranks, or \
                 create_groups was not called"
            ))),
            Some(Group::Alone) => Ok(None),
            Some(Group::Shared(comm)) => comm.lock().map(Some).map_err(|_| {
                nccl(format!(
                    "module {module}: an earlier all-reduce panicked on rank {rank}"
                ))
            }),
        }
    }

    /// The error of a failed all-reduce of `module`'s gradients on this rank.
    fn failed(&self, module: usize, why: String) -> EngineError {
        nccl(format!("module {module} on rank {}: {why}", self.rank()))
    }
}

impl ModuleComm {
    /// Sums `buf` over the communicator's ranks through the device buffer, on its stream.
    fn all_reduce(&mut self, buf: &mut [f32]) -> Result<(), String> {
        if buf.is_empty() {
            return Ok(());
        }
        let stream = self.comm.stream();
        if self.device.as_ref().map(CudaSlice::len) != Some(buf.len()) {
            self.device = None;
            let fresh = stream
                .alloc_zeros::<f32>(buf.len())
                .map_err(|e| format!("allocating {} floats on the GPU: {e}", buf.len()))?;
            self.device = Some(fresh);
        }
        let Some(device) = self.device.as_mut() else {
            return Err("no device buffer".into());
        };
        stream
            .memcpy_htod(&*buf, device)
            .map_err(|e| format!("copying to the GPU: {e}"))?;
        self.comm
            .all_reduce_in_place(device, &ReduceOp::Sum)
            .map_err(|e| format!("ncclAllReduce: {:?}", e.0))?;
        stream
            .memcpy_dtoh(device, buf)
            .map_err(|e| format!("copying from the GPU: {e}"))?;
        stream
            .synchronize()
            .map_err(|e| format!("waiting for the all-reduce: {e}"))
    }
}

impl Collective for Nccl {
    fn name(&self) -> &'static str {
        "nccl"
    }

    fn rank(&self) -> usize {
        self.mpi.rank()
    }

    fn world(&self) -> usize {
        self.mpi.world()
    }

    fn node(&self) -> (usize, usize) {
        self.mpi.node()
    }

    fn create_groups(&mut self, groups: &[Vec<usize>]) -> Result<(), EngineError> {
        let rank = self.rank();
        let world = self.world();
        // Every rank sees the same groups, so every rank fails here alike, before any
        // collective call.
        for (m, ranks) in groups.iter().enumerate() {
            let ascending = ranks.windows(2).all(|w| w[0] < w[1]);
            if !ascending || ranks.last().is_some_and(|&r| r >= world) {
                return Err(nccl(format!(
                    "module {m}: group {ranks:?} is not ascending ranks of a world of {world}"
                )));
            }
        }
        // The ids, broadcast over the world in module order with every rank taking part: byte
        // 0 says whether the root could create one, so that a failure reaches every rank.
        let mut ids = Vec::with_capacity(groups.len());
        for (m, ranks) in groups.iter().enumerate() {
            if ranks.len() < 2 {
                ids.push(None);
                continue;
            }
            let root = ranks[0];
            let mut msg = [0u8; ID_BYTES + 1];
            let mut why = None;
            if rank == root {
                match Id::new() {
                    Ok(id) => {
                        msg[0] = 1;
                        msg[1..].copy_from_slice(&id_bytes(&id));
                    }
                    Err(e) => why = Some(format!("{:?}", e.0)),
                }
            }
            self.mpi.broadcast_into(root, &mut msg)?;
            if msg[0] != 1 {
                return Err(nccl(format!(
                    "module {m}: rank {root} could not create an NCCL id{}",
                    why.map(|w| format!(" (ncclGetUniqueId: {w})"))
                        .unwrap_or_default()
                )));
            }
            let mut bytes = [0u8; ID_BYTES];
            bytes.copy_from_slice(&msg[1..]);
            ids.push(Some(id_from_bytes(&bytes)));
        }
        // The communicators, in module order on every rank: ncclCommInitRank waits for the
        // group's other ranks, and one order everywhere means no rank waits on one that is
        // waiting for it.
        let mut modules = Vec::with_capacity(groups.len());
        for (m, (ranks, id)) in groups.iter().zip(ids).enumerate() {
            let Some(position) = ranks.iter().position(|&r| r == rank) else {
                modules.push(Group::Outside);
                continue;
            };
            let Some(id) = id else {
                modules.push(Group::Alone);
                continue;
            };
            let stream = self
                .ctx
                .new_stream()
                .map_err(|e| nccl(format!("module {m}: creating a CUDA stream: {e}")))?;
            let comm = Comm::from_rank(stream, position, ranks.len(), id).map_err(|e| {
                nccl(format!(
                    "module {m}: ncclCommInitRank (rank {position} of {ranks:?}): {:?}",
                    e.0
                ))
            })?;
            modules.push(Group::Shared(Mutex::new(ModuleComm { comm, device: None })));
        }
        self.modules = modules;
        Ok(())
    }

    fn sums_in_order(&self) -> bool {
        true
    }

    fn all_reduce_module(&self, module: usize, buf: &mut [f32]) -> Result<(), EngineError> {
        let Some(mut comm) = self.shared(module)? else {
            return Ok(());
        };
        (comm.all_reduce(buf)).map_err(|e| self.failed(module, e))
    }

    /// On a GPU, the bucket is summed where it lies ([`super::device_sum`]): no copy through the host.
    #[cfg(mosaic_gpu)]
    fn all_reduce_bucket(&self, module: usize, bucket: &Tensor) -> Result<Tensor, EngineError> {
        if !bucket.device().is_cuda() {
            return super::all_reduce_through_host(self, module, bucket);
        }
        let Some(comm) = self.shared(module)? else {
            return Ok(bucket.clone());
        };
        super::device_sum::sum_on_device(&comm.comm, bucket)
            .map_err(|e| self.failed(module, e.to_string()))
    }

    fn all_gather(&self, local: &[f32]) -> Result<Vec<Vec<f32>>, EngineError> {
        self.mpi.all_gather(local)
    }

    fn broadcast(&self, root: usize, buf: &mut [f32]) -> Result<(), EngineError> {
        self.mpi.broadcast(root, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_survives_its_bytes() {
        // Odd byte values 1..=255: those above 127 are negative as a signed c_char.
        let internal: [c_char; ID_BYTES] = std::array::from_fn(|i| (i * 2 + 1) as u8 as c_char);
        let bytes = id_bytes(&Id::uninit(internal));
        assert_eq!(bytes[127], 255);
        assert_eq!(id_from_bytes(&bytes).internal(), &internal);
    }
}
