//! Ranks as processes started by `mpirun`, through the `mpi` crate (OpenMPI on Debian).

use ::mpi::collective::SystemOperation;
use ::mpi::datatype::PartitionMut;
use ::mpi::environment::Universe;
use ::mpi::topology::{Color, Communicator, SimpleCommunicator};
use ::mpi::traits::*;
use ::mpi::{Count, Threading};

use super::Collective;
use crate::error::EngineError;

/// The environment variables a launcher sets in every rank it starts (OpenMPI, PMI, PMIx).
const LAUNCHER_VARS: [&str; 3] = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"];

/// MPI collectives: gathers and broadcasts on `MPI_COMM_WORLD`, gradient all-reduces on one
/// communicator per module, split from the world once ([`Collective::create_groups`]).
///
/// MPI is initialised with `MPI_THREAD_MULTIPLE`, since the modules of a stage all-reduce from
/// their own slots at the same time. Each module's communicator is used by that module's job
/// only, and the world communicator by the trainer's thread only, between stages.
///
/// MPI lives as long as the process: [`Mpi::end`] finalises it, or ends the whole job, as the
/// process exits.
pub struct Mpi {
    groups: Vec<Option<SimpleCommunicator>>,
    world: SimpleCommunicator,
    rank: usize,
    size: usize,
    /// See [`Collective::node`].
    node: (usize, usize),
}

/// MPI's universe from [`Mpi::launched`] until [`Mpi::end`]: not a trainer's, whose drop on an
/// error would finalise MPI, which OpenMPI does only with every rank, while the others wait for
/// this one in a collective (a hung job).
static UNIVERSE: std::sync::Mutex<Option<Universe>> = std::sync::Mutex::new(None);

// SAFETY: MPI runs with MPI_THREAD_MULTIPLE (checked in `Mpi::launched`), so its calls may come
// from any thread; the handles are plain identifiers, and the trainer never uses one
// communicator from two threads at once (see the type's documentation).
unsafe impl Send for Mpi {}
// SAFETY: as above.
unsafe impl Sync for Mpi {}

impl Mpi {
    /// Ends MPI as the process exits with `code`, where [`Mpi::launched`] started it: a
    /// failure (`code` ≠ 0) in a job of more than one rank ends every rank with it
    /// (`MPI_Abort`), since the others may wait for this one in a collective; else MPI is
    /// finalised, as every rank does at the end of a run.
    pub fn end(code: i32) {
        let universe = UNIVERSE.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(universe) = universe else { return };
        let world = universe.world();
        if code != 0 && world.size() > 1 {
            world.abort(code);
        }
        drop(universe);
    }

    /// MPI, if this process was started by an MPI launcher (`mpirun`, `mpiexec`, `srun`);
    /// `None` otherwise, so that a plain run never initialises MPI.
    pub fn launched() -> Result<Option<Mpi>, EngineError> {
        if !LAUNCHER_VARS.iter().any(|v| std::env::var_os(v).is_some()) {
            return Ok(None);
        }
        let Some((universe, provided)) = ::mpi::initialize_with_threading(Threading::Multiple)
        else {
            return Err(collective(
                "MPI was already initialised in this process".into(),
            ));
        };
        if provided != Threading::Multiple {
            return Err(collective(format!(
                "the MPI library provides {provided:?} threading, but the modules of a stage \
                 all-reduce from their own threads, which needs Multiple \
                 (MPI_THREAD_MULTIPLE)"
            )));
        }
        let world = universe.world();
        *UNIVERSE.lock().unwrap_or_else(|e| e.into_inner()) = Some(universe);
        // The ranks sharing this one's memory, so its machine (MPI_Comm_split_type), whatever
        // the launcher: OpenMPI's mpirun, MPICH's, srun.
        let here = world.split_shared(world.rank());
        let node = (here.rank() as usize, here.size() as usize);
        Ok(Some(Mpi {
            groups: Vec::new(),
            rank: world.rank() as usize,
            size: world.size() as usize,
            world,
            node,
        }))
    }

