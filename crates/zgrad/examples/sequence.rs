//! A sequence model: an attention encoder over sequences of S tokens of F features, one
//! logit per position, trained to name the position of the token whose first feature is the
//! largest (`Task::class_index(S)`: S logits against the position's index). Built from
//! zgrad's `nn` modules (a Linear token embedding, one `EncoderBlock` with QK-norm attention,
//! a Linear head per token).
//!
//! Sequences here are all of length S with no padding: an embedding of token ids and a
//! key-padding mask are ops being added beside this work (issue 40, item 3); this example
//! uses only the ops there are.
//!
//! ```sh
//! cargo run --release -p zgrad --example sequence                 # CPU
//! cargo run --release -p zgrad --example sequence -- --device sim # simulated device
//! cargo run --release -p zgrad --features gpu --example sequence -- --device cuda
//! ```

// An example program: it prints its metrics; its types are the user's own.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    missing_debug_implementations
)]

pub mod common;

use common::{Example, device_from_args, fail, on_device, uniform};
use zcompute::{Capture, prelude::*};
use zgrad::nn::{EncoderBlock, Linear};
use zgrad::rng::SplitMix64;
use zgrad::{EvalReport, GradError, Model, Tape, Task, TrainSchedule, Trainer, TrainerConfig, Var};

/// Tokens `[S, F]` -> `Linear(F, D)` -> encoder block -> `Linear(D, 1)` per token: `[S]`
/// logits over the positions.
pub struct Encoder<B: Ops<f32>> {
    pub tokens: usize,
    pub features: usize,
    pub embed: Linear<B, f32>,
    pub block: EncoderBlock<B, f32>,
    pub head: Linear<B, f32>,
}

// By hand: a derive would ask `B: Clone`; a clone shares the parameters.
impl<B: Ops<f32>> Clone for Encoder<B> {
    fn clone(&self) -> Self {
        Encoder {
            tokens: self.tokens,
            features: self.features,
            embed: self.embed.clone(),
            block: self.block.clone(),
            head: self.head.clone(),
        }
    }
}

impl<B: Ops<f32>> Encoder<B> {
    pub fn new(
        b: &B,
        tokens: usize,
        features: usize,
        width: usize,
        heads: usize,
        seed: u64,
    ) -> zgrad::Result<Self> {
        let mut rng = SplitMix64::new(seed);
        Ok(Encoder {
            tokens,
            features,
            embed: Linear::init(b, features, width, &mut rng)?,
            block: EncoderBlock::init(b, width, heads, 2 * width, &mut rng)?,
            head: Linear::init(b, width, 1, &mut rng)?,
        })
    }
}

impl<B: Ops<f32> + 'static> Model<B, f32> for Encoder<B> {
    fn task(&self) -> Task {
        Task::class_index(self.tokens)
    }

    fn named_parameters(&self) -> Vec<(String, Var<B, f32>)> {
        let mut out = vec![
            ("embed.weight".to_string(), self.embed.weight.clone()),
            ("embed.bias".to_string(), self.embed.bias.clone()),
        ];
        out.extend(self.block.named_parameters("block."));
        out.push(("head.weight".to_string(), self.head.weight.clone()));
        out.push(("head.bias".to_string(), self.head.bias.clone()));
        out
    }

    fn loss(
        &self,
        tape: &Tape<'_, B, f32>,
        x: &Var<B, f32>,
        y: &Var<B, f32>,
    ) -> zgrad::Result<(Var<B, f32>, Var<B, f32>)> {
        let batch = x.shape()[0];
        let h = self.embed.forward(tape, x)?;
        let h = self.block.forward(tape, &h)?;
        let logits = tape.reshape(&self.head.forward(tape, &h)?, &[batch, self.tokens])?;
        Ok((
            tape.task_loss(&Model::<B, f32>::task(self), &logits, y)?,
            logits,
        ))
    }

    fn sample_shape(&self, values: usize) -> zgrad::Result<Vec<usize>> {
        let (s, f) = (self.tokens, self.features);
        if values != s * f {
            return Err(GradError::BadInput(format!(
                "a sample of {values} values: the encoder takes [{s}, {f}]"
            )));
        }
        Ok(vec![s, f])
    }
}

/// The sizes of a run (`Sequence::default()` is the command's).
pub struct Sequence {
    pub tokens: usize,
    pub features: usize,
    pub width: usize,
    pub train: usize,
    pub batch: usize,
    pub epochs: usize,
    pub quiet: bool,
}

impl Default for Sequence {
    fn default() -> Self {
        Sequence {
            tokens: 8,
            features: 4,
            width: 16,
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
}

impl Sequence {
    fn data(&self, seed: u64, n: usize) -> (Vec<f32>, Vec<f32>) {
        let (s, f) = (self.tokens, self.features);
        let x = uniform(seed, n * s * f);
        let y = x
            .chunks_exact(s * f)
            .map(|seq| {
                (0..s).fold(
                    0,
                    |best, t| if seq[t * f] > seq[best * f] { t } else { best },
                ) as f32
            })
            .collect();
        (x, y)
    }
}

impl Example for Sequence {
    type Out = Outcome;

    fn run<B: Capture<f32> + 'static>(&self, b: B) -> zgrad::Result<Outcome> {
        let model = Encoder::new(&b, self.tokens, self.features, self.width, 2, 5)?;
        let config = TrainerConfig {
            schedule: TrainSchedule::Batched,
            capture: true,
            lr: 3e-3,
            eval_batch: 256,
            ..TrainerConfig::default()
        };
        let mut trainer = Trainer::new(b, model, config)?;
        let (x, y) = self.data(1, self.train);
        let (vx, vy) = self.data(2, self.train / 4);
        trainer.load_validation(&vx, &vy, vy.len())?;
        let before = trainer.evaluate_validation()?;
        let per = self.tokens * self.features;
        let (mut first_loss, mut last_loss) = (None, 0.0);
        for epoch in 0..self.epochs {
            let steps = self.train / self.batch;
            let mut sum = 0.0;
            for s in 0..steps {
                let rows = s * self.batch..(s + 1) * self.batch;
                let r = trainer.train_batch(
                    &x[rows.start * per..rows.end * per],
                    &y[rows.clone()],
                    self.batch,
                )?;
                first_loss.get_or_insert(r.loss);
                sum += r.loss;
            }
            last_loss = sum / steps as f64;
            if !self.quiet {
                println!("epoch {epoch}: mean training loss {last_loss:.4}");
            }
        }
        let after = trainer.evaluate_validation()?;
        if !self.quiet {
            println!(
                "validation ({} sequences of {}): cross-entropy {:.4} -> {:.4}, accuracy {:.3} -> {:.3} (chance {:.3})",
                after.samples,
                self.tokens,
                before.loss,
                after.loss,
                before.accuracy,
                after.accuracy,
                1.0 / self.tokens as f64
            );
        }
        Ok(Outcome {
            first_loss: first_loss.unwrap_or(f64::NAN),
            last_loss,
            before,
            after,
        })
    }
}

fn main() {
    let device = device_from_args().unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    });
    if let Err(e) = on_device(device, &Sequence::default()) {
        fail(&e);
    }
}
