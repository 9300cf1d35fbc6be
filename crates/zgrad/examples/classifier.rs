//! A 10-class classifier: a perceptron whose task is "10 logits against a class index"
//! (`Task::class_index(10)`), trained with the batched schedule captured as one graph, its
//! validation set evaluated on the device (cross-entropy and accuracy, read back once).
//!
//! ```sh
//! cargo run --release -p zgrad --example classifier                 # CPU
//! cargo run --release -p zgrad --example classifier -- --device sim # simulated device
//! cargo run --release -p zgrad --features gpu --example classifier -- --device cuda
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

/// The sizes of a run (`Classifier::default()` is the command's).
pub struct Classifier {
    pub features: usize,
    pub classes: usize,
    pub hidden: usize,
    pub train: usize,
    pub batch: usize,
    pub epochs: usize,
    pub quiet: bool,
}

impl Default for Classifier {
    fn default() -> Self {
        Classifier {
            features: 16,
            classes: 10,
            hidden: 64,
            train: 4096,
            batch: 64,
            epochs: 8,
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
}

impl Classifier {
    /// `n` samples and their class: the largest of a fixed random linear map of the features.
    fn data(&self, seed: u64, n: usize) -> (Vec<f32>, Vec<f32>) {
        let (f, c) = (self.features, self.classes);
        let teacher = uniform(7, c * f);
        let x = uniform(seed, n * f);
        let y = x
            .chunks_exact(f)
            .map(|s| {
                let score = |k: usize| -> f32 {
                    teacher[k * f..(k + 1) * f]
                        .iter()
                        .zip(s)
                        .map(|(w, v)| w * v)
                        .sum()
                };
                (0..c).fold(0, |best, k| if score(k) > score(best) { k } else { best }) as f32
            })
            .collect();
        (x, y)
    }
}

impl Example for Classifier {
    type Out = Outcome;

    fn run<B: Capture<f32> + 'static>(&self, b: B) -> zgrad::Result<Outcome> {
        let task = Task::class_index(self.classes);
        let model = TaskMlp::new(&b, self.features, self.hidden, task, 1)?;
        let config = TrainerConfig {
            schedule: TrainSchedule::Batched,
            capture: true,
            lr: 3e-3,
            eval_batch: 512,
            ..TrainerConfig::default()
        };
        let mut trainer = Trainer::new(b, model, config)?;
        let (x, y) = self.data(1, self.train);
        let (vx, vy) = self.data(2, self.train / 4);
        trainer.load(Load::Validation {
            x: &vx,
            y: &vy,
            n: vy.len(),
        })?;
        let before = trainer.evaluate(EvalSource::Validation)?;
        let f = self.features;
        let (first_loss, last_loss) = train_epochs(
            &mut trainer,
            (&x, f),
            (&y, 1),
            self.train,
            self.batch,
            self.epochs,
            self.quiet,
        )?;
        let after = trainer.evaluate(EvalSource::Validation)?;
        if !self.quiet {
            println!(
                "validation ({} samples): cross-entropy {:.4} -> {:.4}, accuracy {:.3} -> {:.3}",
                after.samples, before.loss, after.loss, before.accuracy, after.accuracy
            );
        }
        Ok(Outcome {
            first_loss,
            last_loss,
            before,
            after,
        })
    }
}

fn main() {
    main_of(&Classifier::default());
}
