//! Placement that knows nodes: which nodes a module's replicas lie on, what spanning them
//! costs, and a relabelling of a stage's GPUs that keeps each module on as few nodes as it can.
//!
//! # Nodes and what spanning them costs
//! A profile with `nodes` (`mosaic_profile::Nodes`) says that the pool's GPUs are numbered node
//! by node — node `k` holds GPUs `k·gpus_per_node ..` — and that its samples at `dp` = d
//! assume the *packed* placement: the d replicas on ⌈d / gpus_per_node⌉ nodes, as evenly as
//! those allow (see [`Spread::packed`]; so does the zoo's device model at its power-of-two
//! dps).
//! A ring all-reduce whose GPUs lie on one node runs at the NVLink bus bandwidth `intra`; one
//! that spans nodes runs at most at `inter × k`, `k` its fewest GPUs on one node (NCCL runs
//! one ring per NIC, and a node drives only the NICs of its GPUs in the ring), and never
//! faster than `intra` ([`ring_gbps`]). A placement is charged what its slower ring adds to
//! the packed one's, in full ([`cross_node_ms`]):
//!
//! ```text
//! extra = 2(d−1)/d × grad_gib × 2³⁰ B × (1 / ring(placement) − 1 / ring(packed)), ≥ 0
//! ```
//!
//! With d ≤ gpus_per_node the packed ring is inside a node, so a module split over two nodes
//! with one replica alone on a node pays `2(d−1)/d × bytes × (1/inter − 1/intra)`; a split
//! 4 + 4 pays with `4 × inter` in place of `inter`. With d > gpus_per_node the packed ring
//! already crosses nodes, and only a placement leaving fewer replicas on one of its nodes than
//! the packed one pays. The charge leaves out the per-hop latency (2(d−1) × ~10 µs more across
//! nodes) and the overlap with the backward pass (the zoo's device model hides up to half of
//! the ring behind it; the simulator hides none): it is the whole extra transfer.
//!
//! # The embedding
//! StageEval places replicas up to GPU relabelling: all GPUs are identical, so any permutation
//! of their numbers is the same allocation, and [`embed`] picks the one that suits the nodes.
//! GPUs hosting the same set of modules (a *class*) are interchangeable; the embedding assigns
//! each class's GPUs to nodes:
//! 1. **Priority**: modules in decreasing order of what spanning can cost them (the charge
//!    with one replica alone on a node), then of dp; or, second order, the charged modules by
//!    the time they would then take (their time plus that charge), so that a module with
//!    slack in its stage yields to the one that sets the stage time.
//! 2. **Whole nodes**: a class larger than a node fills whole nodes first (every module of it
//!    has dp > gpus_per_node, so full nodes are its packed placement); the rest of each class
//!    is an *item* to pack.
//! 3. **Grouping**: for each module in priority order, the items holding its GPUs are grouped
//!    by best-fit decreasing into groups of at most one node, and each group becomes one item,
//!    so that the module's GPUs will share as few nodes as the items already formed allow.
//! 4. **Packing**: items go to nodes whole, best fit, in priority order (or largest first);
//!    an item no node has room for is split over the nodes with the most room left. Idle
//!    GPUs fill what is left.
//! 5. **Polish**: a local search swaps two GPUs of different nodes while that lowers the stage
//!    time (or the total charge at the same time): for each charged module, slowest first, it
//!    moves one replica between its least-populated node and another of its nodes — gathering
//!    it, or evening it out (4 + 4 all-reduces faster than 7 + 1).
//!
//! Twelve variants (either priority; grouping for all modules, for the charged ones only, or
//! for none; packing by priority or by size) are scored against the input's own numbering and
//! the best is polished and kept: the least stage time, then the least total charge, then the
//! fewest extra nodes per module in priority order; the input's numbering wins ties, then the
//! earlier variant. A variant takes O(M·G log G) for G GPUs and M modules at most, and the
//! polish stops after O(M·G) steps of work: for 1,024 GPUs and 32 modules placed at random
//! the whole takes about 5 ms in the `ci` profile (50 ms for 65,536 GPUs and 64 modules). On
//! random stages of up to 8 GPUs it finds the best of all relabellings (checked by brute
//! force) in about 98 % of cases; it can miss where the best is two swaps away through a
//! worse layout.
//!
//! # Guarantees
//! - The result is the input relabelled by one permutation of `0..gpus`: every module keeps its
//!   candidate and dp distinct GPUs (listed ascending), and the modules each GPU hosts — so its
//!   quota and memory — move together.
//! - Each module's time is its input time plus [`cross_node_ms`] of its new GPUs, never less;
//!   the stage time is the largest.
//! - Without `nodes` in the profile, or on a pool within one node, the input comes back as it is.
//! - Never worse than the input's own numbering: the stage time and then the total charge are
//!   at most what the input's GPUs would be charged, and the input comes back relabelled only
//!   when that strictly improves the score.
//! - When `gpus_per_node` and every dp are powers of two, no GPU hosts two modules and the
//!   pool is whole nodes, every module lies on its packed nodes (⌈dp / gpus_per_node⌉) and
//!   nothing is charged: largest-first packing of power-of-two items never splits one.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeSet, HashMap};

