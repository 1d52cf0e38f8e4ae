//! Python bindings of the Mosaic planner: the `mosaic._core` extension module of the
//! `mosaic-rs` package (`pip install .` at the repository root; `import mosaic`).
//!
//! Every function validates its input exactly as the `mosaic` command does — a dict is
//! serialised to JSON and read by the same parser as a file — and every bad input raises
//! `mosaic.MosaicError` (a `ValueError`) with the message the command prints: the file (or the
//! name given to a dict), the field path, what was expected. Nothing panics across the
//! boundary: each call runs under `catch_unwind`, and a panic becomes
//! `MosaicError("internal error: …")`. The long computations (planning, comparing,
//! simulating, fitting) release the GIL.
//!
//! The planner crates stay free of Python: this crate alone depends on pyo3.

mod files;
mod json;
mod plan;
mod profile;
mod sim;

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

pyo3::create_exception!(
    mosaic,
    MosaicError,
    PyValueError,
    "Bad input to Mosaic: a profile, plan or colocations document that does not validate, an \
     unknown zoo name, an argument out of range, a file that cannot be read or written. The \
     message is the one the `mosaic` command prints: the file (or the name given to a dict), \
     the field path such as `modules[0].samples[0].sm`, and what was expected. A subclass of \
     ValueError."
);

/// A `MosaicError` with `message`.
pub(crate) fn error(message: impl Into<String>) -> PyErr {
    MosaicError::new_err(message.into())
}

/// The text of a panic's payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// Runs `f`, turning a panic into the error `internal error: …` (Rust code only: no Python
/// objects, so that it may run with the GIL released).
pub(crate) fn guarded<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => Err(format!(
            "internal error: {} (please report it)",
            panic_message(payload.as_ref())
        )),
    }
}

/// Runs `f`, which may touch Python objects, turning a panic into `MosaicError("internal
/// error: …")`.
pub(crate) fn guarded_py<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => Err(error(format!(
            "internal error: {} (please report it)",
            panic_message(payload.as_ref())
        ))),
    }
}

/// Runs the pure-Rust `f` with the GIL released, under [`guarded`]; its error message becomes
/// a `MosaicError`.
pub(crate) fn detached<T: Send>(
    py: Python<'_>,
    f: impl FnOnce() -> Result<T, String> + Send,
) -> PyResult<T> {
    py.detach(|| guarded(f)).map_err(error)
}

/// The names of the built-in models (`mosaic zoo`), for `Profile.zoo(model, cluster)`.
#[pyfunction]
fn zoo_models() -> PyResult<Vec<String>> {
    guarded_py(|| Ok(mosaic_zoo::models().into_iter().map(|m| m.name).collect()))
}

/// The names of the built-in clusters (`mosaic zoo`), for `Profile.zoo(model, cluster)`.
///
/// Any `<device>x<N>` also works (e.g. `h100x24`, `a100x16`); the devices are those of
/// `zoo_devices()`.
#[pyfunction]
fn zoo_clusters() -> PyResult<Vec<String>> {
    guarded_py(|| Ok(mosaic_zoo::clusters().into_iter().map(|c| c.name).collect()))
}

/// The names of the built-in devices (`mosaic zoo`): the `<device>` of a `<device>x<N>`
/// cluster name.
#[pyfunction]
fn zoo_devices() -> PyResult<Vec<String>> {
    guarded_py(|| {
        Ok(mosaic_zoo::devices()
            .into_iter()
            .map(|d| d.short_name)
            .collect())
    })
}

/// Everything built in, as `mosaic zoo --json` prints it: a dict with `models` (each with
/// its modules and architecture), `devices` (datasheets) and `clusters`.
#[pyfunction]
fn zoo(py: Python<'_>) -> PyResult<Py<PyAny>> {
    guarded_py(|| {
        let all = serde_json::json!({
            "models": mosaic_zoo::models(),
            "devices": mosaic_zoo::devices(),
            "clusters": mosaic_zoo::clusters(),
        });
        json::to_py(py, &all)
    })
}

/// Panics inside the bindings, to test that a panic reaches Python as `MosaicError("internal
/// error: …")` and not as a crash (not part of the API).
#[pyfunction]
fn _panic_for_tests(py: Python<'_>) -> PyResult<()> {
    detached(py, || -> Result<(), String> {
        panic!("a deliberate panic")
    })
}

/// Mosaic: plans the training of multimodal models by temporal-spatial GPU multiplexing
/// (the Rust planner's bindings; import `mosaic`, not `mosaic._core`).
#[pymodule(name = "_core")]
fn core_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("MosaicError", m.py().get_type::<MosaicError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<profile::Profile>()?;
    m.add_class::<profile::Colocations>()?;
    m.add_class::<plan::Plan>()?;
    m.add_function(wrap_pyfunction!(plan::plan, m)?)?;
    m.add_function(wrap_pyfunction!(plan::compare, m)?)?;
    m.add_function(wrap_pyfunction!(sim::simulate, m)?)?;
    m.add_function(wrap_pyfunction!(sim::simulate_colocations, m)?)?;
    m.add_function(wrap_pyfunction!(sim::fit, m)?)?;
    m.add_function(wrap_pyfunction!(zoo_models, m)?)?;
    m.add_function(wrap_pyfunction!(zoo_clusters, m)?)?;
    m.add_function(wrap_pyfunction!(zoo_devices, m)?)?;
    m.add_function(wrap_pyfunction!(zoo, m)?)?;
    m.add_function(wrap_pyfunction!(_panic_for_tests, m)?)?;
    Ok(())
}
