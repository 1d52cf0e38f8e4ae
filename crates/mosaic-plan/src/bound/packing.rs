//! The stage-packing bound: a weight y_m per module such that no stage a plan can form
//! holds more weight than it lasts. Every module sits in exactly one stage, so any plan takes
//! Σ_s T_s ≥ Σ_s Σ_{m∈s} y_m = Σ_m y_m.
//!
//! What a stage can hold, relaxed: a stage of time T holds an antichain S of the DAG (no
//! module beside its ancestor) whose modules each have a run (`options.rs`) no slower than T,
//! and whose runs' units fit the pool together: Σ_{m∈S} u_m(T) ≤ K, u_m(T) the least units of
//! m's runs within T (dp × quota when sharing, dp × the whole GPU when alone), K the pool's
//! units. The best y is the dual of the configuration LP min Σ T_j x_j over stages j covering
//! every module once:
//!
//! max Σ_m y_m  subject to  Σ_{m∈S} y_m ≤ T for every stage (S, T) above.
//!
//! Where the area bound lets modules share the pool's time freely, this sees that a module
//! holds its quota for its whole stage, so modules that cannot fit beside each other at
//! their fast runs need stages of their own; and with the antichain it sees that a chain's
//! modules need a stage each. On 16 zoo-shaped modules on 8 GPUs the LP of every antichain was
//! within 1 % of the best integer stage sequence (a one-off SciPy check, README).
//!
//! The LP is solved by cutting planes (`simplex.rs`): the most violated stages are found by a
//! knapsack per stage time T over the modules (a *pricing* step), added as rows, and the LP
//! solved again. Pricing relaxes the antichain to "at most one module per chain" of a chain
//! cover of the group (every antichain is one) and the units to ⌊u·c/K⌋ of a capacity
//! c ≤ [`CAPACITY`] (every set that fits K fits c), so it checks more sets than can be
//! stages. Each round's y, divided by its worst violation (found by the same pricing), is
//! feasible; the best of these is the answer, so the bound is sound however early the loop
//! stops.

use std::time::Instant;

use mosaic_profile::ModuleSet;

use super::options::Run;
use super::simplex::Simplex;
use crate::Problem;

/// The most knapsack capacity units pricing uses; larger pools are scaled down to it.
const CAPACITY: u64 = 256;

/// The most rounds of cutting planes per group.
const ROUNDS: usize = 40;

/// Rounds in which neither the LP's value falls nor the bound rises by a factor of
/// 1 + [`GAIN`], after which the loop stops (cutting planes stall on degenerate optima).
const STALL: usize = 12;

/// The least relative rise of the bound that counts as progress.
const GAIN: f64 = 1e-3;

/// The most rows one round adds.
const CUTS_PER_ROUND: usize = 8;

/// Per module, its weight (module docs) within its group of `groups` (modules of different
/// groups are ordered, so every stage lies in one group), from the `runs` of each module.
/// Each group comes with the bound its weights must beat to be worth having: where the LP
/// proves they cannot, the group's weights stay 0. Stops adding cuts at `deadline`.
pub(super) fn weights(
    problem: &Problem,
    runs: &[Vec<Run>],
    groups: &[(ModuleSet, f64)],
    deadline: Option<Instant>,
) -> Vec<f64> {
    let pool = u64::from(problem.model.units_per_gpu) * u64::from(problem.gpus);
    let ancestors: Vec<ModuleSet> = problem.model.modules.iter().map(|m| m.ancestors).collect();
    let mut y = vec![0.0; runs.len()];
    for &(group, floor) in groups {
        let members: Vec<usize> = group.iter().collect();
        let packing = Packing::new(&members, &ancestors, runs, pool);
        let Some(weights) = packing.solve(floor, deadline) else {
            continue;
        };
        for (m, w) in members.iter().zip(weights) {
            y[*m] = w;
        }
    }
    y
}

/// A stage as pricing finds it: its weight and its members (local indices).
type Stage = (f64, Vec<usize>);

/// One group's pricing data.
struct Packing {
    /// Stage times at which some module's least units change, ascending.
    times: Vec<f64>,
    /// Per member (local index) and time, its least scaled units within that time.
    units: Vec<Vec<Option<u32>>>,
    /// A chain cover of the members (local indices).
    chains: Vec<Vec<usize>>,
    /// The knapsack capacity.
    capacity: usize,
}