use mosaic_profile::{Nodes, PerfModel};

use crate::stage_eval::{Placement, StageAlloc};

/// Bytes in a GiB (gradient sizes); bandwidths are in GB/s, 10⁹ bytes.
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// The nodes `gpus` lie on (GPU `g` on node `g / gpus_per_node`), ascending and distinct: a
/// plan's `nodes` of a module.
pub fn nodes_of(gpus: &[u32], gpus_per_node: u32) -> Vec<u32> {
    let mut nodes: Vec<u32> = gpus.iter().map(|&g| g / gpus_per_node.max(1)).collect();
    nodes.sort_unstable();
    nodes.dedup();
    nodes
}

/// How a module's replicas lie on the nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spread {
    /// Nodes holding at least one replica.
    pub nodes: u32,
    /// The fewest replicas on one of those nodes (0 without replicas).
    pub fewest: u32,
}

impl Spread {
    /// The spread of replicas on `gpus`.
    pub fn of(gpus: &[u32], gpus_per_node: u32) -> Spread {
        let mut on: Vec<u32> = gpus.iter().map(|&g| g / gpus_per_node.max(1)).collect();
        on.sort_unstable();
        let mut spread = Spread {
            nodes: 0,
            fewest: 0,
        };
        let mut k = 0;
        while k < on.len() {
            let run = on[k..].iter().take_while(|&&n| n == on[k]).count() as u32;
            spread.fewest = if spread.nodes == 0 {
                run
            } else {
                spread.fewest.min(run)
            };
            spread.nodes += 1;
            k += run as usize;
        }
        spread
    }

    /// The packed spread a profile's samples at `dp` assume: ⌈dp / gpus_per_node⌉ nodes, as
    /// evenly as they allow (whole nodes when `dp` is a multiple of `gpus_per_node`).
    pub fn packed(dp: u32, gpus_per_node: u32) -> Spread {
        if dp == 0 {
            return Spread {
                nodes: 0,
                fewest: 0,
            };
        }
        let nodes = dp.div_ceil(gpus_per_node.max(1));
        Spread {
            nodes,
            fewest: dp / nodes,
        }
    }
}

/// The bus bandwidth, GB/s, of a ring all-reduce whose replicas lie as `spread` says: `intra`
/// inside one node; across nodes `inter` × its fewest replicas on one node, at most `intra`.
pub fn ring_gbps(nodes: &Nodes, spread: Spread) -> f64 {
    if spread.nodes <= 1 {
        nodes.intra_gbps
    } else {
        nodes
            .intra_gbps
            .min(nodes.inter_gbps * spread.fewest as f64)
    }
}

/// The time, in ms, that a module all-reducing `grad_gib` GiB per replica adds when its
/// replicas lie on `gpus` rather than on the packed placement its profile assumes (the
/// module documentation's formula): 0 for one replica, no gradient, or a placement whose ring
/// is no slower than the packed one's.
pub fn cross_node_ms(nodes: &Nodes, grad_gib: f64, gpus: &[u32]) -> f64 {
    spread_ms(
        nodes,
        grad_gib,
        gpus.len() as u32,
        Spread::of(gpus, nodes.gpus_per_node),
    )
}

