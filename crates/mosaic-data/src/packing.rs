//! FlowTrain's dynamic packing scheduler (FlowTrain §3.4, Algorithm 1): best-fit packing,
//! the cost model, cost buckets and zig-zag dispatch.

use std::cmp::Reverse;

/// The largest microbatch capacity [`pack`] accepts: its segment tree is indexed by residual
/// capacity, so it takes O(capacity) memory (about 4 bytes per token of capacity, 17 MB here).
/// FlowTrain packs to at most 32K tokens (§4.7).
pub const MAX_CAPACITY: u32 = 1 << 22;

/// Why [`pack`] refused its input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PackError {
    /// A microbatch that holds no tokens cannot hold any sequence.
    #[error("microbatch capacity must be positive")]
    ZeroCapacity,
    /// The residual-indexed segment tree would be too large.
    #[error("microbatch capacity {capacity} exceeds the supported maximum {MAX_CAPACITY}")]
    CapacityTooLarge {
        /// The capacity asked for, in tokens ([`crate::policy::auto_capacity`]: the top of its
        /// search, `u32::MAX` if beyond a `u32`).
        capacity: u32,
    },
    /// Sequence `index` fits in no microbatch (FlowTrain does not split sequences).
    #[error("sequence {index} has {length} tokens, more than the capacity {capacity}")]
    TooLong {
        /// The sequence's 0-based index in `lengths`.
        index: usize,
        /// The sequence's length, in tokens.
        length: u32,
        /// The microbatch capacity, in tokens.
        capacity: u32,
    },
}

/// Marks an empty leaf or the end of a bucket's list.
const NONE: u32 = u32::MAX;

/// FlowTrain's segment tree (Algorithm 1, line 1) over residual capacities `0..=capacity`,
/// with 64-way nodes: a node is a 64-bit word whose bit `i` says whether child `i` holds an
/// open microbatch, and leaf bit `r` whether some open microbatch has residual `r`. A best-fit
/// query — the smallest present residual `≥ length` — climbs from leaf `length` until a word
/// has a set bit at or after it and descends by lowest set bits: at most 2 × 4 word reads for
/// capacities up to 2²⁴, where the binary tree of the paper reads 2 × 22 nodes. It answers
/// exactly the paper's query (the result is the same microbatch), only faster. Open
/// microbatches with equal residual are kept in an intrusive stack per leaf (`head`/`next`).
struct ResidualTree {
    /// `levels[0]` holds one bit per residual; `levels[k + 1]` one bit per word of `levels[k]`.
    levels: Vec<Vec<u64>>,
    head: Vec<u32>,
    next: Vec<u32>,
}

impl ResidualTree {
    fn new(capacity: u32) -> Self {
        let mut levels = Vec::new();
        let mut bits = capacity as usize + 1;
        loop {
            let words = bits.div_ceil(64);
            levels.push(vec![0u64; words]);
            if words == 1 {
                break;
            }
            bits = words;
        }
        ResidualTree {
            levels,
            head: vec![NONE; capacity as usize + 1],
            next: Vec::new(),
        }
    }

    /// Marks residual `r` present, and each ancestor word non-empty.
    fn insert(&mut self, r: u32) {
        let mut i = r as usize;
        for level in &mut self.levels {
            let word = &mut level[i / 64];
            let was_empty = *word == 0;
            *word |= 1 << (i % 64);
            if !was_empty {
                return;
            }
            i /= 64;
        }
    }

    /// Marks residual `r` absent, and each ancestor word that becomes empty.
    fn remove(&mut self, r: u32) {
        let mut i = r as usize;
        for level in &mut self.levels {
            let word = &mut level[i / 64];
            *word &= !(1 << (i % 64));
            if *word != 0 {
                return;
            }
            i /= 64;
        }
    }

    /// The smallest present residual `≥ x`.
    fn successor(&self, x: u32) -> Option<u32> {
        let mut level = 0;
        let mut i = x as usize;
        loop {
            let word = *self.levels[level].get(i / 64)?;
            let rest = word & (u64::MAX << (i % 64));
            if rest != 0 {
                i = (i / 64) * 64 + rest.trailing_zeros() as usize;
                break;
            }
            level += 1;
            if level == self.levels.len() {
                return None;
            }
            i = i / 64 + 1;
        }
        while level > 0 {
            level -= 1;
            i = i * 64 + self.levels[level][i].trailing_zeros() as usize;
        }
        Some(i as u32)
    }

    fn push(&mut self, r: u32, batch: usize) {
        self.next.resize(self.next.len().max(batch + 1), NONE);
        self.next[batch] = self.head[r as usize];
        if self.head[r as usize] == NONE {
            self.insert(r);
        }
        self.head[r as usize] = batch as u32;
    }

