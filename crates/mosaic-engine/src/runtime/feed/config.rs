//! What the feed makes ([`FeedConfig`], sent to the producers as JSON) and how it waits
//! ([`FeedOptions`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::EngineError;
use crate::models::data::{Field, Kind};

/// The most images one sample may hold (`--images-per-sample`).
pub const MAX_IMAGES_PER_SAMPLE: u32 = 64;
/// The smallest side of an encoded image, in pixels (`--image-resolution`).
pub const MIN_RESOLUTION: u32 = 8;
/// The largest side of an encoded image, in pixels: a 4096² RGB image is 48 MiB decoded.
pub const MAX_RESOLUTION: u32 = 4096;
/// The most producer processes (`--producers`).
pub const MAX_PRODUCERS: usize = 64;
/// Encoded images made at start-up; samples draw theirs from this pool (each draw is decoded
/// anew, as a sample read from storage would be).
pub const POOL: u32 = 16;

/// The model's image input: one grayscale image per sample.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageInput {
    /// The field's name (`image`).
    pub name: String,
    /// Rows of the model's input.
    pub height: u32,
    /// Columns of the model's input.
    pub width: u32,
}

/// The model's text input: token ids, and optionally their per-sample lengths.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TextInput {
    /// The field's name (`text`).
    pub name: String,
    /// Tokens per sample (the field's width).
    pub len: u32,
    /// Ids are below this; `vocab − 1` ends a text, 0 pads it.
    pub vocab: u32,
    /// The per-sample lengths field (`text_len`), if the model reads one: texts are then padded
    /// on the right; without it they are padded on the left, so that the last token, which the
    /// tower reads, ends the text.
    pub lengths: Option<String>,
}

/// What the feed makes: the same on the trainer and in every producer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeedConfig {
    /// Seed of the raw data (the pool of encoded images, and every batch's draws).
    pub seed: u64,
    /// A sample holds 1 to this many images, drawn per sample.
    pub images_per_sample: u32,
    /// Side of the encoded images, in pixels (square).
    pub resolution: u32,
    /// Data-parallel ranks a batch is reordered for (contiguous equal shards, as the trainer
    /// cuts them); 1 keeps the drawn order.
    pub dp: u32,
    /// The image input.
    pub image: ImageInput,
    /// The text input.
    pub text: TextInput,
}

/// How the trainer side waits for producers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeedOptions {
    /// Steps asked for ahead of the one being trained (at least 1): the producers' run-ahead.
    pub depth: usize,
    /// How long a producer may take to start or to deliver a step before the feed fails.
    pub timeout: Duration,
}

/// Seconds a producer may take per decoded pixel before the feed gives up on it: 20× the ~10
/// ns a pixel took to decode and resize here (`mosaic measure preprocess`: 420 ms for 16
/// samples of 2.6 images of 1024² px), so only a stuck producer times out, not a slow step.
const SECONDS_PER_PIXEL: f64 = 200e-9;

impl FeedOptions {
    /// The default run-ahead, and a timeout that grows with the work of one step: 120 s plus
    /// `SECONDS_PER_PIXEL` for each pixel of a step's worst case (`batch` samples of
    /// `images_per_sample` images) and of the encoded pool made at start-up.
    pub fn for_work(config: &FeedConfig, batch: usize) -> FeedOptions {
        let pixels = f64::from(config.resolution).powi(2)
            * (batch as f64 * f64::from(config.images_per_sample) + f64::from(POOL));
        FeedOptions {
            timeout: FeedOptions::default().timeout
                + Duration::from_secs_f64(pixels * SECONDS_PER_PIXEL),
            ..FeedOptions::default()
        }
    }
}

impl Default for FeedOptions {
    /// 4 steps ahead, 120 s.
    fn default() -> Self {
        FeedOptions {
            depth: 4,
            timeout: Duration::from_secs(120),
        }
    }
}

