//! A small deterministic random source for test data, synthetic models, initialisation and
//! synthetic batches.
//!
//! [`SplitMix64`] (Steele, Lea and Flood, "Fast splittable pseudorandom number generators",
//! OOPSLA 2014) is self-contained rather than the `rand` crate, so that no dependency update
//! can change what a seed gives: a test, a benchmark or a training run sees the same numbers
//! forever. [`SplitMix64::stream`] derives independent streams from a seed and a label, so
//! that, for example, one module's initial weights do not depend on which other modules exist.

/// The golden-ratio increment of SplitMix64's state.
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's finaliser: two multiply-xorshifts and a final xorshift.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The SplitMix64 pseudo-random generator (Steele, Lea and Flood, OOPSLA 2014): tiny, fast,
/// and good enough for test data. Not for cryptography.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose sequence is fully determined by `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// An independent stream for `(seed, label, index)`, e.g. `("init/vision", 0)` or
    /// `("batch", step)`: the label is hashed (FNV-1a) and mixed with the seed and the index.
    pub fn stream(seed: u64, label: &str, index: u64) -> Self {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in label.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        SplitMix64::new(mix(mix(seed ^ GOLDEN) ^ h).wrapping_add(mix(index.wrapping_add(GOLDEN))))
    }

    /// The next 64 uniformly distributed bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        mix(self.state)
    }

    /// A uniform float in [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform float in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.next_f64()
    }

    /// A float in [lo, hi) whose logarithm is uniform (so every decade is equally likely);
    /// `lo` must be positive.
    pub fn log_uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo * (hi / lo).powf(self.next_f64())
    }

    /// A uniform integer in `0..n`; `n` must be positive.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "SplitMix64::below(0)");
        // Multiply-shift (Lemire): bias below 2^-64 per draw, irrelevant for test data.
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// A uniform integer in `lo..=hi`; requires `lo <= hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        assert!(lo <= hi, "SplitMix64::range({lo}, {hi})");
        lo + self.below((hi - lo) as u64 + 1) as usize
    }

    /// `true` with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.next_f64() < p
    }

    /// Shuffles `items` in place (Fisher–Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }

    /// A standard normal draw (Box–Muller, from two uniform draws).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64(); // (0, 1]
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// `n` normal draws with standard deviation `std`, as f32: the numbers of `n` calls of
    /// [`Self::normal`], drawn on every core when there are millions (a real-size model's
    /// initialisation). Each draw takes two steps of the state, so where every part of the
    /// sequence starts is known in advance.
    pub fn normals(&mut self, n: usize, std: f64) -> Vec<f32> {
        /// Draws below which one thread does it all.
        const PARALLEL_FROM: usize = 1 << 21;
        let parts = match n {
            0..PARALLEL_FROM => 1,
            _ => std::thread::available_parallelism().map_or(1, |t| t.get()),
        };
        self.normals_in(n, std, parts)
    }

    /// [`Self::normals`] in `parts` parts, each on its own thread (one: on this one).
    fn normals_in(&mut self, n: usize, std: f64, parts: usize) -> Vec<f32> {
        let start = self.state;
        let at = |draw: usize| start.wrapping_add(GOLDEN.wrapping_mul(2 * draw as u64));
        self.state = at(n);
        let fill = |first: usize, out: &mut [f32]| {
            let mut rng = SplitMix64 { state: at(first) };
            for x in out {
                *x = (rng.normal() * std) as f32;
            }
        };
        let mut out = vec![0f32; n];
        let per = n.div_ceil(parts.max(1)).max(1);
        if parts <= 1 {
            fill(0, &mut out);
            return out;
        }
        std::thread::scope(|s| {
            for (i, part) in out.chunks_mut(per).enumerate() {
                s.spawn(move || fill(i * per, part));
            }
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_are_pinned() {
        // SplitMix64's reference outputs for seed 0: a change here changes every synthetic
        // model, test and training run that was ever seeded.
        let mut r = SplitMix64::new(0);
        let first: Vec<u64> = (0..4).map(|_| r.next_u64()).collect();
        assert_eq!(
            first,
            [
                0xe220_a839_7b1d_cdaf,
                0x6e78_9e6a_a1b9_65f4,
                0x06c4_5d18_8009_454f,
                0xf88b_b8a8_724c_81ec
            ]
        );
        assert_eq!(SplitMix64::new(42).next_u64(), 0xbdd7_3226_2feb_6e95);
        // The engine's streams, uniform and normal draws (its `Rng` gave these).
        assert_eq!(
            SplitMix64::stream(7, "x", 3).next_u64(),
            0xc337_5784_d00f_5fd7
        );
        assert_eq!(SplitMix64::new(1).next_f64(), 0.5665615751722809);
        assert_eq!(SplitMix64::new(1).normal(), -0.034267321791851144);
    }

    #[test]
    fn streams_are_repeatable_and_distinct() {
        let a = |seed, label, index| SplitMix64::stream(seed, label, index).next_u64();
        assert_eq!(a(7, "x", 3), a(7, "x", 3));
        assert_ne!(a(7, "x", 3), a(7, "x", 4));
        assert_ne!(a(7, "x", 3), a(7, "y", 3));
        assert_ne!(a(7, "x", 3), a(8, "x", 3));
    }

    #[test]
    fn draws_stay_in_their_ranges() {
        let mut r = SplitMix64::new(3);
        for _ in 0..1000 {
            assert!(r.below(5) < 5);
            assert!((2..=4).contains(&r.range(2, 4)));
            let u = r.uniform(-1.0, 1.0);
            assert!((-1.0..1.0).contains(&u));
            let l = r.log_uniform(1.0, 100.0);
            assert!((1.0..100.0).contains(&l));
        }
        let mut v: Vec<u32> = (0..50).collect();
        r.shuffle(&mut v);
        assert_ne!(v, (0..50).collect::<Vec<_>>());
        v.sort_unstable();
        assert_eq!(v, (0..50).collect::<Vec<_>>());
    }

    #[test]
    fn normals_in_parts_are_the_sequential_draws() {
        let mut one = SplitMix64::new(7);
        let sequential: Vec<f32> = (0..1001).map(|_| (one.normal() * 0.5) as f32).collect();
        for parts in [1, 2, 3, 8, 2000] {
            let mut r = SplitMix64::new(7);
            assert_eq!(r.normals_in(1001, 0.5, parts), sequential, "{parts} parts");
            assert_eq!(
                r.next_u64(),
                one.clone().next_u64(),
                "the state moves on alike"
            );
        }
    }

    #[test]
    fn normals_have_unit_variance() {
        let xs = SplitMix64::new(1).normals(20_000, 1.0);
        let mean = xs.iter().map(|&x| x as f64).sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!(
            mean.abs() < 0.03 && (var - 1.0).abs() < 0.05,
            "{mean} {var}"
        );
    }
}
