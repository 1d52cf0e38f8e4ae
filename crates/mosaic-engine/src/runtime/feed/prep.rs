//! The preprocessing itself: raw data made at start-up from the seed, and the batch of a step
//! prepared from it (decode, resize, normalise, tokenise, reorder).

use std::collections::BTreeMap;
use std::f64::consts::TAU;
use std::io::Cursor;
use std::time::Instant;

use candle_core::{Device, Tensor};
use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::PngEncoder;
use image::imageops::FilterType;
use image::{ExtendedColorType, ImageEncoder, ImageFormat};
use mosaic_kit::rng::SplitMix64;

use super::config::{FeedConfig, POOL};
use super::reorder::reorder;
use crate::error::EngineError;
use crate::models::data::{Batch, Field};

/// Luma mean and standard deviation the images are normalised with (CLIP's RGB statistics,
/// weighted as luma).
const MEAN: f32 = 0.46;
const STD: f32 = 0.27;
/// JPEG quality of the encoded pool.
const JPEG_QUALITY: u8 = 90;

/// Words the captions are made of: an image's tint, its stripe count and its orientation.
const TINTS: [&str; 8] = [
    "red", "orange", "yellow", "green", "cyan", "blue", "purple", "grey",
];
const COUNTS: [&str; 8] = [
    "one", "two", "three", "four", "five", "six", "seven", "eight",
];
const HEADINGS: [&str; 8] = [
    "east",
    "northeast",
    "north",
    "northwest",
    "west",
    "southwest",
    "south",
    "southeast",
];
/// Words that lengthen a caption (drawn per sample, so text lengths vary).
const FILLERS: [&str; 12] = [
    "a", "photo", "of", "the", "with", "and", "soft", "bright", "pattern", "scene", "small",
    "image",
];
/// RGB of each tint.
const TINT_RGB: [[f64; 3]; 8] = [
    [1.0, 0.2, 0.2],
    [1.0, 0.6, 0.1],
    [1.0, 1.0, 0.2],
    [0.2, 0.9, 0.3],
    [0.2, 0.9, 0.9],
    [0.2, 0.3, 1.0],
    [0.7, 0.2, 0.9],
    [0.6, 0.6, 0.6],
];

/// One encoded image of the pool and what it shows.
struct Encoded {
    bytes: Vec<u8>,
    format: ImageFormat,
    /// (tint, stripes, heading), each `0..8`.
    attrs: [usize; 3],
}

/// A prepared batch: the model's tensors as flat values, the order they were put in, and what
/// preparing them cost.
#[derive(Debug, Clone, PartialEq)]
pub struct Prepared {
    /// The data position.
    pub step: u64,
    /// Samples.
    pub batch: usize,
    /// `[batch, height, width]` normalised luma, row-major.
    pub image: Vec<f32>,
    /// `[batch, len]` token ids.
    pub text: Vec<u32>,
    /// `[batch]` tokens of each text (end token included, padding not).
    pub text_len: Vec<u32>,
    /// `order[j]`: the drawn sample at position `j` (the reordering's permutation).
    pub order: Vec<u32>,
    /// `[batch]` each position's sample cost (images × pixels + text tokens).
    pub cost: Vec<f64>,
    /// Wall-clock milliseconds the preparation took where it ran (not compared by `==` users
    /// who want bit-identical tensors: see [`Prepared::same_tensors`]).
    pub prep_ms: f64,
}

impl Prepared {
    /// True when both hold the same step, order and tensors, bit for bit (times aside).
    pub fn same_tensors(&self, other: &Prepared) -> bool {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        self.step == other.step
            && self.batch == other.batch
            && bits(&self.image) == bits(&other.image)
            && self.text == other.text
            && self.text_len == other.text_len
            && self.order == other.order
    }

    /// Images decoded for the batch (a sample's cost is its images × `resolution`² plus its
    /// text tokens).
    pub fn images(&self, config: &FeedConfig) -> u32 {
        let pixels = f64::from(config.resolution).powi(2);
        (self.cost.iter().zip(&self.text_len))
            .map(|(c, &l)| ((c - f64::from(l)) / pixels).round() as u32)
            .sum()
    }

