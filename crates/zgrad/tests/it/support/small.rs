//! The small XAsset the trainer tests share (F = 5, S = 3, D = 8, H = 2, FF = 16, one block)
//! and random labelled samples for it.

use zgrad::XAssetConfig;
use zgrad::rng::SplitMix64;

pub const SMALL: XAssetConfig = XAssetConfig {
    features: 5,
    scales: 3,
    width: 8,
    heads: 2,
    ff: 16,
    layers: 1,
};

/// `n` samples of `c` from `seed`: standard normal features, then labels 0 or 1 with equal
/// odds, all from one generator.
pub fn labelled(c: XAssetConfig, n: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let mut rng = SplitMix64::new(seed);
    let x = rng
        .normal_vec(n * c.scales * c.features)
        .iter()
        .map(|&v| v as f32)
        .collect();
    let y = (0..n)
        .map(|_| f32::from(u8::from(rng.next_f64() > 0.5)))
        .collect();
    (x, y)
}
