//! The built-in models: the six of the paper's evaluation (§5.1) and the four-module OFASys of
//! its Fig. 14a.

mod clip;
mod ctvlm;
mod imagebind;
mod ofasys;
mod qwen3_vl;
mod unified_io_2;

use crate::error::ZooError;
use crate::spec::ModelSpec;

/// All built-in models, in the order of the paper's Fig. 9, then `ofasys-4`.
pub fn models() -> Vec<ModelSpec> {
    vec![
        clip::clip(),
        qwen3_vl::qwen3_vl(),
        unified_io_2::unified_io_2(),
        imagebind::imagebind(),
        ofasys::ofasys(),
        ctvlm::ctvlm(),
        ofasys::ofasys_4(),
    ]
}

/// Whether `a` and `b` name the same model: compared lower case without `-`, `_`, spaces or
/// dots, so that `Qwen3-VL`, `qwen3vl` and `QWEN3_VL` are one.
pub fn same_model(a: &str, b: &str) -> bool {
    normalise(a) == normalise(b)
}

/// Lower case without `-`, `_`, spaces or dots ([`same_model`]).
fn normalise(name: &str) -> String {
    name.chars()
        .filter(|c| !matches!(c, '-' | '_' | ' ' | '.'))
        .flat_map(char::to_lowercase)
        .collect()
}

/// The built-in model called `name` (case, `-` and `_` ignored).
pub fn model(name: &str) -> Result<ModelSpec, ZooError> {
    let all = models();
    let key = normalise(name);
    match all.iter().position(|m| normalise(&m.name) == key) {
        Some(i) => Ok(all.into_iter().nth(i).expect("index from position")),
        None => Err(ZooError::UnknownModel {
            name: name.to_string(),
            known: all
                .iter()
                .map(|m| m.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}