    /// The batch the trainer reads: `fields` name the tensors (the model's image, text and
    /// optional lengths fields, as [`FeedConfig::for_fields`] found them).
    pub fn to_batch(
        &self,
        config: &FeedConfig,
        fields: &[Field],
        device: &Device,
    ) -> candle_core::Result<Batch> {
        let name = |n: &str| -> candle_core::Result<&'static str> {
            fields
                .iter()
                .map(|f| f.name)
                .find(|&f| f == n)
                .ok_or_else(|| {
                    candle_core::Error::Msg(format!("the model has no field `{n}` to feed"))
                })
        };
        let (h, w, l) = (
            config.image.height as usize,
            config.image.width as usize,
            config.text.len as usize,
        );
        let mut tensors = BTreeMap::new();
        tensors.insert(
            name(&config.image.name)?,
            Tensor::from_vec(self.image.clone(), (self.batch, h, w), device)?,
        );
        tensors.insert(
            name(&config.text.name)?,
            Tensor::from_vec(self.text.clone(), (self.batch, l), device)?,
        );
        if let Some(lengths) = &config.text.lengths {
            tensors.insert(
                name(lengths)?,
                Tensor::from_vec(self.text_len.clone(), self.batch, device)?,
            );
        }
        Ok(Batch { tensors })
    }
}

/// Splits `text` into lowercase words (runs of ASCII letters and digits) and maps each to an id
/// in `1..vocab − 1` by its FNV-1a hash: a real, if simple, word-level tokenizer (ids collide
/// when a vocabulary is smaller than the words). `0` is left for padding and `vocab − 1` for
/// the end of a text; `vocab` must be at least 3.
pub fn tokenize(text: &str, vocab: u32) -> Vec<u32> {
    let span = u64::from(vocab.max(3) - 2);
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for b in w.bytes() {
                h = (h ^ u64::from(b.to_ascii_lowercase())).wrapping_mul(0x0100_0000_01b3);
            }
            1 + (h % span) as u32
        })
        .collect()
}

/// The raw data of a feed and the preparation of its batches (see the module documentation).
pub struct Preprocessor {
    config: FeedConfig,
    pool: Vec<Encoded>,
}

impl std::fmt::Debug for Preprocessor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Preprocessor")
            .field("config", &self.config)
            .field("pool_bytes", &self.encoded_bytes())
            .finish()
    }
}

