//! Preprocessing off the training path (DistTrain §4, "CPU preprocessing disaggregation", and
//! its Fig. 21): encoded images are decoded and resized and texts tokenised in *producer*
//! processes that feed the trainer through a local Unix socket, each global batch reordered
//! there for the data-parallel ranks, so that the trainer's thread only copies finished tensors.
//!
//! - [`FeedConfig`] says what is made: up to `images_per_sample` encoded images (PNG and JPEG
//!   alternately) of `resolution`² pixels and one caption per sample, for a model whose data
//!   is one grayscale image `[H, W]`, token ids `[L]` and optionally their per-sample lengths
//!   (`clip-tiny`).
//! - [`Preprocessor`] makes the raw data at start-up, deterministically from the seed (a pool of
//!   encoded images with seeded content — oriented gradients, stripes, a tint and noise — made
//!   with the `image` crate), and prepares the batch of a step: decode, resize (triangle
//!   filter) to the model's input, normalise, average a sample's images, tokenise its caption
//!   ([`tokenize`]: words hashed into the vocabulary), and reorder ([`reorder`]). The batch of
//!   step `s` depends only on `(seed, s)`.
//! - [`InProcessFeed`] runs it on the trainer's thread (the baseline); [`ProducerFeed`] spawns
//!   `K` producer processes ([`Launcher`]: the `mosaic` binary itself, `mosaic train produce`,
//!   which calls [`produce`]), sends them the config, asks worker `s mod K` for step `s` up to
//!   [`FeedOptions::depth`] steps ahead, and keeps what arrives in a reorder buffer by step.
//!   Both are [`DataSource`](crate::models::DataSource)s and give bit-identical tensors.
//! - Producers die with the feed (killed and reaped on drop) and exit by themselves when the
//!   socket closes; a producer that dies or falls silent for [`FeedOptions::timeout`] fails the
//!   step with an error naming it, never a hang.
//!
//! Wire format (`wire`): frames of a kind byte, a little-endian u32 length and a payload; a
//! batch is its step, the producer's preparation time and named tensors (name, dtype, dims, raw
//! little-endian values).

mod config;
mod consumer;
mod prep;
mod producer;
mod reorder;
mod wire;

pub use config::{
    FeedConfig, FeedOptions, ImageInput, TextInput, MAX_IMAGES_PER_SAMPLE, MAX_PRODUCERS,
    MAX_RESOLUTION, MIN_RESOLUTION, POOL,
};
pub use consumer::{feed, DataTiming, Feed, FeedStats, InProcessFeed, Launcher, ProducerFeed};
pub use prep::{tokenize, Prepared, Preprocessor};
pub use producer::produce;
pub use reorder::{reorder, shard_loads};
