//! The ways a module can run, as the relaxation sees them: per candidate, a time no plan
//! beats and the quota area × time it takes from the pool, with the interference of Eq. 8
//! that sharing a GPU costs.
//!
//! In a plan, a module at candidate (dp, a) of time t either shares some GPU or has each of
//! its dp GPUs to itself for its stage:
//! - **shared**: its rectified time is t·(1 + max Δ_g) over its GPUs, and a shared GPU's Δ is
//!   e1 + e2·ΣB + e3·ΠB ≥ e1 + e2·(B(a) + B_min), B_min the least bandwidth utilisation of any
//!   module that could share a stage with it (coefficients are non-negative, so the product
//!   term adds nothing less than 0). Its area is dp·a over that rectified time.
//! - **alone**: its time is t, but no other module uses its GPUs in the stage, so it takes all
//!   of their quota: area dp·U (U the units per GPU) over t.
//!
//! Either way the area argument of the module docs holds (a GPU's quotas in a stage sum to at
//! most U, for a time no shorter than any rectified time on it), so a bound taking each module
//! at its best option is a bound on every plan. The alone option is what makes interference
//! count: a module that avoids it pays for the quota it leaves idle. A module whose quota
//! leaves no room for the smallest quota of any module it could share with, or that shares a
//! stage with no other module, runs alone.

use mosaic_profile::ModuleSet;

use crate::Problem;

/// One way a module can run (module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Run {
    /// A time no plan runs the module faster at this candidate, ms.
    pub(super) time_ms: f64,
    /// Quota units taken from the pool × time, unit·ms.
    pub(super) area_time: f64,
    /// Quota units taken from the pool: dp × quota when sharing, dp × U when alone.
    pub(super) units: u32,
}

/// Per module, its runs over its candidates (module docs); `comparable[m]` holds m's
/// ancestors and descendants, the modules that never share a stage with it.
pub(super) fn options(problem: &Problem, comparable: &[ModuleSet]) -> Vec<Vec<Run>> {
    let model = problem.model;
    let e = model.interference;
    let units = model.units_per_gpu;
    let n = model.modules.len();
    // Per module, the least bandwidth utilisation and quota of any candidate.
    let least = |m: usize| {
        let list = &problem.cands[m].list;
        let bw = list.iter().map(|c| c.bw_util).fold(f64::INFINITY, f64::min);
        let quota = list.iter().map(|c| c.units).min().unwrap_or(u32::MAX);
        (bw, quota)
    };
    let least: Vec<(f64, u32)> = (0..n).map(least).collect();
    (0..n)
        .map(|m| {
            // The least B and quota of a module that could share m's stage, if any could.
            let partners = (0..n).filter(|&o| o != m && !comparable[m].contains(o));
            let partner = partners.map(|o| least[o]).fold(None, |acc, (bw, quota)| {
                let (b, q) = acc.unwrap_or((f64::INFINITY, u32::MAX));
                Some((b.min(bw), q.min(quota)))
            });
            let mut list = Vec::new();
            for c in &problem.cands[m].list {
                let t = c.time_ms;
                list.push(Run {
                    time_ms: t,
                    area_time: f64::from(c.dp) * f64::from(units) * t,
                    units: c.dp * units,
                });
                let Some((bw, quota)) = partner else { continue };
                if c.units.saturating_add(quota) <= units {
                    let shared = t * (1.0 + e.e1 + e.e2 * (c.bw_util + bw));
                    list.push(Run {
                        time_ms: shared,
                        area_time: f64::from(c.area) * shared,
                        units: c.area,
                    });
                }
            }
            list
        })
        .collect()
}

/// The runs of `list` that no other run beats in both time and area, fastest first: the
/// Lagrangian bound takes the least of λ·time + (1 − λ)·area over runs within a time cap,
/// which only these can be.
pub(super) fn area_front(mut list: Vec<Run>) -> Vec<Run> {
    list.sort_by(|a, b| {
        a.time_ms
            .total_cmp(&b.time_ms)
            .then(a.area_time.total_cmp(&b.area_time))
    });
    let mut least = f64::INFINITY;
    list.retain(|r| {
        let keep = r.area_time < least;
        least = least.min(r.area_time);
        keep
    });
    list
}

#[cfg(test)]
mod tests {
    use super::*;
    use mosaic_profile::{Interference, PerfModel};

    use crate::candidates::Candidate;

    use crate::synthetic::random_profiles;

    /// Each candidate runs alone at its own time over whole GPUs, and shares (where its quota
    /// leaves room for a partner's least) at Δ's least value over its own quota; a module that
    /// shares a stage with no other runs alone only.
    #[test]
    fn each_candidate_runs_alone_or_shares_at_the_least_slowdown() {
        let mut file = random_profiles(3, 6, 8);
        file.interference = Interference {
            e1: 0.02,
            e2: 0.05,
            e3: 0.3,
        };
        let model = PerfModel::new(&file, 0.1, "t").expect("valid");
        let problem = Problem::new(&model, 8).expect("placeable");
        let n = model.modules.len();
        let least_bw = |m: usize| {
            let list = &problem.cands[m].list;
            list.iter().map(|c| c.bw_util).fold(f64::INFINITY, f64::min)
        };
        let mut shared = 0;
        for (m, runs) in options(&problem, &vec![ModuleSet::EMPTY; n])
            .iter()
            .enumerate()
        {
            let partner_bw = (0..n)
                .filter(|&o| o != m)
                .map(least_bw)
                .fold(f64::INFINITY, f64::min);
            let mut expected = Vec::new();
            for c in &problem.cands[m].list {
                let t = c.time_ms;
                expected.push(Run {
                    time_ms: t,
                    area_time: f64::from(c.dp) * 10.0 * t,
                    units: c.dp * 10,
                });
                // Every module has a 0.1 quota (one unit) to share with.
                if c.units < 10 {
                    let slow = t * (1.0 + 0.02 + 0.05 * (c.bw_util + partner_bw));
                    expected.push(Run {
                        time_ms: slow,
                        area_time: f64::from(c.area) * slow,
                        units: c.area,
                    });
                    shared += 1;
                }
            }
            assert_eq!(runs, &expected, "module {m}");
        }
        assert!(shared > 0);
        let alone = options(&problem, &vec![ModuleSet::all(n); n]);
        for (m, runs) in alone.iter().enumerate() {
            let whole = |c: &Candidate| Run {
                time_ms: c.time_ms,
                area_time: f64::from(c.dp) * 10.0 * c.time_ms,
                units: c.dp * 10,
            };
            let cands = &problem.cands[m].list;
            let all: Vec<Run> = cands.iter().map(whole).collect();
            assert_eq!(runs, &all, "module {m} shares with none");
        }
    }

    /// Only runs that no other beats in both time and area stay, fastest first.
    #[test]
    fn the_area_front_keeps_the_undominated_runs() {
        let run = |time_ms, area_time| Run {
            time_ms,
            area_time,
            units: 1,
        };
        let list = vec![
            run(3.0, 5.0),
            run(1.0, 9.0),
            run(2.0, 9.0),
            run(4.0, 5.0),
            run(5.0, 1.0),
        ];
        assert_eq!(
            area_front(list),
            vec![run(1.0, 9.0), run(3.0, 5.0), run(5.0, 1.0)]
        );
    }
}