    /// Best fit (lines 2–3): removes and returns an open microbatch with the smallest residual
    /// `≥ length`.
    fn take_best_fit(&mut self, length: u32) -> Option<(usize, u32)> {
        let r = self.successor(length)?;
        let batch = self.head[r as usize];
        self.head[r as usize] = self.next[batch as usize];
        if self.head[r as usize] == NONE {
            self.remove(r);
        }
        Some((batch as usize, r))
    }
}

/// Packs sequences of `lengths` tokens into microbatches of at most `capacity` tokens by
/// FlowTrain's segment-tree best fit (§3.4, Algorithm 1, lines 1–11), longest sequence
/// first, in O(n log n + n log capacity) time. Each sequence goes to the open microbatch with
/// the least residual capacity that still holds it, or opens a new one; a microbatch leaves
/// the tree once its residual falls below the shortest sequence. Returns, per microbatch in
/// order of opening, the indices of its sequences; ties keep input order, so the result is
/// deterministic.
pub fn pack(lengths: &[u32], capacity: u32) -> Result<Vec<Vec<usize>>, PackError> {
    if capacity == 0 {
        return Err(PackError::ZeroCapacity);
    }
    if capacity > MAX_CAPACITY {
        return Err(PackError::CapacityTooLarge { capacity });
    }
    if let Some((index, &length)) = lengths.iter().enumerate().find(|(_, &l)| l > capacity) {
        return Err(PackError::TooLong {
            index,
            length,
            capacity,
        });
    }
    let shortest = lengths.iter().copied().min().unwrap_or(0);
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_unstable_by_key(|&i| (Reverse(lengths[i]), i)); // ties in input order

    let mut tree = ResidualTree::new(capacity);
    // Each sequence's microbatch, then the lists built at their final sizes (one allocation
    // per microbatch rather than a growing vector each).
    let mut owner = Vec::with_capacity(order.len());
    let mut sizes: Vec<usize> = Vec::new();
    for &i in &order {
        let length = lengths[i];
        let (batch, residual) = tree.take_best_fit(length).unwrap_or_else(|| {
            sizes.push(0); // lines 7–9: open a new microbatch
            (sizes.len() - 1, capacity)
        });
        owner.push(batch); // lines 4–6
        sizes[batch] += 1;
        let residual = residual - length;
        if residual >= shortest {
            tree.push(residual, batch); // else it leaves the tree (lines 10–11)
        }
    }
    let mut batches: Vec<Vec<usize>> = sizes.into_iter().map(Vec::with_capacity).collect();
    for (i, batch) in order.into_iter().zip(owner) {
        batches[batch].push(i);
    }
    Ok(batches)
}

/// FlowTrain's execution-cost model of a packed microbatch (§3.4, Eq. 3): `α·Σ lᵢ² + β·Σ lᵢ`,
/// the quadratic attention term plus the linear MLP term over its sequences' lengths.
/// FlowTrain normalises lengths by the microbatch capacity; fold that into `alpha`/`beta`.
pub fn cost(lengths: impl IntoIterator<Item = u32>, alpha: f64, beta: f64) -> f64 {
    lengths
        .into_iter()
        .map(f64::from)
        .map(|l| alpha * l * l + beta * l)
        .sum()
}

/// FlowTrain's zig-zag dispatch (§3.4, Algorithm 1, lines 15–27): microbatches sorted by
/// `costs` descending are dealt to DP ranks `0, 1, …, r−1`, then `r−1, …, 0`, and so on, so
/// expensive and cheap microbatches pair up on each rank. Returns the microbatch indices of
/// each rank. For non-negative costs the rank loads differ by at most the largest cost.
///
/// # Panics
/// If `ranks` is 0.
pub fn zigzag(costs: &[f64], ranks: usize) -> Vec<Vec<usize>> {
    assert!(ranks > 0, "zigzag over 0 ranks");
    let mut order: Vec<usize> = (0..costs.len()).collect();
    order.sort_by(|&a, &b| costs[b].total_cmp(&costs[a]));
    let mut out = vec![Vec::new(); ranks];
    for (k, batch) in order.into_iter().enumerate() {
        let (round, pos) = (k / ranks, k % ranks);
        out[if round % 2 == 0 { pos } else { ranks - 1 - pos }].push(batch);
    }
    out
}

