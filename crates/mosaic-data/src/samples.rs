//! Per-sample sizes from a user's JSONL file: one JSON object per line, such as
//!
//! ```json
//! {"text_tokens": 312, "images": [[336, 336], [224, 448]], "audio_seconds": 4.5}
//! ```
//!
//! Every field is optional (0 or no images when absent); any other field is refused, naming
//! it. Images are `[height, width]` in pixels. A [`Tokenizer`] turns a [`Sample`] into the
//! tokens the backbone sees, and [`token_counts`] into the `u32` sizes the policies take; a
//! sample must come to at least one token (`{}` alone is refused there: a training sample
//! carries something, and a batch of empty samples has no cost to balance).
//!
//! Limits, checked where the input enters: the file at most
//! [`mosaic_kit::files::MAX_TEXT_BYTES`] (256 MiB) and a regular file; at most
//! [`MAX_SAMPLES`] samples and at least one (blank lines are skipped); text at most
//! [`MAX_TEXT_TOKENS`] tokens; at most [`MAX_IMAGES`] images per sample, sides
//! `1..=`[`MAX_IMAGE_SIDE`] pixels; audio seconds finite in `[0, `[`MAX_AUDIO_SECONDS`]`]`;
//! and, in [`token_counts`], from 1 to [`crate::packing::MAX_CAPACITY`] tokens a sample.
//! Errors name the file, the 1-based line and the field, and say what was expected.

use mosaic_kit::files::{read_text, MAX_TEXT_BYTES};
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::Value;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

/// The most samples one file may hold: a million, above any global batch by orders of
/// magnitude, and what every policy simulates within seconds (FlowTrain's capacity search
/// packs the batch some twenty times; ten million samples took `mosaic compare` 100 s).
pub const MAX_SAMPLES: usize = 1_000_000;
/// The longest image side in pixels: 64K, far above any encoder's input (gigapixel slides
/// are tiled before they reach a ViT).
pub const MAX_IMAGE_SIDE: u32 = 65_536;
/// The most images in one sample.
pub const MAX_IMAGES: usize = 1_024;
/// The most text tokens in one sample: 2²⁴ (16M), beyond any context length in use.
pub const MAX_TEXT_TOKENS: u32 = 1 << 24;
/// The longest audio clip in seconds: one day.
pub const MAX_AUDIO_SECONDS: f64 = 86_400.0;
/// The fields a sample line may have.
pub const FIELDS: [&str; 3] = ["text_tokens", "images", "audio_seconds"];

/// ViT patch side of [`Tokenizer::default`]: 14 pixels, as CLIP ViT-L/14 (Radford et al.
/// 2021) and the ViT-bigG/14 of Qwen-VL (Bai et al. 2023) use.
pub const DEFAULT_PATCH: u32 = 14;
/// Audio tokens per second of [`Tokenizer::default`]: 25, Qwen2-Audio's rate (Chu et al.
/// 2024: the Whisper-large-v3 encoder turns 16 kHz audio into 100 mel frames/s, its stride-2
/// convolution into 50 frames/s, 1,500 per 30 s window, and a stride-2 pooling layer into
/// one token per 40 ms).
pub const DEFAULT_AUDIO_TOKENS_PER_SECOND: f64 = 25.0;

/// One training sample's raw size: text tokens, images in pixels, audio seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Text tokens (already tokenised).
    pub text_tokens: u32,
    /// Images as `(height, width)` in pixels.
    pub images: Vec<(u32, u32)>,
    /// Audio length in seconds.
    pub audio_seconds: f64,
    /// The 1-based line of the file the sample came from (0 for samples made in code), so
    /// that later errors can name it.
    pub line: usize,
    /// The file the sample came from, as errors name it (empty for samples made in code);
    /// shared by all of one file's samples.
    pub file: Arc<str>,
}

/// How raw sizes become tokens: images cut into `patch × patch` pixel patches, one token
/// each; audio at a fixed token rate.
///
/// The default counts a ViT's patches before any token merger or resampler: Qwen2-VL merges
/// 2 × 2 patches into one token (model it with `patch: 28`), Qwen-VL resamples every image to
/// 256 tokens (not expressible here).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tokenizer {
    /// Patch side in pixels (0 is read as 1; [`token_counts`] refuses it).
    pub patch: u32,
    /// Audio tokens per second (must be finite and non-negative; [`token_counts`] checks).
    pub audio_tokens_per_second: f64,
}

