//! What crosses ranks between a trainer's stages: module outputs and gradients gathered
//! through the host, sums over ranks, and module states shared before a checkpoint. Ranks run
//! the same schedule and draw the same batch, so these collective calls line up without
//! coordination.

use candle_core::{Device, Tensor};

use super::Trainer;
use crate::error::EngineError;
use crate::models::model::shards;
use crate::models::nn::to_f32s;
use crate::runtime::collective::buffers::{bucket, decode, encode, unbucket};

impl Trainer {
    /// The whole batch of module `m`'s row shards, on every rank: this rank's `local` rows (its
    /// replicas' shards in replica order, `None` if it holds none) and the other ranks'. Across
    /// ranks the rows meet on the host and stay there: each reader copies them onto its own
    /// stream, where an upload onto `m`'s stream would race the readers' copies.
    pub(super) fn gather_rows(
        &self,
        m: usize,
        local: Option<Tensor>,
    ) -> Result<Tensor, EngineError> {
        let name = self.model.modules[m].name;
        if self.collective.world() == 1 {
            return Ok(local.expect("a single rank holds every replica"));
        }
        let chunks = self.collective.all_gather(&encode(local.as_ref(), name)?)?;
        let placement = self.schedule.placement(m);
        let shards = shards(self.config.batch, placement.dp());
        let mut pieces: Vec<&[f32]> = vec![&[]; placement.dp()];
        let mut dims = None;
        for (rank, chunk) in chunks.iter().enumerate() {
            let Some((d, data)) = decode(chunk) else {
                continue;
            };
            let row: usize = d[1..].iter().product();
            let mut at = 0;
            for s in shards.iter().filter(|s| self.ranks[m][s.index] == rank) {
                let len = s.rows.len() * row;
                pieces[s.index] = &data[at..at + len];
                at += len;
            }
            dims = Some(d);
        }
        let mut dims = dims.expect("some rank holds a replica");
        dims[0] = self.config.batch;
        Tensor::from_vec(pieces.concat(), dims, &Device::Cpu).map_err(EngineError::tensor(name))
    }

    /// The sum over ranks of the ranks' `local` tensors (`None` where a rank has none), in rank
    /// order, on every rank.
    pub(super) fn sum_over_ranks(&self, local: Option<Tensor>) -> Result<Tensor, EngineError> {
        if self.collective.world() == 1 {
            return Ok(local.expect("a single rank holds every replica"));
        }
        let chunks = self
            .collective
            .all_gather(&encode(local.as_ref(), "sum")?)?;
        let mut total: Option<(Vec<usize>, Vec<f32>)> = None;
        for (d, data) in chunks.iter().filter_map(|c| decode(c)) {
            match &mut total {
                None => total = Some((d, data.to_vec())),
                Some((_, acc)) => acc.iter_mut().zip(data).for_each(|(a, b)| *a += b),
            }
        }
        let (dims, data) = total.expect("some rank holds a replica");
        Tensor::from_vec(data, dims, &Device::Cpu).map_err(EngineError::tensor("sum"))
    }

    /// Rank `root`'s `tensors` on every rank (each rank passes tensors of the same shapes, on
    /// the device they come back on), through the host: a collective call.
    pub(super) fn broadcast_tensors(
        &self,
        root: usize,
        tensors: &[Tensor],
        module: &str,
    ) -> Result<Vec<Tensor>, EngineError> {
        let err = || EngineError::tensor(module);
        let Some(first) = tensors.first() else {
            return Ok(Vec::new());
        };
        let mut buf = to_f32s(&bucket(tensors).map_err(err())?).map_err(err())?;
        self.collective.broadcast(root, &mut buf)?;
        let got = Tensor::from_vec(
            buf,
            tensors.iter().map(Tensor::elem_count).sum::<usize>(),
            first.device(),
        );
        unbucket(&got.map_err(err())?, tensors).map_err(err())
    }

    /// Gives every rank the parameters and optimizer state of the modules it holds no replica
    /// of, from the lowest rank that does; a collective call (every rank calls it). Before a
    /// checkpoint, so that rank 0 writes every module's current state.
    pub(crate) fn share_module_states(&self) -> Result<(), EngineError> {
        let world = self.collective.world();
        for (m, module) in self.model.modules.iter().enumerate() {
            if self.groups[m].len() == world {
                continue;
            }
            let root = self.groups[m][0];
            let err = || EngineError::tensor(module.name);
            let mut opt = self.optimizers[m].lock().expect("optimizer lock");
            let params: Vec<Tensor> = module
                .params
                .iter()
                .map(|(_, v)| v.as_detached_tensor())
                .collect();
            let share = |tensors: &[Tensor]| -> Result<Vec<Tensor>, EngineError> {
                // Copies: the optimizer updates its state tensors in place, each on its own.
                (self.broadcast_tensors(root, tensors, module.name)?.iter())
                    .map(|t| t.copy().map_err(err()))
                    .collect()
            };
            for ((_, var), p) in module.params.iter().zip(share(&params)?) {
                var.set(&p).map_err(err())?;
            }
            opt.m = share(&opt.m)?;
            opt.v = share(&opt.v)?;
            // Steps taken: every rank holding the module took the same number.
            let mut t = [opt.t as f32];
            self.collective.broadcast(root, &mut t)?;
            opt.t = t[0] as u64;
        }
        Ok(())
    }
}
