//! Fitting Eq. 8's coefficients to observations, and how well each model predicts held-out
//! colocations (the paper's Figs. 8b and 12a).

use std::collections::BTreeMap;
use std::path::Path;

use mosaic_profile::Interference;
use serde::{Deserialize, Serialize};

use crate::error::FitError;
use crate::nnls::nnls;
use crate::observe::Observation;

/// The largest interference coefficient a profile may hold (`mosaic-profiles/1`: a slowdown of
/// 100× per unit of bandwidth is far past any measured colocation).
pub const MAX_COEFFICIENT: f64 = mosaic_profile::MAX_INTERFERENCE;

/// The value of [`FitReport::format`].
pub const REPORT_FORMAT: &str = "mosaic-fit/1";

/// Every [`HOLDOUT_EVERY`]-th sample (the 5th, 10th, …) is held out of the fit by default.
pub const HOLDOUT_EVERY: usize = 5;

/// The three performance models of the paper's ablation (§5.3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Model {
    /// Interference-unaware: the scaling surface alone (Δ = 0).
    Unaware,
    /// Additive only: Δ = e1 + e2·ΣB (e3 = 0), the linear model of LLMStation.
    Additive,
    /// The full Eq. 8: Δ = e1 + e2·ΣB + e3·ΠB.
    Full,
}

impl Model {
    /// The three, in the paper's order.
    pub const ALL: [Model; 3] = [Model::Unaware, Model::Additive, Model::Full];

    /// Short name, as in files and tables.
    pub fn name(self) -> &'static str {
        match self {
            Model::Unaware => "unaware",
            Model::Additive => "additive",
            Model::Full => "full",
        }
    }

    /// The model with its formula.
    pub fn describe(self) -> &'static str {
        match self {
            Model::Unaware => "interference-unaware (Δ = 0)",
            Model::Additive => "additive only (Δ = e1 + e2·ΣB)",
            Model::Full => "full Eq. 8 (Δ = e1 + e2·ΣB + e3·ΠB)",
        }
    }
}

/// Fits `model`'s coefficients to `obs`: one regression row per observation, the observed
/// slowdown `measured / f_m(dp, sm) − 1` against `[1, ΣB, ΠB]` (the columns the model uses),
/// by exact non-negative least squares ([`nnls`]) — the planner requires e ≥ 0. Least squares
/// on the slowdown is least squares on the relative error of the predicted time.
///
/// The unaware model has nothing to fit: zeros. No observations: zeros.
pub fn fit<'a>(obs: impl IntoIterator<Item = &'a Observation>, model: Model) -> Interference {
    let obs: Vec<&Observation> = obs.into_iter().collect();
    let y: Vec<f64> = obs.iter().map(|o| o.slowdown()).collect();
    match model {
        Model::Unaware => Interference::default(),
        Model::Additive => {
            let rows: Vec<[f64; 2]> = obs.iter().map(|o| [1.0, o.sum_bw()]).collect();
            let [e1, e2] = nnls(&rows, &y);
            Interference { e1, e2, e3: 0.0 }
        }
        Model::Full => {
            let rows: Vec<[f64; 3]> = obs.iter().map(|o| [1.0, o.sum_bw(), o.prod_bw()]).collect();
            let [e1, e2, e3] = nnls(&rows, &y);
            Interference { e1, e2, e3 }
        }
    }
}

/// How well predicted times match measured ones.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Accuracy {
    /// Observations (module-in-sample rows) compared.
    pub n: usize,
    /// Coefficient of determination of the predicted vs measured times: 1 − SS_res / SS_tot
    /// around the mean measured time. `None` with fewer than two observations or when every
    /// measured time is the same.
    pub r2: Option<f64>,
    /// The same for the slowdowns (`time / f_m − 1`), the part the interference term
    /// explains: times span three decades across modules, so R² of times is dominated by the
    /// largest modules and close to 1 for any model; this one is not.
    pub r2_slowdown: Option<f64>,
    /// Mean of |predicted − measured| / measured.
    pub mean_rel_err: f64,
    /// Largest |predicted − measured| / measured.
    pub max_rel_err: f64,
}

/// Coefficient of determination of `(measured, predicted)` pairs.
fn r_squared(pairs: &[(f64, f64)]) -> Option<f64> {
    if pairs.len() < 2 {
        return None;
    }
    let mean = pairs.iter().map(|p| p.0).sum::<f64>() / pairs.len() as f64;
    let ss_tot: f64 = pairs.iter().map(|p| (p.0 - mean).powi(2)).sum();
    let ss_res: f64 = pairs.iter().map(|p| (p.0 - p.1).powi(2)).sum();
    (ss_tot > 0.0).then(|| 1.0 - ss_res / ss_tot)
}

