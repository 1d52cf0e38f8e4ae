//! `mosaic.Profile` (a `mosaic-profiles/1` document) and `mosaic.Colocations` (a
//! `mosaic-colocations/1` document).

use std::path::PathBuf;

use mosaic_profile::{ColocationFile, Interference, ProfileFile};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::{error, files, guarded, guarded_py, json};

/// The built-in model and cluster a profile was generated for (`Profile.zoo`).
#[derive(Clone, Debug)]
pub(crate) struct Zoo {
    pub model: String,
    pub cluster: String,
}

/// Profiles of a multimodal model's modules: a validated ``mosaic-profiles/1`` document (the
/// README's "File formats"), the planner's input.
///
/// Make one with ``Profile.from_dict``, ``Profile.from_file``, ``Profile.from_json`` or
/// ``Profile.zoo`` (the analytical profile of a built-in model, as ``mosaic profile``). Every
/// constructor validates as the ``mosaic`` command does and raises ``MosaicError`` naming the
/// file (or the dict's ``name``) and the field, e.g. ``<dict>: field
/// `modules[0].samples[0].sm`: expected an SM quota in (0, 1]``. A Profile is immutable.
#[pyclass(module = "mosaic", name = "Profile", frozen)]
#[derive(Clone)]
pub struct Profile {
    pub(crate) file: ProfileFile,
    /// What errors call it: the file, the dict's name, or `model@cluster`.
    pub(crate) name: String,
    pub(crate) zoo: Option<Zoo>,
}

impl Profile {
    /// Parses and validates `text` as the command reads a file.
    fn parse(text: &str, name: &str, zoo: Option<Zoo>) -> Result<Profile, String> {
        let file = mosaic_profile::parse(text, name).map_err(|e| e.to_string())?;
        Ok(Profile {
            file,
            name: name.to_string(),
            zoo,
        })
    }

    /// The profile `obj` stands for: a `Profile`, a dict (validated as `from_dict` does) or a
    /// path (as `from_file`); `what` names the argument in errors.
    pub(crate) fn from_any(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Profile> {
        if let Ok(p) = obj.cast::<Profile>() {
            return Ok(p.get().clone());
        }
        if obj.is_instance_of::<PyDict>() {
            return Profile::from_dict(obj, "<dict>");
        }
        if let Ok(path) = obj.extract::<PathBuf>() {
            return Profile::from_file(path);
        }
        Err(error(format!(
            "{what}: expected a mosaic.Profile, a dict or a file path, found {}",
            obj.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        )))
    }

    /// The label the command prints in headers: `ofasys on h100x8`, or the file name.
    pub(crate) fn label(&self) -> String {
        match &self.zoo {
            Some(z) => format!("{} on {}", z.model, z.cluster),
            None => self.name.clone(),
        }
    }
}

#[pymethods]
impl Profile {
    /// Validates a dict shaped like a ``mosaic-profiles/1`` file (serialised to JSON and read
    /// by the same parser as ``mosaic plan --profiles``). ``name`` stands for the file in
    /// error messages. Raises ``MosaicError`` naming the field at fault; NaN, infinities,
    /// non-string keys and values JSON cannot hold are refused the same way.
    #[staticmethod]
    #[pyo3(signature = (d, name = "<dict>"))]
    pub(crate) fn from_dict(d: &Bound<'_, PyAny>, name: &str) -> PyResult<Profile> {
        guarded_py(|| {
            let text = json::document(d, name, "(root)", "mosaic-profiles/1").map_err(error)?;
            Profile::parse(&text, name, None)
                .map_err(json::without_position)
                .map_err(error)
        })
    }

    /// Validates the text of a ``mosaic-profiles/1`` file. ``name`` stands for the file in
    /// error messages.
    #[staticmethod]
    #[pyo3(signature = (text, name = "<json>"))]
    fn from_json(text: &str, name: &str) -> PyResult<Profile> {
        guarded(|| Profile::parse(text, name, None)).map_err(error)
    }

    /// Reads and validates a ``mosaic-profiles/1`` file (``str`` or ``os.PathLike``). A file
    /// that cannot be read raises ``MosaicError`` naming it.
    #[staticmethod]
    pub(crate) fn from_file(path: PathBuf) -> PyResult<Profile> {
        guarded(|| {
            let file = mosaic_profile::load(&path).map_err(|e| e.to_string())?;
            Ok(Profile {
                file,
                name: path.display().to_string(),
                zoo: None,
            })
        })
        .map_err(error)
    }

