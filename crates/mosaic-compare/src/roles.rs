//! The module groups of the disaggregated strategies (DistTrain §4.1, FlowTrain §3.1):
//! encoders, the backbone and the heads, inferred from the DAG because the profile format
//! records no roles.

use mosaic_profile::{ModuleSet, PerfModel};

/// A model's modules split into encoders → backbone → heads.
///
/// - **Backbone**: among the *joint* modules — those that every source module (a module
///   without producers) reaches, i.e. the modules where all modalities meet — the one with the
///   most work (least GPU-time `dp × quota × time` over its options); ties go to the first in
///   topological order. A model with several disconnected parts has no joint module; then the
///   module with the most work overall. (OFASys: `llm`; CLIP: the contrastive head `align`,
///   where the two towers meet; a chain `vision → llm → head`: `llm`.)
/// - **Heads** (DistTrain's generators): every module after the backbone.
/// - **Encoders**: all other modules — those before the backbone and side branches that do not
///   depend on it.
///
/// The three sets partition the modules, and they run in the order encoders → backbone →
/// heads without breaking a dependency: encoders are closed under producers (a producer of an
/// encoder cannot be the backbone or after it), and the backbone's producers are all encoders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Roles {
    /// Modules before the backbone (and side branches independent of it).
    pub encoders: ModuleSet,
    /// The backbone: one module.
    pub backbone: ModuleSet,
    /// Modules after the backbone.
    pub heads: ModuleSet,
}

/// The groups of `model` (see [`Roles`]).
pub fn roles(model: &PerfModel) -> Roles {
    let n = model.modules.len();
    let all = ModuleSet::all(n);
    let sources = (0..n)
        .filter(|&m| model.modules[m].parents.is_empty())
        .fold(ModuleSet::EMPTY, |s, m| s.union(ModuleSet::single(m)));
    let joint = |m: usize| {
        sources
            .minus(model.modules[m].ancestors.union(ModuleSet::single(m)))
            .is_empty()
    };
    let work = |m: usize| {
        model.modules[m]
            .options
            .iter()
            .map(|o| o.dp as f64 * o.sm * o.time_ms)
            .fold(f64::INFINITY, f64::min)
    };
    let any_joint = (0..n).any(joint);
    let mut backbone = model.topo_order[0];
    let mut most = f64::NEG_INFINITY;
    for &m in &model.topo_order {
        if (!any_joint || joint(m)) && work(m) > most {
            most = work(m);
            backbone = m;
        }
    }
    let heads = (0..n)
        .filter(|&m| model.modules[m].ancestors.contains(backbone))
        .fold(ModuleSet::EMPTY, |s, m| s.union(ModuleSet::single(m)));
    let backbone = ModuleSet::single(backbone);
    Roles {
        encoders: all.minus(backbone).minus(heads),
        backbone,
        heads,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{model, module};

    fn names(model: &PerfModel, set: ModuleSet) -> Vec<&str> {
        set.iter().map(|m| model.modules[m].name.as_str()).collect()
    }

    #[test]
    fn ofasys_like_clip_like_and_chain() {
        // Three encoders into an LLM with two heads; the LLM is not the biggest module.
        let m = model(
            vec![
                module("text", &[], &[(1, 50.0)]),
                module("vision", &[], &[(1, 500.0)]),
                module("audio", &[], &[(1, 40.0)]),
                module("llm", &["text", "vision", "audio"], &[(1, 300.0)]),
                module("speech", &["llm"], &[(1, 20.0)]),
                module("motion", &["llm"], &[(1, 20.0)]),
            ],
            80.0,
        );
        let r = roles(&m);
        assert_eq!(names(&m, r.encoders), ["text", "vision", "audio"]);
        assert_eq!(names(&m, r.backbone), ["llm"]);
        assert_eq!(names(&m, r.heads), ["speech", "motion"]);

        // CLIP: the towers meet in the contrastive head, which is the backbone.
        let m = model(
            vec![
                module("vision", &[], &[(1, 100.0)]),
                module("text", &[], &[(1, 60.0)]),
                module("align", &["vision", "text"], &[(1, 1.0)]),
            ],
            80.0,
        );
        let r = roles(&m);
        assert_eq!(names(&m, r.encoders), ["vision", "text"]);
        assert_eq!(names(&m, r.backbone), ["align"]);
        assert!(r.heads.is_empty());

        // A chain: every module is joint; the biggest is the backbone.
        let m = model(
            vec![
                module("vision", &[], &[(1, 100.0)]),
                module("llm", &["vision"], &[(1, 300.0)]),
                module("head", &["llm"], &[(1, 10.0)]),
            ],
            80.0,
        );
        let r = roles(&m);
        assert_eq!(names(&m, r.encoders), ["vision"]);
        assert_eq!(names(&m, r.backbone), ["llm"]);
        assert_eq!(names(&m, r.heads), ["head"]);
    }
}