/// The accuracy of coefficients `e` on `obs`.
pub fn accuracy<'a>(obs: impl IntoIterator<Item = &'a Observation>, e: &Interference) -> Accuracy {
    let mut times = Vec::new();
    let mut slow = Vec::new();
    for o in obs {
        let p = o.predict(e);
        times.push((o.measured_ms, p));
        slow.push((o.slowdown(), p / o.base_ms - 1.0));
    }
    let rel: Vec<f64> = times.iter().map(|(m, p)| (p - m).abs() / m).collect();
    Accuracy {
        n: times.len(),
        r2: r_squared(&times),
        r2_slowdown: r_squared(&slow),
        mean_rel_err: mean(rel.iter().copied()),
        max_rel_err: rel.iter().copied().fold(f64::NAN, f64::max),
    }
}

/// Accuracy on the held-out samples with a given number of co-located modules (Fig. 12a's x axis).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ByModules {
    /// Modules per sample.
    pub modules: usize,
    /// Held-out samples with that many modules.
    pub samples: usize,
    /// Their mean measured slowdown (`measured / f_m(dp, sm) − 1`), whatever the model.
    pub mean_slowdown: f64,
    /// The accuracy on their observations.
    pub accuracy: Accuracy,
}

/// One model fitted on the training samples and evaluated on both sets.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelFit {
    /// Which model.
    pub model: Model,
    /// Its coefficients (fitted on the training samples).
    pub interference: Interference,
    /// Accuracy on the training samples.
    pub train: Accuracy,
    /// Accuracy on the held-out samples.
    pub test: Accuracy,
    /// Accuracy on the held-out samples, by number of co-located modules, ascending.
    pub by_modules: Vec<ByModules>,
}

/// The fit of the three models and their accuracy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FitReport {
    /// Always [`REPORT_FORMAT`].
    pub format: String,
    /// Colocation samples in all.
    pub samples: usize,
    /// Samples the coefficients were fitted on.
    pub train_samples: usize,
    /// Samples held out for [`ModelFit::test`].
    pub test_samples: usize,
    /// Every this-many-th sample is held out.
    pub holdout_every: usize,
    /// Whether the test set is really held out: with fewer samples than `holdout_every` it is
    /// empty, and the test figures are then those of the training samples.
    pub held_out: bool,
    /// Mean measured slowdown of the test observations (how much interference there is).
    pub mean_slowdown: f64,
    /// Largest measured slowdown of the test observations.
    pub max_slowdown: f64,
    /// The best slowdown R² on the test observations that *any* GPU-wide Δ could reach — one
    /// Δ for all modules of a colocation, as Eq. 8 gives — namely each sample's mean measured
    /// slowdown: the share of the variance that lies between samples rather than between the
    /// modules of one sample. `None` as for [`Accuracy::r2`].
    pub ceiling_r2_slowdown: Option<f64>,
    /// Unaware, additive, full.
    pub models: Vec<ModelFit>,
}

impl FitReport {
    /// The title of the predicted-vs-measured scatter plot of profiles `profiles` fitted to
    /// colocations `colocations`: how many samples it shows, held out or fitted.
    pub fn scatter_title(&self, profiles: &str, colocations: &str) -> String {
        let (count, which) = if self.held_out {
            (self.test_samples, "held-out")
        } else {
            (self.samples, "fitted")
        };
        format!("{profiles}: predicted vs measured, {count} {which} colocations ({colocations})")
    }

    /// The fit of `model`.
    pub fn model(&self, model: Model) -> &ModelFit {
        self.models
            .iter()
            .find(|m| m.model == model)
            .expect("every model is fitted")
    }
}

/// Whether sample `sample` is held out when every `every`-th sample is (never for `every` < 2).
pub fn is_held_out(sample: usize, every: usize) -> bool {
    every >= 2 && sample % every == every - 1
}

/// The observations [`evaluate`] tests on: those of the held-out samples, or all of them when
/// none is held out.
pub fn test_set(obs: &[Observation], every: usize) -> Vec<&Observation> {
    let test: Vec<&Observation> = obs
        .iter()
        .filter(|o| is_held_out(o.sample, every))
        .collect();
    if test.is_empty() {
        obs.iter().collect()
    } else {
        test
    }
}

