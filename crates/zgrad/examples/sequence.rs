//! A sequence model: token ids -> an embedding -> masked self-attention over sequences of
//! varying length -> the mean over each sequence's own (unpadded) positions -> a class.
//!
//! Each sample is `S` token ids (as whole numbers in `f32`), a sequence of 2..=S tokens from a
//! vocabulary `1..V`, padded with id 0 to `S`. Each token belongs to one of `C` classes
//! (`id % C`) and a sequence's label is the class most of its tokens belong to (the lowest on
//! a tie): `Task::class_index(C)`. The padding never counts: the key-padding mask (1 on the
//! sequence, 0 on padding, `min(id, 1)` on the device) keeps attention off padded keys
//! (`Tape::masked_attention`) and the pooling averages the unpadded positions only.
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

use common::{Example, main_of, train_epochs};
use zcompute::{Activation, Capture, prelude::*};
use zgrad::nn::Linear;
use zgrad::rng::SplitMix64;
use zgrad::{
    EvalReport, EvalSource, GradError, Load, Model, Tape, Task, TrainSchedule, Trainer,
    TrainerConfig, Var,
};

/// The id of padding (its row of the table is never read into a result).
pub const PAD: usize = 0;

/// `ids [B, S]` -> `embedding [V, D]` -> `x + attention(x)` (one head, key-padding mask) ->
/// `tanh(Linear(D, D))` -> mean over the unpadded positions `[B, D]` -> `Linear(D, C)`.
pub struct SequenceClassifier<B: Ops<f32>> {
    pub tokens: usize,
    pub classes: usize,
    pub embedding: Var<B, f32>,
    pub q: Linear<B, f32>,
    pub k: Linear<B, f32>,
    pub v: Linear<B, f32>,
    pub mix: Linear<B, f32>,
    pub head: Linear<B, f32>,
}

// By hand: a derive would ask `B: Clone`; a clone shares the parameters.
impl<B: Ops<f32>> Clone for SequenceClassifier<B> {
    fn clone(&self) -> Self {
        SequenceClassifier {
            tokens: self.tokens,
            classes: self.classes,
            embedding: self.embedding.clone(),
            q: self.q.clone(),
            k: self.k.clone(),
            v: self.v.clone(),
            mix: self.mix.clone(),
            head: self.head.clone(),
        }
    }
}

impl<B: Ops<f32>> SequenceClassifier<B> {
    pub fn new(
        b: &B,
        vocab: usize,
        tokens: usize,
        classes: usize,
        width: usize,
        seed: u64,
    ) -> zgrad::Result<Self> {
        let mut rng = SplitMix64::new(seed);
        let table: Vec<f32> = rng
            .normal_vec(vocab * width)
            .into_iter()
            .map(|v| v as f32)
            .collect();
        Ok(SequenceClassifier {
            tokens,
            classes,
            embedding: Var::parameter_from(b, &table, &[vocab, width])?,
            q: Linear::init(b, width, width, &mut rng)?,
            k: Linear::init(b, width, width, &mut rng)?,
            v: Linear::init(b, width, width, &mut rng)?,
            mix: Linear::init(b, width, width, &mut rng)?,
            head: Linear::init(b, width, classes, &mut rng)?,
        })
    }

    /// The logits `[B, C]` of the ids `[B, S]`.
    pub fn forward(
        &self,
        tape: &Tape<'_, B, f32>,
        ids: &Var<B, f32>,
    ) -> zgrad::Result<Var<B, f32>> {
        let (batch, s) = (ids.shape()[0], self.tokens);
        let width = self.embedding.shape()[1];
        // 1 on a token, 0 on padding (ids are whole numbers >= 0; PAD is 0).
        let one = Var::constant(tape.backend().full(&[], 1.0)?);
        let keep = tape.minimum(ids, &one)?;
        let x = tape.embedding(&self.embedding, ids.value())?;
        let (q, k, v) = (
            self.q.forward(tape, &x)?,
            self.k.forward(tape, &x)?,
            self.v.forward(tape, &x)?,
        );
        let key_keep = tape.reshape(&keep, &[batch, 1, s])?;
        let scale = 1.0 / (width as f32).sqrt();
        let attended = tape.masked_attention(&q, &k, &v, &key_keep, scale)?;
        let h = self
            .mix
            .forward_act(tape, &tape.add(&x, &attended)?, Activation::Tanh)?;
        // The mean over each sequence's own positions: padded rows are multiplied by 0.
        let kept = tape.mul(&h, &tape.reshape(&keep, &[batch, s, 1])?)?;
        let pooled = tape.div(&tape.sum(&kept, 1, false)?, &tape.sum(&keep, 1, true)?)?;
        self.head.forward(tape, &pooled)
    }
}

