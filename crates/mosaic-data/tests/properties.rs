//! Property tests of the packing, dispatch, partitioning and size-generation bounds, and of
//! the JSONL sample reader against mangled input.

use mosaic_data::greedy_partition_sized;
use mosaic_data::packing::MAX_CAPACITY;
use mosaic_data::{buckets, cost, generate, greedy_partition, loads, lower_bound, pack, zigzag};
use mosaic_data::{parse_jsonl, token_counts, zigzag_buckets};
use mosaic_data::{Distribution, PackError, SamplesError, Tokenizer};
use proptest::prelude::*;

/// Every index of `0..n` appears exactly once across `groups`.
fn is_permutation(groups: &[Vec<usize>], n: usize) -> bool {
    let mut seen: Vec<usize> = groups.iter().flatten().copied().collect();
    seen.sort_unstable();
    seen == (0..n).collect::<Vec<_>>()
}

fn token_loads(lengths: &[u32], batches: &[Vec<usize>]) -> Vec<u32> {
    batches
        .iter()
        .map(|b| b.iter().map(|&i| lengths[i]).sum())
        .collect()
}

/// Best fit decreasing by linear scan, the obvious O(n²) reference. Open microbatches with
/// equal residuals are interchangeable, so any tie-break gives the same multiset of loads.
fn naive_best_fit(lengths: &[u32], capacity: u32) -> Vec<u32> {
    let mut sorted = lengths.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let mut load: Vec<u32> = Vec::new();
    for l in sorted {
        match (0..load.len())
            .filter(|&b| load[b] + l <= capacity)
            .max_by_key(|&b| load[b])
        {
            Some(b) => load[b] += l,
            None => load.push(l),
        }
    }
    load
}

/// The fewest microbatches of `capacity` that hold `lengths` (exhaustive; tiny inputs only).
fn optimal_bins(lengths: &[u32], capacity: u32) -> usize {
    fn fits(items: &[u32], bins: &mut [u32], capacity: u32) -> bool {
        let Some((&x, rest)) = items.split_first() else {
            return true;
        };
        for b in 0..bins.len() {
            if bins[b] + x <= capacity {
                bins[b] += x;
                if fits(rest, bins, capacity) {
                    return true;
                }
                bins[b] -= x;
            }
            if bins[b] == 0 {
                break; // the remaining empty bins are interchangeable with this one
            }
        }
        false
    }
    (1..=lengths.len())
        .find(|&k| fits(lengths, &mut vec![0; k], capacity))
        .unwrap_or(0)
}

/// The least makespan of `costs` over `groups` groups (exhaustive; tiny inputs only).
fn optimal_makespan(costs: &[f64], groups: usize) -> f64 {
    let combos = groups.pow(costs.len() as u32);
    (0..combos)
        .map(|mut code| {
            let mut load = vec![0.0; groups];
            for &c in costs {
                load[code % groups] += c;
                code /= groups;
            }
            load.into_iter().fold(0.0, f64::max)
        })
        .fold(f64::INFINITY, f64::min)
}

/// One valid JSONL sample line with any subset of the fields.
fn valid_line() -> impl Strategy<Value = String> {
    (
        prop::option::of(0u32..=1 << 24),
        prop::option::of(prop::collection::vec((1u32..=65_536, 1u32..=65_536), 0..4)),
        prop::option::of(0.0f64..=86_400.0),
    )
        .prop_map(|(text, images, audio)| {
            let mut fields = Vec::new();
            if let Some(t) = text {
                fields.push(format!("\"text_tokens\": {t}"));
            }
            if let Some(images) = images {
                let list: Vec<String> = images.iter().map(|(h, w)| format!("[{h}, {w}]")).collect();
                fields.push(format!("\"images\": [{}]", list.join(", ")));
            }
            if let Some(a) = audio {
                fields.push(format!("\"audio_seconds\": {a}"));
            }
            format!("{{{}}}", fields.join(", "))
        })
}

fn lengths_and_capacity() -> impl Strategy<Value = (Vec<u32>, u32)> {
    (1u32..=4096).prop_flat_map(|c| (prop::collection::vec(0..=c, 0..200), Just(c)))
}