    /// The analytical profile of a built-in model on a built-in cluster, as ``mosaic profile
    /// --model MODEL --cluster CLUSTER`` writes it (``zoo_models()``, ``zoo_clusters()``; any
    /// ``<device>xN`` cluster works). The profile remembers both names: ``plan()`` then
    /// defaults to the cluster's GPUs and ``simulate()`` to its model and cluster.
    #[staticmethod]
    fn zoo(model: &str, cluster: &str) -> PyResult<Profile> {
        guarded(|| {
            let spec = mosaic_zoo::model(model).map_err(|e| e.to_string())?;
            let cluster = mosaic_zoo::cluster(cluster).map_err(|e| e.to_string())?;
            Ok(Profile {
                file: mosaic_zoo::profile(&spec, &cluster),
                name: format!("{}@{}", spec.name, cluster.name),
                zoo: Some(Zoo {
                    model: spec.name.clone(),
                    cluster: cluster.name.clone(),
                }),
            })
        })
        .map_err(error)
    }

    /// The profile as a dict (the ``mosaic-profiles/1`` document; ``from_dict`` reads it
    /// back).
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        guarded_py(|| json::ser_to_py(py, &self.file))
    }

    /// The profile as ``mosaic-profiles/1`` JSON text, as ``mosaic profile --out`` writes it.
    fn to_json(&self) -> PyResult<String> {
        guarded(|| files::pretty(&self.file)).map_err(error)
    }

    /// Writes the profile as a ``mosaic-profiles/1`` file (``mosaic plan --profiles`` reads
    /// it). Raises ``MosaicError`` naming the file if it cannot be written.
    fn write(&self, path: PathBuf) -> PyResult<()> {
        guarded(|| {
            files::check_output("path", &path)?;
            files::write(&path, &files::pretty(&self.file)?)
        })
        .map_err(error)
    }

    /// The same profile with the interference coefficients of Eq. 8 replaced (Δ = e1 +
    /// e2·ΣB + e3·ΠB; each in [0, 100]), validated again. ``mosaic.fit()`` returns the
    /// profile with the fitted coefficients already (its ``"profile"``).
    #[pyo3(signature = (e1, e2, e3))]
    fn with_interference(&self, e1: f64, e2: f64, e3: f64) -> PyResult<Profile> {
        guarded(|| {
            let mut file = self.file.clone();
            file.interference = Interference { e1, e2, e3 };
            let value = serde_json::to_value(&file).map_err(|e| e.to_string())?;
            if value
                .pointer("/interference/e1")
                .is_none_or(|v| v.is_null())
                || value
                    .pointer("/interference/e2")
                    .is_none_or(|v| v.is_null())
                || value
                    .pointer("/interference/e3")
                    .is_none_or(|v| v.is_null())
            {
                return Err(format!(
                    "{}: field `interference`: expected finite coefficients, found e1 = {e1}, \
                     e2 = {e2}, e3 = {e3}",
                    self.name
                ));
            }
            Profile::parse(&value.to_string(), &self.name, self.zoo.clone())
        })
        .map_err(error)
    }

    /// What error messages call this profile: the file, the dict's ``name``, or
    /// ``model@cluster`` for a zoo profile.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The module names, in the file's order.
    #[getter]
    fn modules(&self) -> Vec<String> {
        self.file.modules.iter().map(|m| m.name.clone()).collect()
    }

    /// The device the samples were taken on, as a dict (``name``, ``sm_count``,
    /// ``memory_gib``, and ``partition`` when the device has an SM partition rule).
    #[getter]
    fn device(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        guarded_py(|| json::ser_to_py(py, &self.file.device))
    }

    /// The interference coefficients as a dict ``{"e1", "e2", "e3"}``.
    #[getter]
    fn interference(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        guarded_py(|| json::ser_to_py(py, &self.file.interference))
    }

    /// The pool's node description (``gpus_per_node``, ``intra_gbps``, ``inter_gbps``), or
    /// None when the profile has none.
    #[getter]
    fn nodes(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        guarded_py(|| json::ser_to_py(py, &self.file.nodes))
    }

    /// Where the file came from (free text), or None.
    #[getter]
    fn source(&self) -> Option<String> {
        self.file.source.clone()
    }

    /// The built-in model of a ``Profile.zoo`` profile, else None.
    #[getter]
    fn zoo_model(&self) -> Option<String> {
        self.zoo.as_ref().map(|z| z.model.clone())
    }

    /// The built-in cluster of a ``Profile.zoo`` profile, else None.
    #[getter]
    fn zoo_cluster(&self) -> Option<String> {
        self.zoo.as_ref().map(|z| z.cluster.clone())
    }