impl Packing {
    /// The pricing data of the modules `members`.
    fn new(members: &[usize], ancestors: &[ModuleSet], runs: &[Vec<Run>], pool: u64) -> Self {
        let capacity = pool.min(CAPACITY);
        let scale = |u: u32| (u64::from(u) * capacity / pool) as u32;
        // Per member, the runs no faster one beats in units: time rising, units falling.
        let fronts: Vec<Vec<(f64, u32)>> = members
            .iter()
            .map(|&m| {
                let mut list: Vec<(f64, u32)> =
                    runs[m].iter().map(|r| (r.time_ms, r.units)).collect();
                list.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                let mut least = u32::MAX;
                list.retain(|&(_, u)| {
                    let keep = u < least;
                    least = least.min(u);
                    keep
                });
                list
            })
            .collect();
        let mut times: Vec<f64> = fronts.iter().flatten().map(|&(t, _)| t).collect();
        times.sort_by(f64::total_cmp);
        times.dedup();
        let units = fronts
            .iter()
            .map(|front| {
                let mut k = 0;
                let mut least = None;
                times
                    .iter()
                    .map(|&t| {
                        while k < front.len() && front[k].0 <= t {
                            least = Some(scale(front[k].1));
                            k += 1;
                        }
                        least
                    })
                    .collect()
            })
            .collect();
        Packing {
            times,
            units,
            chains: chain_cover(members, ancestors),
            capacity: capacity as usize,
        }
    }

    /// The group's weights by cutting planes (module docs), feasible: the best found before
    /// the LP is solved, stalls for [`STALL`] rounds, or runs out of rounds, rows or time;
    /// `None` where they cannot beat `floor` (the LP's optimum over the rows so far, at least
    /// its optimum over all, is no more) or do not.
    fn solve(&self, floor: f64, deadline: Option<Instant>) -> Option<Vec<f64>> {
        let n = self.units.len();
        let mut lp = Simplex::new(n, n + ROUNDS * CUTS_PER_ROUND);
        for (i, units) in self.units.iter().enumerate() {
            // A module alone in its stage lasts at least its fastest run.
            let fastest = units.iter().position(Option::is_some);
            lp.add_row(&[i], fastest.map_or(0.0, |k| self.times[k]));
        }
        let mut y = lp.solve(deadline);
        let (mut best, mut best_sum) = (vec![0.0; n], 0.0);
        let (mut rounds, mut stalled, mut last_upper) = (0, 0, f64::INFINITY);
        loop {
            let upper: f64 = y.iter().sum();
            if upper <= floor {
                return None;
            }
            // Scaled by its worst ratio, y is feasible: no stage then outweighs its time.
            let worst = self.worst(&y, 4 * CUTS_PER_ROUND, 1.0);
            let ratio = worst.first().map_or(1.0, |w| w.0);
            let fell = upper < last_upper * (1.0 - GAIN);
            let rose = upper / ratio > best_sum * (1.0 + GAIN);
            if rose {
                best = y.iter().map(|w| w / ratio).collect();
                best_sum = upper / ratio;
            }
            stalled = if fell || rose { 0 } else { stalled + 1 };
            last_upper = upper;
            let cuts: Vec<_> = worst.into_iter().filter(|w| w.0 > 1.0 + 1e-7).collect();
            if cuts.is_empty()
                || stalled >= STALL
                || rounds >= ROUNDS
                || !lp.has_room()
                || deadline.is_some_and(|d| Instant::now() >= d)
            {
                break;
            }
            let mut added: Vec<Vec<usize>> = Vec::new();
            for (_, k, set) in cuts {
                if added.len() < CUTS_PER_ROUND && !added.contains(&set) {
                    // The cut holds from the least time at which its set fits.
                    let least = (0..=k).find(|&j| self.fits(j, &set)).unwrap_or(k);
                    lp.add_row(&set, self.times[least]);
                    added.push(set);
                }
            }
            y = lp.solve(deadline);
            rounds += 1;
        }
        // A margin against the rounding of the sums compared in `worst`.
        (best_sum > floor).then(|| best.iter().map(|w| w * (1.0 - 1e-12)).collect())
    }