/// [`cross_node_ms`] of `dp` replicas spread as `spread`.
fn spread_ms(nodes: &Nodes, grad_gib: f64, dp: u32, spread: Spread) -> f64 {
    if dp < 2 || grad_gib.is_nan() || grad_gib <= 0.0 {
        return 0.0;
    }
    let packed = Spread::packed(dp, nodes.gpus_per_node);
    let d = dp as f64;
    let bytes = 2.0 * (d - 1.0) / d * grad_gib * GIB;
    let slower = 1.0 / ring_gbps(nodes, spread) - 1.0 / ring_gbps(nodes, packed);
    (bytes * slower / 1e9 * 1e3).max(0.0)
}

/// The stage `alloc` on a pool of `gpus` GPUs, relabelled so that each module's replicas lie
/// on as few nodes as possible and each module's time charged for the nodes it still spans
/// beyond its packed placement (the module documentation's algorithm and guarantees). Without
/// node information in `model` it returns `alloc` unchanged.
///
/// `alloc`'s times are StageEval's, without any charge: embedding an embedded stage keeps its
/// numbering but would charge it twice.
pub fn embed(alloc: &StageAlloc, model: &PerfModel, gpus: u32) -> StageAlloc {
    let Some(nodes) = model.nodes else {
        return alloc.clone();
    };
    let pool = alloc
        .placements
        .iter()
        .flat_map(|p| p.gpus.iter().map(|&g| g.saturating_add(1)))
        .fold(gpus, u32::max);
    let gpn = nodes.gpus_per_node.max(1);
    if pool <= gpn {
        return alloc.clone();
    }
    let e = Embedding::new(alloc, model, nodes, pool);
    let mut best = e.score(None);
    if alloc.placements.len() <= 64 {
        let charged = e.worst.iter().filter(|&&w| w > 0.0).count();
        let mut limits = vec![alloc.placements.len(), charged, 0];
        limits.dedup();
        let mut best_perm: Vec<u32> = (0..pool).collect();
        for priority in [&e.by_cost, &e.by_time] {
            for &limit in &limits {
                for by_size in [false, true] {
                    let perm = e.pack(priority, limit, by_size);
                    let s = e.score(Some(&perm));
                    if s.better_than(&best) {
                        best = s;
                        best_perm = perm;
                    }
                }
            }
        }
        e.polish(&mut best_perm);
        let s = e.score(Some(&best_perm));
        if s.better_than(&best) {
            best = s;
        }
    }
    StageAlloc {
        time_ms: best.stage_ms,
        placements: alloc
            .placements
            .iter()
            .zip(best.gpus)
            .zip(&best.extra)
            .map(|((p, gpus), &extra)| Placement {
                gpus,
                time_ms: p.time_ms + extra,
                ..p.clone()
            })
            .collect(),
        ..alloc.clone()
    }
}

/// A stage's GPUs grouped by the placements they host, and the placements' priorities.
struct Embedding<'a> {
    alloc: &'a StageAlloc,
    nodes: Nodes,
    gpn: u32,
    pool: u32,
    /// Per placement, the gradient it all-reduces, GiB.
    grad: Vec<f64>,
    /// Per placement, its charge with one replica alone on a node, ms.
    worst: Vec<f64>,
    /// By what spanning can cost: the charged placements by `worst`, then by dp.
    by_cost: Priority,
    /// By the time spanning can lead to: the charged placements by time + `worst`, then the
    /// others by dp.
    by_time: Priority,
    /// GPUs hosting the same placements (a bitmask over placement indices), by bitmask.
    classes: Vec<(u64, Vec<u32>)>,
    /// Per GPU, the placements it hosts (a bitmask).
    mask: Vec<u64>,
}

/// The pieces of classes that go to a node together: (class, GPUs of it).
#[derive(Debug, Clone, Default)]
struct Item {
    pieces: Vec<(usize, u32)>,
    size: u32,
}