    /// Every rank receives rank `root`'s `buf` in its own `buf` (of the same length), on the
    /// world communicator: a collective call every rank makes, in the same order. Floats for
    /// [`Collective::broadcast`], bytes for small control data such as the NCCL unique ids
    /// `Nccl` hands out.
    pub(crate) fn broadcast_into<T: Equivalence>(
        &self,
        root: usize,
        buf: &mut [T],
    ) -> Result<(), EngineError> {
        if root >= self.size {
            return Err(collective(format!(
                "broadcast from rank {root} in a world of {}",
                self.size
            )));
        }
        self.world.process_at_rank(root as i32).broadcast_into(buf);
        Ok(())
    }
}

fn collective(message: String) -> EngineError {
    EngineError::Collective {
        collective: "mpi",
        message,
    }
}

/// Where each rank's part of a gather of `counts` begins: their running sums, `None` where the
/// whole exceeds MPI's 32-bit count.
fn displacements(counts: &[Count]) -> Option<Vec<Count>> {
    let mut at: Count = 0;
    let mut displs = Vec::with_capacity(counts.len());
    for &c in counts {
        displs.push(at);
        at = at.checked_add(c)?;
    }
    Some(displs)
}

fn count(n: usize) -> Result<Count, EngineError> {
    Count::try_from(n).map_err(|_| collective(format!("{n} elements exceed MPI's count limit")))
}

impl Collective for Mpi {
    fn name(&self) -> &'static str {
        "mpi"
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.size
    }

    fn node(&self) -> (usize, usize) {
        self.node
    }

    fn create_groups(&mut self, groups: &[Vec<usize>]) -> Result<(), EngineError> {
        self.groups = groups
            .iter()
            .map(|ranks| {
                // A split is collective over the world: every rank takes part, in module
                // order; the ranks outside the group get no communicator.
                let member = ranks.contains(&self.rank);
                let color = if member {
                    Color::with_value(0)
                } else {
                    Color::undefined()
                };
                let comm = self.world.split_by_color(color);
                if member && comm.as_ref().map(|c| c.size() as usize) != Some(ranks.len()) {
                    return Err(collective(format!(
                        "the group of ranks {ranks:?} came out with {:?} ranks",
                        comm.map(|c| c.size())
                    )));
                }
                Ok(comm)
            })
            .collect::<Result<_, _>>()?;
        Ok(())
    }

    fn all_reduce_module(&self, module: usize, buf: &mut [f32]) -> Result<(), EngineError> {
        let comm = self
            .groups
            .get(module)
            .and_then(Option::as_ref)
            .ok_or_else(|| {
                collective(format!(
                    "rank {} has no group for module {module}: not one of its ranks, or \
                     create_groups was not called",
                    self.rank
                ))
            })?;
        if comm.size() == 1 {
            return Ok(());
        }
        let send = buf.to_vec();
        comm.all_reduce_into(&send[..], buf, SystemOperation::sum());
        Ok(())
    }

    fn all_gather(&self, local: &[f32]) -> Result<Vec<Vec<f32>>, EngineError> {
        let mut counts = vec![0 as Count; self.size];
        self.world
            .all_gather_into(&count(local.len())?, &mut counts[..]);
        // Every rank gathered the same counts, so every rank fails here alike.
        let displs = displacements(&counts).ok_or_else(|| {
            let total: usize = counts.iter().map(|&c| c as usize).sum();
            collective(format!(
                "gathering {total} floats from {} ranks: MPI's displacements are 32-bit, so a \
                 gather holds at most {} (a smaller batch gathers less)",
                self.size,
                Count::MAX
            ))
        })?;
        let total = counts.iter().map(|&c| c as usize).sum();
        let mut all = vec![0f32; total];
        {
            let mut partition = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
            self.world.all_gather_varcount_into(local, &mut partition);
        }
        Ok(counts
            .iter()
            .zip(&displs)
            .map(|(&c, &d)| all[d as usize..(d + c) as usize].to_vec())
            .collect())
    }

    fn broadcast(&self, root: usize, buf: &mut [f32]) -> Result<(), EngineError> {
        self.broadcast_into(root, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gather_past_mpis_32_bit_counts_is_refused() {
        assert_eq!(displacements(&[3, 0, 2]), Some(vec![0, 3, 3]));
        assert_eq!(
            displacements(&[Count::MAX - 1, 1]),
            Some(vec![0, Count::MAX - 1])
        );
        assert_eq!(displacements(&[Count::MAX, 1]), None);
        assert_eq!(displacements(&[1 << 30, 1 << 30]), None);
    }
}
