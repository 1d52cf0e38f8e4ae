//! Robust statistics: summaries that a few outliers (a descheduled thread, a cold cache, a
//! straggling kernel) do not move.
//!
//! Values are ordered by [`f64::total_cmp`], so NaNs do not panic: a (positive) NaN sorts
//! above every number, and is the median only when at least half of the values are NaN.

/// The values of `xs`, sorted by [`f64::total_cmp`].
fn sorted(xs: &[f64]) -> Vec<f64> {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

/// The median of `xs`: the middle value in sorted order, or the mean of the two middle values
/// when their number is even; `None` when `xs` is empty.
pub fn median(xs: &[f64]) -> Option<f64> {
    let v = sorted(xs);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// How far `a` is from the reference `b`: the largest |a − b| over the largest |b| (infinite
/// when their lengths differ, NaN when either holds a NaN, so that no bound is met), the
/// measure the GPU checks hold against their bounds.
pub fn relative_error(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return f32::INFINITY;
    }
    if a.iter().chain(b).any(|x| x.is_nan()) {
        return f32::NAN;
    }
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-30);
    let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    diff / scale
}

/// The largest of `errors` (0 for none), NaN where any is NaN: `f32::max` drops a NaN, and a
/// NaN error must meet no bound.
pub fn worst(errors: impl IntoIterator<Item = f32>) -> f32 {
    errors.into_iter().fold(0f32, |w, e| {
        if w.is_nan() || e.is_nan() {
            f32::NAN
        } else {
            w.max(e)
        }
    })
}

/// The high median of `xs`: the value at index `n / 2` of the sorted values (the middle one
/// when `n` is odd, the larger of the two middle ones when it is even), so always one of the
/// inputs; `None` when `xs` is empty.
pub fn median_high(xs: &[f64]) -> Option<f64> {
    let v = sorted(xs);
    v.get(v.len() / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn relative_error_is_over_the_references_largest_value() {
        assert_eq!(relative_error(&[1.0, 2.5], &[1.0, 2.0]), 0.25);
        assert_eq!(relative_error(&[0.0], &[0.0]), 0.0);
        assert_eq!(relative_error(&[1.0], &[1.0, 2.0]), f32::INFINITY);
        // A NaN anywhere meets no bound (`f32::max` alone would drop it).
        assert!(relative_error(&[1.0, f32::NAN], &[1.0, 2.0]).is_nan());
        assert!(relative_error(&[1.0, 2.0], &[f32::NAN, 2.0]).is_nan());
    }

    #[test]
    fn the_worst_error_keeps_a_nan() {
        assert_eq!(worst([]), 0.0);
        assert_eq!(worst([1e-3, 2e-2, 0.0]), 2e-2);
        assert!(worst([1e-3, f32::NAN, 2e-2]).is_nan());
        assert!(worst([f32::NAN, 1.0]).is_nan());
        let bound_met = worst([0.0, f32::NAN]) < 1.0;
        assert!(!bound_met, "a NaN meets no bound");
    }

    #[test]
    fn medians_of_small_samples() {
        assert_eq!(median(&[]), None);
        assert_eq!(median_high(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median_high(&[4.0, 1.0, 3.0, 2.0]), Some(3.0));
        assert_eq!(median_high(&[5.0, 1.0, 3.0]), Some(3.0));
        // An outlier does not move it.
        assert_eq!(median(&[1.0, 2.0, 1e9]), Some(2.0));
        // NaN sorts last instead of panicking.
        assert_eq!(median(&[f64::NAN, 1.0, 2.0]), Some(2.0));
    }

    proptest! {
        #[test]
        fn a_median_has_at_most_half_the_values_on_each_side(
            xs in prop::collection::vec(-1e6f64..1e6, 1..60)
        ) {
            let n = xs.len();
            let below = |m: f64| xs.iter().filter(|&&x| x < m).count();
            let above = |m: f64| xs.iter().filter(|&&x| x > m).count();

            let hi = median_high(&xs).unwrap();
            prop_assert!(xs.contains(&hi));
            prop_assert!(2 * below(hi) <= n && 2 * above(hi) <= n);

            let m = median(&xs).unwrap();
            prop_assert!(2 * below(m) <= n && 2 * above(m) <= n);
            if n % 2 == 1 {
                prop_assert_eq!(m, hi);
            } else {
                // Between the two middle values, which are inputs.
                let v = sorted(&xs);
                prop_assert!(v[n / 2 - 1] <= m && m <= v[n / 2]);
            }
        }
    }
}