impl Preprocessor {
    /// Checks `config` and makes the pool of encoded images: [`POOL`] images of
    /// `resolution`² RGB pixels, PNG and JPEG alternately, each an oriented gradient with
    /// stripes in a tint plus noise, all drawn from the seed.
    pub fn new(config: FeedConfig) -> Result<Preprocessor, EngineError> {
        config.check()?;
        let pool = (0..POOL)
            .map(|p| encode(&config, p))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Preprocessor { config, pool })
    }

    /// The config.
    pub fn config(&self) -> &FeedConfig {
        &self.config
    }

    /// Bytes of encoded images held.
    pub fn encoded_bytes(&self) -> usize {
        self.pool.iter().map(|e| e.bytes.len()).sum()
    }

    /// The batch of `batch` samples at data position `step`: depends only on the seed, `step`
    /// and `batch`. Each sample draws 1 to `images_per_sample` images from the pool and a
    /// caption of its first image; its images are decoded, resized to the model's input by a
    /// triangle filter, turned into luma, normalised and averaged; its caption is tokenised,
    /// ended and padded. The batch is then reordered for `dp` ranks ([`reorder`]).
    pub fn prepare(&self, step: u64, batch: usize) -> Result<Prepared, String> {
        let t0 = Instant::now();
        let c = &self.config;
        let (h, w, l) = (
            c.image.height as usize,
            c.image.width as usize,
            c.text.len as usize,
        );
        let pixels = f64::from(c.resolution) * f64::from(c.resolution);
        let mut rng = SplitMix64::stream(c.seed, "feed/batch", step);
        let mut images = Vec::with_capacity(batch * h * w);
        let mut texts = Vec::with_capacity(batch * l);
        let mut lens = Vec::with_capacity(batch);
        let mut costs = Vec::with_capacity(batch);
        for _ in 0..batch {
            let count = 1 + rng.below(u64::from(c.images_per_sample)) as usize;
            let picks: Vec<usize> = (0..count)
                .map(|_| rng.below(self.pool.len() as u64) as usize)
                .collect();
            let caption = caption(self.pool[picks[0]].attrs, &mut rng);
            let mut sum = vec![0f32; h * w];
            for &p in &picks {
                let luma = self.decode_resize(&self.pool[p])?;
                sum.iter_mut().zip(&luma).for_each(|(s, x)| *s += x);
            }
            images.extend(sum.iter().map(|s| s / count as f32));
            let (ids, len) = self.text_ids(&caption);
            texts.extend(ids);
            lens.push(len);
            costs.push(count as f64 * pixels + f64::from(len));
        }
        let order = reorder(&costs, c.dp as usize);
        let take = |v: &[f32], width: usize| -> Vec<f32> {
            order
                .iter()
                .flat_map(|&i| v[i * width..(i + 1) * width].iter().copied())
                .collect()
        };
        let image = take(&images, h * w);
        let text = order
            .iter()
            .flat_map(|&i| texts[i * l..(i + 1) * l].iter().copied())
            .collect();
        Ok(Prepared {
            step,
            batch,
            image,
            text,
            text_len: order.iter().map(|&i| lens[i]).collect(),
            cost: order.iter().map(|&i| costs[i]).collect(),
            order: order.iter().map(|&i| i as u32).collect(),
            prep_ms: t0.elapsed().as_secs_f64() * 1e3,
        })
    }

    /// One encoded image decoded, resized to the model's input and normalised, as luma.
    fn decode_resize(&self, e: &Encoded) -> Result<Vec<f32>, String> {
        let c = &self.config;
        let rgb = image::load_from_memory_with_format(&e.bytes, e.format)
            .map_err(|err| format!("cannot decode a {:?} image: {err}", e.format))?
            .into_rgb8();
        let small =
            image::imageops::resize(&rgb, c.image.width, c.image.height, FilterType::Triangle);
        Ok(small
            .pixels()
            .map(|p| {
                let [r, g, b] = p.0.map(f32::from);
                ((0.299 * r + 0.587 * g + 0.114 * b) / 255.0 - MEAN) / STD
            })
            .collect())
    }

    /// The caption's ids, ended by `vocab − 1` and padded with 0 to the text width (on the
    /// right when the model reads lengths, else on the left), and its length.
    fn text_ids(&self, caption: &str) -> (Vec<u32>, u32) {
        let t = &self.config.text;
        let l = t.len as usize;
        let mut ids = tokenize(caption, t.vocab);
        ids.truncate(l - 1);
        ids.push(t.vocab - 1);
        let len = ids.len();
        let pad = std::iter::repeat_n(0, l - len);
        let ids = if t.lengths.is_some() {
            ids.into_iter().chain(pad).collect()
        } else {
            pad.chain(ids).collect()
        };
        (ids, len as u32)
    }
}

/// A caption of an image with `attrs`: its three attribute words, then 0 to 12 filler words.
fn caption(attrs: [usize; 3], rng: &mut SplitMix64) -> String {
    let mut words = vec![TINTS[attrs[0]], COUNTS[attrs[1]], HEADINGS[attrs[2]]];
    let extra = rng.below(13) as usize;
    words.extend((0..extra).map(|_| FILLERS[rng.below(FILLERS.len() as u64) as usize]));
    words.join(" ")
}

