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

/// Sum of losses and of correct predictions over some samples.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Tally {
    pub loss_sum: f64,
    pub correct: f64,
    pub samples: u64,
}

impl Tally {
    /// A tally of `samples` samples with mean loss `loss` and accuracy `accuracy`.
    #[must_use]
    pub fn of(samples: usize, loss: f64, accuracy: f64) -> Tally {
        Tally {
            loss_sum: loss * samples as f64,
            correct: accuracy * samples as f64,
            samples: samples as u64,
        }
    }

    pub fn add(&mut self, other: Tally) {
        self.loss_sum += other.loss_sum;
        self.correct += other.correct;
        self.samples += other.samples;
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
}