impl<'a> Embedding<'a> {
    fn new(alloc: &'a StageAlloc, model: &PerfModel, nodes: Nodes, pool: u32) -> Self {
        let grad: Vec<f64> = alloc
            .placements
            .iter()
            .map(|p| model.modules.get(p.module).map_or(0.0, |m| m.grad_gib))
            .collect();
        let worst: Vec<f64> = alloc
            .placements
            .iter()
            .zip(&grad)
            .map(|(p, &g)| {
                let alone = Spread {
                    nodes: 2,
                    fewest: 1,
                };
                spread_ms(&nodes, g, p.gpus.len() as u32, alone)
            })
            .collect();
        let ps = &alloc.placements;
        let by_dp = |a: usize, b: usize| ps[b].gpus.len().cmp(&ps[a].gpus.len()).then(a.cmp(&b));
        let by_cost = Priority::new(ps.len(), |a, b| {
            worst[b].total_cmp(&worst[a]).then_with(|| by_dp(a, b))
        });
        let at_worst = |a: usize| match worst[a] > 0.0 {
            true => ps[a].time_ms + worst[a],
            false => f64::NEG_INFINITY,
        };
        let by_time = Priority::new(ps.len(), |a, b| {
            at_worst(b)
                .total_cmp(&at_worst(a))
                .then(worst[b].total_cmp(&worst[a]))
                .then_with(|| by_dp(a, b))
        });
        let mut mask = vec![0u64; pool as usize];
        if alloc.placements.len() <= 64 {
            for (i, p) in alloc.placements.iter().enumerate() {
                for &g in &p.gpus {
                    mask[g as usize] |= 1 << i;
                }
            }
        }
        let mut index: HashMap<u64, usize> = HashMap::new();
        let mut classes: Vec<(u64, Vec<u32>)> = Vec::new();
        for (g, &m) in mask.iter().enumerate() {
            let c = *index.entry(m).or_insert_with(|| {
                classes.push((m, Vec::new()));
                classes.len() - 1
            });
            classes[c].1.push(g as u32);
        }
        // By hosted set, not by GPU number: every variant then depends only on the stage's
        // classes and sizes, so that embedding an embedded stage finds nothing better.
        classes.sort_unstable_by_key(|&(m, _)| m);
        Embedding {
            alloc,
            gpn: nodes.gpus_per_node.max(1),
            nodes,
            pool,
            grad,
            worst,
            by_cost,
            by_time,
            classes,
            mask,
        }
    }

