//! On/off settings of the engine read once from the environment: which ops run on a GPU
//! (`MOSAIC_KERNELS`, `kernels::KERNELS`, the GPU build's) and whether launch-bound modules replay CUDA
//! graphs (`MOSAIC_GRAPHS`, [`crate::runtime::graphed::GRAPHS`]). For measuring what a part
//! gains (the same binary, A against B) and for getting past one that fails on some GPU.

use std::ffi::OsStr;
use std::sync::OnceLock;

use crate::error::EngineError;

/// An environment variable that is unset or `on` (the default), or `off`, under its own words.
pub struct EnvSwitch {
    /// The variable.
    pub var: &'static str,
    /// The value that turns the part on (also the default).
    pub on: &'static str,
    /// The value that turns it off.
    pub off: &'static str,
    setting: OnceLock<Result<bool, String>>,
}

impl EnvSwitch {
    /// The switch of `var`, whose values are `on` and `off`.
    pub const fn new(var: &'static str, on: &'static str, off: &'static str) -> EnvSwitch {
        EnvSwitch {
            var,
            on,
            off,
            setting: OnceLock::new(),
        }
    }

    /// Whether the part is on (read once; a value the switch does not know counts as on here
    /// and is refused by [`EnvSwitch::check`]).
    pub fn is_on(&self) -> bool {
        self.setting().unwrap_or(true)
    }

    /// Err, naming the variable and the values it takes, where it holds another.
    pub fn check(&self) -> Result<(), EngineError> {
        self.setting()
            .map(|_| ())
            .map_err(|v| EngineError::BadSetting {
                setting: self.var.into(),
                message: format!(
                    "expected `{}` (the default) or `{}`, got `{v}`",
                    self.on, self.off
                ),
            })
    }

    fn setting(&self) -> Result<bool, String> {
        (self.setting)
            .get_or_init(|| self.parse(std::env::var_os(self.var).as_deref()))
            .clone()
    }

    /// A value (`None`: unset) as on or off, or the value not understood.
    fn parse(&self, v: Option<&OsStr>) -> Result<bool, String> {
        match v {
            None => Ok(true),
            Some(v) if v == self.on => Ok(true),
            Some(v) if v == self.off => Ok(false),
            Some(v) => Err(v.to_string_lossy().into_owned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_switch_is_on_by_default_off_by_its_word_and_refuses_the_rest() {
        let s = EnvSwitch::new("MOSAIC_TEST_SWITCH_UNSET", "fused", "composed");
        assert_eq!(s.parse(None), Ok(true));
        assert_eq!(s.parse(Some(OsStr::new("fused"))), Ok(true));
        assert_eq!(s.parse(Some(OsStr::new("composed"))), Ok(false));
        assert_eq!(s.parse(Some(OsStr::new("off"))), Err("off".to_string()));
        // Unset in the environment: on, and nothing to refuse.
        assert!(s.is_on());
        s.check().unwrap();
    }
}