proptest! {
    /// Every sample lands in exactly one microbatch, none over capacity, and the count obeys
    /// `⌈S/C⌉ ≤ k ≤ max(⌈2S/C⌉, 1)` for `S = Σ l`. The upper bound holds for any any-fit rule
    /// (best fit among them): no two microbatches end at most half full, since the later one's
    /// first sequence (≤ its final load ≤ C/2) would have fit into the earlier one (residual
    /// then ≥ C/2), which was open (a microbatch only leaves the tree when no sequence fits).
    /// So k − 1 microbatches carry more than C/2 each: k − 1 < 2S/C, i.e. k ≤ ⌈2S/C⌉ (or
    /// k = 1 when every length is 0). The result also matches a naive best fit decreasing.
    #[test]
    fn packing_is_a_valid_best_fit((lengths, capacity) in lengths_and_capacity()) {
        let batches = pack(&lengths, capacity).unwrap();
        prop_assert!(is_permutation(&batches, lengths.len()));
        let loads = token_loads(&lengths, &batches);
        prop_assert!(loads.iter().all(|&l| l <= capacity));
        prop_assert!(batches.iter().all(|b| !b.is_empty()));
        let total: u64 = lengths.iter().map(|&l| u64::from(l)).sum();
        let c = u64::from(capacity);
        let k = batches.len() as u64;
        prop_assert!(k >= total.div_ceil(c));
        prop_assert!(k <= (2 * total).div_ceil(c).max(u64::from(!lengths.is_empty())));
        let (mut ours, mut naive) = (loads, naive_best_fit(&lengths, capacity));
        ours.sort_unstable();
        naive.sort_unstable();
        prop_assert_eq!(ours, naive);
    }

    /// On tiny inputs, best fit decreasing uses at most 3/2 of the optimal microbatch count,
    /// its absolute worst-case ratio (Simchi-Levi, "New worst-case results for the bin-packing
    /// problem", NRL 1994), against an exhaustive optimum.
    #[test]
    fn packing_is_within_three_halves_of_optimal(
        lengths in prop::collection::vec(1u32..=100, 1..=8),
    ) {
        let opt = optimal_bins(&lengths, 100);
        let k = pack(&lengths, 100).unwrap().len();
        prop_assert!(k >= opt && 2 * k <= 3 * opt, "k = {k}, opt = {opt}");
    }

    /// Zig-zag deals each microbatch once, and (for non-negative costs) rank loads differ by
    /// at most the largest cost. Why: for ranks p < q, round j contributes a_jp − a_jq, which
    /// is ≥ 0 on forward rounds and ≤ 0 on backward ones, with magnitude at most the spread of
    /// the costs dealt in round j (or their maximum, on a last partial round, an empty slot
    /// counting 0). Costs are dealt in descending order, so those spreads are disjoint
    /// sub-intervals of [0, max cost]: the positive terms, and likewise the negative ones,
    /// sum to at most the largest cost.
    #[test]
    fn zigzag_balances_within_the_largest_cost(
        costs in prop::collection::vec(0u32..10_000, 0..100),
        ranks in 1usize..10,
    ) {
        let costs: Vec<f64> = costs.into_iter().map(f64::from).collect();
        let assignment = zigzag(&costs, ranks);
        prop_assert_eq!(assignment.len(), ranks);
        prop_assert!(is_permutation(&assignment, costs.len()));
        let load = loads(&costs, &assignment);
        let spread = load.iter().copied().fold(f64::MIN, f64::max)
            - load.iter().copied().fold(f64::MAX, f64::min);
        prop_assert!(spread <= costs.iter().copied().fold(0.0, f64::max));
    }

    /// Cost buckets hold every microbatch once, the dearest bucket first, each sorted by cost
    /// descending and spanning at most `(max − min)/count` of cost.
    #[test]
    fn buckets_cover_the_costs_in_even_bins(
        costs in prop::collection::vec(0u32..10_000, 0..100),
        count in 1usize..8,
    ) {
        let costs: Vec<f64> = costs.into_iter().map(f64::from).collect();
        let bins = buckets(&costs, count);
        prop_assert_eq!(bins.len(), count);
        prop_assert!(is_permutation(&bins, costs.len()));
        let hi = costs.iter().copied().fold(f64::MIN, f64::max);
        let lo = costs.iter().copied().fold(f64::MAX, f64::min);
        let width = (hi - lo) / count as f64;
        let mut floor = f64::INFINITY;
        for bin in &bins {
            let c: Vec<f64> = bin.iter().map(|&i| costs[i]).collect();
            prop_assert!(c.windows(2).all(|w| w[0] >= w[1]));
            if let (Some(&top), Some(&bottom)) = (c.first(), c.last()) {
                prop_assert!(top - bottom <= width * (1.0 + 1e-12));
                prop_assert!(top <= floor);
                floor = bottom;
            }
        }
    }

    /// Bucketed zig-zag deals every microbatch once, ranks' counts differ by at most the
    /// number of buckets whose size is no multiple of the ranks (each bucket's zig-zag gives
    /// every rank ⌊n_b/r⌋ or ⌈n_b/r⌉), loads by at most the sum of the buckets' largest
    /// costs (the zig-zag bound per bucket; a bucket that starts backward is a mirrored
    /// zig-zag), each rank runs its microbatches bucket by bucket, dearest first, and one
    /// bucket is plain zig-zag.
    #[test]
    fn zigzag_buckets_balance_bucket_by_bucket(
        costs in prop::collection::vec(0u32..10_000, 0..120),
        ranks in 1usize..8,
        count in 1usize..6,
    ) {
        let costs: Vec<f64> = costs.into_iter().map(f64::from).collect();
        let dealt = zigzag_buckets(&costs, ranks, count);
        prop_assert_eq!(dealt.len(), ranks);
        prop_assert!(is_permutation(&dealt, costs.len()));
        let bins = buckets(&costs, count);
        let partial = bins.iter().filter(|b| !b.len().is_multiple_of(ranks)).count();
        let counts: Vec<usize> = dealt.iter().map(Vec::len).collect();
        let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        prop_assert!(hi - lo <= partial, "counts {counts:?}, {partial} partial buckets");
        let bound: f64 = bins.iter().map(|b| b.first().map_or(0.0, |&i| costs[i])).sum();
        let load = loads(&costs, &dealt);
        let spread = load.iter().copied().fold(f64::MIN, f64::max)
            - load.iter().copied().fold(f64::MAX, f64::min);
        prop_assert!(spread <= bound);
        let bin_of: Vec<usize> = {
            let mut b = vec![0; costs.len()];
            for (j, bin) in bins.iter().enumerate() {
                for &i in bin {
                    b[i] = j;
                }
            }
            b
        };
        for rank in &dealt {
            prop_assert!(rank.windows(2).all(|w| bin_of[w[0]] <= bin_of[w[1]]
                && (bin_of[w[0]] < bin_of[w[1]] || costs[w[0]] >= costs[w[1]])));
        }
        prop_assert_eq!(zigzag_buckets(&costs, ranks, 1), zigzag(&costs, ranks));
    }
    /// Sized greedy partitioning places every sample once and never overfills a group; with
    /// room for everything in every group it is plain greedy partitioning.
    #[test]
    fn sized_partition_respects_the_room(
        costs in prop::collection::vec(0.0f64..100.0, 0..40),
        room in prop::collection::vec(0usize..12, 1..6),
    ) {
        match greedy_partition_sized(&costs, &room) {
            None => prop_assert!(room.iter().sum::<usize>() < costs.len()),
            Some(groups) => {
                prop_assert!(is_permutation(&groups, costs.len()));
                prop_assert!(groups.iter().zip(&room).all(|(g, &r)| g.len() <= r));
            }
        }
        let wide = vec![costs.len(); room.len()];
        prop_assert_eq!(
            greedy_partition_sized(&costs, &wide).unwrap(),
            greedy_partition(&costs, room.len())
        );
    }


    /// Greedy partitioning (LPT) assigns each sample once, and its makespan lies between the
    /// lower bound (which no partition beats) and Graham's `(4/3 − 1/(3m))·OPT`, against an
    /// exhaustive optimum. Integer-valued costs keep the sums exact.
    #[test]
    fn greedy_partition_is_within_grahams_bound(
        costs in prop::collection::vec(0u32..1000, 0..=8),
        groups in 1usize..=3,
    ) {
        let costs: Vec<f64> = costs.into_iter().map(f64::from).collect();
        let assignment = greedy_partition(&costs, groups);
        prop_assert_eq!(assignment.len(), groups);
        prop_assert!(is_permutation(&assignment, costs.len()));
        let makespan = loads(&costs, &assignment).into_iter().fold(0.0, f64::max);
        let opt = optimal_makespan(&costs, groups);
        let m = groups as f64;
        prop_assert!(lower_bound(&costs, groups) <= opt);
        prop_assert!(opt <= makespan);
        prop_assert!(makespan <= (4.0 / 3.0 - 1.0 / (3.0 * m)) * opt + 1e-9);
    }

    /// The lower bound holds for any size of input, where no optimum is computable.
    #[test]
    fn greedy_partition_respects_the_lower_bound(
        costs in prop::collection::vec(0.0f64..1e6, 0..300),
        groups in 1usize..16,
    ) {
        let assignment = greedy_partition(&costs, groups);
        prop_assert!(is_permutation(&assignment, costs.len()));
        let makespan = loads(&costs, &assignment).into_iter().fold(0.0, f64::max);
        prop_assert!(makespan >= lower_bound(&costs, groups) * (1.0 - 1e-12));
    }

    /// Sizes are deterministic per seed, as many as asked, and within `[1, max]`.
    #[test]
    fn sizes_are_seeded_and_bounded(
        seed: u64,
        n in 0usize..500,
        median in 0.5f64..5000.0,
        sigma in 0.0f64..3.0,
        max in 1u32..20_000,
    ) {
        let custom = Distribution::LogNormal { median, sigma, max };
        for (dist, max) in [(custom, max), (Distribution::TEXT, 8192), (Distribution::INTERLEAVED, 8192)] {
            let sizes = generate(dist, n, seed);
            prop_assert_eq!(sizes.len(), n);
            prop_assert!(sizes.iter().all(|&s| (1..=max).contains(&s)));
            prop_assert_eq!(&sizes, &generate(dist, n, seed));
        }
    }
}

