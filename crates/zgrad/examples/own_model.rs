//! The guide's "A model of your own" (docs/guide.md), as it is printed there: a zgrad test
//! checks that the guide's code block is this file, and runs it.
//!
//! ```sh
//! cargo run --release -p zgrad --example own_model
//! ```

// An example program: it prints its metrics; its types are the user's own.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    missing_debug_implementations
)]

use std::collections::HashMap;
use zcompute::{Activation, Capture, Engine, prelude::*};
use zgrad::model::ParameterBuilder;
use zgrad::nn::Linear;
use zgrad::{
    EvalSource, GradError, Model, StepSource, Tape, Task, TrainSchedule, Trainer, TrainerConfig,
    Var,
};

#[derive(Clone)] // a clone shares the parameters (a captured graph's body holds one)
pub struct Mlp<B: Ops<f32>> {
    scales: usize,
    features: usize,
    l1: Linear<B, f32>,
    l2: Linear<B, f32>,
}

impl<B: Ops<f32>> Mlp<B> {
    pub fn new(
        b: &B,
        scales: usize,
        features: usize,
        hidden: usize,
        seed: u64,
    ) -> zgrad::Result<Self> {
        // PyTorch's nn.Linear initialisation, every parameter a view of one flat buffer.
        let mut p = ParameterBuilder::new(seed);
        p.linear("l1", scales * features, hidden)
            .linear("l2", hidden, 1);
        let params = p.build(b)?; // [(name, Var)] in the order added
        let var = |i: usize| params[i].1.clone();
        let (l1, l2) = (
            Linear {
                weight: var(0),
                bias: var(1),
            },
            Linear {
                weight: var(2),
                bias: var(3),
            },
        );
        Ok(Mlp {
            scales,
            features,
            l1,
            l2,
        })
    }
}

impl<B: Ops<f32> + Clone + 'static> Model<B, f32> for Mlp<B> {
    // What it outputs per sample and what its targets are: one logit, a label in {0, 1}
    // (the default; a 10-class model says Task::class_index(10), a regression Task::regression(k)).
    fn task(&self) -> Task {
        Task::binary()
    }

    fn named_parameters(&self) -> Vec<(String, Var<B, f32>)> {
        let vars = [
            &self.l1.weight,
            &self.l1.bias,
            &self.l2.weight,
            &self.l2.bias,
        ];
        let names = ["l1.weight", "l1.bias", "l2.weight", "l2.bias"];
        names
            .iter()
            .zip(vars)
            .map(|(n, v)| (n.to_string(), v.clone()))
            .collect()
    }

    fn loss(
        &self,
        tape: &Tape<'_, B, f32>,
        x: &Var<B, f32>,
        y: &Var<B, f32>,
    ) -> zgrad::Result<(Var<B, f32>, Var<B, f32>)> {
        let batch = x.shape().first().copied().unwrap_or(0);
        let flat = tape.reshape(x, &[batch, self.scales * self.features])?;
        let hidden = self.l1.forward_act(tape, &flat, Activation::Tanh)?;
        let logits = tape.reshape(&self.l2.forward(tape, &hidden)?, &[batch])?;
        // The task's loss (here BCE with logits); shapes are checked against the task.
        Ok((tape.task_loss(&self.task(), &logits, y)?, logits)) // mean loss, logits [batch]
    }

    fn sample_shape(&self, values: usize) -> zgrad::Result<Vec<usize>> {
        let (s, f) = (self.scales, self.features);
        if values != s * f {
            return Err(GradError::BadInput(format!(
                "a sample of {values} values: the MLP takes [{s}, {f}]"
            )));
        }
        Ok(vec![s, f])
    }
}

/// Trains the MLP a few steps on `b` and saves a checkpoint into `dir`; the last step's loss.
pub fn train<B: Capture<f32> + Clone + 'static>(b: B, dir: &std::path::Path) -> zgrad::Result<f64> {
    let model = Mlp::new(&b, 3, 4, 16, 7)?;
    let config = TrainerConfig {
        schedule: TrainSchedule::PerSample, // or Batched
        capture: true,                      // one graph launch per sample
        clip_grad: Some(1.0),
        ..TrainerConfig::default()
    };
    let mut trainer = Trainer::new(b, model, config)?; // Trainer<_, f32, Mlp<_>>
    let batch = 8;
    let x: Vec<f32> = (0..batch * 12)
        .map(|i| ((i * 7 % 13) as f32 - 6.0) / 6.0)
        .collect();
    let y: Vec<f32> = x
        .chunks_exact(12)
        .map(|s| f32::from(u8::from(s[0] + s[1] > 0.0)))
        .collect();
    let mut loss = f64::NAN;
    for _ in 0..5 {
        loss = trainer.step(StepSource::host(&x, &y, batch))?.loss; // x: [batch, 3, 4] row-major
    }
    let report = trainer.evaluate(EvalSource::Host(&x, &y))?; // the task's loss and accuracy
    println!(
        "loss {loss:.4}, evaluated: loss {:.4}, accuracy {:.2}",
        report.loss, report.accuracy
    );
    trainer.save_checkpoint(&dir.join("mlp.safetensors"), HashMap::new())?; // l1.weight, ..., optim.m.l1.weight, ...
    Ok(loss)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let b = Engine::sim(256 << 20)?; // or Engine::cpu(), Engine::cuda(0)?
    train(b, &std::env::temp_dir())?;
    Ok(())
}