impl Default for Tokenizer {
    /// [`DEFAULT_PATCH`] and [`DEFAULT_AUDIO_TOKENS_PER_SECOND`].
    fn default() -> Self {
        Tokenizer {
            patch: DEFAULT_PATCH,
            audio_tokens_per_second: DEFAULT_AUDIO_TOKENS_PER_SECOND,
        }
    }
}

impl Sample {
    /// Each image's tokens: `⌈h / patch⌉ · ⌈w / patch⌉` (a partial patch is padded).
    pub fn image_tokens(&self, tok: &Tokenizer) -> Vec<u64> {
        let patch = u64::from(tok.patch.max(1));
        self.images
            .iter()
            .map(|&(h, w)| u64::from(h).div_ceil(patch) * u64::from(w).div_ceil(patch))
            .collect()
    }

    /// The audio's tokens: `⌈seconds · rate⌉` (0 for a non-finite or negative product;
    /// saturating at `u64::MAX`).
    pub fn audio_tokens(&self, tok: &Tokenizer) -> u64 {
        let t = (self.audio_seconds * tok.audio_tokens_per_second).ceil();
        if t.is_finite() && t > 0.0 {
            t as u64 // saturating cast
        } else {
            0
        }
    }

    /// All tokens: text + Σ image tokens + audio tokens (saturating).
    pub fn tokens(&self, tok: &Tokenizer) -> u64 {
        self.image_tokens(tok)
            .into_iter()
            .fold(u64::from(self.text_tokens), u64::saturating_add)
            .saturating_add(self.audio_tokens(tok))
    }
}

/// Why samples were refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplesError {
    /// The file could not be read (missing, not a regular file, too large, not UTF-8).
    #[error("{file}: {message}")]
    Read {
        /// The file's path.
        file: String,
        /// Why it could not be read.
        message: String,
    },
    /// A line is not valid JSON.
    #[error("{file}, line {line}, column {column}: not valid JSON: {message}")]
    Json {
        /// The file (as named to [`parse_jsonl`]).
        file: String,
        /// The line, 1-based.
        line: usize,
        /// The column in that line where the JSON parser stopped, 1-based.
        column: usize,
        /// The JSON parser's message, without its position.
        message: String,
    },
    /// A line is JSON but not an object.
    #[error("{file}, line {line}: expected a JSON object such as {{\"text_tokens\": 312}}, found {found}")]
    NotObject {
        /// The file (as named to [`parse_jsonl`]).
        file: String,
        /// The line, 1-based.
        line: usize,
        /// A short description of the value found instead.
        found: String,
    },
    /// A field that samples do not have.
    #[error("{file}, line {line}: unknown field `{field}`; expected text_tokens, images or audio_seconds")]
    UnknownField {
        /// The file (as named to [`parse_jsonl`]).
        file: String,
        /// The line, 1-based.
        line: usize,
        /// The field's name (at most its first 80 characters).
        field: String,
    },
    /// A field given twice on one line.
    #[error("{file}, line {line}: field `{field}` is given twice")]
    DuplicateField {
        /// The file (as named to [`parse_jsonl`]).
        file: String,
        /// The line, 1-based.
        line: usize,
        /// The field's name.
        field: String,
    },
    /// A field whose value is of the wrong kind or out of range.
    #[error("{file}, line {line}: field `{field}`: expected {expected}, found {found}")]
    Field {
        /// The file (as named to [`parse_jsonl`]).
        file: String,
        /// The line, 1-based.
        line: usize,
        /// The field, with a path into it (`images[2][1]`).
        field: String,
        /// What the field must hold, in words.
        expected: String,
        /// A short description of the value found.
        found: String,
    },
    /// More than [`MAX_SAMPLES`] samples.
    #[error("{file}, line {line}: more than {MAX_SAMPLES} samples")]
    TooMany {
        /// The file (as named to [`parse_jsonl`]).
        file: String,
        /// The line of the first sample over the limit, 1-based.
        line: usize,
    },
    /// Not one sample.
    #[error("{file}: no samples (every line is blank); expected one JSON object per line")]
    Empty {
        /// The file (as named to [`parse_jsonl`]).
        file: String,
    },
    /// A sample with more tokens than a microbatch can hold.
    #[error(
        "{}sample {index} has {tokens} tokens (text, image patches and audio together); \
         expected at most {limit}, the most one microbatch can hold",
        at(file, *line)
    )]
    TooManyTokens {
        /// The sample's file (empty for samples made in code).
        file: String,
        /// The sample's 0-based index in the samples given.
        index: usize,
        /// The sample's line, 1-based (0 for samples made in code).
        line: usize,
        /// The sample's total tokens.
        tokens: u64,
        /// The most tokens a sample may have: [`crate::packing::MAX_CAPACITY`].
        limit: u32,
    },
    /// A sample of no tokens at all (no text, images or audio).
    #[error(
        "{}sample {index} has no tokens; expected at least 1 (text_tokens, images or \
         audio_seconds above 0): a training sample must carry something",
        at(file, *line)
    )]
    NoTokens {
        /// The sample's file (empty for samples made in code).
        file: String,
        /// The sample's 0-based index in the samples given.
        index: usize,
        /// The sample's line, 1-based (0 for samples made in code).
        line: usize,
    },
    /// A tokenizer setting out of range.
    #[error("tokenizer {field} is {value}; expected {expected}")]
    BadTokenizer {
        /// The setting: `"patch"` or `"audio_tokens_per_second"`.
        field: &'static str,
        /// Its value, as text.
        value: String,
        /// What it must be, in words.
        expected: &'static str,
    },
}