    /// One variant of the embedding: classes to items, items grouped for the first `limit`
    /// placements in `priority`'s order, packed into nodes (by priority, or largest first when
    /// `by_size`). Returns the permutation: the new number of each GPU.
    fn pack(&self, priority: &Priority, limit: usize, by_size: bool) -> Vec<u32> {
        let gpn = self.gpn;
        let bins = self.pool.div_ceil(gpn) as usize;
        let full_bins = (self.pool / gpn) as usize;
        let mut room: Vec<u32> = (0..bins)
            .map(|b| if b < full_bins { gpn } else { self.pool % gpn })
            .collect();
        let mut content: Vec<Vec<(usize, u32)>> = vec![Vec::new(); bins];
        // Whole nodes of the classes larger than a node; their remainders become items.
        let mut next_full = 0;
        let mut items: Vec<Item> = Vec::new();
        let mut owner: Vec<Option<usize>> = vec![None; self.classes.len()];
        for (c, (_, gpus)) in self.classes.iter().enumerate() {
            let size = gpus.len() as u32;
            for _ in 0..size / gpn {
                content[next_full].push((c, gpn));
                room[next_full] = 0;
                next_full += 1;
            }
            let rest = size % gpn;
            if rest > 0 {
                owner[c] = Some(items.len());
                items.push(Item {
                    pieces: vec![(c, rest)],
                    size: rest,
                });
            }
        }
        // Grouping, module by module in priority order.
        let mut classes_of: Vec<Vec<usize>> = vec![Vec::new(); priority.rank.len()];
        for (c, (mask, _)) in self.classes.iter().enumerate() {
            let mut bits = *mask;
            while bits != 0 {
                classes_of[bits.trailing_zeros() as usize].push(c);
                bits &= bits - 1;
            }
        }
        for &p in priority.rank.iter().take(limit) {
            let mut held: Vec<usize> = classes_of[p].iter().filter_map(|&c| owner[c]).collect();
            held.sort_unstable();
            held.dedup();
            if held.len() < 2 {
                continue;
            }
            held.sort_by_key(|&i| (Reverse(items[i].size), i));
            // Best-fit decreasing into groups of at most a node: (room left, group) -> items.
            let mut open: BTreeSet<(u32, usize)> = BTreeSet::new();
            let mut groups: Vec<Vec<usize>> = Vec::new();
            for i in held {
                let size = items[i].size;
                match open.range((size, 0)..).next().copied() {
                    Some((left, g)) => {
                        open.remove(&(left, g));
                        open.insert((left - size, g));
                        groups[g].push(i);
                    }
                    None => {
                        open.insert((gpn - size, groups.len()));
                        groups.push(vec![i]);
                    }
                }
            }
            for group in groups {
                let (&head, rest) = group.split_first().expect("groups are not empty");
                for &i in rest {
                    let moved = std::mem::take(&mut items[i]);
                    for &(c, _) in &moved.pieces {
                        owner[c] = Some(head);
                    }
                    items[head].size += moved.size;
                    items[head].pieces.extend(moved.pieces);
                }
            }
        }
        // Packing: busy items first, in the variant's order; idle GPUs fill what is left.
        let mut order: Vec<(bool, u64, u64, usize)> = items
            .iter()
            .enumerate()
            .filter(|(_, item)| item.size > 0)
            .map(|(i, item)| {
                let mask = (item.pieces.iter()).fold(0u64, |m, &(c, _)| m | self.classes[c].0);
                let first = priority.best_position(mask) as u64;
                let larger = u64::from(u32::MAX - item.size);
                match by_size {
                    true => (mask == 0, larger, first, i),
                    false => (mask == 0, first, larger, i),
                }
            })
            .collect();
        order.sort_unstable();
        let mut free: BTreeSet<(u32, usize)> = (0..bins)
            .filter(|&b| room[b] > 0)
            .map(|b| (room[b], b))
            .collect();
        let mut deferred: Vec<usize> = Vec::new();
        for &(_, _, _, i) in &order {
            let size = items[i].size;
            match free.range((size, 0)..).next().copied() {
                Some((left, b)) => {
                    free.remove(&(left, b));
                    if left > size {
                        free.insert((left - size, b));
                    }
                    content[b].extend(items[i].pieces.iter().copied());
                }
                None => deferred.push(i),
            }
        }
        // Items no node had room for, split over the nodes with the most room left.
        for i in deferred {
            let mut pieces = items[i].pieces.iter().copied();
            let mut piece = pieces.next();
            while let Some((c, mut n)) = piece {
                let (left, b) = free.pop_last().expect("the nodes hold every GPU");
                let take = n.min(left);
                content[b].push((c, take));
                if left > take {
                    free.insert((left - take, b));
                }
                n -= take;
                piece = if n > 0 { Some((c, n)) } else { pieces.next() };
            }
        }
        // Node b's GPUs are b·gpn.., filled in content order.
        let mut perm = vec![0u32; self.pool as usize];
        let mut next = vec![0usize; self.classes.len()];
        for (b, pieces) in content.iter().enumerate() {
            let mut slot = b as u32 * gpn;
            for &(c, n) in pieces {
                for _ in 0..n {
                    perm[self.classes[c].1[next[c]] as usize] = slot;
                    next[c] += 1;
                    slot += 1;
                }
            }
        }
        perm
    }