proptest! {
    // Thousands of cases: the reader is the crate's one door for untrusted input.
    #![proptest_config(ProptestConfig::with_cases(4000))]

    /// Thousands of mangled JSONL texts (byte flips, cuts, duplicated spans, huge or odd
    /// numbers spliced in) are each parsed to samples or refused with an error, never a
    /// panic; what parses stays within the documented limits.
    #[test]
    fn mangled_jsonl_never_panics(
        lines in prop::collection::vec(valid_line(), 1..6),
        edits in prop::collection::vec((0usize..7, any::<usize>(), any::<u8>(), 0usize..8), 0..6),
    ) {
        let unmangled = edits.is_empty();
        let mut bytes = lines.join("\n").into_bytes();
        const SPLICES: [&str; 8] = [
            "1e400", "-0", "18446744073709551616", "4294967297", "NaN", "[[", "\"\\u0000\"",
            "99999999999999999999999999999999999999.5",
        ];
        for (kind, at, byte, which) in edits {
            let at = if bytes.is_empty() { 0 } else { at % (bytes.len() + 1) };
            match kind {
                0 if at < bytes.len() => bytes[at] = byte,
                1 => bytes.truncate(at),
                2 => {
                    let span: Vec<u8> = bytes[at..].iter().take(usize::from(byte)).copied().collect();
                    bytes.splice(at..at, span);
                }
                3 => { bytes.splice(at..at, SPLICES[which].bytes()); }
                4 if at < bytes.len() => { bytes.remove(at); }
                5 => {
                    const PUNCT: &[u8] = b"{}[],:\"\n 0";
                    bytes.insert(at, PUNCT[usize::from(byte) % PUNCT.len()]);
                }
                _ => { bytes.splice(at..at, b"\n".iter().copied()); }
            }
        }
        let text = String::from_utf8_lossy(&bytes);
        let result = parse_jsonl(&text, "fuzz.jsonl");
        if unmangled {
            prop_assert!(result.is_ok(), "{text:?}: {result:?}");
        }
        match result {
            Ok(samples) => {
                prop_assert!(!samples.is_empty());
                for s in &samples {
                    prop_assert!(s.text_tokens <= 1 << 24 && s.images.len() <= 1024);
                    prop_assert!(s.images.iter().all(|&(h, w)| (1..=65_536).contains(&h) && (1..=65_536).contains(&w)));
                    prop_assert!((0.0..=86_400.0).contains(&s.audio_seconds));
                    prop_assert!(s.line >= 1);
                }
                let tok = Tokenizer::default();
                match token_counts(&samples, &tok) {
                    Ok(sizes) => prop_assert!(sizes.iter().all(|&t| (1..=MAX_CAPACITY).contains(&t))),
                    Err(e) => {
                        // Too many tokens or none: either way the file and line are named.
                        let named = matches!(
                            &e,
                            SamplesError::TooManyTokens { file, line, .. }
                                | SamplesError::NoTokens { file, line, .. }
                                if file == "fuzz.jsonl" && *line >= 1
                        );
                        prop_assert!(named, "{e:?}");
                        prop_assert!(e.to_string().starts_with("fuzz.jsonl, line "), "{e}");
                    }
                }
            }
            Err(e) => prop_assert!(e.to_string().contains("fuzz.jsonl")),
        }
    }
}