    /// Up to `limit` stage times at which the heaviest stage (`heaviest`) outweighs the time
    /// by a ratio above `above`, the largest ratios first, as (ratio, time index, members).
    ///
    /// Best first over ranges of time indices: the heaviest stage only grows with the time,
    /// so over [lo, hi] no ratio exceeds weight(hi) / time(lo), and a range whose bound is
    /// below every ratio still wanted is never priced inside.
    fn worst(&self, y: &[f64], limit: usize, above: f64) -> Vec<(f64, usize, Vec<usize>)> {
        let mut found = Vec::new();
        let Some(last) = self.times.len().checked_sub(1) else {
            return found;
        };
        // Open ranges as (bound, lo, hi, heaviest at hi).
        let mut open: Vec<(f64, usize, usize, Stage)> = Vec::new();
        let top = self.heaviest(last, y);
        open.push((top.0 / self.times[0], 0, last, top));
        while found.len() < limit {
            let Some(at) = (0..open.len()).max_by(|&a, &b| open[a].0.total_cmp(&open[b].0)) else {
                break;
            };
            let (bound, lo, hi, heaviest) = open.swap_remove(at);
            if bound <= above {
                break;
            }
            if lo == hi {
                found.push((bound, lo, heaviest.1));
                continue;
            }
            let mid = (lo + hi) / 2;
            let left = self.heaviest(mid, y);
            open.push((left.0 / self.times[lo], lo, mid, left));
            open.push((heaviest.0 / self.times[mid + 1], mid + 1, hi, heaviest));
        }
        found
    }

    /// Whether the members `set` fit the capacity together at time index `k`.
    fn fits(&self, k: usize, set: &[usize]) -> bool {
        let mut used = 0usize;
        for &i in set {
            match self.units[i][k] {
                Some(u) => used += u as usize,
                None => return false,
            }
        }
        used <= self.capacity
    }

    /// The heaviest set of at most one member per chain fitting the capacity at time index
    /// `k` (a multiple-choice knapsack), as (weight, members).
    fn heaviest(&self, k: usize, y: &[f64]) -> Stage {
        let c = self.capacity;
        let items: Vec<Vec<(usize, usize)>> = self
            .chains
            .iter()
            .map(|chain| {
                chain
                    .iter()
                    .filter(|&&i| y[i] > 0.0)
                    .filter_map(|&i| self.units[i][k].map(|u| (i, u as usize)))
                    .filter(|&(_, u)| u <= c)
                    .collect()
            })
            .collect();
        // Where any one member per chain fits, the heaviest per chain is the answer.
        let widest: usize = items
            .iter()
            .map(|list| list.iter().map(|&(_, u)| u).max().unwrap_or(0))
            .sum();
        if widest <= c {
            let picks = items.iter().filter_map(|list| {
                list.iter()
                    .max_by(|a, b| y[a.0].total_cmp(&y[b.0]))
                    .map(|&(i, _)| i)
            });
            let set: Vec<usize> = picks.collect();
            return (set.iter().map(|&i| y[i]).sum(), set);
        }
        let mut best = vec![0.0f64; c + 1];
        let mut before = vec![0.0f64; c + 1];
        // Per chain and room, the member it took (usize::MAX: none).
        let mut pick = vec![usize::MAX; items.len() * (c + 1)];
        for (chain, list) in items.iter().enumerate() {
            if list.is_empty() {
                continue;
            }
            // From the chains before only, so that one chain gives one member even at 0 units.
            before.copy_from_slice(&best);
            let picks = &mut pick[chain * (c + 1)..(chain + 1) * (c + 1)];
            for (room, (best, picked)) in best.iter_mut().zip(picks).enumerate() {
                for &(i, u) in list {
                    if u <= room && before[room - u] + y[i] > *best {
                        *best = before[room - u] + y[i];
                        *picked = i;
                    }
                }
            }
        }
        // Walk the choices back from the full capacity.
        let mut set = Vec::new();
        let mut room = c;
        for chain in (0..items.len()).rev() {
            let i = pick[chain * (c + 1) + room];
            if i != usize::MAX {
                set.push(i);
                room -= self.units[i][k].expect("picked members fit") as usize;
            }
        }
        (best[c], set)
    }
}

/// A least cover of `members` by chains (local indices), each totally ordered by ancestry:
/// a maximum matching of (ancestor, descendant) pairs joins each matched pair into one chain
/// (Dilworth's theorem by König's); ancestry is transitive, so a chain's modules are all
/// comparable and no antichain holds two of them.
fn chain_cover(members: &[usize], ancestors: &[ModuleSet]) -> Vec<Vec<usize>> {
    let n = members.len();
    let before = |u: usize, v: usize| ancestors[members[v]].contains(members[u]);
    let mut next: Vec<Option<usize>> = vec![None; n];
    let mut prev: Vec<Option<usize>> = vec![None; n];
    for u in 0..n {
        let mut seen = vec![false; n];
        augment(u, &before, &mut next, &mut prev, &mut seen);
    }
    let mut chains = Vec::new();
    for start in (0..n).filter(|&v| prev[v].is_none()) {
        let mut chain = vec![start];
        let mut at = start;
        while let Some(v) = next[at] {
            chain.push(v);
            at = v;
        }
        chains.push(chain);
    }
    chains
}

