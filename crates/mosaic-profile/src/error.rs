//! The one error type of this crate: what is wrong, in which file, at which field.

use std::path::PathBuf;

/// The most characters of a message an error shows: a parser's message, or a list of names,
/// echoes the user's text, which may be of any length.
const MAX_MESSAGE_CHARS: usize = 1000;

/// `message` with its middle left out past [`MAX_MESSAGE_CHARS`].
fn clip(message: &str) -> std::borrow::Cow<'_, str> {
    mosaic_kit::text::clip_middle(message, MAX_MESSAGE_CHARS)
}

/// A profile file that cannot be read or does not describe a valid model.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// The file could not be read at all.
    #[error("{file}: cannot read: {error}")]
    Io {
        /// The file.
        file: PathBuf,
        /// The OS error (in the message, not a separate cause, so it is printed once).
        error: std::io::Error,
    },
    /// The JSON is malformed, a field is missing or has the wrong type.
    #[error("{file}: field `{field}`: {message}", message = clip(message))]
    Syntax {
        /// The file.
        file: PathBuf,
        /// Path of the offending field, e.g. `modules[2].samples[0].time_ms`.
        field: String,
        /// What the parser expected.
        message: String,
    },
    /// The JSON is well-formed but its content is invalid (cycle, unknown name, bad range...).
    #[error("{file}: field `{field}`: {message}", message = clip(message))]
    Invalid {
        /// The file.
        file: PathBuf,
        /// Path of the offending field.
        field: String,
        /// What is wrong and what was expected.
        message: String,
    },
}

impl ProfileError {
    pub(crate) fn invalid(
        file: impl Into<PathBuf>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        ProfileError::Invalid {
            file: file.into(),
            field: field.into(),
            message: message.into(),
        }
    }

    /// The text of the file at `path`: a regular file of at most
    /// [`mosaic_kit::files::MAX_TEXT_BYTES`].
    pub(crate) fn read(path: &std::path::Path) -> Result<String, ProfileError> {
        mosaic_kit::files::read_text(path, mosaic_kit::files::MAX_TEXT_BYTES).map_err(|error| {
            ProfileError::Io {
                file: path.to_path_buf(),
                error,
            }
        })
    }

    /// The field the error is about, if any.
    pub fn field(&self) -> Option<&str> {
        match self {
            ProfileError::Io { .. } => None,
            ProfileError::Syntax { field, .. } | ProfileError::Invalid { field, .. } => Some(field),
        }
    }
}
