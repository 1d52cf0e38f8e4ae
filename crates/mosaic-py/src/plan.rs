//! `mosaic.plan()`, `mosaic.Plan` (a `mosaic-plan/1` document) and `mosaic.compare()`.

use std::path::PathBuf;
use std::time::Duration;

use mosaic_compare::{CompareError, CompareOptions, Strategy};
use mosaic_plan::{PlanError, Search, SolveOptions};
use mosaic_profile::{PerfModel, ProfileError, MAX_QUOTA_UNITS};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::profile::Profile;
use crate::{detached, error, files, guarded, guarded_py, json};

/// A temporal-spatial plan: a validated ``mosaic-plan/1`` document (the README's "File
/// formats"): stages that run one after another on the whole pool, and in each stage every
/// module's data-parallel degree, SM quota, GPUs and predicted time.
///
/// ``plan()`` makes one; ``Plan.from_file``, ``from_dict`` and ``from_json`` read one back
/// (the same reader as ``mosaic simulate --plan``; a plan is checked against its model only
/// when it is simulated). ``str(plan)`` is a table like ``mosaic plan`` prints.
#[pyclass(module = "mosaic", name = "Plan", frozen)]
#[derive(Clone)]
pub struct Plan {
    pub(crate) plan: mosaic_plan::Plan,
    /// What errors call it: the file, the dict's name, or `profile-name (plan)`.
    pub(crate) name: String,
    /// The header of `str(plan)`.
    label: String,
}

impl Plan {
    fn parse(text: &str, name: &str) -> Result<Plan, String> {
        let plan = mosaic_plan::parse_plan(text, name).map_err(|e| e.to_string())?;
        Ok(Plan::read(plan, name))
    }

    /// A plan read from `name`, labelled as the command labels its input.
    fn read(plan: mosaic_plan::Plan, name: &str) -> Plan {
        let label = match (&plan.model, &plan.cluster) {
            (Some(m), Some(c)) => format!("{m} on {c}"),
            _ => name.to_string(),
        };
        Plan {
            plan,
            name: name.to_string(),
            label,
        }
    }

    /// The plan `obj` stands for: a `Plan`, a dict or a path.
    pub(crate) fn from_any(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Plan> {
        if let Ok(p) = obj.cast::<Plan>() {
            return Ok(p.get().clone());
        }
        if obj.is_instance_of::<PyDict>() {
            return Plan::from_dict(obj, "<dict>");
        }
        if let Ok(path) = obj.extract::<PathBuf>() {
            return Plan::from_file(path);
        }
        Err(error(format!(
            "{what}: expected a mosaic.Plan, a dict or a file path, found {}",
            obj.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        )))
    }
}

#[pymethods]
impl Plan {
    /// Reads a dict shaped like a ``mosaic-plan/1`` file (``Plan.to_dict()`` gives one);
    /// ``name`` stands for the file in error messages, which name the field at fault.
    #[staticmethod]
    #[pyo3(signature = (d, name = "<dict>"))]
    fn from_dict(d: &Bound<'_, PyAny>, name: &str) -> PyResult<Plan> {
        guarded_py(|| {
            let text = json::document(d, name, "(file)", "mosaic-plan/1").map_err(error)?;
            Plan::parse(&text, name)
                .map_err(json::without_position)
                .map_err(error)
        })
    }

    /// Reads the text of a ``mosaic-plan/1`` file.
    #[staticmethod]
    #[pyo3(signature = (text, name = "<json>"))]
    fn from_json(text: &str, name: &str) -> PyResult<Plan> {
        guarded(|| Plan::parse(text, name)).map_err(error)
    }

    /// Reads a ``mosaic-plan/1`` file (``mosaic plan --out``, ``Plan.write``).
    #[staticmethod]
    fn from_file(path: PathBuf) -> PyResult<Plan> {
        guarded(|| {
            let plan = mosaic_plan::load_plan(&path).map_err(|e| e.to_string())?;
            Ok(Plan::read(plan, &path.display().to_string()))
        })
        .map_err(error)
    }

    /// The plan as a dict: the ``mosaic-plan/1`` document (``Plan.from_dict`` reads it back).
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        guarded_py(|| json::ser_to_py(py, &self.plan))
    }

    /// The plan as ``mosaic-plan/1`` JSON text, as ``mosaic plan --json`` prints it.
    fn to_json(&self) -> PyResult<String> {
        guarded(|| files::pretty(&self.plan)).map_err(error)
    }

