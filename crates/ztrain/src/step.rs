//! The bridge to zgrad's `Trainer`: the backend bound the run needs, the trainer's
//! configuration from the run's, and running tallies of loss and accuracy.

use zcompute::{Backend, Capture, PinnedHost};
use zgrad::TrainerConfig;

use crate::config::RunConfig;

/// The backend traits the run needs (zgrad's trainer captures through `Capture`; a training
/// set on the host is staged in `PinnedHost` memory).
pub trait TrainBackend: Backend<f32> + Capture<f32> + PinnedHost<f32> + Clone + 'static {}
impl<B: Backend<f32> + Capture<f32> + PinnedHost<f32> + Clone + 'static> TrainBackend for B {}

/// zgrad's trainer configuration for `config`, a run of `total_steps` optimiser steps.
#[must_use]
// The struct update fills the test-only fields zgrad's `testing` feature adds (the tests' build
// has them, ztrain's own build does not).
#[allow(clippy::needless_update)]
pub fn trainer_config(config: &RunConfig, total_steps: u64) -> TrainerConfig {
    TrainerConfig {
        schedule: config.schedule,
        capture: config.capture,
        lr: config.lr,
        lr_schedule: config
            .lr_schedule
            .schedule(config.warmup_steps, total_steps),
        clip_grad: config.clip_grad,
        adamw: zgrad::AdamWHyper {
            weight_decay: config.weight_decay,
            ..zgrad::AdamWHyper::default()
        },
        sgd: config.sgd,
        eval_batch: config.batch,
        precision: config.precision,
        ..TrainerConfig::default()
    }
}

/// Sum of losses and of correct predictions over some samples, and a regression's metrics
/// where an evaluation reported them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Tally {
    pub loss_sum: f64,
    pub correct: f64,
    pub samples: u64,
    /// A regression task's evaluation (`zgrad::EvalReport::regression`): its metrics stand
    /// for the task's, and `correct` (NaN) is not one. `None` for a classification task and
    /// for a running tally of training steps.
    pub regression: Option<zgrad::RegressionMetrics>,
}

impl Tally {
    /// A tally of `samples` samples with mean loss `loss` and accuracy `accuracy`.
    #[must_use]
    pub fn of(samples: usize, loss: f64, accuracy: f64) -> Tally {
        Tally {
            loss_sum: loss * samples as f64,
            correct: accuracy * samples as f64,
            samples: samples as u64,
            regression: None,
        }
    }

    /// The tally of an evaluation: its loss and accuracy, and a regression's metrics.
    #[must_use]
    pub fn of_report(e: &zgrad::EvalReport) -> Tally {
        Tally {
            regression: e.regression,
            ..Tally::of(e.samples, e.loss, e.accuracy)
        }
    }

    /// Adds `other`'s samples. A regression's metrics do not add up from two tallies', so
    /// the sum has them only when one side has no samples.
    pub fn add(&mut self, other: Tally) {
        self.regression = match (self.samples, other.samples) {
            (0, _) => other.regression,
            (_, 0) => self.regression,
            _ => None,
        };
        self.loss_sum += other.loss_sum;
        self.correct += other.correct;
        self.samples += other.samples;
    }

    /// The task's metrics as a line prints them: `acc 0.9404` for a classification,
    /// `mse 0.0123 mae 0.0890 pearson 0.987` for a regression.
    #[must_use]
    pub fn metrics_text(&self) -> String {
        match self.regression {
            Some(r) => format!("mse {:.4} mae {:.4} pearson {:.3}", r.mse, r.mae, r.pearson),
            None => format!("acc {:.4}", self.accuracy()),
        }
    }

    /// The accuracy where the task reports one (`None` for a regression).
    #[must_use]
    pub fn reported_accuracy(&self) -> Option<f64> {
        self.regression.is_none().then(|| self.accuracy())
    }

    #[must_use]
    pub fn mean_loss(&self) -> f64 {
        self.loss_sum / self.samples.max(1) as f64
    }

    #[must_use]
    pub fn accuracy(&self) -> f64 {
        self.correct / self.samples.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tallies_weight_by_samples() {
        let mut t = Tally::of(2, 1.0, 0.5);
        t.add(Tally::of(6, 0.2, 1.0));
        assert!((t.mean_loss() - 0.4).abs() < 1e-12);
        assert!((t.accuracy() - 7.0 / 8.0).abs() < 1e-12);
        assert_eq!(Tally::default().mean_loss(), 0.0);
    }

    #[test]
    fn a_regressions_tally_prints_its_metrics_and_no_accuracy() {
        let report = zgrad::EvalReport {
            loss: 0.0123,
            accuracy: f64::NAN,
            samples: 24,
            regression: Some(zgrad::RegressionMetrics {
                mse: 0.0123,
                mae: 0.089,
                pearson: 0.9871,
            }),
        };
        let t = Tally::of_report(&report);
        assert_eq!(t.metrics_text(), "mse 0.0123 mae 0.0890 pearson 0.987");
        assert_eq!(t.reported_accuracy(), None);
        let c = Tally::of(4, 0.5, 0.75);
        assert_eq!(c.metrics_text(), "acc 0.7500");
        assert_eq!(c.reported_accuracy(), Some(0.75));
        // Two regressions' metrics do not add up: the sum has none rather than a wrong one.
        let mut sum = Tally::default();
        sum.add(t);
        assert_eq!(sum.regression, t.regression);
        sum.add(t);
        assert_eq!(sum.regression, None);
    }
}