/// Pool image `p`: content drawn from the seed, PNG for even `p`, JPEG for odd.
fn encode(config: &FeedConfig, p: u32) -> Result<Encoded, EngineError> {
    let mut rng = SplitMix64::stream(config.seed, "feed/pool", u64::from(p));
    let attrs = [0; 3].map(|_: usize| rng.below(8) as usize);
    let n = config.resolution as usize;
    let angle = attrs[2] as f64 * TAU / 8.0;
    let (cos, sin) = (angle.cos(), angle.sin());
    let freq = (attrs[1] + 1) as f64;
    let tint = TINT_RGB[attrs[0]];
    let mut pixels = Vec::with_capacity(n * n * 3);
    for y in 0..n {
        for x in 0..n {
            let (u, v) = (x as f64 / n as f64 - 0.5, y as f64 / n as f64 - 0.5);
            let along = u * cos + v * sin;
            let gradient = 0.5 + 0.7 * along;
            let stripes = 0.5 + 0.5 * (TAU * freq * along).sin();
            let value = 0.55 * gradient + 0.45 * stripes;
            let noise = rng.next_u64();
            for (k, t) in tint.iter().enumerate() {
                let jitter = ((noise >> (16 * k)) & 0x1f) as f64 - 15.5;
                pixels.push((value * t * 255.0 + jitter).clamp(0.0, 255.0) as u8);
            }
        }
    }
    let mut bytes = Vec::new();
    let side = config.resolution;
    let (result, format) = if p.is_multiple_of(2) {
        let e = PngEncoder::new(Cursor::new(&mut bytes));
        (
            e.write_image(&pixels, side, side, ExtendedColorType::Rgb8),
            ImageFormat::Png,
        )
    } else {
        let e = JpegEncoder::new_with_quality(Cursor::new(&mut bytes), JPEG_QUALITY);
        (
            e.write_image(&pixels, side, side, ExtendedColorType::Rgb8),
            ImageFormat::Jpeg,
        )
    };
    result.map_err(|e| EngineError::BadSetting {
        setting: "--image-resolution".into(),
        message: format!("cannot encode a {side}×{side} {format:?} image: {e}"),
    })?;
    Ok(Encoded {
        bytes,
        format,
        attrs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::feed::config::{ImageInput, TextInput};

    fn config(lengths: bool) -> FeedConfig {
        FeedConfig {
            seed: 3,
            images_per_sample: 3,
            resolution: 40,
            dp: 2,
            image: ImageInput {
                name: "image".into(),
                height: 16,
                width: 16,
            },
            text: TextInput {
                name: "text".into(),
                len: 8,
                vocab: 64,
                lengths: lengths.then(|| "text_len".into()),
            },
        }
    }

    #[test]
    fn tokens_are_words_hashed_into_the_vocabulary() {
        let ids = tokenize("Red, two  east!", 64);
        assert_eq!(ids.len(), 3);
        assert!(ids.iter().all(|&i| (1..63).contains(&i)));
        assert_eq!(ids, tokenize("red two east", 64));
        assert_ne!(tokenize("red", 64), tokenize("blue", 64));
        assert!(tokenize("  ", 64).is_empty());
    }

    #[test]
    fn texts_end_and_pad_on_the_side_the_model_reads() {
        for lengths in [true, false] {
            let p = Preprocessor::new(config(lengths)).unwrap();
            let b = p.prepare(5, 6).unwrap();
            for (i, row) in b.text.chunks(8).enumerate() {
                let len = b.text_len[i] as usize;
                assert!((4..=8).contains(&len), "{len}");
                let (body, end) = if lengths {
                    (&row[..len], &row[len..])
                } else {
                    (&row[8 - len..], &row[..8 - len])
                };
                assert_eq!(*body.last().unwrap(), 63, "{row:?}");
                assert!(end.iter().all(|&t| t == 0), "{row:?}");
            }
        }
    }

    #[test]
    fn images_are_decoded_normalised_and_vary() {
        let p = Preprocessor::new(config(true)).unwrap();
        assert!(p.encoded_bytes() > 0);
        let b = p.prepare(0, 4).unwrap();
        assert_eq!(b.image.len(), 4 * 256);
        assert!(b.image.iter().all(|x| x.is_finite() && x.abs() < 4.0));
        assert_ne!(b.image[..256], b.image[256..512]);
        let mut order = b.order.clone();
        order.sort_unstable();
        assert_eq!(order, vec![0, 1, 2, 3]);
    }
}
