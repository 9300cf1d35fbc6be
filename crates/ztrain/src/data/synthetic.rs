//! The synthetic data set: deterministic for a seed, with a documented labelling rule.
//!
//! Every feature value `x[s, f]` is an independent standard normal (drawn in sample, scale,
//! feature order). Let `x̄_f` be feature `f` averaged over the `S` scales and
//! `K = min(F, INFORMATIVE_FEATURES)`. The clean label is
//!
//! ```text
//! y = 1  if  x̄_0 − x̄_1 + x̄_2 − x̄_3 + … ± x̄_(K−1) > 0,  else 0
//! ```
//!
//! (feature `f < K` weighs `+1` when `f` is even, `−1` when odd; the other features are noise).
//! Samples too close to the boundary are redrawn: with `z` the sum above scaled to unit variance
//! (`z = Σ_s Σ_f w_f x[s, f] / sqrt(S·K)`), a draw with `|z| < MARGIN` is discarded and the
//! sample drawn again, so the classes are separated by a gap a model can find from a few
//! thousand samples. Then each label is flipped with probability `FLIP_PROBABILITY` (5%), so
//! no model can beat 0.95 accuracy in expectation and a model that has learnt the rule lands
//! near it.
//!
//! Why this rule: the XAsset model pools over scales with a mean and has no position
//! information, so its output is a symmetric function of the scales; a rule on scale averages
//! is one it can represent, and it still has to find the informative features among all `F`.

use super::Dataset;
use crate::rng::Rng;
use rayon::prelude::*;

/// Features that carry the signal (the first ones; fewer when `F` is smaller).
pub const INFORMATIVE_FEATURES: usize = 8;

/// Half-width of the gap around the boundary, in standard deviations of the rule's score.
pub const MARGIN: f64 = 0.5;

/// Probability that a label is flipped after the rule is applied.
pub const FLIP_PROBABILITY: f64 = 0.05;

/// The rule's weight for feature `f`: `+1` or `−1` for the informative ones, else 0.
#[must_use]
pub fn rule_weight(f: usize) -> f64 {
    if f >= INFORMATIVE_FEATURES {
        0.0
    } else if f.is_multiple_of(2) {
        1.0
    } else {
        -1.0
    }
}

/// The rule's score of one sample given as `S·F` values in CSV order, scaled to unit variance
/// for standard normal features.
#[must_use]
pub fn score(sample: &[f32], scales: usize, features: usize) -> f64 {
    let k = features.min(INFORMATIVE_FEATURES);
    let mut sum = 0.0f64;
    for s in 0..scales {
        for f in 0..k {
            sum += rule_weight(f) * f64::from(sample[s * features + f]);
        }
    }
    sum / ((scales * k) as f64).sqrt()
}

/// The clean (unflipped) label of one sample given as `S·F` values in CSV order.
#[must_use]
pub fn clean_label(sample: &[f32], scales: usize, features: usize) -> f32 {
    // Averaging over the scales (or scaling) does not change the sign.
    if score(sample, scales, features) > 0.0 {
        1.0
    } else {
        0.0
    }
}

/// `samples` samples of `scales × features`, from `seed`.
///
/// The stream is the one a plain loop draws (every value of a sample in order, a rejected
/// sample drawn again, then the flip), in two passes so the bulk runs on every core with the
/// same bits: one pass on one thread walks the stream, computing only the informative values
/// the margin and the label need and stepping over the others, and keeps the generator's state
/// at the start of each accepted draw; then every sample's values are recomputed from its
/// state in parallel.
#[must_use]
pub fn generate(samples: usize, scales: usize, features: usize, seed: u64) -> Dataset {
    let width = scales * features;
    let (starts, y) = accepted_draws(samples, scales, features, seed);
    let mut x = vec![0.0f32; samples * width];
    if width > 0 {
        x.par_chunks_mut(width)
            .zip(starts.par_iter())
            .for_each(|(row, start)| {
                let mut rng = start.clone();
                for v in row {
                    *v = rng.normal() as f32;
                }
            });
    }
    Dataset {
        scales,
        features,
        x,
        y,
    }
}

