//! A model of the user's own with a target contract of its choosing (`Model::task`): a tanh
//! hidden layer and a linear head of `outputs` values over `features` inputs, its loss either
//! the task's (`Tape::task_loss`) or a loss the user picked (for the misuses of issue 40: a
//! distribution loss given class indices, outputs `[B, C]` against `[B]` labels).

#![allow(dead_code)]

use zcompute::{Activation, Element, prelude::*};
use zgrad::model::ParameterBuilder;
use zgrad::nn::Linear;
use zgrad::{GradError, Model, Tape, Task, Var};

/// Which loss the head's `loss` computes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LossKind {
    /// `tape.task_loss(&task, ..)`.
    Task,
    /// `tape.cross_entropy(&logits, y)` whatever `y` is (what a PyTorch user writes first).
    SoftCrossEntropy,
    /// `tape.bce_with_logits(&logits, y)` whatever the shapes.
    Bce,
    /// `tape.mse(&out, y)`.
    Mse,
}

pub struct Head<B: Ops<T>, T: Element> {
    pub features: usize,
    /// Values per sample of the output (`[B, outputs]`; 1 with `squeeze`: `[B]`).
    pub outputs: usize,
    pub squeeze: bool,
    pub task: Option<Task>,
    pub loss: LossKind,
    pub l1: Linear<B, T>,
    pub l2: Linear<B, T>,
}

impl<B: Ops<T>, T: Element> Clone for Head<B, T> {
    fn clone(&self) -> Self {
        Head {
            features: self.features,
            outputs: self.outputs,
            squeeze: self.squeeze,
            task: self.task,
            loss: self.loss,
            l1: self.l1.clone(),
            l2: self.l2.clone(),
        }
    }
}

impl<B: Ops<T>, T: Element> Head<B, T> {
    /// `task: None` leaves `Model::task` at its default (binary).
    pub fn new(
        b: &B,
        features: usize,
        outputs: usize,
        task: Option<Task>,
        loss: LossKind,
    ) -> zgrad::Result<Self> {
        let mut p = ParameterBuilder::new(11);
        p.linear("l1", features, 8).linear("l2", 8, outputs);
        let v: Vec<_> = p.build(b)?.into_iter().map(|(_, v)| v).collect();
        Ok(Head {
            features,
            outputs,
            squeeze: false,
            task,
            loss,
            l1: Linear {
                weight: v[0].clone(),
                bias: v[1].clone(),
            },
            l2: Linear {
                weight: v[2].clone(),
                bias: v[3].clone(),
            },
        })
    }

    /// The same head giving `[B]` (one output per sample, squeezed).
    pub fn squeezed(mut self) -> Self {
        self.squeeze = true;
        self
    }
}

impl<B: Ops<T> + 'static, T: Element> Model<B, T> for Head<B, T> {
    fn task(&self) -> Task {
        self.task.unwrap_or_else(Task::binary)
    }

    fn named_parameters(&self) -> Vec<(String, Var<B, T>)> {
        [
            ("l1.weight", &self.l1.weight),
            ("l1.bias", &self.l1.bias),
            ("l2.weight", &self.l2.weight),
            ("l2.bias", &self.l2.bias),
        ]
        .into_iter()
        .map(|(n, v)| (n.to_string(), v.clone()))
        .collect()
    }

    fn loss(
        &self,
        tape: &Tape<'_, B, T>,
        x: &Var<B, T>,
        y: &Var<B, T>,
    ) -> zgrad::Result<(Var<B, T>, Var<B, T>)> {
        let batch = x.shape()[0];
        let hidden = self.l1.forward_act(tape, x, Activation::Tanh)?;
        let mut out = self.l2.forward(tape, &hidden)?;
        if self.squeeze {
            out = tape.reshape(&out, &[batch])?;
        }
        let loss = match self.loss {
            LossKind::Task => tape.task_loss(&Model::<B, T>::task(self), &out, y)?,
            LossKind::SoftCrossEntropy => tape.cross_entropy(&out, y)?,
            LossKind::Bce => tape.bce_with_logits(&out, y)?,
            LossKind::Mse => tape.mse(&out, y)?,
        };
        Ok((loss, out))
    }

    fn sample_shape(&self, values: usize) -> zgrad::Result<Vec<usize>> {
        if values != self.features {
            return Err(GradError::BadInput(format!(
                "a sample of {values} values: the head takes [{}]",
                self.features
            )));
        }
        Ok(vec![self.features])
    }
}

/// `n` samples of `features` values and their class index among `classes` (the largest of
/// the first `classes` features: learnable).
pub fn classes(seed: u64, n: usize, features: usize, classes: usize) -> (Vec<f32>, Vec<f32>) {
    let mut rng = zgrad::rng::SplitMix64::new(seed);
    let x: Vec<f32> = rng
        .uniform_vec(n * features, -1.0, 1.0)
        .into_iter()
        .map(|v| v as f32)
        .collect();
    let y = x
        .chunks_exact(features)
        .map(|s| {
            let mut best = 0;
            for c in 0..classes {
                if s[c] > s[best] {
                    best = c;
                }
            }
            best as f32
        })
        .collect();
    (x, y)
}
