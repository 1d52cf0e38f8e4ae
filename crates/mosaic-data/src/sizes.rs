//! Seeded synthetic per-sample token counts with the skew of real multimodal data.
//!
//! DistTrain §2.3 (Fig. 5) measures LAION-400M: text and image subsequence sizes, and the
//! number of images per sample, all have skewed, long-tailed distributions, packed into
//! 8K-token training sequences. The figure gives histograms, not fitted parameters, so the
//! constants below reproduce that shape and are illustrative, not a fit.

use mosaic_kit::rng::SplitMix64;

/// Training sequence length of DistTrain's characterisation (§2.3: "an 8K-token input
/// sequence"); samples are clamped to it.
pub const SEQ_MAX: u32 = 8192;
/// Median text length in tokens: DistTrain §4.2's "typical training sample" has a 256-word text.
pub const TEXT_MEDIAN: f64 = 256.0;
/// Log-space spread of text lengths: a long right tail (p99 ≈ 10× the median), as Fig. 5(a).
pub const TEXT_SIGMA: f64 = 1.0;
/// Tokens per image: one token per 16×16 patch (§2.3) of a 256×256 image.
pub const IMAGE_TOKENS: u32 = 256;
/// Chance of one more image per sample: a geometric count, mean 1, skewed as Fig. 5(c).
pub const IMAGE_CONTINUE: f64 = 0.5;

/// A distribution of per-sample token counts for [`generate`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Distribution {
    /// Log-normal lengths, `median · exp(sigma · N(0, 1))`: text (DistTrain Fig. 5(a)).
    LogNormal {
        /// The median length, in tokens.
        median: f64,
        /// The spread: the standard deviation of the natural log of the length.
        sigma: f64,
        /// The largest count, in tokens; longer draws are clamped to it (0 is read as 1).
        max: u32,
    },
    /// A log-normal text plus a geometric number of images of `image_tokens` each (another
    /// image with chance `image_continue`): interleaved samples (DistTrain Fig. 5(a)–(c)).
    Interleaved {
        /// The median text length, in tokens.
        text_median: f64,
        /// The spread of text lengths: the standard deviation of their natural log.
        text_sigma: f64,
        /// The tokens of one image.
        image_tokens: u32,
        /// The chance, from 0 to 1, of one more image: images are added while a draw with
        /// this chance succeeds.
        image_continue: f64,
        /// The largest count, in tokens; longer draws are clamped to it (0 is read as 1), and
        /// images stop once they alone reach it.
        max: u32,
    },
}

impl Distribution {
    /// Text-only samples with the paper-derived constants above.
    pub const TEXT: Distribution = Distribution::LogNormal {
        median: TEXT_MEDIAN,
        sigma: TEXT_SIGMA,
        max: SEQ_MAX,
    };
    /// Interleaved image–text samples with the paper-derived constants above.
    pub const INTERLEAVED: Distribution = Distribution::Interleaved {
        text_median: TEXT_MEDIAN,
        text_sigma: TEXT_SIGMA,
        image_tokens: IMAGE_TOKENS,
        image_continue: IMAGE_CONTINUE,
        max: SEQ_MAX,
    };

    /// The names [`Distribution::by_name`] knows.
    pub const NAMES: [&'static str; 2] = ["text", "interleaved"];

    /// The built-in distribution called `name`: `"text"` ([`Distribution::TEXT`]) or
    /// `"interleaved"` ([`Distribution::INTERLEAVED`]).
    pub fn by_name(name: &str) -> Option<Distribution> {
        match name {
            "text" => Some(Distribution::TEXT),
            "interleaved" => Some(Distribution::INTERLEAVED),
            _ => None,
        }
    }

    fn max(&self) -> u32 {
        match *self {
            Distribution::LogNormal { max, .. } | Distribution::Interleaved { max, .. } => max,
        }
    }

    fn sample(&self, rng: &mut SplitMix64) -> f64 {
        match *self {
            Distribution::LogNormal { median, sigma, .. } => median * (sigma * rng.normal()).exp(),
            Distribution::Interleaved {
                text_median,
                text_sigma,
                image_tokens,
                image_continue,
                max,
            } => {
                let text = text_median * (text_sigma * rng.normal()).exp();
                let mut images = 0.0;
                // The cap keeps a degenerate `image_continue ≥ 1` from looping forever.
                while images * f64::from(image_tokens.max(1)) < f64::from(max)
                    && rng.chance(image_continue)
                {
                    images += 1.0;
                }
                text + images * f64::from(image_tokens)
            }
        }
    }
}

/// `n` per-sample token counts drawn from `dist`, rounded and clamped to `[1, max]`; the same
/// `seed` always gives the same counts (SplitMix64 from `mosaic-kit`).
pub fn generate(dist: Distribution, n: usize, seed: u64) -> Vec<u32> {
    let mut rng = SplitMix64::new(seed);
    let max = dist.max().max(1);
    (0..n)
        .map(|_| dist.sample(&mut rng).round().clamp(1.0, f64::from(max)) as u32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve() {
        for name in Distribution::NAMES {
            assert!(Distribution::by_name(name).is_some(), "{name}");
        }
        assert_eq!(Distribution::by_name("text"), Some(Distribution::TEXT));
        assert_eq!(Distribution::by_name("audio"), None);
    }
}