    /// Local search on `perm`: swaps two GPUs of different nodes while that lowers the stage
    /// time, or the total charge at the same stage time. For each charged module, slowest
    /// first, the swaps tried move one of its replicas between its least-populated node and
    /// another of its nodes, in either direction (gathering it, or evening it out), against a
    /// GPU of each hosted set there; the best such swap is made if it improves. The search
    /// stops at a local optimum or after O(M·G) steps of work for M modules on G GPUs.
    fn polish(&self, perm: &mut [u32]) {
        let gpn = self.gpn as usize;
        let n_nodes = self.pool.div_ceil(self.gpn) as usize;
        let ps = &self.alloc.placements;
        let m = ps.len();
        let mut work = 16 * (m + 1) * self.pool as usize + (1 << 16);
        // Slot (new number) -> GPU (old number), and per module its replicas on each node.
        let mut at = vec![0u32; perm.len()];
        for (g, &slot) in perm.iter().enumerate() {
            at[slot as usize] = g as u32;
        }
        let mut count = vec![0u32; m * n_nodes];
        for (g, &slot) in perm.iter().enumerate() {
            for i in bits(self.mask[g]) {
                count[i * n_nodes + slot as usize / gpn] += 1;
            }
        }
        let row = |count: &[u32], i: usize, n: usize| count[i * n_nodes + n];
        // Module i's charge with the replica counts `count` (O(N)).
        let extra_of = |count: &[u32], i: usize| {
            let spread = (0..n_nodes)
                .map(|n| row(count, i, n))
                .filter(|&c| c > 0)
                .fold(
                    Spread {
                        nodes: 0,
                        fewest: u32::MAX,
                    },
                    |s, c| Spread {
                        nodes: s.nodes + 1,
                        fewest: s.fewest.min(c),
                    },
                );
            spread_ms(&self.nodes, self.grad[i], ps[i].gpus.len() as u32, spread)
        };
        let stage_of = |extra: &[f64]| (0..m).map(|i| ps[i].time_ms + extra[i]).fold(0.0, f64::max);
        // Swapping GPUs hosting `mx` on node `a` and `my` on node `b` moves the replicas of
        // the modules of one and not the other.
        let shift = |count: &mut [u32], mx: u64, my: u64, a: usize, b: usize| {
            for i in bits(mx ^ my) {
                let (from, to) = if mx >> i & 1 == 1 { (a, b) } else { (b, a) };
                count[i * n_nodes + from] -= 1;
                count[i * n_nodes + to] += 1;
            }
        };
        let mut extra: Vec<f64> = (0..m).map(|i| extra_of(&count, i)).collect();
        let (mut stage, mut total) = (stage_of(&extra), extra.iter().sum::<f64>());
        let tol = |x: f64| 1e-9 * x.abs().max(1.0);
        'improve: loop {
            let mut charged: Vec<usize> = (0..m).filter(|&i| extra[i] > 0.0).collect();
            charged.sort_by(|&a, &b| {
                (ps[b].time_ms + extra[b]).total_cmp(&(ps[a].time_ms + extra[a]))
            });
            for &b in &charged {
                let Some(left) = work.checked_sub(n_nodes + m) else {
                    break 'improve;
                };
                work = left;
                let held: Vec<usize> = (0..n_nodes).filter(|&n| row(&count, b, n) > 0).collect();
                let Some(&lo) = held
                    .iter()
                    .min_by_key(|&&n| (row(&count, b, n), Reverse(n)))
                else {
                    continue;
                };
                // The slots of node `n` with (or without) a replica of b, one per hosted set.
                let slots = |n: usize, with: bool| {
                    let mut v: Vec<(u64, usize)> = (n * gpn..((n + 1) * gpn).min(at.len()))
                        .map(|s| (self.mask[at[s] as usize], s))
                        .filter(|&(mk, _)| (mk >> b & 1 == 1) == with)
                        .collect();
                    v.sort_unstable();
                    v.dedup_by_key(|&mut (mk, _)| mk);
                    v.into_iter().map(|(_, s)| s).collect::<Vec<usize>>()
                };
                let mut best: Option<(f64, f64, usize, usize)> = None;
                for &hi in held.iter().filter(|&&n| n != lo) {
                    // Gather b (a replica from `lo` to `hi`), or even it out (from `hi` to
                    // `lo`) where `hi` holds at least two more.
                    let mut moves = vec![(slots(lo, true), slots(hi, false))];
                    if row(&count, b, hi) > row(&count, b, lo) + 1 {
                        moves.push((slots(hi, true), slots(lo, false)));
                    }
                    for (xs, ys) in &moves {
                        for (&x, &y) in xs.iter().flat_map(|x| ys.iter().map(move |y| (x, y))) {
                            let (mx, my) = (self.mask[at[x] as usize], self.mask[at[y] as usize]);
                            let cost = 2 * gpn + m + (mx ^ my).count_ones() as usize * n_nodes;
                            let Some(left) = work.checked_sub(cost) else {
                                break 'improve;
                            };
                            work = left;
                            let (nx, ny) = (x / gpn, y / gpn);
                            shift(&mut count, mx, my, nx, ny);
                            let mut trial = extra.clone();
                            for i in bits(mx ^ my) {
                                trial[i] = extra_of(&count, i);
                            }
                            shift(&mut count, mx, my, ny, nx);
                            let (st, tt) = (stage_of(&trial), trial.iter().sum::<f64>());
                            let (bs, bt) = best.map_or((stage, total), |(s, t, _, _)| (s, t));
                            if st < bs - tol(bs) || (st <= bs + tol(bs) && tt < bt - tol(bt)) {
                                best = Some((st, tt, x, y));
                            }
                        }
                    }
                }
                if let Some((st, tt, x, y)) = best {
                    let (mx, my) = (self.mask[at[x] as usize], self.mask[at[y] as usize]);
                    shift(&mut count, mx, my, x / gpn, y / gpn);
                    for i in bits(mx ^ my) {
                        extra[i] = extra_of(&count, i);
                    }
                    at.swap(x, y);
                    perm[at[x] as usize] = x as u32;
                    perm[at[y] as usize] = y as u32;
                    (stage, total) = (st, tt);
                    continue 'improve;
                }
            }
            break;
        }
    }

    /// The placements' GPUs under `perm` (`None`: as they are), their charges and the score.
    fn score(&self, perm: Option<&[u32]>) -> Score {
        let mut score = Score {
            gpus: Vec::with_capacity(self.alloc.placements.len()),
            extra: Vec::with_capacity(self.alloc.placements.len()),
            stage_ms: 0.0,
            total_ms: 0.0,
            spans: vec![0; self.by_cost.rank.len()],
        };
        for (i, p) in self.alloc.placements.iter().enumerate() {
            let mut gpus: Vec<u32> = match perm {
                Some(perm) => p.gpus.iter().map(|&g| perm[g as usize]).collect(),
                None => p.gpus.clone(),
            };
            gpus.sort_unstable();
            let dp = gpus.len() as u32;
            let spread = Spread::of(&gpus, self.gpn);
            let extra = spread_ms(&self.nodes, self.grad[i], dp, spread);
            score.stage_ms = score.stage_ms.max(p.time_ms + extra);
            score.total_ms += extra;
            score.spans[self.by_cost.position[i]] = spread
                .nodes
                .saturating_sub(Spread::packed(dp, self.gpn).nodes);
            score.gpus.push(gpus);
            score.extra.push(extra);
        }
        score
    }
}