    /// Writes the plan as a ``mosaic-plan/1`` file (``mosaic simulate --plan`` and ``mosaic
    /// train --plan`` read it). Raises ``MosaicError`` naming the file if it cannot be
    /// written.
    fn write(&self, path: PathBuf) -> PyResult<()> {
        guarded(|| {
            files::check_output("path", &path)?;
            files::write(&path, &files::pretty(&self.plan)?)
        })
        .map_err(error)
    }

    /// Predicted iteration time in ms: the sum of the stage times.
    #[getter]
    fn iteration_ms(&self) -> f64 {
        self.plan.iteration_ms
    }

    /// Whether the plan is proven optimal for its profiles and pool.
    #[getter]
    fn optimal(&self) -> bool {
        self.plan.optimal
    }

    /// A proven lower bound on every plan's iteration time in ms (the plan is within
    /// ``iteration_ms / lower_bound_ms - 1`` of the optimum), or None when none was computed.
    #[getter]
    fn lower_bound_ms(&self) -> Option<f64> {
        self.plan.lower_bound_ms
    }

    /// Wall-clock solve time in ms.
    #[getter]
    fn solve_ms(&self) -> f64 {
        self.plan.solve_ms
    }

    /// The search that found the plan: ``gahc``, ``local`` or ``exact`` (other tools' names
    /// for baselines).
    #[getter]
    fn search(&self) -> &str {
        &self.plan.search
    }

    /// GPUs in the pool.
    #[getter]
    fn gpus(&self) -> u32 {
        self.plan.gpus
    }

    /// The device the profiles describe.
    #[getter]
    fn device(&self) -> &str {
        &self.plan.device
    }

    /// The quota step, as a fraction of a GPU.
    #[getter]
    fn granularity(&self) -> f64 {
        self.plan.granularity
    }

    /// SMs per GPU when the device has an SM partition rule (every quota is then a whole
    /// number of them, ``sm × sm_count``), else None.
    #[getter]
    fn sm_count(&self) -> Option<u32> {
        self.plan.sm_count
    }

    /// The built-in model planned (a ``Profile.zoo`` profile), else None.
    #[getter]
    fn model(&self) -> Option<String> {
        self.plan.model.clone()
    }

    /// The built-in cluster planned for (a ``Profile.zoo`` profile), else None.
    #[getter]
    fn cluster(&self) -> Option<String> {
        self.plan.cluster.clone()
    }

    /// The stages in execution order, as in the ``mosaic-plan/1`` file: a list of dicts with
    /// ``time_ms``, ``gpu_quota`` (per GPU) and ``modules`` (each with ``name``, ``dp``,
    /// ``sm``, ``gpus``, ``time_ms``, ``base_ms``, ``mem_gib``, and ``nodes`` when the profile
    /// has nodes).
    #[getter]
    fn stages(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        guarded_py(|| json::ser_to_py(py, &self.plan.stages))
    }

    /// What error messages call this plan: its file, its dict's name, or the profile's.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    fn __str__(&self) -> PyResult<String> {
        guarded(|| Ok(mosaic_plan::render::plan_table(&self.plan, &self.label))).map_err(error)
    }

    fn __repr__(&self) -> String {
        let proof = if self.plan.optimal {
            ", optimal".to_string()
        } else {
            match self.plan.lower_bound_ms {
                Some(b) if b > 0.0 => format!(
                    ", within {:.1} % of optimal",
                    100.0 * (self.plan.iteration_ms / b - 1.0)
                ),
                _ => String::new(),
            }
        };
        format!(
            "<mosaic.Plan {}: {:.3} ms in {} stage(s) on {} × {}{proof}>",
            self.label,
            self.plan.iteration_ms,
            self.plan.stages.len(),
            self.plan.gpus,
            self.plan.device
        )
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<Plan>()
            .is_ok_and(|o| o.get().plan == self.plan)
    }

    #[classattr]
    const __hash__: Option<Py<PyAny>> = None;
}

/// Refuses a `granularity` that is no quota step (the command's `--granularity` rule).
fn check_granularity(g: f64) -> Result<(), String> {
    let units = (1.0 / g).round();
    if g > 0.0 && g <= 1.0 && (units * g - 1.0).abs() <= 1e-9 && units <= MAX_QUOTA_UNITS as f64 {
        return Ok(());
    }
    Err(format!(
        "granularity: expected a quota step in [1/{MAX_QUOTA_UNITS}, 1] that divides 1 (e.g. \
         0.1, 0.05), found {g}"
    ))
}

