//! The device model's free constants: the ones `mosaic calibrate` fits to a measured profile.

use crate::analytic::Calibration;
use crate::bounds;

/// A constant of [`Calibration`] that is fitted to measurements rather than assumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FreeConstant {
    /// [`Calibration::gemm_efficiency`].
    GemmEfficiency,
    /// [`Calibration::rows_half`].
    RowsHalf,
    /// [`Calibration::sm_exponent`].
    SmExponent,
    /// [`Calibration::bw_saturation`].
    BwSaturation,
    /// [`Calibration::launch_step_ms`].
    LaunchStepMs,
    /// [`Calibration::launch_us`].
    LaunchUs,
    /// [`Calibration::overlap_exponent`].
    OverlapExponent,
}

impl FreeConstant {
    /// Every free constant, in the order fits report them.
    pub const ALL: [FreeConstant; 7] = [
        FreeConstant::GemmEfficiency,
        FreeConstant::RowsHalf,
        FreeConstant::SmExponent,
        FreeConstant::BwSaturation,
        FreeConstant::LaunchStepMs,
        FreeConstant::LaunchUs,
        FreeConstant::OverlapExponent,
    ];

    /// The field's name in [`Calibration`] (and in `mosaic-calibration/1` files).
    pub fn name(self) -> &'static str {
        match self {
            FreeConstant::GemmEfficiency => "gemm_efficiency",
            FreeConstant::RowsHalf => "rows_half",
            FreeConstant::SmExponent => "sm_exponent",
            FreeConstant::BwSaturation => "bw_saturation",
            FreeConstant::LaunchStepMs => "launch_step_ms",
            FreeConstant::LaunchUs => "launch_us",
            FreeConstant::OverlapExponent => "overlap_exponent",
        }
    }

    /// The range a fit may take it in: exactly the range a calibration file may state it in
    /// ([`Calibration::BOUNDS`], which says why), so that every fit is a valid file's.
    pub fn bounds(self) -> (f64, f64) {
        let b = match self {
            FreeConstant::GemmEfficiency => bounds::GEMM_EFFICIENCY,
            FreeConstant::RowsHalf => bounds::ROWS_HALF,
            FreeConstant::SmExponent => bounds::SM_EXPONENT,
            FreeConstant::BwSaturation => bounds::BW_SATURATION,
            FreeConstant::LaunchStepMs => bounds::LAUNCH_STEP_MS,
            FreeConstant::LaunchUs => bounds::LAUNCH_US,
            FreeConstant::OverlapExponent => bounds::OVERLAP_EXPONENT,
        };
        (b.min, b.max)
    }

    /// Its value in `cal`.
    pub fn get(self, cal: &Calibration) -> f64 {
        match self {
            FreeConstant::GemmEfficiency => cal.gemm_efficiency,
            FreeConstant::RowsHalf => cal.rows_half,
            FreeConstant::SmExponent => cal.sm_exponent,
            FreeConstant::BwSaturation => cal.bw_saturation,
            FreeConstant::LaunchStepMs => cal.launch_step_ms,
            FreeConstant::LaunchUs => cal.launch_us,
            FreeConstant::OverlapExponent => cal.overlap_exponent,
        }
    }

    /// `cal` with it set to `value`.
    pub fn set(self, cal: &mut Calibration, value: f64) {
        let field = match self {
            FreeConstant::GemmEfficiency => &mut cal.gemm_efficiency,
            FreeConstant::RowsHalf => &mut cal.rows_half,
            FreeConstant::SmExponent => &mut cal.sm_exponent,
            FreeConstant::BwSaturation => &mut cal.bw_saturation,
            FreeConstant::LaunchStepMs => &mut cal.launch_step_ms,
            FreeConstant::LaunchUs => &mut cal.launch_us,
            FreeConstant::OverlapExponent => &mut cal.overlap_exponent,
        };
        *field = value;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_then_get_round_trips_and_defaults_lie_in_bounds() {
        let mut cal = Calibration::default();
        for c in FreeConstant::ALL {
            let (lo, hi) = c.bounds();
            let v = c.get(&Calibration::default());
            assert!(
                v >= lo && v <= hi,
                "{} = {v} outside [{lo}, {hi}]",
                c.name()
            );
            c.set(&mut cal, 0.5 * (lo + hi));
            assert_eq!(c.get(&cal), 0.5 * (lo + hi));
        }
    }
}