/// An order of a stage's placements, highest priority first.
struct Priority {
    /// Placement indices in order.
    rank: Vec<usize>,
    /// Per placement, its position in `rank`.
    position: Vec<usize>,
}

impl Priority {
    /// The `n` placements sorted by `cmp`.
    fn new(n: usize, cmp: impl Fn(usize, usize) -> Ordering) -> Priority {
        let mut rank: Vec<usize> = (0..n).collect();
        rank.sort_by(|&a, &b| cmp(a, b));
        let mut position = vec![0; n];
        for (k, &p) in rank.iter().enumerate() {
            position[p] = k;
        }
        Priority { rank, position }
    }

    /// The best position among the placements of `mask`, or `usize::MAX` for idle GPUs.
    fn best_position(&self, mask: u64) -> usize {
        let mut best = usize::MAX;
        let mut bits = mask;
        while bits != 0 {
            best = best.min(self.position[bits.trailing_zeros() as usize]);
            bits &= bits - 1;
        }
        best
    }
}

/// The indices of the set bits of `mask`, ascending.
fn bits(mask: u64) -> impl Iterator<Item = usize> {
    let mut rest = mask;
    std::iter::from_fn(move || {
        (rest != 0).then(|| {
            let i = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            i
        })
    })
}

/// One relabelling of a stage, scored.
struct Score {
    /// Per placement, its GPUs, ascending.
    gpus: Vec<Vec<u32>>,
    /// Per placement, its charge, ms.
    extra: Vec<f64>,
    /// The stage time with the charges, ms.
    stage_ms: f64,
    /// The charges' sum, ms.
    total_ms: f64,
    /// Per placement in priority order, the nodes it spans beyond its packed placement's.
    spans: Vec<u32>,
}

