//! Learning-rate schedules: the rate of optimiser step `t` (counted from 1) as a function of the
//! base rate. Pure host arithmetic; the trainer writes the result into the optimiser's slot in
//! device memory before each step, so a captured step follows the schedule on replay.

/// How the learning rate changes over the steps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LrSchedule {
    /// The base rate at every step.
    Constant,
    /// Rises linearly from `base/warmup_steps` to `base` over the first `warmup_steps`, then
    /// stays there.
    LinearWarmup { warmup_steps: u64 },
    /// Linear warm-up, then a half cosine from `base` down to `base * min_ratio` at
    /// `total_steps`; stays at the minimum after.
    Cosine {
        warmup_steps: u64,
        total_steps: u64,
        min_ratio: f64,
    },
}

/// How the rate decays after the warm-up, before the run's length is known (a command line's
/// choice); [`LrDecay::schedule`] makes the [`LrSchedule`] once it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LrDecay {
    /// The base rate throughout (after the warm-up).
    Constant,
    /// A half cosine from the base rate to 0 over the run's steps (after the warm-up).
    Cosine,
}

impl LrDecay {
    /// The schedule of a run of `total_steps` with `warmup_steps` of linear warm-up.
    #[must_use]
    pub fn schedule(self, warmup_steps: u64, total_steps: u64) -> LrSchedule {
        match self {
            LrDecay::Constant if warmup_steps == 0 => LrSchedule::Constant,
            LrDecay::Constant => LrSchedule::LinearWarmup { warmup_steps },
            LrDecay::Cosine => LrSchedule::Cosine {
                warmup_steps,
                total_steps,
                min_ratio: 0.0,
            },
        }
    }
}

impl LrSchedule {
    /// The rate of step `step` (1-based; 0 is treated as 1).
    #[must_use]
    pub fn lr_at(&self, base: f64, step: u64) -> f64 {
        let step = step.max(1);
        let warm = |w: u64| {
            if w > 0 && step < w {
                step as f64 / w as f64
            } else {
                1.0
            }
        };
        match *self {
            LrSchedule::Constant => base,
            LrSchedule::LinearWarmup { warmup_steps } => base * warm(warmup_steps),
            LrSchedule::Cosine {
                warmup_steps,
                total_steps,
                min_ratio,
            } => {
                if step < warmup_steps {
                    return base * warm(warmup_steps);
                }
                let span = total_steps.saturating_sub(warmup_steps).max(1);
                let done = (step - warmup_steps).min(span) as f64 / span as f64;
                let cos = 0.5 * (1.0 + (std::f64::consts::PI * done).cos());
                base * (min_ratio + (1.0 - min_ratio) * cos)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{LrDecay, LrSchedule};
    use rstest::rstest;

    #[rstest]
    #[case(LrDecay::Constant, 0, LrSchedule::Constant)]
    #[case(LrDecay::Constant, 3, LrSchedule::LinearWarmup { warmup_steps: 3 })]
    #[case(LrDecay::Cosine, 3, LrSchedule::Cosine { warmup_steps: 3, total_steps: 10, min_ratio: 0.0 })]
    fn a_decay_becomes_the_schedule_of_the_run(
        #[case] decay: LrDecay,
        #[case] warmup: u64,
        #[case] want: LrSchedule,
    ) {
        assert_eq!(decay.schedule(warmup, 10), want);
    }

    #[rstest]
    #[case::constant(LrSchedule::Constant, 7, 1.0)]
    #[case::warmup_first(LrSchedule::LinearWarmup { warmup_steps: 4 }, 1, 0.25)]
    #[case::warmup_mid(LrSchedule::LinearWarmup { warmup_steps: 4 }, 2, 0.5)]
    #[case::warmup_done(LrSchedule::LinearWarmup { warmup_steps: 4 }, 9, 1.0)]
    #[case::cosine_warm(LrSchedule::Cosine { warmup_steps: 2, total_steps: 12, min_ratio: 0.1 }, 1, 0.5)]
    #[case::cosine_top(LrSchedule::Cosine { warmup_steps: 2, total_steps: 12, min_ratio: 0.1 }, 2, 1.0)]
    #[case::cosine_half(LrSchedule::Cosine { warmup_steps: 2, total_steps: 12, min_ratio: 0.1 }, 7, 0.55)]
    #[case::cosine_end(LrSchedule::Cosine { warmup_steps: 2, total_steps: 12, min_ratio: 0.1 }, 12, 0.1)]
    #[case::cosine_after(LrSchedule::Cosine { warmup_steps: 2, total_steps: 12, min_ratio: 0.1 }, 40, 0.1)]
    fn rates(#[case] s: LrSchedule, #[case] step: u64, #[case] ratio: f64) {
        let lr = s.lr_at(2e-3, step);
        assert!((lr - 2e-3 * ratio).abs() < 1e-15, "{s:?} step {step}: {lr}");
    }
}
