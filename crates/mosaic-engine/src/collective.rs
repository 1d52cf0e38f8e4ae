//! Collectives among the data-parallel replicas of one module.
//!
//! The trainer talks to replicas only through [`Collective`], so that replicas in other
//! processes can join later behind the same calls. Today's implementation, [`InProcess`], holds
//! every replica of a module in this process (they share one copy of the parameters) and
//! reduces their tensors in replica order, which makes a run repeatable bit for bit.
//!
//! Gradient semantics: each replica computes the gradient of *its share* of the batch loss
//! (the loss is a mean over the whole batch, and a replica's share is the sum of its samples'
//! terms divided by the whole batch size), so the sum over replicas is the gradient of the
//! batch loss. That is the same as data-parallel training's "average the gradients of each
//! replica's mean loss" (a replica's mean loss is `d ×` its share), without the scaling back
//! and forth, and it keeps the gradient that crosses a module boundary the true ∂loss/∂x.

use candle_core::{Result, Tensor};

/// How the replicas of a module combine tensors.
pub trait Collective: Send + Sync {
    /// A short name for logs (`in-process`).
    fn name(&self) -> &'static str;

    /// Sums `local[r][i]` over the replicas `r`, for every tensor `i`; every replica receives
    /// the sums. `local` holds this process's replicas in replica order.
    fn all_reduce_sum(&self, local: Vec<Vec<Tensor>>) -> Result<Vec<Tensor>>;

    /// Concatenates the replicas' row shards along dimension 0, in replica order; every
    /// replica receives the whole.
    fn all_gather_rows(&self, local: Vec<Tensor>) -> Result<Tensor>;
}

/// Every replica in this process: reductions are ordered sums, gathers are concatenations.
#[derive(Debug, Clone, Copy, Default)]
pub struct InProcess;

impl Collective for InProcess {
    fn name(&self) -> &'static str {
        "in-process"
    }

    fn all_reduce_sum(&self, local: Vec<Vec<Tensor>>) -> Result<Vec<Tensor>> {
        let mut replicas = local.into_iter();
        let Some(mut acc) = replicas.next() else {
            return Ok(Vec::new());
        };
        for r in replicas {
            assert_eq!(r.len(), acc.len(), "replicas reduce different tensor lists");
            for (a, t) in acc.iter_mut().zip(r) {
                *a = (&*a + t)?;
            }
        }
        Ok(acc)
    }

    fn all_gather_rows(&self, local: Vec<Tensor>) -> Result<Tensor> {
        if local.len() == 1 {
            return Ok(local.into_iter().next().unwrap());
        }
        Tensor::cat(&local.iter().collect::<Vec<_>>(), 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn sums_and_gathers_in_replica_order() -> Result<()> {
        let d = Device::Cpu;
        let t = |v: &[f32]| Tensor::new(v, &d);
        let sums = InProcess.all_reduce_sum(vec![
            vec![t(&[1.0, 2.0])?, t(&[10.0])?],
            vec![t(&[3.0, 4.0])?, t(&[20.0])?],
        ])?;
        assert_eq!(sums[0].to_vec1::<f32>()?, [4.0, 6.0]);
        assert_eq!(sums[1].to_vec1::<f32>()?, [30.0]);
        let all = InProcess.all_gather_rows(vec![t(&[1.0])?, t(&[2.0, 3.0])?])?;
        assert_eq!(all.to_vec1::<f32>()?, [1.0, 2.0, 3.0]);
        Ok(())
    }
}