#[test]
fn bad_inputs_are_errors() {
    assert_eq!(pack(&[1], 0), Err(PackError::ZeroCapacity));
    assert_eq!(
        pack(&[], MAX_CAPACITY + 1),
        Err(PackError::CapacityTooLarge {
            capacity: MAX_CAPACITY + 1
        })
    );
    let err = pack(&[3, 9, 12], 10).unwrap_err();
    assert_eq!(
        err,
        PackError::TooLong {
            index: 2,
            length: 12,
            capacity: 10
        }
    );
    assert_eq!(
        err.to_string(),
        "sequence 2 has 12 tokens, more than the capacity 10"
    );
    assert_eq!(pack(&[], 10), Ok(vec![]));
}

#[test]
fn examples() {
    // Longest first: 6 opens #0, 5 opens #1, 4 best-fits #0 (residual 4 beats 5), 1 fills #1.
    assert_eq!(
        pack(&[4, 6, 5, 1], 10).unwrap(),
        vec![vec![1, 0], vec![2, 3]]
    );
    assert_eq!(cost([1, 2, 3], 0.5, 2.0), 0.5 * 14.0 + 2.0 * 6.0);
    // Zig-zag: 0, 1, 2, then 2, 1, 0.
    let dealt = zigzag(&[6.0, 5.0, 4.0, 3.0, 2.0, 1.0], 3);
    assert_eq!(dealt, vec![vec![0, 5], vec![1, 4], vec![2, 3]]);
    // DistTrain Fig. 11's idea: the two largest samples end up in different groups.
    assert_eq!(
        greedy_partition(&[4.0, 3.0, 2.0, 1.0], 2),
        vec![vec![0, 3], vec![1, 2]]
    );
    assert_eq!(lower_bound(&[4.0, 3.0, 2.0, 1.0], 2), 5.0);
}

#[test]
fn generated_sizes_are_skewed() {
    let sizes = generate(Distribution::TEXT, 10_000, 7);
    let mut sorted = sizes.clone();
    sorted.sort_unstable();
    let mean = sizes.iter().map(|&s| f64::from(s)).sum::<f64>() / sizes.len() as f64;
    let median = f64::from(sorted[sorted.len() / 2]);
    assert!((median - 256.0).abs() < 20.0, "median {median}");
    assert!(
        mean > 1.4 * median,
        "a long right tail: mean {mean}, median {median}"
    );
}
