//! Python objects ↔ JSON values. A dict handed to `from_dict` becomes JSON text that the
//! crates' own parsers read, so it is validated exactly as a file is; what JSON cannot hold
//! (a NaN, a key that is no string, an object of another type, a dict that contains itself)
//! is refused here, naming the field as the parsers do.

use pyo3::exceptions::PyOverflowError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};

/// Nesting deeper than this is refused (serde_json's own limit when reading text is 128): a
/// dict or list that contains itself would otherwise recurse without end.
pub(crate) const MAX_DEPTH: usize = 128;

/// One step of a field path.
enum Step {
    Key(String),
    Index(usize),
}

/// The path as the parsers write it: `modules[0].samples[2].sm`, or `root` when empty.
fn path_text(path: &[Step], root: &str) -> String {
    let mut s = String::new();
    for step in path {
        match step {
            Step::Key(k) => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(k);
            }
            Step::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    if s.is_empty() {
        root.to_string()
    } else {
        s
    }
}

/// The Python type name of `obj`, for messages.
fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".into())
}

/// Converts `obj` (dicts, lists, tuples, str, int, float, bool, None, and objects with
/// `__index__`, `__float__` or `tolist()` such as NumPy scalars and arrays) to a JSON value.
/// The error is `{name}: field `{path}`: {what}`, as the parsers word theirs; `root` names
/// the whole document in it (`(root)` for profiles, `(file)` for plans).
pub(crate) fn to_value(obj: &Bound<'_, PyAny>, name: &str, root: &str) -> Result<Value, String> {
    let mut path = Vec::new();
    convert(obj, &mut path, 0).map_err(|msg| {
        let mut field = path_text(&path, root);
        if field.chars().count() > 200 {
            field = field.chars().take(200).collect::<String>() + "…";
        }
        format!("{name}: field `{field}`: {msg}")
    })
}

/// The document `obj` as JSON text for a parser, refusing anything but a dict at the top
/// (serde would read a list as the fields in order); `what` names the format in the error.
pub(crate) fn document(
    obj: &Bound<'_, PyAny>,
    name: &str,
    root: &str,
    what: &str,
) -> Result<String, String> {
    if !obj.is_instance_of::<PyDict>() {
        return Err(format!(
            "{name}: field `{root}`: expected a dict (a {what} document), found {}",
            type_name(obj)
        ));
    }
    to_value(obj, name, root).map(|v| v.to_string())
}

/// A parser's message on JSON text made from a dict, without the text position serde adds
/// (`… at line 1 column 312`), which means nothing to the dict's owner.
pub(crate) fn without_position(message: String) -> String {
    if let Some(at) = message.rfind(" at line ") {
        let tail = &message[at + " at line ".len()..];
        let mut parts = tail.splitn(3, ' ');
        let (line, col, num) = (parts.next(), parts.next(), parts.next());
        let digits = |s: Option<&str>| {
            s.is_some_and(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        };
        if digits(line) && col == Some("column") && digits(num) {
            return message[..at].to_string();
        }
    }
    message
}

/// The recursive step of [`to_value`]; on error `path` is left at the offending field.
fn convert(obj: &Bound<'_, PyAny>, path: &mut Vec<Step>, depth: usize) -> Result<Value, String> {
    if depth > MAX_DEPTH {
        return Err(format!(
            "nested more than {MAX_DEPTH} levels deep (a dict or list that contains itself?)"
        ));
    }
    if obj.is_none() {
        return Ok(Value::Null);
    }
    // bool before int: True is an int to Python.
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if obj.is_instance_of::<PyInt>() {
        return int_value(obj);
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        return float_value(f.value());
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return s
            .to_cow()
            .map(|s| Value::String(s.to_string()))
            .map_err(|e| format!("not valid UTF-8 text: {e}"));
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut map = Map::new();
        for (k, v) in d.iter() {
            let Ok(key) = k.cast::<PyString>() else {
                return Err(format!(
                    "expected string keys, found the key {} of type {}",
                    k.repr().map(|r| r.to_string()).unwrap_or_default(),
                    type_name(&k)
                ));
            };
            let key = key
                .to_cow()
                .map_err(|e| format!("a key that is not valid UTF-8 text: {e}"))?
                .to_string();
            path.push(Step::Key(key.clone()));
            let value = convert(&v, path, depth + 1)?;
            path.pop();
            map.insert(key, value);
        }
        return Ok(Value::Object(map));
    }
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        let mut items = Vec::new();
        for (i, item) in obj.try_iter().map_err(|e| e.to_string())?.enumerate() {
            let item = item.map_err(|e| e.to_string())?;
            path.push(Step::Index(i));
            items.push(convert(&item, path, depth + 1)?);
            path.pop();
        }
        return Ok(Value::Array(items));
    }
    // NumPy and friends: integers with __index__, floats with __float__, arrays with tolist().
    if obj.hasattr("__index__").unwrap_or(false) {
        if let Ok(i) = obj.call_method0("__index__") {
            return convert(&i, path, depth + 1);
        }
    }
    if obj.hasattr("tolist").unwrap_or(false) {
        if let Ok(l) = obj.call_method0("tolist") {
            if !l.is(obj) {
                return convert(&l, path, depth + 1);
            }
        }
    }
    if obj.hasattr("__float__").unwrap_or(false) {
        if let Ok(f) = obj.call_method0("__float__") {
            if let Ok(f) = f.extract::<f64>() {
                return float_value(f);
            }
        }
    }
    Err(format!(
        "expected a JSON value (dict, list, str, int, float, bool or None), found {}",
        type_name(obj)
    ))
}

/// A Python int as a JSON integer.
fn int_value(obj: &Bound<'_, PyAny>) -> Result<Value, String> {
    if let Ok(i) = obj.extract::<i64>() {
        return Ok(Value::Number(i.into()));
    }
    if let Ok(u) = obj.extract::<u64>() {
        return Ok(Value::Number(u.into()));
    }
    let text = obj.str().map(|s| s.to_string()).unwrap_or_default();
    Err(format!(
        "the integer {text} is out of range (at most 64 bits)"
    ))
}

/// A Python float as a JSON number: JSON has no NaN or infinity.
fn float_value(f: f64) -> Result<Value, String> {
    Number::from_f64(f)
        .map(Value::Number)
        .ok_or_else(|| format!("expected a finite number, found {f}"))
}

/// A JSON value as Python objects: dicts, lists, str, int, float, bool, None.
pub(crate) fn to_py(py: Python<'_>, value: &Value) -> PyResult<Py<PyAny>> {
    Ok(match value {
        Value::Null => py.None(),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any().unbind(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any().unbind()
            } else if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any().unbind()
            } else if let Some(f) = n.as_f64() {
                PyFloat::new(py, f).into_any().unbind()
            } else {
                return Err(PyOverflowError::new_err(format!("{n}: not a number")));
            }
        }
        Value::String(s) => PyString::new(py, s).into_any().unbind(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(to_py(py, item)?)?;
            }
            list.into_any().unbind()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (k, v) in map {
                dict.set_item(k, to_py(py, v)?)?;
            }
            dict.into_any().unbind()
        }
    })
}

/// A serialisable value as Python objects.
pub(crate) fn ser_to_py<T: serde::Serialize>(py: Python<'_>, value: &T) -> PyResult<Py<PyAny>> {
    let value = serde_json::to_value(value)
        .map_err(|e| crate::error(format!("internal error: cannot serialise: {e}")))?;
    to_py(py, &value)
}
