//! `mosaic.simulate()`, `mosaic.simulate_colocations()` and `mosaic.fit()`.

use std::path::PathBuf;

use mosaic_fit::Model;
use mosaic_profile::PerfModel;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::plan::Plan;
use crate::profile::{Colocations, Profile, Zoo};
use crate::{detached, error, files, guarded_py, json};

/// Checks the optional output paths before any work.
fn check_outputs(outputs: &[(&str, &Option<PathBuf>)]) -> Result<(), String> {
    for (what, path) in outputs {
        if let Some(p) = path {
            files::check_output(what, p)?;
        }
    }
    Ok(())
}

/// Executes ``plan`` in the event-driven simulator, as ``mosaic simulate --plan`` does: the
/// simulated iteration against the plan's prediction, per stage and module, and the GPUs'
/// utilisation.
///
/// The simulator executes built-in models (its ground truth is the zoo's device model), so
/// it needs a zoo model and cluster: ``model`` and ``cluster`` when given, else those of
/// ``profile`` when it is a ``Profile.zoo`` profile, else the plan's own ``model`` and
/// ``cluster`` (set when it was planned from a zoo profile). A plan of a measured profile
/// thus needs ``model=`` and ``cluster=``. ``plan`` and ``profile`` may also be dicts or
/// file paths.
///
/// ``trace``: write the timeline as a Chrome trace (open it in ui.perfetto.dev);
/// ``svg``: write a picture of the simulated plan. Both paths are checked before the run.
///
/// Returns the ``mosaic-sim/1`` report as a dict (``mosaic simulate --json``):
/// ``iteration_ms`` (simulated), ``predicted_ms`` (the plan's), ``prediction_error``
/// (simulated / predicted - 1), ``stages`` (each module's predicted, alone and simulated
/// times), ``gpu_utilisation``, ``mean_utilisation``, ``min_utilisation``,
/// ``mean_occupancy``, ``timeline``; ``slices`` (every kernel segment, long) only with
/// ``slices=True``; and ``notes`` (e.g. a plan simulated on another cluster than planned).
/// Raises ``MosaicError`` when the plan does not match the model or the cluster, naming the
/// field.
#[pyfunction]
#[pyo3(signature = (plan, profile = None, cluster = None, trace = None, svg = None, model = None, slices = false))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn simulate(
    py: Python<'_>,
    plan: &Bound<'_, PyAny>,
    profile: Option<&Bound<'_, PyAny>>,
    cluster: Option<String>,
    trace: Option<PathBuf>,
    svg: Option<PathBuf>,
    model: Option<String>,
    slices: bool,
) -> PyResult<Py<PyAny>> {
    let plan = Plan::from_any(plan, "plan")?;
    let (zoo, profile_name): (Option<Zoo>, Option<String>) = match profile {
        Some(p) if !p.is_none() => {
            let p = Profile::from_any(p, "profile")?;
            (p.zoo, Some(p.name))
        }
        _ => (None, None),
    };
    let value = detached(py, || {
        check_outputs(&[("trace", &trace), ("svg", &svg)])?;
        let file = plan.name.as_str();
        let p = &plan.plan;
        let no_zoo = |what: &str, field: &str, arg: &str, list: &str| {
            let profile = match &profile_name {
                Some(n) => format!(", and the profile {n} is no Profile.zoo profile"),
                None => String::new(),
            };
            format!(
                "{file}: the plan names no {what} (field `{field}`){profile}; give {arg}=NAME \
                 (see mosaic.{list}()): the simulator executes built-in models"
            )
        };
        let model_name = model
            .clone()
            .or(zoo.as_ref().map(|z| z.model.clone()))
            .or(p.model.clone())
            .ok_or_else(|| no_zoo("model", "model", "model", "zoo_models"))?;
        let cluster_name = cluster
            .clone()
            .or(zoo.as_ref().map(|z| z.cluster.clone()))
            .or(p.cluster.clone())
            .ok_or_else(|| no_zoo("cluster", "cluster", "cluster", "zoo_clusters"))?;
        let spec = mosaic_zoo::model(&model_name).map_err(|e| e.to_string())?;
        let cluster = mosaic_zoo::cluster(&cluster_name).map_err(|e| e.to_string())?;
        let mut notes = Vec::new();
        for (what, planned, used) in [
            ("model", &p.model, &spec.name),
            ("cluster", &p.cluster, &cluster.name),
        ] {
            if let Some(planned) = planned.as_ref().filter(|x| !x.eq_ignore_ascii_case(used)) {
                notes.push(format!(
                    "{file} was planned for {what} {planned}; simulating it on {used}"
                ));
            }
        }
        let report = mosaic_sim::simulate(p, file, &spec, &cluster).map_err(|e| e.to_string())?;
        if let Some(path) = &trace {
            let text = serde_json::to_string(&mosaic_sim::chrome_trace(&report))
                .map_err(|e| e.to_string())?
                + "\n";
            files::write(path, &text)?;
        }
        if let Some(path) = &svg {
            files::write(path, &mosaic_sim::svg(&report))?;
        }
        let mut value = serde_json::to_value(&report).map_err(|e| e.to_string())?;
        if let Some(map) = value.as_object_mut() {
            if !slices {
                map.remove("slices");
            }
            map.insert("notes".into(), serde_json::json!(notes));
        }
        Ok(value)
    })?;
    guarded_py(|| json::to_py(py, &value))
}

