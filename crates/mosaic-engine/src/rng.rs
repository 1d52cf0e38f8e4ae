//! A small deterministic random source for initialisation and synthetic data.
//!
//! candle's CPU `randn` draws from the thread-local `rand` generator and cannot be seeded, so a
//! run could not be repeated bit for bit. Everything random in the engine comes from here
//! instead: SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
//! generators", OOPSLA 2014), with independent streams derived from a seed and a label, so that
//! a module's initial weights do not depend on which other modules exist or on the plan, and the
//! batch of step `s` does not depend on how many batches were drawn before (the data position
//! of a checkpoint is just `s`).

/// SplitMix64: 64 bits of state, one multiply-xorshift finaliser per draw.
#[derive(Debug, Clone)]
pub struct Rng(u64);

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// An independent stream for `(seed, label, index)`, e.g. `("init/vision", 0)` or
    /// `("batch", step)`.
    pub fn stream(seed: u64, label: &str, index: u64) -> Rng {
        // FNV-1a over the label, then mixed with the seed and the index.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in label.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        Rng(mix(mix(seed ^ GOLDEN) ^ h).wrapping_add(mix(index.wrapping_add(GOLDEN))))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN);
        mix(self.0)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        // Lemire's multiply-shift; the bias is below 2^-32 for the small n used here.
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform(); // (0, 1]
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// `n` normal draws with standard deviation `std`, as f32.
    pub fn normals(&mut self, n: usize, std: f64) -> Vec<f32> {
        (0..n).map(|_| (self.normal() * std) as f32).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_repeatable_and_distinct() {
        let a: Vec<u64> = (0..4).map(|_| Rng::stream(7, "x", 3).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        assert_ne!(
            Rng::stream(7, "x", 3).next_u64(),
            Rng::stream(7, "x", 4).next_u64()
        );
        assert_ne!(
            Rng::stream(7, "x", 3).next_u64(),
            Rng::stream(7, "y", 3).next_u64()
        );
        assert_ne!(
            Rng::stream(7, "x", 3).next_u64(),
            Rng::stream(8, "x", 3).next_u64()
        );
    }

    #[test]
    fn normals_have_unit_variance() {
        let mut r = Rng::new(1);
        let xs = r.normals(20_000, 1.0);
        let mean = xs.iter().map(|&x| x as f64).sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!(
            mean.abs() < 0.03 && (var - 1.0).abs() < 0.05,
            "{mean} {var}"
        );
        assert!((0..1000).all(|_| r.below(5) < 5));
    }
}
