//! Each module's deployment candidates on a given GPU pool, ordered for the solvers.

use mosaic_profile::QuotaOption;

/// One (dp, quota) candidate of a module, with the numbers the solvers need.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// Data-parallel degree: replicas on that many distinct GPUs.
    pub dp: u32,
    /// Quota per replica in granularity units.
    pub units: u32,
    /// Predicted time without interference, in ms.
    pub time_ms: f64,
    /// Memory per GPU, in GiB.
    pub mem_gib: f64,
    /// Bandwidth utilisation B(m, a).
    pub bw_util: f64,
    /// Quota units over all replicas: dp × units.
    pub area: u32,
}

impl From<&QuotaOption> for Candidate {
    fn from(o: &QuotaOption) -> Self {
        Candidate {
            dp: o.dp,
            units: o.units,
            time_ms: o.time_ms,
            mem_gib: o.mem_gib,
            bw_util: o.bw_util,
            area: o.dp * o.units,
        }
    }
}

/// The most smaller quotas each option is checked against for dominance ([`Candidates::new`]):
/// every quota of a GPU of up to 256 units (an H100 has 132), so zoo and measured profiles are
/// filtered exactly.
const FRONT: usize = 256;

/// A module's candidates sorted by time, with prefix minima for the capacity bounds.
#[derive(Debug, Clone)]
pub struct Candidates {
    /// Undominated candidates, fastest first.
    pub list: Vec<Candidate>,
    /// `min_area[k]`: the smallest `area` among `list[..=k]`.
    min_area: Vec<u32>,
    /// `min_mem[k]`: the smallest dp × mem among `list[..=k]`.
    min_mem: Vec<f64>,
    /// The smallest area × time over all candidates (unit·ms), for area lower bounds.
    pub min_area_time: f64,
}

impl Candidates {
    /// The candidates of `options` (ordered by dp, then units) that fit a pool of `gpus` GPUs,
    /// without the dominated ones: a quota is dominated when a smaller quota at the same dp is
    /// no slower, needs no more memory and no more bandwidth (swapping to it can never hurt any
    /// module of a stage, because Δ of Eq. 8 grows with every B when e1, e2, e3 ≥ 0).
    ///
    /// Each option is checked against the Pareto front of the smaller quotas at its dp, at most
    /// `FRONT` of them: on a fine grid (10,000 SMs) with time falling and bandwidth rising in
    /// the quota the front holds every option, and checking them all took 18 s for 16 modules.
    /// Past the cap some dominated options stay, which costs the search time, never a plan.
    pub fn new(options: &[QuotaOption], gpus: u32) -> Self {
        let mut list: Vec<Candidate> = Vec::new();
        let mut front: Vec<&QuotaOption> = Vec::new();
        for (k, o) in options.iter().enumerate() {
            if k > 0 && options[k - 1].dp != o.dp {
                front.clear();
            }
            if o.dp > gpus {
                continue;
            }
            let no_worse = |p: &QuotaOption, o: &QuotaOption| {
                p.time_ms <= o.time_ms && p.mem_gib <= o.mem_gib && p.bw_util <= o.bw_util
            };
            if front.iter().any(|p| p.units < o.units && no_worse(p, o)) {
                continue;
            }
            list.push(Candidate::from(o));
            front.retain(|p| !no_worse(o, p));
            if front.len() < FRONT {
                front.push(o);
            }
        }
        list.sort_by(|a, b| a.time_ms.total_cmp(&b.time_ms).then(a.area.cmp(&b.area)));
        let mut min_area = Vec::with_capacity(list.len());
        let mut min_mem = Vec::with_capacity(list.len());
        let (mut a, mut m) = (u32::MAX, f64::INFINITY);
        for c in &list {
            a = a.min(c.area);
            m = m.min(c.dp as f64 * c.mem_gib);
            min_area.push(a);
            min_mem.push(m);
        }
        let min_area_time = list
            .iter()
            .map(|c| c.area as f64 * c.time_ms)
            .fold(f64::INFINITY, f64::min);
        Candidates {
            list,
            min_area,
            min_mem,
            min_area_time,
        }
    }

    /// Whether the module has no candidate on this pool.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The fastest candidate's time (infinite when there is none).
    pub fn min_time(&self) -> f64 {
        self.list.first().map_or(f64::INFINITY, |c| c.time_ms)
    }

    /// How many candidates are strictly faster than `tau` (they form a prefix of `list`).
    pub fn count_below(&self, tau: f64) -> usize {
        self.list.partition_point(|c| c.time_ms < tau)
    }

    /// The least quota area and least total memory any candidate faster than `tau` needs.
    pub fn min_need_below(&self, tau: f64) -> Option<(u32, f64)> {
        let k = self.count_below(tau);
        (k > 0).then(|| (self.min_area[k - 1], self.min_mem[k - 1]))
    }

    /// The least quota area any candidate at most `tau` needs.
    pub fn min_area_at_most(&self, tau: f64) -> Option<u32> {
        let k = self.list.partition_point(|c| c.time_ms <= tau);
        (k > 0).then(|| self.min_area[k - 1])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opt(dp: u32, units: u32, time_ms: f64, bw: f64) -> QuotaOption {
        QuotaOption {
            dp,
            units,
            sm: units as f64 / 10.0,
            time_ms,
            mem_gib: 1.0,
            bw_util: bw,
            sm_util: 0.5,
        }
    }

    #[test]
    fn saturated_quotas_are_dominated_and_big_dp_dropped() {
        let options = [
            opt(1, 1, 100.0, 0.1),
            opt(1, 2, 50.0, 0.2),
            opt(1, 3, 50.0, 0.2), // no faster than 2 units: dominated
            opt(1, 4, 40.0, 0.1),
            opt(16, 1, 5.0, 0.1), // more GPUs than the pool
        ];
        let c = Candidates::new(&options, 8);
        let kept: Vec<(u32, u32)> = c.list.iter().map(|c| (c.dp, c.units)).collect();
        assert_eq!(kept, vec![(1, 4), (1, 2), (1, 1)]);
        assert_eq!(c.count_below(50.0), 1);
        assert_eq!(c.min_need_below(60.0), Some((2, 1.0)));
        assert_eq!(c.min_need_below(40.0), None);
        assert_eq!(c.min_area_at_most(40.0), Some(4));
    }
}
