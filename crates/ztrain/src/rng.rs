//! The run's random numbers: xoshiro256** seeded through SplitMix64. Written here (a few lines)
//! rather than taken from a crate so that its state is four plain `u64`s a checkpoint can store
//! and restore exactly, and so the synthetic data set stays the same across dependency updates.

/// A small, fast generator with a 256-bit state. Deterministic for a given seed on every
/// platform.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rng {
    s: [u64; 4],
}

/// SplitMix64: spreads one seed over the xoshiro state (never all zero).
fn splitmix64(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    /// A generator for `seed`; different seeds give unrelated streams.
    #[must_use]
    pub fn new(seed: u64) -> Rng {
        let mut x = seed;
        let s = [
            splitmix64(&mut x),
            splitmix64(&mut x),
            splitmix64(&mut x),
            splitmix64(&mut x),
        ];
        Rng { s }
    }

    /// The generator with exactly this state (from a checkpoint). `None` for the all-zero state,
    /// which xoshiro can never reach and never leaves.
    #[must_use]
    pub fn from_state(s: [u64; 4]) -> Option<Rng> {
        (s != [0; 4]).then_some(Rng { s })
    }

    /// The state, for a checkpoint.
    #[must_use]
    pub fn state(&self) -> [u64; 4] {
        self.s
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n` (`n > 0`), without modulo bias (Lemire's method).
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }

    /// A standard normal sample (Box–Muller; one of the pair is dropped so that the state
    /// alone determines the stream, with no cached spare to checkpoint).
    pub fn normal(&mut self) -> f64 {
        // 1 - u is in (0, 1], so the logarithm is finite.
        let u = 1.0 - self.next_f64();
        let v = self.next_f64();
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    /// Advances the stream past `n` normals without computing them: `n` calls of
    /// [`Rng::normal`] leave the generator in the same state.
    pub fn skip_normals(&mut self, n: usize) {
        for _ in 0..2 * n {
            self.next_u64();
        }
    }

    /// Shuffles `items` in place (Fisher–Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::{any, prop_assert, prop_assert_eq, proptest};

    #[test]
    fn same_seed_same_stream_and_state_round_trips() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        for _ in 0..10 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let mut c = Rng::from_state(a.state()).expect("nonzero state");
        assert_eq!(a.next_u64(), c.next_u64());
        assert_ne!(Rng::new(7).next_u64(), Rng::new(8).next_u64());
    }

    #[test]
    fn zero_state_is_refused() {
        assert!(Rng::from_state([0; 4]).is_none());
    }

    #[test]
    fn normal_has_unit_moments() {
        let mut r = Rng::new(1);
        let n = 200_000;
        let xs: Vec<f64> = (0..n).map(|_| r.normal()).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "var {var}");
    }

    proptest! {
        #[test]
        fn below_stays_in_range(seed in any::<u64>(), n in 1u64..1000) {
            let mut r = Rng::new(seed);
            for _ in 0..50 {
                prop_assert!(r.below(n) < n);
            }
        }

        #[test]
        fn shuffle_is_a_permutation(seed in any::<u64>(), n in 0usize..200) {
            let mut v: Vec<usize> = (0..n).collect();
            Rng::new(seed).shuffle(&mut v);
            let mut sorted = v.clone();
            sorted.sort_unstable();
            prop_assert_eq!(sorted, (0..n).collect::<Vec<_>>());
        }
    }
}
