//! What is trained: the module DAG ([`model`]) built from layers that pass gradients
//! ([`nn`]), the data it trains on ([`data`]), and the built-in engine models: small but real
//! multimodal networks, trainable from random initialisation on synthetic data that is
//! learnable (the loss really falls).
//!
//! The built-in models are not the zoo's analytical models: they are tiny (width 32, one or two
//! blocks per module) so that they train in milliseconds on a CPU, but they have the zoo
//! models' module structure, so that plans place them the same way. Each brings its synthetic
//! data ([`DataSource`]); [`data::TensorFile`] reads the user's own tensors instead. Texts have
//! per-sample lengths and are packed FlowTrain-style with block-diagonal attention masks
//! ([`packed`]).

mod clip;
pub mod data;
pub mod model;
pub mod nn;
mod omni;
pub mod packed;
pub mod towers;

use candle_core::Device;

pub use self::data::{Batch, DataSource, Field, Kind, TensorFile};
pub use self::model::{Model, Module, Net};
pub use self::towers::TextLayout;
use crate::error::EngineError;

/// `(name, description)` of every built-in engine model.
pub const MODELS: &[(&str, &str)] = &[
    (
        "clip-tiny",
        "CLIP-like: ViT image tower + causal text tower → contrastive align (vision, text → align)",
    ),
    (
        "omni-tiny",
        "ImageBind/OFASys-like: vision, audio and text encoders → transformer backbone \
         (vision, audio, text → backbone)",
    ),
];

/// Builds the built-in model `name` with parameters and data drawn from `seed`; its texts are
/// packed ([`TextLayout::Packed`]).
pub fn build(name: &str, seed: u64, device: &Device) -> Result<Model, EngineError> {
    build_with(name, seed, device, TextLayout::Packed)
}

/// [`build`], with the text tower running texts as `layout` says: the same parameters and
/// data, and the same mathematics, either way.
pub fn build_with(
    name: &str,
    seed: u64,
    device: &Device,
    layout: TextLayout,
) -> Result<Model, EngineError> {
    build_placed(name, seed, layout, &|_| device.clone())
}

/// [`build_with`], every module's parameters on the device `place` gives for its name (its
/// GPU slot's, when training on a GPU).
pub fn build_placed(
    name: &str,
    seed: u64,
    layout: TextLayout,
    place: &dyn Fn(&str) -> Device,
) -> Result<Model, EngineError> {
    let model = match name.to_ascii_lowercase().as_str() {
        "clip-tiny" => clip::build(seed, place, layout),
        "omni-tiny" => omni::build(seed, place, layout),
        _ => {
            return Err(EngineError::UnknownModel {
                name: name.to_string(),
                known: MODELS.iter().map(|m| m.0).collect::<Vec<_>>().join(", "),
            })
        }
    }
    .map_err(EngineError::tensor("init"))?;
    model.check();
    Ok(model)
}