/// Where a sample came from, as an error's prefix: `file, line L: ` (either part left out
/// when unknown).
fn at(file: &str, line: usize) -> String {
    match (file.is_empty(), line) {
        (true, 0) => String::new(),
        (true, line) => format!("line {line}: "),
        (false, 0) => format!("{file}: "),
        (false, line) => format!("{file}, line {line}: "),
    }
}

/// A line's object entries in order, duplicates kept (a map would drop them silently).
struct Entries(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entries;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
                let mut out = Vec::new();
                while let Some(entry) = map.next_entry::<String, Value>()? {
                    out.push(entry);
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// A short description of a JSON value for error messages.
fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => {
            let s = n.to_string();
            if s.len() > 40 {
                format!("{}…", &s[..40])
            } else {
                s
            }
        }
        Value::String(s) => {
            let short: String = s.chars().take(40).collect();
            if short.len() < s.len() {
                format!("the string {short:?}…")
            } else {
                format!("the string {short:?}")
            }
        }
        Value::Array(a) => format!("a list of {} items", a.len()),
        Value::Object(_) => "an object".into(),
    }
}

/// The message of a `serde_json` error without its "at line L column C" suffix.
fn json_message(e: &serde_json::Error) -> String {
    let msg = e.to_string();
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg,
    }
}