/// Random colocations of a built-in model's modules measured on one simulated GPU of a
/// built-in cluster, as ``mosaic simulate colocations`` writes them: ``count`` (1 to
/// 100,000) colocations of 2–8 modules each at dp 1, quotas in whole SM partitions of the
/// device that fit one GPU together; the same ``seed`` gives the same measurements. The data
/// ``fit()`` fits the interference coefficients to.
#[pyfunction]
#[pyo3(signature = (model, cluster, count, seed = 1))]
pub(crate) fn simulate_colocations(
    py: Python<'_>,
    model: String,
    cluster: String,
    count: i64,
    seed: u64,
) -> PyResult<Colocations> {
    detached(py, || {
        if !(1..=100_000).contains(&count) {
            return Err(format!(
                "count: expected 1 to 100000 colocations, found {count}"
            ));
        }
        let spec = mosaic_zoo::model(&model).map_err(|e| e.to_string())?;
        let cluster = mosaic_zoo::cluster(&cluster).map_err(|e| e.to_string())?;
        let name = format!("{}@{}", spec.name, cluster.name);
        let perf = PerfModel::new(&mosaic_zoo::profile(&spec, &cluster), 0.1, &name)
            .map_err(|e| e.to_string())?;
        let file = mosaic_sim::random_colocations(&spec, &cluster, &perf, count as usize, seed);
        Ok(Colocations {
            file,
            name: format!("{name} colocations (seed {seed})"),
        })
    })
}

// The default of `holdout_every` above is the command's.
const _: () = assert!(mosaic_fit::HOLDOUT_EVERY == 5);