impl Score {
    /// Strictly better: less stage time, then less total charge, then fewer extra nodes,
    /// compared module by module in priority order.
    fn better_than(&self, other: &Score) -> bool {
        self.stage_ms
            .total_cmp(&other.stage_ms)
            .then(self.total_ms.total_cmp(&other.total_ms))
            .then_with(|| self.spans.cmp(&other.spans))
            == Ordering::Less
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// H100 nodes as the zoo writes them: 8 GPUs, 360 GB/s NVLink and 40 GB/s per NIC.
    const H100: Nodes = Nodes {
        gpus_per_node: 8,
        intra_gbps: 360.0,
        inter_gbps: 40.0,
    };

    /// The extra ms of `dp` replicas of 1 GiB moving from ring `packed` to ring `actual`.
    fn expected(dp: u32, actual: f64, packed: f64) -> f64 {
        let d = dp as f64;
        2.0 * (d - 1.0) / d * GIB * (1.0 / actual - 1.0 / packed) / 1e6
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn spreads_count_nodes_and_the_fewest_replicas_on_one() {
        assert_eq!(
            Spread::of(&[0, 1, 2, 9], 8),
            Spread {
                nodes: 2,
                fewest: 1
            }
        );
        assert_eq!(
            Spread::of(&[17, 3, 16, 2, 1], 8),
            Spread {
                nodes: 2,
                fewest: 2
            }
        );
        assert_eq!(Spread::of(&[], 8).nodes, 0);
        assert_eq!(
            Spread::packed(12, 8),
            Spread {
                nodes: 2,
                fewest: 6
            }
        );
        assert_eq!(
            Spread::packed(16, 8),
            Spread {
                nodes: 2,
                fewest: 8
            }
        );
        assert_eq!(Spread::packed(5, 8).nodes, 1);
        assert_eq!(nodes_of(&[15, 0, 7, 8, 30], 8), vec![0, 1, 3]);
    }

    #[test]
    fn a_module_inside_a_node_pays_nothing() {
        let all: Vec<u32> = (0..8).collect();
        assert_eq!(cross_node_ms(&H100, 1.0, &all), 0.0);
        assert_eq!(cross_node_ms(&H100, 1.0, &[12, 9, 14]), 0.0);
        // One replica, or no gradient, pays nothing wherever it is.
        assert_eq!(cross_node_ms(&H100, 1.0, &[13]), 0.0);
        assert_eq!(cross_node_ms(&H100, 0.0, &[0, 8]), 0.0);
    }

    #[test]
    fn a_split_node_module_pays_the_nic_bottleneck() {
        // 7 + 1: the lone replica's NIC carries the ring: 2(d−1)/d × bytes × (1/inter − 1/intra).
        let seven_one: Vec<u32> = (1..9).collect();
        let got = cross_node_ms(&H100, 1.0, &seven_one);
        assert!(close(got, expected(8, 40.0, 360.0)), "{got}");
        assert!(got > 40.0 && got < 50.0, "{got} ms for a GiB");
        // 4 + 4: four rings through four NICs each way.
        let four_four = [4, 5, 6, 7, 8, 9, 10, 11];
        let split = cross_node_ms(&H100, 1.0, &four_four);
        assert!(close(split, expected(8, 160.0, 360.0)), "{split}");
        assert!(split < got);
        // Linear in the gradient.
        assert!(close(cross_node_ms(&H100, 2.5, &four_four), 2.5 * split));
    }

    #[test]
    fn a_multi_node_module_pays_only_below_its_packed_spread() {
        let packed: Vec<u32> = (0..16).collect();
        assert_eq!(cross_node_ms(&H100, 1.0, &packed), 0.0);
        // The same 2 nodes, unevenly (8 + 8 is the packed spread; 16 on 3 nodes is not).
        let shifted: Vec<u32> = (4..20).collect(); // 4 + 8 + 4
        let got = cross_node_ms(&H100, 1.0, &shifted);
        assert!(close(got, expected(16, 160.0, 320.0)), "{got}");
        // Where the NICs outrun NVLink, spreading costs nothing more.
        let fat = Nodes {
            inter_gbps: 400.0,
            ..H100
        };
        assert_eq!(cross_node_ms(&fat, 1.0, &shifted), 0.0);
    }
}