/// Parses one non-blank line of `shared`, the file.
fn parse_line(text: &str, shared: &Arc<str>, line: usize) -> Result<Sample, SamplesError> {
    let file: &str = shared;
    let entries = match serde_json::from_str::<Entries>(text) {
        Ok(e) => e.0,
        Err(e) if e.classify() == serde_json::error::Category::Data => {
            let found = serde_json::from_str::<Value>(text)
                .map(|v| describe(&v))
                .unwrap_or_else(|_| "something else".into());
            return Err(SamplesError::NotObject {
                file: file.into(),
                line,
                found,
            });
        }
        Err(e) => {
            return Err(SamplesError::Json {
                file: file.into(),
                line,
                column: e.column(),
                message: json_message(&e),
            })
        }
    };
    let field_err = |field: String, expected: String, found: &Value| SamplesError::Field {
        file: file.into(),
        line,
        field,
        expected,
        found: describe(found),
    };
    let mut sample = Sample {
        text_tokens: 0,
        images: Vec::new(),
        audio_seconds: 0.0,
        line,
        file: Arc::clone(shared),
    };
    let mut seen = [false; FIELDS.len()];
    for (key, value) in &entries {
        let Some(f) = FIELDS.iter().position(|f| f == key) else {
            let field: String = key.chars().take(80).collect();
            return Err(SamplesError::UnknownField {
                file: file.into(),
                line,
                field,
            });
        };
        if std::mem::replace(&mut seen[f], true) {
            return Err(SamplesError::DuplicateField {
                file: file.into(),
                line,
                field: key.clone(),
            });
        }
        match f {
            0 => {
                sample.text_tokens = value
                    .as_u64()
                    .filter(|&t| t <= u64::from(MAX_TEXT_TOKENS))
                    .map(|t| t as u32)
                    .ok_or_else(|| {
                        field_err(
                            key.clone(),
                            format!("a whole number of tokens from 0 to {MAX_TEXT_TOKENS}"),
                            value,
                        )
                    })?;
            }
            1 => {
                let list = value
                    .as_array()
                    .filter(|a| a.len() <= MAX_IMAGES)
                    .ok_or_else(|| {
                        field_err(
                            key.clone(),
                            format!("a list of at most {MAX_IMAGES} [height, width] pairs"),
                            value,
                        )
                    })?;
                for (i, image) in list.iter().enumerate() {
                    let pair = image.as_array().filter(|p| p.len() == 2).ok_or_else(|| {
                        field_err(
                            format!("images[{i}]"),
                            "a [height, width] pair in pixels".into(),
                            image,
                        )
                    })?;
                    let mut side = [0u32; 2];
                    for (j, v) in pair.iter().enumerate() {
                        side[j] = v
                            .as_u64()
                            .filter(|s| (1..=u64::from(MAX_IMAGE_SIDE)).contains(s))
                            .map(|s| s as u32)
                            .ok_or_else(|| {
                                let what = ["height", "width"][j];
                                field_err(
                                    format!("images[{i}][{j}]"),
                                    format!("the {what} in whole pixels, 1 to {MAX_IMAGE_SIDE}"),
                                    v,
                                )
                            })?;
                    }
                    sample.images.push((side[0], side[1]));
                }
            }
            _ => {
                sample.audio_seconds = value
                    .as_f64()
                    .filter(|s| s.is_finite() && (0.0..=MAX_AUDIO_SECONDS).contains(s))
                    .ok_or_else(|| {
                        field_err(
                            key.clone(),
                            format!("a number of seconds from 0 to {MAX_AUDIO_SECONDS}"),
                            value,
                        )
                    })?;
            }
        }
    }
    Ok(sample)
}

/// Parses JSONL `text` (one sample object per line, blank lines skipped) read from `file`
/// (used in error messages only).
///
/// # Errors
/// [`SamplesError`] naming `file`, the 1-based line and the field: invalid JSON, a line
/// that is no object, an unknown or repeated field, a value of the wrong kind or out of the
/// module's limits, more than [`MAX_SAMPLES`] samples, or none.
pub fn parse_jsonl(text: &str, file: &str) -> Result<Vec<Sample>, SamplesError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let shared: Arc<str> = Arc::from(file);
    let mut samples = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        if samples.len() == MAX_SAMPLES {
            return Err(SamplesError::TooMany {
                file: file.into(),
                line: i + 1,
            });
        }
        samples.push(parse_line(line, &shared, i + 1)?);
    }
    if samples.is_empty() {
        return Err(SamplesError::Empty { file: file.into() });
    }
    Ok(samples)
}

/// Reads and parses the JSONL file at `path` ([`parse_jsonl`]) through
/// [`mosaic_kit::files::read_text`]: regular files only, at most 256 MiB.
///
/// # Errors
/// [`SamplesError::Read`] if the file cannot be read, else as [`parse_jsonl`].
pub fn read_jsonl(path: &Path) -> Result<Vec<Sample>, SamplesError> {
    let file = path.display().to_string();
    let text = read_text(path, MAX_TEXT_BYTES).map_err(|e| SamplesError::Read {
        file: file.clone(),
        message: e.to_string(),
    })?;
    parse_jsonl(&text, &file)
}