/// Fits the interference coefficients e1, e2, e3 of Eq. 8 to colocation measurements and
/// measures the performance model's accuracy, as ``mosaic fit --json`` does (without its
/// end-to-end plans: plan and simulate the fitted profile for those).
///
/// ``profile``: the profiles the measurements are fitted against (a ``Profile``, dict or
/// path); ``colocations``: a ``Colocations`` (or dict or path). Every ``holdout_every``-th
/// sample (≥ 2; 5 as the command) is held out to test on. ``out``: also write the fitted
/// profile (``mosaic fit --out``); ``svg``: the predicted-vs-measured scatter plot.
///
/// Returns a dict: ``interference`` (the full model's fitted ``{"e1", "e2", "e3"}``),
/// ``profile`` (a ``Profile`` with those coefficients, ready for ``plan()``: the only value
/// that is not plain JSON), ``fit`` (the ``mosaic-fit`` report: each model — unaware,
/// additive, full — with its coefficients and train/test accuracy: R², mean and max relative
/// error, by number of co-located modules), ``surface`` (the scaling surface's
/// leave-one-out error, its error against the dense device model for a zoo profile, and the
/// profiling cost), and ``profiles`` / ``colocations`` (what was fitted).
#[pyfunction]
#[pyo3(signature = (profile, colocations, holdout_every = 5, out = None, svg = None))]
pub(crate) fn fit(
    py: Python<'_>,
    profile: &Bound<'_, PyAny>,
    colocations: &Bound<'_, PyAny>,
    holdout_every: i64,
    out: Option<PathBuf>,
    svg: Option<PathBuf>,
) -> PyResult<Py<PyAny>> {
    let profile = Profile::from_any(profile, "profile")?;
    let colocations = Colocations::from_any(colocations, "colocations")?;
    let (value, fitted) = detached(py, || {
        check_outputs(&[("out", &out), ("svg", &svg)])?;
        let every = usize::try_from(holdout_every)
            .ok()
            .filter(|&n| n >= 2)
            .ok_or_else(|| format!("holdout_every: expected 2 or more, found {holdout_every}"))?;
        let perf = PerfModel::new(&profile.file, mosaic_fit::LOOKUP_GRANULARITY, &profile.name)
            .map_err(|e| e.to_string())?;
        let obs = mosaic_fit::observations(&perf, &colocations.file, &colocations.name)
            .map_err(|e| e.to_string())?;
        let report = mosaic_fit::evaluate(&obs, every);
        mosaic_fit::check_fitted(&report, &obs, &colocations.name).map_err(|e| e.to_string())?;
        let zoo = match &profile.zoo {
            Some(z) => Some((
                mosaic_zoo::model(&z.model).map_err(|e| e.to_string())?,
                mosaic_zoo::cluster(&z.cluster).map_err(|e| e.to_string())?,
            )),
            None => None,
        };
        let truth = zoo.as_ref().map(|(model, cluster)| {
            let cal = mosaic_zoo::Calibration::default();
            move |i: usize, dp: u32, sm: f64| cal.estimate(model, i, cluster, dp, sm).time_ms
        });
        let surface = serde_json::json!({
            "leave_one_out": mosaic_fit::leave_one_out(&profile.file),
            "dense": truth
                .as_ref()
                .map(|t| mosaic_fit::dense_error(&profile.file, mosaic_fit::DENSE_STEP, t)),
            "cost": mosaic_fit::profiling_cost(
                &profile.file,
                mosaic_fit::DENSE_STEP,
                None,
                mosaic_fit::PROFILED_ITERATIONS,
                truth.as_ref().map(|t| t as &dyn Fn(usize, u32, f64) -> f64),
            ),
        });
        let e = report.model(Model::Full).interference;
        let fitted = mosaic_fit::write_fitted(&profile.file, e);
        if let Some(path) = &out {
            files::write(path, &files::pretty(&fitted)?)?;
        }
        if let Some(path) = &svg {
            let title = report.scatter_title(&profile.name, &colocations.name);
            let text = mosaic_fit::scatter_svg(&title, &mosaic_fit::scatter_series(&report, &obs));
            files::write(path, &text)?;
        }
        let value = serde_json::json!({
            "profiles": profile.name,
            "colocations": colocations.name,
            "interference": e,
            "fit": report,
            "surface": surface,
        });
        let fitted = Profile {
            file: fitted,
            name: profile.name.clone(),
            zoo: profile.zoo.clone(),
        };
        Ok((value, fitted))
    })?;
    guarded_py(|| {
        let dict = json::to_py(py, &value)?;
        dict.bind(py)
            .cast::<PyDict>()
            .map_err(|e| error(e.to_string()))?
            .set_item("profile", Bound::new(py, fitted)?)?;
        Ok(dict)
    })
}