/// FlowTrain's cost buckets (§3.4, Algorithm 1, lines 12–14: "we cluster packed microbatches
/// with similar computational intensities into a discrete bucket"): `count` equal-width bins
/// of cost between the smallest and the largest finite cost, the most expensive bin first
/// (bucket `b` holds the costs in `(max − (b+1)·w, max − b·w]` for width `w`; the last one
/// also holds the minimum),
/// each holding its microbatch indices sorted by cost descending (lines 15–16; ties in index
/// order). Returns exactly `count` buckets, some possibly empty.
///
/// The paper does not say how it clusters. Equal-width bins are chosen because they bound
/// what the paper wants bounded, the latency spread inside a bucket: any two costs in one
/// bucket differ by at most `(max − min) / count`. Packed microbatches are filled close to
/// one capacity, so their costs span a narrow range (a ratio of a few between the cheapest
/// and the dearest), where log-scale bins would give nearly the same split with a relative
/// instead of an absolute bound. If every cost is equal everything lands in bucket 0;
/// `+∞` goes to bucket 0, NaN and `−∞` to the last bucket.
///
/// # Panics
/// If `count` is 0.
pub fn buckets(costs: &[f64], count: usize) -> Vec<Vec<usize>> {
    assert!(count > 0, "0 cost buckets");
    let finite = || costs.iter().copied().filter(|c| c.is_finite());
    let hi = finite().fold(f64::NEG_INFINITY, f64::max);
    let lo = finite().fold(f64::INFINITY, f64::min);
    let bin = |c: f64| -> usize {
        if c == f64::INFINITY {
            0
        } else if !c.is_finite() {
            count - 1
        } else if hi > lo {
            // Saturating cast: a NaN from an overflowing span lands in bucket 0.
            (((hi - c) / (hi - lo) * count as f64) as usize).min(count - 1)
        } else {
            0
        }
    };
    let mut order: Vec<usize> = (0..costs.len()).collect();
    order.sort_by(|&a, &b| costs[b].total_cmp(&costs[a]));
    let mut out = vec![Vec::new(); count];
    for k in order {
        out[bin(costs[k])].push(k);
    }
    out
}

/// FlowTrain's bucketed zig-zag dispatch (§3.4, Algorithm 1, lines 12–27): the microbatches
/// of each of `bucket_count` [`buckets`] (most expensive bucket first, each sorted by cost
/// descending) are dealt to the ranks `0, 1, …, r−1`, then `r−1, …, 0`, and so on, bucket
/// by bucket, so every rank runs its microbatches bucket by bucket, dearest first. Each
/// bucket starts a new traversal in the direction opposite to the last round of the bucket
/// before (the paper reverses the direction after each pass and does not say where a bucket
/// starts; starting opposite hands a partial round's extra microbatches to the other end of
/// the ranks). Returns the microbatch indices of each rank. With one bucket this is
/// [`zigzag`].
///
/// Per bucket the ranks' counts differ by at most one and (for non-negative costs) their
/// loads by at most the bucket's largest cost (the [`zigzag`] bound), so over all buckets
/// the counts differ by at most the number of buckets whose size is no multiple of `ranks`
/// and the loads by at most the sum of the buckets' largest costs.
///
/// # Panics
/// If `ranks` or `bucket_count` is 0.
pub fn zigzag_buckets(costs: &[f64], ranks: usize, bucket_count: usize) -> Vec<Vec<usize>> {
    assert!(ranks > 0, "zigzag over 0 ranks");
    let mut out = vec![Vec::new(); ranks];
    let mut forward = true;
    for bucket in buckets(costs, bucket_count) {
        let dir = |round: usize| forward == round.is_multiple_of(2);
        for (t, &k) in bucket.iter().enumerate() {
            let (round, pos) = (t / ranks, t % ranks);
            out[if dir(round) { pos } else { ranks - 1 - pos }].push(k);
        }
        if let Some(last) = bucket.len().checked_sub(1) {
            forward = !dir(last / ranks);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_split_the_cost_range_evenly() {
        let costs = [1.0, 9.0, 5.0, 2.0, 8.0, 4.9];
        // Width 2 from the top: (7, 9] → {9, 8}, (5, 7] → {}, (3, 5] → {5, 4.9}, [1, 3] → {2, 1}.
        assert_eq!(
            buckets(&costs, 4),
            vec![vec![1, 4], vec![], vec![2, 5], vec![3, 0]]
        );
        assert_eq!(buckets(&[3.0, 3.0], 3), vec![vec![0, 1], vec![], vec![]]);
        assert_eq!(
            buckets(&[f64::NAN, 1.0, f64::INFINITY], 2),
            vec![vec![2, 1], vec![0]]
        );
        assert_eq!(buckets(&[], 2), vec![Vec::<usize>::new(), vec![]]);
    }

    #[test]
    fn buckets_start_where_the_last_round_turned() {
        // Two ranks, two buckets {9, 8, 7} and {2, 1}: 9 → 0, 8 → 1, 7 → 1 (backward), so
        // the next bucket starts forward again: 2 → 0, 1 → 1.
        let costs = [9.0, 8.0, 7.0, 2.0, 1.0];
        assert_eq!(
            zigzag_buckets(&costs, 2, 2),
            vec![vec![0, 3], vec![1, 2, 4]]
        );
        // One round per bucket: the second bucket runs backward.
        assert_eq!(
            zigzag_buckets(&[9.0, 8.0, 2.0, 1.0], 2, 2),
            vec![vec![0, 3], vec![1, 2]]
        );
        assert_eq!(zigzag_buckets(&costs, 2, 1), zigzag(&costs, 2));
    }
}