/// Each sample's total tokens ([`Sample::tokens`]) as the `u32` sizes the policies take.
///
/// # Errors
/// [`SamplesError::BadTokenizer`] for a patch of 0 or a token rate that is negative or not
/// finite; naming the sample's file, its line and its index,
/// [`SamplesError::TooManyTokens`] for a sample over [`crate::packing::MAX_CAPACITY`] tokens
/// (no microbatch could hold it) and [`SamplesError::NoTokens`] for a sample of 0 tokens
/// (nothing to train on; a batch of them has no cost, and every policy's times would be 0).
pub fn token_counts(samples: &[Sample], tok: &Tokenizer) -> Result<Vec<u32>, SamplesError> {
    if tok.patch == 0 {
        return Err(SamplesError::BadTokenizer {
            field: "patch",
            value: "0".into(),
            expected: "a patch side of at least 1 pixel",
        });
    }
    let rate = tok.audio_tokens_per_second;
    if !(rate.is_finite() && rate >= 0.0) {
        return Err(SamplesError::BadTokenizer {
            field: "audio_tokens_per_second",
            value: rate.to_string(),
            expected: "a finite, non-negative rate",
        });
    }
    let limit = crate::packing::MAX_CAPACITY;
    samples
        .iter()
        .enumerate()
        .map(|(index, s)| {
            let tokens = s.tokens(tok);
            if tokens == 0 {
                return Err(SamplesError::NoTokens {
                    file: s.file.to_string(),
                    index,
                    line: s.line,
                });
            }
            u32::try_from(tokens)
                .ok()
                .filter(|&t| t <= limit)
                .ok_or_else(|| SamplesError::TooManyTokens {
                    file: s.file.to_string(),
                    index,
                    line: s.line,
                    tokens,
                    limit,
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        parse_jsonl(text, "s.jsonl").unwrap_err().to_string()
    }

    #[test]
    fn good_lines_parse() {
        let text = "{\"text_tokens\": 312, \"images\": [[336, 336], [224, 448]], \"audio_seconds\": 4.5}\n\
                    \n   \n{}\r\n{\"audio_seconds\": 2}\n";
        let samples = parse_jsonl(text, "s.jsonl").unwrap();
        assert_eq!(samples.len(), 3);
        assert_eq!(samples[0].text_tokens, 312);
        assert_eq!(samples[0].images, vec![(336, 336), (224, 448)]);
        assert_eq!(samples[0].line, 1);
        assert_eq!(samples[1].line, 4);
        assert_eq!(samples[1].images, vec![]);
        assert_eq!(samples[2].audio_seconds, 2.0);
        let tok = Tokenizer::default();
        // 336/14 = 24 → 576; 224/14 = 16, 448/14 = 32 → 512; 4.5 s · 25 = 112.5 → 113.
        assert_eq!(samples[0].image_tokens(&tok), vec![576, 512]);
        assert_eq!(samples[0].tokens(&tok), 312 + 576 + 512 + 113);
        // A partial patch counts whole: 15 × 1 px is 2 × 1 patches.
        let odd = Sample {
            text_tokens: 0,
            images: vec![(15, 1)],
            audio_seconds: 0.0,
            line: 0,
            file: Arc::from(""),
        };
        assert_eq!(odd.tokens(&tok), 2);
        assert_eq!(&*samples[1].file, "s.jsonl");
        let (first, last) = (&samples[..1], &samples[2..]);
        assert_eq!(token_counts(first, &tok).unwrap(), vec![1513]);
        assert_eq!(token_counts(last, &tok).unwrap(), vec![50]);
    }

    /// A sample of no tokens (`{}`, zeros, an empty image list, or audio at a rate of 0) is
    /// refused, naming the file, its line and its index; so is a batch of nothing else.
    #[test]
    fn empty_samples_are_refused_naming_file_and_line() {
        let tok = Tokenizer::default();
        for (text, line, index) in [
            ("{\"text_tokens\": 5}\n\n{}\n", 3, 1),
            (
                "{\"text_tokens\": 0, \"images\": [], \"audio_seconds\": 0}",
                1,
                0,
            ),
            ("{\"audio_seconds\": 0.0}\n{\"text_tokens\": 1}", 1, 0),
        ] {
            let samples = parse_jsonl(text, "z.jsonl").unwrap();
            let e = token_counts(&samples, &tok).unwrap_err();
            assert_eq!(
                e,
                SamplesError::NoTokens {
                    file: "z.jsonl".into(),
                    index,
                    line
                },
                "{text:?}"
            );
            let msg = e.to_string();
            assert!(
                msg.starts_with(&format!(
                    "z.jsonl, line {line}: sample {index} has no tokens"
                )) && msg.contains("at least 1"),
                "{msg}"
            );
        }
        let mute = Tokenizer {
            audio_tokens_per_second: 0.0,
            ..tok
        };
        let audio = parse_jsonl("{\"audio_seconds\": 3}", "a.jsonl").unwrap();
        assert_eq!(token_counts(&audio, &tok).unwrap(), vec![75]);
        assert!(matches!(
            token_counts(&audio, &mute),
            Err(SamplesError::NoTokens { line: 1, .. })
        ));
    }

    #[test]
    fn bad_lines_name_line_and_field() {
        let cases: &[(&str, &[&str])] = &[
            (
                "{}\n{\"text_tokens\": -1}",
                &["line 2", "`text_tokens`", "whole number", "-1"],
            ),
            (
                "{\"text_tokens\": 1.5}",
                &["line 1", "`text_tokens`", "1.5"],
            ),
            (
                "{\"text_tokens\": 16777217}",
                &["`text_tokens`", "16777216"],
            ),
            (
                "{\"images\": [[1, 2], [3]]}",
                &["`images[1]`", "[height, width]"],
            ),
            (
                "{\"images\": [[1, 0]]}",
                &["`images[0][1]`", "width", "found 0"],
            ),
            (
                "{\"images\": [[70000, 1]]}",
                &["`images[0][0]`", "height", "65536"],
            ),
            ("{\"images\": 3}", &["`images`", "list"]),
            (
                "{\"audio_seconds\": \"4\"}",
                &["`audio_seconds`", "the string \"4\""],
            ),
            ("{\"audio_seconds\": 86401}", &["`audio_seconds`", "86400"]),
            ("{\"audio_seconds\": null}", &["`audio_seconds`", "null"]),
            (
                "\n\n{\"txt\": 3}",
                &["line 3", "unknown field `txt`", "text_tokens"],
            ),
            (
                "{\"images\": [], \"images\": []}",
                &["line 1", "`images` is given twice"],
            ),
            ("[1, 2]", &["line 1", "JSON object", "a list of 2 items"]),
            (
                "{\"text_tokens\": 3",
                &["s.jsonl, line 1, column", "not valid JSON"],
            ),
            ("{} {}", &["line 1", "not valid JSON", "trailing"]),
            (" \n\t\n", &["s.jsonl", "no samples"]),
        ];
        for (text, wants) in cases {
            let msg = err(text);
            for want in *wants {
                assert!(msg.contains(want), "{text:?}: {msg:?} lacks {want:?}");
            }
        }
        let many = format!(
            "{{\"images\": [{}]}}",
            vec!["[1, 1]"; MAX_IMAGES + 1].join(",")
        );
        assert!(err(&many).contains("at most 1024"));
    }

    #[test]
    fn token_limits_and_tokenizers_are_checked() {
        let big = Sample {
            text_tokens: MAX_TEXT_TOKENS,
            images: vec![],
            audio_seconds: 0.0,
            line: 7,
            file: Arc::from(""),
        };
        let msg = token_counts(&[big], &Tokenizer::default())
            .unwrap_err()
            .to_string();
        assert!(
            msg.starts_with("line 7: sample 0 has 16777216 tokens") && msg.contains("4194304"),
            "{msg}"
        );
        // From a file, the error names it: text at its limit, or one 64K × 64K image.
        for text in [
            "{\"text_tokens\": 1}\n{\"text_tokens\": 16777216}",
            "{\"text_tokens\": 1}\n{\"images\": [[65536, 65536]]}",
        ] {
            let samples = parse_jsonl(text, "big.jsonl").unwrap();
            let msg = token_counts(&samples, &Tokenizer::default())
                .unwrap_err()
                .to_string();
            assert!(
                msg.starts_with("big.jsonl, line 2: sample 1 has ")
                    && msg.contains("expected at most 4194304"),
                "{msg}"
            );
        }
        let bad = Tokenizer {
            patch: 0,
            ..Tokenizer::default()
        };
        assert!(matches!(
            token_counts(&[], &bad),
            Err(SamplesError::BadTokenizer { field: "patch", .. })
        ));
        let nan = Tokenizer {
            audio_tokens_per_second: f64::NAN,
            ..Tokenizer::default()
        };
        assert!(token_counts(&[], &nan).is_err());
    }

    #[test]
    fn files_are_read_through_the_guard() {
        let dir = std::env::temp_dir().join(format!("mosaic-data-samples-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.jsonl");
        std::fs::write(&path, "{\"text_tokens\": 5}\n").unwrap();
        assert_eq!(read_jsonl(&path).unwrap()[0].text_tokens, 5);
        let msg = read_jsonl(&dir).unwrap_err().to_string();
        assert!(msg.contains("directory"), "{msg}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
