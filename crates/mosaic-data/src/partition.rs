//! DistTrain's intra-microbatch reordering (DistTrain §6.1, Algorithm 2): spread the samples
//! of a global batch over DP groups so that the most loaded group carries as little as
//! possible (multiway number partitioning, NP-hard).

/// Greedy number partitioning (DistTrain §6.1, Algorithm 2): each sample, largest first, goes
/// to the currently lightest of `groups` groups (the first on ties); O(n log n + n·m).
/// Returns the sample indices of each group.
///
/// Sorting largest first is Graham's LPT rule, whose makespan is at most `4/3 − 1/(3m)` of the
/// optimum (Graham 1969), the `≤ 4/3` DistTrain cites. Algorithm 2 as printed sorts
/// *ascending* (line 3), which only guarantees `2 − 1/m`; this follows the bound instead.
///
/// # Panics
/// If `groups` is 0.
pub fn greedy_partition(costs: &[f64], groups: usize) -> Vec<Vec<usize>> {
    assert!(groups > 0, "partition into 0 groups");
    greedy_partition_sized(costs, &vec![costs.len(); groups]).expect("every group has room")
}

/// [`greedy_partition`] into groups of bounded size: group `g` takes at most `room[g]`
/// samples, each sample going, largest first, to the lightest group that still has room (the
/// first on ties). A trainer whose ranks take fixed-size shards of a batch needs this form
/// (`room` = the shard sizes). `None` when the groups cannot hold every sample.
pub fn greedy_partition_sized(costs: &[f64], room: &[usize]) -> Option<Vec<Vec<usize>>> {
    if room.iter().sum::<usize>() < costs.len() {
        return None;
    }
    let mut order: Vec<usize> = (0..costs.len()).collect();
    order.sort_by(|&a, &b| costs[b].total_cmp(&costs[a]));
    let mut out: Vec<Vec<usize>> = room
        .iter()
        .map(|&r| Vec::with_capacity(r.min(costs.len())))
        .collect();
    let mut load = vec![0.0_f64; room.len()];
    for i in order {
        let g = (0..room.len()).filter(|&g| out[g].len() < room[g]).fold(
            None,
            |best: Option<usize>, g| match best {
                Some(b) if load[b] <= load[g] => Some(b),
                _ => Some(g),
            },
        )?;
        out[g].push(i);
        load[g] += costs[i];
    }
    Some(out)
}

/// A lower bound on the optimal makespan of splitting `costs` over `groups` groups: no group
/// can carry less than the largest item or than the average, `max(max cᵢ, Σ cᵢ / m)`.
///
/// # Panics
/// If `groups` is 0.
pub fn lower_bound(costs: &[f64], groups: usize) -> f64 {
    assert!(groups > 0, "lower bound over 0 groups");
    let largest = costs.iter().copied().fold(0.0, f64::max);
    largest.max(costs.iter().sum::<f64>() / groups as f64)
}

/// The load of each group of `assignment` (from [`greedy_partition`] or
/// [`crate::packing::zigzag`]): the sum of its items' `costs`.
pub fn loads(costs: &[f64], assignment: &[Vec<usize>]) -> Vec<f64> {
    assignment
        .iter()
        .map(|g| g.iter().map(|&i| costs[i]).sum())
        .collect()
}