/// The generator's state at the start of each sample's accepted draw, and the labels, from one
/// walk of the stream (the values outside the informative features are skipped, not computed).
fn accepted_draws(
    samples: usize,
    scales: usize,
    features: usize,
    seed: u64,
) -> (Vec<Rng>, Vec<f32>) {
    let mut rng = Rng::new(seed);
    let k = features.min(INFORMATIVE_FEATURES);
    let norm = ((scales * k) as f64).sqrt();
    let mut starts = Vec::with_capacity(samples);
    let mut y = Vec::with_capacity(samples);
    for _ in 0..samples {
        let (start, z) = loop {
            let start = rng.clone();
            // The sum `score` makes, in its order, from the same f32 values.
            let mut sum = 0.0f64;
            for _ in 0..scales {
                for f in 0..k {
                    sum += rule_weight(f) * f64::from(rng.normal() as f32);
                }
                rng.skip_normals(features - k);
            }
            let z = sum / norm;
            if z.abs() >= MARGIN {
                break (start, z);
            }
        };
        let mut label = if z > 0.0 { 1.0 } else { 0.0 };
        if rng.next_f64() < FLIP_PROBABILITY {
            label = 1.0 - label;
        }
        starts.push(start);
        y.push(label);
    }
    (starts, y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    /// The generator as one plain loop: every value in order, a rejected sample drawn again.
    fn generate_in_one_loop(samples: usize, scales: usize, features: usize, seed: u64) -> Dataset {
        let mut rng = Rng::new(seed);
        let width = scales * features;
        let mut x = Vec::with_capacity(samples * width);
        let mut y = Vec::with_capacity(samples);
        for _ in 0..samples {
            let start = x.len();
            loop {
                x.extend((0..width).map(|_| rng.normal() as f32));
                if score(&x[start..], scales, features).abs() >= MARGIN {
                    break;
                }
                x.truncate(start);
            }
            let mut label = clean_label(&x[start..], scales, features);
            if rng.next_f64() < FLIP_PROBABILITY {
                label = 1.0 - label;
            }
            y.push(label);
        }
        Dataset {
            scales,
            features,
            x,
            y,
        }
    }

    #[rstest]
    #[case(500, 12, 193, 7)]
    #[case(300, 3, 5, 1)]
    #[case(300, 2, 8, 9)]
    #[case(200, 1, 1, 42)]
    #[case(0, 12, 193, 3)]
    fn the_two_pass_generator_gives_the_one_loop_stream_bit_for_bit(
        #[case] samples: usize,
        #[case] scales: usize,
        #[case] features: usize,
        #[case] seed: u64,
    ) {
        let fast = generate(samples, scales, features, seed);
        let plain = generate_in_one_loop(samples, scales, features, seed);
        assert_eq!(fast.y, plain.y);
        let bits = |d: &Dataset| d.x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&fast), bits(&plain));
    }

    #[test]
    fn skipping_normals_leaves_the_state_computing_them_would() {
        let (mut a, mut b) = (Rng::new(5), Rng::new(5));
        for _ in 0..37 {
            a.normal();
        }
        b.skip_normals(37);
        assert_eq!(a.state(), b.state());
    }

    #[test]
    fn same_seed_same_data_other_seed_other_data() {
        assert_eq!(generate(20, 3, 5, 1), generate(20, 3, 5, 1));
        assert_ne!(generate(20, 3, 5, 1).x, generate(20, 3, 5, 2).x);
    }

    #[rstest]
    #[case(12, 193)]
    #[case(2, 3)]
    #[case(1, 1)]
    fn about_five_percent_of_labels_disagree_with_the_rule(
        #[case] scales: usize,
        #[case] features: usize,
    ) {
        let n = 20_000;
        let d = generate(n, scales, features, 42);
        let w = d.sample_width();
        let flipped = (0..n)
            .filter(|&i| clean_label(&d.x[i * w..(i + 1) * w], scales, features) != d.y[i])
            .count();
        let rate = flipped as f64 / n as f64;
        // Binomial(20000, 0.05): standard deviation 0.0015; 4 sigma.
        assert!((rate - FLIP_PROBABILITY).abs() < 0.006, "flip rate {rate}");
        // The rule is symmetric, so the classes are balanced.
        assert!((d.positive_fraction() - 0.5).abs() < 0.02);
    }

    #[test]
    fn no_sample_lies_inside_the_margin() {
        let d = generate(2000, 12, 193, 3);
        let w = d.sample_width();
        for i in 0..d.len() {
            assert!(score(&d.x[i * w..(i + 1) * w], 12, 193).abs() >= MARGIN);
        }
    }

    #[test]
    fn the_rule_reads_the_scale_averages_of_the_informative_features() {
        // Two scales, ten features: only features 0..8 count, even +1, odd -1.
        let mut sample = vec![0.0f32; 20];
        sample[1] = 1.0; // -1 at scale 0
        assert_eq!(clean_label(&sample, 2, 10), 0.0);
        sample[10] = 2.0; // +2 at scale 1, feature 0
        assert_eq!(clean_label(&sample, 2, 10), 1.0);
        sample[19] = 100.0; // feature 9: noise
        sample[18] = -100.0; // feature 8: noise
        assert_eq!(clean_label(&sample, 2, 10), 1.0);
    }
}