    fn __repr__(&self) -> String {
        format!(
            "<mosaic.Profile {}: {} modules on {}>",
            self.name,
            self.file.modules.len(),
            self.file.device.name
        )
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<Profile>()
            .is_ok_and(|o| o.get().file == self.file)
    }

    // Defining __eq__ makes the class unhashable, as Python's own mutable-looking values.
    #[classattr]
    const __hash__: Option<Py<PyAny>> = None;
}

/// Colocation measurements: a validated ``mosaic-colocations/1`` document — modules that ran
/// side by side on the same GPUs and their measured times, what ``fit()`` fits the
/// interference coefficients to.
///
/// Make one with ``Colocations.from_dict``, ``from_file``, ``from_json``, or
/// ``simulate_colocations()`` (random colocations of a built-in model measured in the
/// simulator, as ``mosaic simulate colocations``). Invalid input raises ``MosaicError``
/// naming the field, e.g. ``samples[0].modules[1].sm``.
#[pyclass(module = "mosaic", name = "Colocations", frozen)]
#[derive(Clone)]
pub struct Colocations {
    pub(crate) file: ColocationFile,
    pub(crate) name: String,
}

impl Colocations {
    fn parse(text: &str, name: &str) -> Result<Colocations, String> {
        let file = mosaic_profile::parse_colocations(text, name).map_err(|e| e.to_string())?;
        Ok(Colocations {
            file,
            name: name.to_string(),
        })
    }

    /// The colocations `obj` stands for: `Colocations`, a dict or a path.
    pub(crate) fn from_any(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Colocations> {
        if let Ok(c) = obj.cast::<Colocations>() {
            return Ok(c.get().clone());
        }
        if obj.is_instance_of::<PyDict>() {
            return Colocations::from_dict(obj, "<dict>");
        }
        if let Ok(path) = obj.extract::<PathBuf>() {
            return Colocations::from_file(path);
        }
        Err(error(format!(
            "{what}: expected a mosaic.Colocations, a dict or a file path, found {}",
            obj.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        )))
    }
}

#[pymethods]
impl Colocations {
    /// Validates a dict shaped like a ``mosaic-colocations/1`` file; ``name`` stands for the
    /// file in error messages.
    #[staticmethod]
    #[pyo3(signature = (d, name = "<dict>"))]
    fn from_dict(d: &Bound<'_, PyAny>, name: &str) -> PyResult<Colocations> {
        guarded_py(|| {
            let text = json::document(d, name, "(root)", "mosaic-colocations/1").map_err(error)?;
            Colocations::parse(&text, name)
                .map_err(json::without_position)
                .map_err(error)
        })
    }

    /// Validates the text of a ``mosaic-colocations/1`` file.
    #[staticmethod]
    #[pyo3(signature = (text, name = "<json>"))]
    fn from_json(text: &str, name: &str) -> PyResult<Colocations> {
        guarded(|| Colocations::parse(text, name)).map_err(error)
    }

    /// Reads and validates a ``mosaic-colocations/1`` file.
    #[staticmethod]
    fn from_file(path: PathBuf) -> PyResult<Colocations> {
        guarded(|| {
            let file = mosaic_profile::load_colocations(&path).map_err(|e| e.to_string())?;
            Ok(Colocations {
                file,
                name: path.display().to_string(),
            })
        })
        .map_err(error)
    }

    /// The measurements as a dict (the ``mosaic-colocations/1`` document).
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        guarded_py(|| json::ser_to_py(py, &self.file))
    }

    /// The measurements as ``mosaic-colocations/1`` JSON text.
    fn to_json(&self) -> PyResult<String> {
        guarded(|| files::pretty(&self.file)).map_err(error)
    }

    /// Writes the measurements as a ``mosaic-colocations/1`` file (``mosaic fit
    /// --colocations`` reads it).
    fn write(&self, path: PathBuf) -> PyResult<()> {
        guarded(|| {
            files::check_output("path", &path)?;
            files::write(&path, &files::pretty(&self.file)?)
        })
        .map_err(error)
    }

    /// What error messages call these measurements: the file or the dict's ``name``.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The device the measurements were taken on (its profile-file name).
    #[getter]
    fn device(&self) -> &str {
        &self.file.device
    }

    /// Where the measurements come from (free text), or None.
    #[getter]
    fn source(&self) -> Option<String> {
        self.file.source.clone()
    }

    /// The number of colocations (samples).
    fn __len__(&self) -> usize {
        self.file.samples.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "<mosaic.Colocations {}: {} colocations on {}>",
            self.name,
            self.file.samples.len(),
            self.file.device
        )
    }
}
