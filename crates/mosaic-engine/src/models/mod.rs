//! What is trained: the module DAG ([`model`]) built from layers that pass gradients
//! ([`nn`]), the data it trains on ([`data`]), and the built-in engine models: small but real
//! multimodal networks, trainable from random initialisation on synthetic data that is
//! learnable (the loss really falls).
//!
//! Two kinds of built-in models. The tiny ones (`clip-tiny`, `omni-tiny`: width 32, one or two
//! blocks per module) train in milliseconds on a CPU and have the zoo models' module structure,
//! so that plans place them the same way. The zoo-built ones ([`zoo`]: `clip`, `imagebind`)
//! are the zoo's architectures at their real sizes, or scaled down by a size factor. Each brings its synthetic
//! data ([`DataSource`]); [`data::TensorFile`] reads the user's own tensors instead. Texts have
//! per-sample lengths and are packed FlowTrain-style with block-diagonal attention masks
//! ([`packed`]).

mod clip;
pub mod data;
pub mod flash;
pub mod grad_op;
pub mod model;
pub mod nn;
mod omni;
pub mod packed;
pub mod recompute;
pub mod towers;
pub mod zoo;

use candle_core::Device;

pub use self::data::{Batch, DataSource, Field, Kind, TensorFile};
pub use self::model::{Model, Module, Net, TextLayout};
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
    (
        "clip",
        "the zoo's CLIP ViT-L/14 at its real size (--size scales it): vision, text → align",
    ),
    (
        "imagebind",
        "the zoo's ImageBind at its real size (--size scales it): frozen vision and text, \
         trained audio, depth, thermal and IMU encoders → align",
    ),
];

/// What a built-in model is built from: enough to build it again, the same, on other devices.
#[derive(Debug, Clone, PartialEq)]
pub struct Recipe {
    /// A name of [`MODELS`].
    pub name: String,
    /// The seed of its parameters and data.
    pub seed: u64,
    /// How a tiny model's text tower runs texts.
    pub layout: TextLayout,
    /// The size factor of a zoo-built model (in (0, 1]; 1 is the zoo's real size); 1 for the
    /// tiny models, which have one size.
    pub size: f64,
}

impl Recipe {
    /// `name` from `seed`, packed texts, size 1.
    pub fn new(name: &str, seed: u64) -> Recipe {
        Recipe {
            name: name.to_string(),
            seed,
            layout: TextLayout::Packed,
            size: 1.0,
        }
    }

    /// The width of the widest encoder of a zoo-built model at this size; `None` for the tiny
    /// built-in models, which are not in the zoo.
    pub fn widest(&self) -> Option<usize> {
        zoo::widest(&self.name.to_ascii_lowercase(), self.size).ok()
    }

    /// The cheapest build of `name` with its modules: what a plan names, at the least cost
    /// (a zoo-built model at size 0.01, a tiny one as it is).
    pub fn smallest(name: &str) -> Recipe {
        Recipe {
            size: if is_tiny(name) { 1.0 } else { 0.01 },
            ..Recipe::new(name, 0)
        }
    }
}

/// Whether `name` is one of the tiny models, which have one size.
pub fn is_tiny(name: &str) -> bool {
    name.to_ascii_lowercase().ends_with("-tiny")
}

/// The tiny built-in models (`clip-tiny`, `omni-tiny`): what a command that trains on this
/// machine's CPU at one size accepts.
pub fn tiny_models() -> Vec<&'static str> {
    MODELS.iter().map(|m| m.0).filter(|n| is_tiny(n)).collect()
}

/// Builds the built-in model `name` with parameters and data drawn from `seed`; its texts are
/// packed ([`TextLayout::Packed`]); a zoo-built model at its real size.
pub fn build(name: &str, seed: u64, device: &Device) -> Result<Model, EngineError> {
    build_placed(&Recipe::new(name, seed), &|_| device.clone())
}

/// [`build`], with the text tower running texts as `layout` says: the same parameters and
/// data, and the same mathematics, either way.
pub fn build_with(
    name: &str,
    seed: u64,
    device: &Device,
    layout: TextLayout,
) -> Result<Model, EngineError> {
    let recipe = Recipe {
        layout,
        ..Recipe::new(name, seed)
    };
    build_placed(&recipe, &|_| device.clone())
}

/// The model `recipe` describes, every module's parameters on the device `place` gives for its
/// name (its GPU slot's, when training on a GPU).
pub fn build_placed(recipe: &Recipe, place: &dyn Fn(&str) -> Device) -> Result<Model, EngineError> {
    let name = recipe.name.to_ascii_lowercase();
    if !(recipe.size > 0.0 && recipe.size <= 1.0) {
        return Err(EngineError::BadSetting {
            setting: "--size".into(),
            message: format!("expected a factor in (0, 1], got {}", recipe.size),
        });
    }
    if is_tiny(&name) && recipe.size != 1.0 {
        return Err(EngineError::BadSetting {
            setting: "--size".into(),
            message: format!(
                "{name} has one size; --size scales the zoo-built models (clip, imagebind)"
            ),
        });
    }
    let model = match name.as_str() {
        "clip-tiny" => clip::build(recipe.seed, place, recipe.layout),
        "omni-tiny" => omni::build(recipe.seed, place, recipe.layout),
        "clip" | "imagebind" => zoo::build(&name, recipe.seed, recipe.size, place),
        _ => {
            return Err(EngineError::UnknownModel {
                name: recipe.name.clone(),
                known: MODELS.iter().map(|m| m.0).collect::<Vec<_>>().join(", "),
            })
        }
    }
    .map_err(EngineError::tensor("init"))?;
    model.check();
    Ok(model)
}

#[cfg(test)]
mod tests {
    use super::Recipe;

    #[test]
    fn the_widest_encoder_is_the_zoo_s_and_scales_with_the_size() {
        assert_eq!(Recipe::new("clip-tiny", 0).widest(), None);
        // CLIP's vision tower is 1024 wide at its real size, as is ImageBind's.
        assert_eq!(Recipe::new("clip", 0).widest(), Some(1024));
        assert_eq!(Recipe::new("imagebind", 0).widest(), Some(1024));
        let small = Recipe {
            size: 0.02,
            ..Recipe::new("clip", 0)
        };
        assert!(small.widest().unwrap() <= 32);
    }
}
