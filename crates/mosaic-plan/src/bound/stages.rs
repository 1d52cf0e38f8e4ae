//! The stage-sequence relaxation: the least total of a group's stages when each module has a
//! weight (its fastest time, or a Lagrangian weight of the bound's module docs), a stage holds
//! any number of them (no SM capacity) and costs its heaviest module.
//!
//! At the fastest times, every plan is such a sequence with modules no faster, so its time
//! bounds the plan's from below. Where the Lagrangian bound sees one critical path, this sees
//! that modules at different depths add stages: a one-module encoder of 80 ms beside a
//! 20 → 27 ms chain costs 100 ms at least (the chain's first stage beside it, or its second),
//! not 80.
//!
//! Some optimal sequence puts into each stage every module it may run (all producers done)
//! that is no heavier than the stage: moving such a module there from a later stage costs
//! nothing more and frees its consumers sooner. So a stage is fixed by its heaviest module,
//! and a dynamic programme over the modules left tries, per stage, each weight among the
//! modules ready to run.

use std::collections::HashMap;

use mosaic_profile::{ModuleSet, PerfModel};

/// The most module sets the programme solves over one bound's lifetime; past it the
/// relaxation is skipped (the Lagrangian bound still holds).
const MAX_STATES: usize = 200_000;

/// The memoised programme over one set of module weights.
pub(crate) struct Stages {
    /// Per module, its weight, ms.
    weight: Vec<f64>,
    /// Per module, its ancestors.
    ancestors: Vec<ModuleSet>,
    /// The least total of each set of modules left, solved so far.
    memo: HashMap<u64, f64>,
}

impl Stages {
    /// The relaxation of `model` with per-module weights `weight`, ms.
    pub(crate) fn new(model: &PerfModel, weight: Vec<f64>) -> Self {
        Stages {
            weight,
            ancestors: model.modules.iter().map(|m| m.ancestors).collect(),
            memo: HashMap::new(),
        }
    }

    /// The least total of the stages that run `left` (a set closed under descendants within
    /// itself: every module of it whose producers in it are done may run), or `None` once the
    /// programme has solved [`MAX_STATES`] sets.
    pub(crate) fn least(&mut self, left: ModuleSet) -> Option<f64> {
        if left.is_empty() {
            return Some(0.0);
        }
        if let Some(&t) = self.memo.get(&left.0) {
            return Some(t);
        }
        if self.memo.len() >= MAX_STATES {
            return None;
        }
        let ready: Vec<usize> = left
            .iter()
            .filter(|&m| self.ancestors[m].intersect(left).is_empty())
            .collect();
        let mut best = f64::INFINITY;
        for &heaviest in &ready {
            let stage_ms = self.weight[heaviest];
            let stage = ready
                .iter()
                .filter(|&&m| self.weight[m] <= stage_ms)
                .fold(ModuleSet::EMPTY, |s, &m| s.union(ModuleSet::single(m)));
            // Ties give the same stage; solve it once.
            if ready
                .iter()
                .any(|&m| m < heaviest && self.weight[m] == stage_ms)
            {
                continue;
            }
            let rest = self.least(left.minus(stage))?;
            best = best.min(stage_ms + rest);
        }
        self.memo.insert(left.0, best);
        Some(best)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model of the given modules (name, after) with one sample each at the given time.
    fn model(modules: &[(&str, &str, f64)]) -> PerfModel {
        let samples: Vec<[(f64, f64); 1]> = modules.iter().map(|m| [(1.0, m.2)]).collect();
        let list: Vec<super::super::fixture::Module> = modules
            .iter()
            .zip(&samples)
            .map(|(m, s)| (m.0, m.1, &s[..]))
            .collect();
        super::super::fixture::model(&list, 0.1)
    }

    #[test]
    fn modules_at_different_depths_add_stages() {
        // text (80) beside the chain depth0 (20) → depth1 (27): text goes with depth1's stage
        // (20 + 80) rather than depth0's (80 + 27).
        let m = model(&[
            ("text", "", 80.0),
            ("d0", "", 20.0),
            ("d1", r#""d0""#, 27.0),
        ]);
        let mut stages = Stages::new(&m, vec![80.0, 20.0, 27.0]);
        assert_eq!(stages.least(ModuleSet::all(3)), Some(100.0));
        // Without text, the chain alone.
        assert_eq!(stages.least(ModuleSet(0b110)), Some(47.0));
    }

    #[test]
    fn independent_modules_share_one_stage() {
        let m = model(&[("a", "", 5.0), ("b", "", 7.0), ("c", "", 3.0)]);
        let mut stages = Stages::new(&m, vec![5.0, 7.0, 3.0]);
        assert_eq!(stages.least(ModuleSet::all(3)), Some(7.0));
    }
}