/// The pool size: `gpus`, or the zoo cluster's (the command's `--gpus` rule).
fn pool(profile: &Profile, gpus: Option<i64>) -> Result<u32, String> {
    match gpus {
        Some(g) if g < 1 => Err(format!("gpus: expected at least 1 GPU, found {g}")),
        Some(g) => u32::try_from(g)
            .ok()
            .filter(|&g| g <= mosaic_plan::MAX_GPUS)
            .ok_or_else(|| {
                format!(
                    "gpus: expected at most {} GPUs (the largest pool the planner takes), found {g}",
                    mosaic_plan::MAX_GPUS
                )
            }),
        None => match &profile.zoo {
            Some(z) => mosaic_zoo::cluster(&z.cluster)
                .map(|c| c.gpus())
                .map_err(|e| e.to_string()),
            None => Err(format!(
                "gpus: required for {} (only a Profile.zoo profile knows its cluster's size)",
                profile.name
            )),
        },
    }
}

/// A time budget in ms as a duration.
fn budget(ms: i64, what: &str) -> Result<Duration, String> {
    u64::try_from(ms)
        .map(Duration::from_millis)
        .map_err(|_| format!("{what}: expected a time in ms ≥ 0, found {ms}"))
}

/// The performance model of `profile` at `granularity`, as the command builds it.
fn perf_model(profile: &Profile, granularity: f64) -> Result<PerfModel, String> {
    check_granularity(granularity)?;
    PerfModel::new(&profile.file, granularity, &profile.name).map_err(|e| match e {
        ProfileError::Invalid { field, message, .. } if field == "granularity" => {
            format!("granularity: {message}")
        }
        other => other.to_string(),
    })
}

/// Plans ``profile`` on ``gpus`` GPUs: stages, and per module its data-parallel degree, SM
/// quota and GPUs, as ``mosaic plan`` does (the README's "The solver").
///
/// ``profile``: a ``Profile`` (or a dict or a path, read as ``Profile.from_dict`` /
/// ``from_file`` would). ``gpus``: the pool size; defaults to the cluster's for a
/// ``Profile.zoo`` profile, else required. ``search``: ``"gahc"`` (the paper's Alg. 1),
/// ``"exact"`` (then local moves and the exact search until it proves the optimum) or
/// ``"auto"`` (the exact search only where it may finish). ``time_budget_ms``: the deadline;
/// the plan returned is the best found by then, with what was proven about it
/// (``Plan.optimal``, ``Plan.lower_bound_ms``). ``granularity``: the quota step, only for
/// devices without an SM partition rule. Releases the GIL while it solves.
///
/// Raises ``MosaicError`` for a bad argument or a profile that cannot be planned (a module
/// that fits on no GPU names ``modules[i].samples``).
#[pyfunction]
#[pyo3(signature = (profile, gpus = None, search = "auto", time_budget_ms = 2000, granularity = 0.1))]
pub(crate) fn plan(
    py: Python<'_>,
    profile: &Bound<'_, PyAny>,
    gpus: Option<i64>,
    search: &str,
    time_budget_ms: i64,
    granularity: f64,
) -> PyResult<Plan> {
    let profile = Profile::from_any(profile, "profile")?;
    detached(py, || {
        let search = match search {
            "gahc" => Search::Gahc,
            "exact" => Search::Exact,
            "auto" => Search::Auto,
            other => {
                return Err(format!(
                    "search: expected \"gahc\", \"exact\" or \"auto\", found \"{other}\""
                ))
            }
        };
        let gpus = pool(&profile, gpus)?;
        let opts = SolveOptions {
            search,
            budget: budget(time_budget_ms, "time_budget_ms")?,
        };
        let model = perf_model(&profile, granularity)?;
        let mut plan = mosaic_plan::solve(&model, gpus, &opts).map_err(|e| {
            let field = match &e {
                PlanError::Unplaceable { module, .. } => model
                    .index_of(module)
                    .map(|i| format!(": field `modules[{i}].samples`"))
                    .unwrap_or_default(),
                _ => String::new(),
            };
            format!("{}{field}: no plan: {e}", profile.name)
        })?;
        plan.model = profile.zoo.as_ref().map(|z| z.model.clone());
        plan.cluster = profile.zoo.as_ref().map(|z| z.cluster.clone());
        Ok(Plan {
            plan,
            name: format!("{} (plan)", profile.name),
            label: profile.label(),
        })
    })
}

