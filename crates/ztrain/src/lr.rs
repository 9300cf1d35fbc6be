//! The learning rate of each optimiser step.

use crate::cli::LrSchedule;

/// The learning rate of step `t` (counted from 1) of a run of `total` steps: linear warm-up
/// from `peak / (warmup + 1)` to `peak` over the first `warmup` steps, then the schedule over the
/// remaining ones (decaying ones reach 0 only past the last step, so no step trains at lr 0).
#[must_use]
pub fn learning_rate(schedule: LrSchedule, peak: f64, warmup: u64, t: u64, total: u64) -> f64 {
    if t <= warmup {
        return peak * t as f64 / (warmup + 1) as f64;
    }
    let span = total.saturating_sub(warmup).max(1) as f64;
    // Progress through the decay: 0 at its first step, below 1 at the last.
    let p = ((t - warmup - 1) as f64 / span).min(1.0);
    match schedule {
        LrSchedule::Constant => peak,
        LrSchedule::Linear => peak * (1.0 - p),
        LrSchedule::Cosine => peak * 0.5 * (1.0 + (std::f64::consts::PI * p).cos()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::{prop_assert, proptest};
    use rstest::rstest;

    #[rstest]
    #[case(LrSchedule::Constant, 0, 1, 10, 1.0)]
    #[case(LrSchedule::Constant, 0, 10, 10, 1.0)]
    #[case(LrSchedule::Linear, 0, 1, 10, 1.0)]
    #[case(LrSchedule::Linear, 0, 6, 10, 0.5)]
    #[case(LrSchedule::Cosine, 0, 1, 10, 1.0)]
    #[case(LrSchedule::Cosine, 0, 6, 10, 0.5)]
    #[case(LrSchedule::Constant, 3, 1, 10, 0.25)]
    #[case(LrSchedule::Constant, 3, 3, 10, 0.75)]
    #[case(LrSchedule::Linear, 4, 5, 14, 1.0)]
    fn values(
        #[case] s: LrSchedule,
        #[case] warmup: u64,
        #[case] t: u64,
        #[case] total: u64,
        #[case] want: f64,
    ) {
        let got = learning_rate(s, 1.0, warmup, t, total);
        assert!((got - want).abs() < 1e-12, "{got} vs {want}");
    }

    proptest! {
        #[test]
        fn positive_and_never_above_peak(t in 1u64..500, total in 1u64..400, warmup in 0u64..50) {
            for s in [LrSchedule::Constant, LrSchedule::Linear, LrSchedule::Cosine] {
                let lr = learning_rate(s, 2e-3, warmup, t, total);
                prop_assert!((0.0..=2e-3).contains(&lr));
                if t <= total { prop_assert!(lr > 0.0); }
            }
        }
    }
}
