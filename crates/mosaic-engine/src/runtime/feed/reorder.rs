//! DistTrain's intra-microbatch reordering (§6.1, Algorithm 2) for the trainer's shards.
//!
//! The trainer cuts a batch into `dp` contiguous shards of fixed sizes
//! ([`crate::models::model::shards`]: `batch / dp` samples, the first `batch % dp` one more),
//! and every module's replica `k` takes shard `k`. So the reordering must put the samples in an
//! order whose shards carry balanced costs: Graham's largest-first greedy rule with each group
//! holding exactly its shard's number of samples (`mosaic_data::greedy_partition_sized`),
//! unless the drawn order is already as balanced. The permutation is
//! applied in the producer; the trainer is unchanged.
//!
//! The loss does not depend on the order: the modules' losses are means over the batch whose
//! terms follow the samples (CLIP's contrastive loss sums, over sample `i`, image `i` against
//! every text and text `i` against every image; permuting images and texts alike permutes
//! both sums' terms), so reordering changes only floating-point summation order.

use crate::models::model::shards;

/// The order of a batch of samples with `costs` for `dp` ranks: `order[j]` is the sample at
/// position `j`, and position `j` lies in the shard of rank `k` when `j` is in
/// `shards(batch, dp)[k].rows`. `dp` of 0 or 1, or a drawn order already as balanced (its
/// heaviest shard no heavier), is kept; `dp` above the batch is taken as the batch.
pub fn reorder(costs: &[f64], dp: usize) -> Vec<usize> {
    let n = costs.len();
    let dp = dp.min(n);
    if dp <= 1 {
        return (0..n).collect();
    }
    let room: Vec<usize> = shards(n, dp).iter().map(|s| s.rows.len()).collect();
    let groups =
        mosaic_data::greedy_partition_sized(costs, &room).expect("the shards hold every sample");
    let order: Vec<usize> = groups
        .into_iter()
        .flat_map(|mut g| {
            g.sort_unstable();
            g
        })
        .collect();
    // The greedy rule has no guarantee against a particular order: never do worse than the
    // drawn one.
    let identity: Vec<usize> = (0..n).collect();
    let heaviest = |o: &[usize]| shard_loads(costs, o, dp).into_iter().fold(0.0, f64::max);
    if heaviest(&identity) <= heaviest(&order) {
        identity
    } else {
        order
    }
}

/// The cost each of `dp` ranks carries when the batch is in `order` (`order[j]` the sample at
/// position `j`): the sums over the trainer's contiguous shards, by `mosaic_data::loads`.
pub fn shard_loads(costs: &[f64], order: &[usize], dp: usize) -> Vec<f64> {
    let groups: Vec<Vec<usize>> = shards(order.len(), dp.clamp(1, order.len().max(1)))
        .iter()
        .map(|s| order[s.rows.clone()].to_vec())
        .collect();
    mosaic_data::loads(costs, &groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_cases() {
        assert_eq!(reorder(&[], 4), Vec::<usize>::new());
        assert_eq!(reorder(&[3.0, 1.0, 2.0], 1), vec![0, 1, 2]);
        // Two ranks of two: {9, 1} and {5, 5}.
        let order = reorder(&[9.0, 5.0, 5.0, 1.0], 2);
        assert_eq!(
            shard_loads(&[9.0, 5.0, 5.0, 1.0], &order, 2),
            vec![10.0, 10.0]
        );
    }
}