/// Compares Mosaic with Megatron-LM, DistMM, Spindle, DistTrain and FlowTrain on the same
/// profiles and pool, as ``mosaic compare --json`` does.
///
/// Returns one dict per strategy, in the command's order: ``strategy`` (its key, e.g.
/// ``"mosaic-exact"``), ``name`` (e.g. ``"Mosaic (exact)"``), ``iteration_ms`` (per global
/// batch for the pipelined ones), ``pipelined``, ``mean_util``, ``min_util``, ``gpu_util``,
/// ``description`` (the plan in one line), ``note`` (or None), ``plan`` (the
/// ``mosaic-plan/1`` dict of a staged strategy, else None) and ``mosaic_exact_speedup`` (this
/// row's time over Mosaic (exact)'s).
///
/// ``gpus`` defaults to a zoo profile's cluster size; ``time_budget_ms`` bounds each exact
/// stage search (Mosaic's and DistMM's); ``global_batch`` (default: the zoo model's batch on
/// its cluster, else unknown) bounds DistTrain's microbatches; ``slice_sync_ms`` is Spindle's
/// cost per extra slice and ``step_overhead_ms`` DistTrain's fixed cost per microbatch step.
/// Data heterogeneity (``mosaic compare --samples/--generate``) is the command's only.
#[pyfunction]
#[pyo3(signature = (profile, gpus = None, time_budget_ms = 2000, global_batch = None, granularity = 0.1, slice_sync_ms = 2.0, step_overhead_ms = 2.0))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn compare(
    py: Python<'_>,
    profile: &Bound<'_, PyAny>,
    gpus: Option<i64>,
    time_budget_ms: i64,
    global_batch: Option<i64>,
    granularity: f64,
    slice_sync_ms: f64,
    step_overhead_ms: f64,
) -> PyResult<Py<PyAny>> {
    let profile = Profile::from_any(profile, "profile")?;
    let rows = detached(py, || {
        for (what, v) in [
            ("slice_sync_ms", slice_sync_ms),
            ("step_overhead_ms", step_overhead_ms),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{what}: expected a time ≥ 0 in ms, found {v}"));
            }
        }
        let global_batch = match global_batch {
            Some(b) => Some(u32::try_from(b).ok().filter(|&b| b >= 1).ok_or_else(|| {
                format!(
                    "global_batch: expected 1 to {} samples, found {b}",
                    u32::MAX
                )
            })?),
            None => match &profile.zoo {
                Some(z) => {
                    let model = mosaic_zoo::model(&z.model).map_err(|e| e.to_string())?;
                    let cluster = mosaic_zoo::cluster(&z.cluster).map_err(|e| e.to_string())?;
                    Some(model.batch_on(&cluster))
                }
                None => None,
            },
        };
        let gpus = pool(&profile, gpus)?;
        let opts = CompareOptions {
            budget: budget(time_budget_ms, "time_budget_ms")?,
            slice_sync_ms,
            step_overhead_ms,
            global_batch,
        };
        let model = perf_model(&profile, granularity)?;
        let rows = mosaic_compare::compare(&model, gpus, &opts).map_err(|e| match e {
            CompareError::NoGpus
            | CompareError::NoWholeGpu { .. }
            | CompareError::NoFit { .. }
            | CompareError::Plan {
                source: PlanError::Unplaceable { .. } | PlanError::TooManyGpus { .. },
                ..
            } => format!("{}: {e}", profile.name),
            other => format!("{}: no comparison: {other}", profile.name),
        })?;
        let mosaic_ms = rows
            .iter()
            .find(|r| r.strategy == Strategy::MosaicExact)
            .map(|r| r.iteration_ms)
            .ok_or("internal error: compare reported no Mosaic (exact) row")?;
        rows.iter()
            .map(|r| {
                let mut v = serde_json::to_value(r).map_err(|e| e.to_string())?;
                if let Some(map) = v.as_object_mut() {
                    map.entry("note").or_insert(serde_json::Value::Null);
                    map.insert(
                        "mosaic_exact_speedup".into(),
                        serde_json::json!(r.iteration_ms / mosaic_ms),
                    );
                }
                Ok(v)
            })
            .collect::<Result<Vec<_>, String>>()
    })?;
    guarded_py(|| {
        let list = PyList::empty(py);
        for r in &rows {
            list.append(json::to_py(py, r)?)?;
        }
        Ok(list.into_any().unbind())
    })
}