impl FeedConfig {
    /// The config for a model with data `fields`: exactly one real field `[H, W]` (the image),
    /// one token field `[L]` and at most the field of its per-sample lengths.
    /// Anything else is refused, naming the flags that asked for the feed; the counts are
    /// checked as by [`FeedConfig::check`].
    pub fn for_fields(
        fields: &[Field],
        seed: u64,
        images_per_sample: u32,
        resolution: u32,
        dp: u32,
    ) -> Result<FeedConfig, EngineError> {
        // The image: the real [H, W] field called `image`, else the first; the text: the first
        // token field [L]; its lengths: the field that says it holds them.
        let image = (fields.iter())
            .filter(|f| f.kind == Kind::Real && f.dims.len() == 2)
            .min_by_key(|f| f.name != "image")
            .map(|f| (f.name, f.dims[0], f.dims[1]));
        let text = fields
            .iter()
            .find_map(|f| match (f.kind, f.dims.as_slice()) {
                (Kind::Index(v), &[l]) => Some((f.name, l, v)),
                _ => None,
            });
        let lengths = (fields.iter())
            .find(|f| text.is_some_and(|t| f.lengths_of == Some(t.0)))
            .map(|f| f.name);
        let other: Vec<&str> = (fields.iter())
            .map(|f| f.name)
            .filter(|&n| Some(n) != image.map(|i| i.0))
            .filter(|&n| Some(n) != text.map(|t| t.0) && Some(n) != lengths)
            .collect();
        let refuse = |why: String| EngineError::BadSetting {
            setting: "--images-per-sample/--image-resolution/--producers".into(),
            message: format!(
                "the image feed makes one grayscale image [H, W] and one text [L] (with its \
                 lengths) per sample; {why}"
            ),
        };
        if !other.is_empty() {
            return Err(refuse(format!(
                "the model also reads {}",
                other
                    .iter()
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let (Some((iname, h, w)), Some((tname, len, vocab))) = (image, text) else {
            return Err(refuse("the model has no image or no text input".into()));
        };
        let small = |x: usize| u32::try_from(x).map_err(|_| refuse(format!("{x} is too large")));
        let config = FeedConfig {
            seed,
            images_per_sample,
            resolution,
            dp,
            image: ImageInput {
                name: iname.into(),
                height: small(h)?,
                width: small(w)?,
            },
            text: TextInput {
                name: tname.into(),
                len: small(len)?,
                vocab,
                lengths: lengths.map(Into::into),
            },
        };
        config.check()?;
        Ok(config)
    }

    /// Checks the counts: 1 to [`MAX_IMAGES_PER_SAMPLE`] images per sample, a resolution of
    /// [`MIN_RESOLUTION`] to [`MAX_RESOLUTION`], a dp of at least 1, a model input of at least
    /// 1×1 and at most the resolution's area, a text of at least 2 tokens over at least 3 ids.
    pub fn check(&self) -> Result<(), EngineError> {
        let bad = |setting: &str, message: String| EngineError::BadSetting {
            setting: setting.into(),
            message,
        };
        if !(1..=MAX_IMAGES_PER_SAMPLE).contains(&self.images_per_sample) {
            return Err(bad(
                "--images-per-sample",
                format!(
                    "{} is not 1 to {MAX_IMAGES_PER_SAMPLE} images",
                    self.images_per_sample
                ),
            ));
        }
        if !(MIN_RESOLUTION..=MAX_RESOLUTION).contains(&self.resolution) {
            return Err(bad(
                "--image-resolution",
                format!(
                    "{} is not {MIN_RESOLUTION} to {MAX_RESOLUTION} pixels",
                    self.resolution
                ),
            ));
        }
        if self.dp == 0 {
            return Err(bad("dp", "expected at least 1 rank".into()));
        }
        let (h, w) = (self.image.height, self.image.width);
        if h == 0 || w == 0 || h > MAX_RESOLUTION || w > MAX_RESOLUTION {
            return Err(bad(
                &self.image.name,
                format!("an image input of {h}×{w} cannot be fed"),
            ));
        }
        if self.text.len < 2 || self.text.vocab < 3 {
            return Err(bad(
                &self.text.name,
                format!(
                    "a text of {} tokens below {} cannot be fed (at least 2 tokens below 3)",
                    self.text.len, self.text.vocab
                ),
            ));
        }
        Ok(())
    }
}