impl<B: Ops<f32> + 'static> Model<B, f32> for SequenceClassifier<B> {
    fn task(&self) -> Task {
        Task::class_index(self.classes)
    }

    fn named_parameters(&self) -> Vec<(String, Var<B, f32>)> {
        let mut out = vec![("embedding.weight".to_string(), self.embedding.clone())];
        for (name, l) in [
            ("q", &self.q),
            ("k", &self.k),
            ("v", &self.v),
            ("mix", &self.mix),
            ("head", &self.head),
        ] {
            out.push((format!("{name}.weight"), l.weight.clone()));
            out.push((format!("{name}.bias"), l.bias.clone()));
        }
        out
    }

    fn loss(
        &self,
        tape: &Tape<'_, B, f32>,
        x: &Var<B, f32>,
        y: &Var<B, f32>,
    ) -> zgrad::Result<(Var<B, f32>, Var<B, f32>)> {
        let logits = self.forward(tape, x)?;
        Ok((
            tape.task_loss(&Model::<B, f32>::task(self), &logits, y)?,
            logits,
        ))
    }

    fn logits(&self, tape: &Tape<'_, B, f32>, x: &Var<B, f32>) -> zgrad::Result<Var<B, f32>> {
        self.forward(tape, x)
    }

    fn sample_shape(&self, values: usize) -> zgrad::Result<Vec<usize>> {
        if values != self.tokens {
            return Err(GradError::BadInput(format!(
                "a sample of {values} values: the model takes {} token ids",
                self.tokens
            )));
        }
        Ok(vec![self.tokens])
    }
}

/// The sizes of a run (`Sequence::default()` is the command's).
pub struct Sequence {
    pub vocab: usize,
    pub tokens: usize,
    pub classes: usize,
    pub width: usize,
    pub train: usize,
    pub batch: usize,
    pub epochs: usize,
    pub schedule: TrainSchedule,
    pub quiet: bool,
}

impl Default for Sequence {
    fn default() -> Self {
        Sequence {
            vocab: 24,
            tokens: 12,
            classes: 4,
            width: 16,
            train: 2048,
            batch: 32,
            epochs: 8,
            schedule: TrainSchedule::Batched,
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
    /// The mean sequence length (of `tokens`) in the validation set.
    pub mean_length: f64,
}

impl Sequence {
    /// `n` padded sequences `[n, S]` of ids and their labels.
    pub fn data(&self, seed: u64, n: usize) -> (Vec<f32>, Vec<f32>) {
        let (s, c) = (self.tokens, self.classes);
        let mut rng = SplitMix64::new(seed);
        let mut x = vec![PAD as f32; n * s];
        let mut y = Vec::with_capacity(n);
        for seq in x.chunks_exact_mut(s) {
            let len = 2 + (rng.next_u64() % (s as u64 - 1)) as usize;
            let mut counts = vec![0usize; c];
            for id in &mut seq[..len] {
                let token = 1 + (rng.next_u64() % (self.vocab as u64 - 1)) as usize;
                counts[token % c] += 1;
                *id = token as f32;
            }
            let label = (0..c).fold(0, |best, k| if counts[k] > counts[best] { k } else { best });
            y.push(label as f32);
        }
        (x, y)
    }
}

impl Example for Sequence {
    type Out = Outcome;

    fn run<B: Capture<f32> + 'static>(&self, b: B) -> zgrad::Result<Outcome> {
        let model =
            SequenceClassifier::new(&b, self.vocab, self.tokens, self.classes, self.width, 5)?;
        let config = TrainerConfig {
            schedule: self.schedule,
            capture: true,
            lr: 1e-2,
            eval_batch: 256,
            ..TrainerConfig::default()
        };
        let mut trainer = Trainer::new(b, model, config)?;
        let (x, y) = self.data(1, self.train);
        let (vx, vy) = self.data(2, self.train / 4);
        let mean_length =
            vx.iter().filter(|&&id| id != PAD as f32).count() as f64 / vy.len() as f64;
        trainer.load(Load::Validation {
            x: &vx,
            y: &vy,
            n: vy.len(),
        })?;
        let before = trainer.evaluate(EvalSource::Validation)?;
        let s = self.tokens;
        let (first_loss, last_loss) = train_epochs(
            &mut trainer,
            (&x, s),
            (&y, 1),
            self.train,
            self.batch,
            self.epochs,
            self.quiet,
        )?;
        let after = trainer.evaluate(EvalSource::Validation)?;
        if !self.quiet {
            println!(
                "validation ({} sequences of mean length {mean_length:.1}, padded to {s}): cross-entropy {:.4} -> {:.4}, accuracy {:.3} -> {:.3} (chance {:.3})",
                after.samples,
                before.loss,
                after.loss,
                before.accuracy,
                after.accuracy,
                1.0 / self.classes as f64
            );
        }
        Ok(Outcome {
            first_loss,
            last_loss,
            before,
            after,
            mean_length,
        })
    }
}

fn main() {
    main_of(&Sequence::default());
}
