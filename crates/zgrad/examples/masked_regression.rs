//! A regression with missing targets: three values per sample, about a third of them missing
//! (`Task::regression(3).weighted()`: each target carries a weight, 0 where it is missing, so
//! a missing value adds nothing to the loss or the gradient, whatever is stored there),
//! trained with the per-sample schedule captured (one graph launch per sample), its
//! validation set evaluated on the device: MSE, MAE and Pearson correlation over the present
//! targets.
//!
//! ```sh
//! cargo run --release -p zgrad --example masked_regression                 # CPU
//! cargo run --release -p zgrad --example masked_regression -- --device sim # simulated device
//! cargo run --release -p zgrad --features gpu --example masked_regression -- --device cuda
//! ```

// An example program: it prints its metrics; its types are the user's own.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    missing_debug_implementations
)]

pub mod common;

use common::{Example, TaskMlp, main_of, train_epochs, uniform};
use zcompute::Capture;
use zgrad::{EvalReport, EvalSource, Load, Task, TrainSchedule, Trainer, TrainerConfig};

/// The sizes of a run (`MaskedRegression::default()` is the command's).
pub struct MaskedRegression {
    pub features: usize,
    pub hidden: usize,
    pub train: usize,
    pub batch: usize,
    pub epochs: usize,
    pub quiet: bool,
}

impl Default for MaskedRegression {
    fn default() -> Self {
        MaskedRegression {
            features: 8,
            hidden: 32,
            train: 2048,
            batch: 32,
            epochs: 6,
            quiet: false,
        }
    }
}

/// What a run measured.
#[derive(Debug)]
pub struct Outcome {
    pub first_loss: f64,
    pub last_loss: f64,
    pub before: EvalReport,
    pub after: EvalReport,
    /// Fraction of targets missing.
    pub missing: f64,
}

const K: usize = 3;

impl MaskedRegression {
    /// `n` samples and their targets `[n, 2, K]` (values, then weights): smooth functions of
    /// the features; a missing value holds a huge number to show it is never read.
    fn data(&self, seed: u64, n: usize) -> (Vec<f32>, Vec<f32>, f64) {
        let f = self.features;
        let a = uniform(11, K * f);
        let x = uniform(seed, n * f);
        let drop = uniform(seed + 100, n * K);
        let (mut y, mut missing) = (Vec::with_capacity(n * 2 * K), 0usize);
        for (i, s) in x.chunks_exact(f).enumerate() {
            let dot = |k: usize| -> f32 {
                a[k * f..(k + 1) * f]
                    .iter()
                    .zip(s)
                    .map(|(w, v)| w * v)
                    .sum()
            };
            let present: Vec<bool> = (0..K).map(|k| drop[i * K + k] > -0.33).collect();
            missing += present.iter().filter(|p| !**p).count();
            y.extend((0..K).map(|k| {
                if present[k] {
                    (dot(k)).tanh() + 0.25 * dot((k + 1) % K)
                } else {
                    1e6
                }
            }));
            y.extend(present.iter().map(|&p| f32::from(u8::from(p))));
        }
        (x, y, missing as f64 / (n * K) as f64)
    }
}

impl Example for MaskedRegression {
    type Out = Outcome;

    fn run<B: Capture<f32> + 'static>(&self, b: B) -> zgrad::Result<Outcome> {
        let task = Task::regression(K).weighted();
        let model = TaskMlp::new(&b, self.features, self.hidden, task, 3)?;
        let config = TrainerConfig {
            schedule: TrainSchedule::PerSample,
            capture: true,
            lr: 3e-3,
            eval_batch: 256,
            ..TrainerConfig::default()
        };
        let mut trainer = Trainer::new(b, model, config)?;
        let (x, y, missing) = self.data(1, self.train);
        let n_val = self.train / 4;
        let (vx, vy, _) = self.data(2, n_val);
        trainer.load(Load::Validation {
            x: &vx,
            y: &vy,
            n: n_val,
        })?;
        let before = trainer.evaluate(EvalSource::Validation)?;
        let (f, per) = (self.features, 2 * K);
        let (first_loss, last_loss) = train_epochs(
            &mut trainer,
            (&x, f),
            (&y, per),
            self.train,
            self.batch,
            self.epochs,
            self.quiet,
        )?;
        let after = trainer.evaluate(EvalSource::Validation)?;
        if !self.quiet {
            let (m0, m1) = (before.regression, after.regression);
            let m0 = m0.ok_or_else(|| zgrad::GradError::Config("no regression metrics".into()))?;
            let m1 = m1.ok_or_else(|| zgrad::GradError::Config("no regression metrics".into()))?;
            println!(
                "validation ({} samples, {:.0}% of targets missing): MSE {:.4} -> {:.4}, MAE {:.4} -> {:.4}, Pearson {:.3} -> {:.3}",
                after.samples,
                missing * 100.0,
                m0.mse,
                m1.mse,
                m0.mae,
                m1.mae,
                m0.pearson,
                m1.pearson
            );
        }
        Ok(Outcome {
            first_loss,
            last_loss,
            before,
            after,
            missing,
        })
    }
}

fn main() {
    main_of(&MaskedRegression::default());
}
