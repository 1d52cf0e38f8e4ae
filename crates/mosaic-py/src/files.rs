//! Writing output files as the command does: refused before any work when the path cannot be
//! a file to write, and errors naming the file.

use std::path::Path;

/// Refuses, before any work, an output path that is a directory or lies in a directory that
/// does not exist (the rule of the command's `--out`, `--trace`, `--svg`); `what` names the
/// argument.
pub(crate) fn check_output(what: &str, path: &Path) -> Result<(), String> {
    let name = path.display();
    if path.is_dir() {
        return Err(format!(
            "{what} {name}: is a directory, expected a file to write"
        ));
    }
    match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(dir) if !dir.is_dir() => Err(format!(
            "{what} {name}: the directory {} does not exist",
            dir.display()
        )),
        _ => Ok(()),
    }
}

/// Writes `text` to `path`; the error names the file.
pub(crate) fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// `value` as the command writes its JSON files: pretty, with a final newline.
pub(crate) fn pretty<T: serde::Serialize>(value: &T) -> Result<String, String> {
    serde_json::to_string_pretty(value)
        .map(|s| s + "\n")
        .map_err(|e| format!("internal error: cannot serialise: {e}"))
}