/// Fits the three models on the samples that are not held out (every `every`-th sample is,
/// [`HOLDOUT_EVERY`] by default: a deterministic split that also spreads a file ordered by
/// module count evenly) and measures each on both sets, and by module count on the test set.
pub fn evaluate(obs: &[Observation], every: usize) -> FitReport {
    // sample → (modules, 1 if held out)
    let mut counts: BTreeMap<usize, (usize, usize)> = BTreeMap::new();
    for o in obs {
        counts.insert(o.sample, (o.modules, is_held_out(o.sample, every) as usize));
    }
    let test_samples = counts.values().filter(|c| c.1 == 1).count();
    let train: Vec<&Observation> = obs
        .iter()
        .filter(|o| !is_held_out(o.sample, every))
        .collect();
    let test = test_set(obs, every);
    let held_out = test_samples > 0;
    let models = Model::ALL
        .iter()
        .map(|&model| {
            let e = fit(train.iter().copied(), model);
            let mut groups: BTreeMap<usize, Vec<&Observation>> = BTreeMap::new();
            for &o in &test {
                groups.entry(o.modules).or_default().push(o);
            }
            let by_modules = groups
                .into_iter()
                .map(|(k, g)| {
                    let mut ids: Vec<usize> = g.iter().map(|o| o.sample).collect();
                    ids.dedup();
                    ByModules {
                        modules: k,
                        samples: ids.len(),
                        mean_slowdown: mean(g.iter().map(|o| o.slowdown())),
                        accuracy: accuracy(g, &e),
                    }
                })
                .collect();
            ModelFit {
                model,
                interference: e,
                train: accuracy(train.iter().copied(), &e),
                test: accuracy(test.iter().copied(), &e),
                by_modules,
            }
        })
        .collect();
    let mut by_sample: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    for o in &test {
        by_sample.entry(o.sample).or_default().push(o.slowdown());
    }
    let ceiling: Vec<(f64, f64)> = test
        .iter()
        .map(|o| (o.slowdown(), mean(by_sample[&o.sample].iter().copied())))
        .collect();
    FitReport {
        format: REPORT_FORMAT.to_string(),
        samples: counts.len(),
        train_samples: counts.len() - test_samples,
        test_samples,
        holdout_every: every,
        held_out,
        mean_slowdown: mean(test.iter().map(|o| o.slowdown())),
        max_slowdown: test.iter().map(|o| o.slowdown()).fold(f64::NAN, f64::max),
        ceiling_r2_slowdown: r_squared(&ceiling),
        models,
    }
}

/// Mean of `xs` (NaN when empty).
fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let (n, sum) = xs.fold((0usize, 0.0), |(n, s), x| (n + 1, s + x));
    sum / n as f64
}

/// Whether a profile can hold `v` as an interference coefficient: a number in [0,
/// [`MAX_COEFFICIENT`]].
fn holds(v: f64) -> bool {
    v.is_finite() && (0.0..=MAX_COEFFICIENT).contains(&v)
}

/// Eq. 8 fitted to `obs` ([`fit`]) by the fullest model — full, additive, else none — whose
/// coefficients a profile can hold: where the bandwidth utilisations are small (a CPU's), the
/// full model may fit ΠB's coefficient past [`MAX_COEFFICIENT`].
pub fn fit_holdable(obs: &[Observation]) -> (Model, Interference) {
    [Model::Full, Model::Additive]
        .into_iter()
        .map(|m| (m, fit(obs, m)))
        .find(|(_, e)| [e.e1, e.e2, e.e3].into_iter().all(holds))
        .unwrap_or((Model::Unaware, Interference::default()))
}

/// Refuses the fit of `report` (on observations `obs` of colocations file `file`) when a model's
/// fitted coefficient is one a profile cannot hold — above [`MAX_COEFFICIENT`] or not a number
/// — so that `mosaic fit` never writes a profile the planner refuses. The error names the
/// samples that drove it: the fitted samples with the largest measured slowdowns, the first
/// one's `time_ms` as the field.
pub fn check_fitted(
    report: &FitReport,
    obs: &[Observation],
    file: impl AsRef<Path>,
) -> Result<(), FitError> {
    for m in &report.models {
        let e = m.interference;
        let Some((name, v)) = [("e1", e.e1), ("e2", e.e2), ("e3", e.e3)]
            .into_iter()
            .find(|&(_, v)| !holds(v))
        else {
            continue;
        };
        // Each observation's field: its module's index within its sample.
        let mut fields = Vec::with_capacity(obs.len());
        let mut j = 0;
        for (i, o) in obs.iter().enumerate() {
            j = if i > 0 && obs[i - 1].sample == o.sample {
                j + 1
            } else {
                0
            };
            fields.push(format!("samples[{}].modules[{j}]", o.sample));
        }
        let mut fitted: Vec<usize> = (0..obs.len())
            .filter(|&i| !is_held_out(obs[i].sample, report.holdout_every))
            .collect();
        fitted.sort_by(|&a, &b| obs[b].slowdown().total_cmp(&obs[a].slowdown()));
        fitted.truncate(3);
        let drivers: Vec<String> = fitted
            .iter()
            .map(|&i| {
                let o = &obs[i];
                format!(
                    "{} (\"{}\" at dp {}, quota {:.4}: {:.6e} ms measured against {:.6e} ms \
                     profiled, slowdown {:.6e})",
                    fields[i],
                    o.module,
                    o.dp,
                    o.sm,
                    o.measured_ms,
                    o.base_ms,
                    o.slowdown()
                )
            })
            .collect();
        let field = fitted
            .first()
            .map_or("samples".to_string(), |&i| format!("{}.time_ms", fields[i]));
        return Err(FitError::invalid(
            file.as_ref(),
            field,
            format!(
                "the {} model fits {name} = {v:.4e}, but a profile's interference coefficients are at \
                 most {MAX_COEFFICIENT} (a slowdown of 100× per unit of bandwidth is past any \
                 real colocation), so no profile could hold it; the fitted samples with the \
                 largest slowdowns drive it: {}",
                m.model.describe(),
                drivers.join("; ")
            ),
        ));
    }
    Ok(())
}