/// Kuhn's augmenting path from `u` (as a predecessor) in the bipartite graph of the pairs
/// `before` holds; true when it matched `u`.
fn augment(
    u: usize,
    before: &dyn Fn(usize, usize) -> bool,
    next: &mut [Option<usize>],
    prev: &mut [Option<usize>],
    seen: &mut [bool],
) -> bool {
    for v in 0..seen.len() {
        if !before(u, v) || seen[v] {
            continue;
        }
        seen[v] = true;
        let free = match prev[v] {
            None => true,
            Some(w) => augment(w, before, next, prev, seen),
        };
        if free {
            next[u] = Some(v);
            prev[v] = Some(u);
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run of `units` at `time_ms`.
    fn run(time_ms: f64, units: u32) -> Run {
        Run {
            time_ms,
            area_time: f64::from(units) * time_ms,
            units,
        }
    }

    /// Two chains a → b → c and d → e, with f beside them: a least cover has three chains,
    /// each totally ordered by ancestry.
    #[test]
    fn chains_cover_the_members_least_ordered_by_ancestry() {
        let set = |ms: &[usize]| {
            ms.iter()
                .fold(ModuleSet::EMPTY, |s, &m| s.union(ModuleSet::single(m)))
        };
        let ancestors = vec![
            set(&[]),
            set(&[0]),
            set(&[0, 1]),
            set(&[]),
            set(&[3]),
            set(&[]),
        ];
        let mut chains = chain_cover(&[0, 1, 2, 3, 4, 5], &ancestors);
        chains.sort();
        assert_eq!(chains, vec![vec![0, 1, 2], vec![3, 4], vec![5]]);
    }

    /// The heaviest stage takes at most one member per chain and fits the capacity: a and b
    /// chained, c beside them, a pool of 10 units.
    #[test]
    fn the_heaviest_stage_fits_and_takes_one_per_chain() {
        let runs = vec![
            vec![run(10.0, 6)],
            vec![run(10.0, 4)],
            vec![run(10.0, 5), run(20.0, 4)],
        ];
        let ancestors = vec![ModuleSet::EMPTY, ModuleSet::single(0), ModuleSet::EMPTY];
        let packing = Packing::new(&[0, 1, 2], &ancestors, &runs, 10);
        assert_eq!(packing.times, vec![10.0, 20.0]);
        let y = [3.0, 2.0, 4.0];
        // At 10 ms: a (6) + c (5) overflow, so b + c (9 units) at weight 6 beats a + nothing.
        let (weight, mut set) = packing.heaviest(0, &y);
        set.sort();
        assert_eq!((weight, set), (6.0, vec![1, 2]));
        // At 20 ms c needs 4: a + c fits at weight 7.
        let (weight, mut set) = packing.heaviest(1, &y);
        set.sort();
        assert_eq!((weight, set), (7.0, vec![0, 2]));
    }

    /// Items scaled to 0 units (a pool larger than the knapsack) still give one per chain.
    #[test]
    fn a_chain_gives_one_member_even_at_zero_units() {
        let runs = vec![vec![run(10.0, 1)], vec![run(10.0, 1)]];
        let ancestors = vec![ModuleSet::EMPTY, ModuleSet::single(0)];
        let packing = Packing::new(&[0, 1], &ancestors, &runs, 100_000);
        assert_eq!(packing.units, vec![vec![Some(0)], vec![Some(0)]]);
        let (weight, set) = packing.heaviest(0, &[2.0, 3.0]);
        assert_eq!((weight, set), (3.0, vec![1]));
    }

    /// The weights of three modules that fit one GPU only in pairs at their slow runs: each
    /// 10 ms alone, a pair 25 ms, so 10 + 10 + 10 = 30 (the LP's optimum) and no stage
    /// outweighs its time.
    #[test]
    fn weights_charge_stages_that_cannot_hold_everything() {
        let runs = vec![vec![run(10.0, 6), run(25.0, 4)]; 3];
        let packing = Packing::new(&[0, 1, 2], &[ModuleSet::EMPTY; 3], &runs, 10);
        let y = packing.solve(0.0, None).expect("above 0");
        assert!((y.iter().sum::<f64>() - 30.0).abs() < 1e-6, "{y:?}");
        assert!(packing.worst(&y, 1, 1.0).is_empty(), "{y:?}");
    }
}
