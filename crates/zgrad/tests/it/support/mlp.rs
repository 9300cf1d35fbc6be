//! A model of the user's own for the trainer's tests (not XAsset): a two-layer perceptron over
//! the flattened `[S, F]` input, `logit = l2(tanh(l1(x)))`, mean BCE-with-logits, built from
//! zgrad's `nn::Linear` and tape ops, its parameters one flat buffer (`ParameterBuilder`).

#![allow(dead_code)]

use zcompute::{Activation, Element, prelude::*};
use zgrad::model::ParameterBuilder;
use zgrad::nn::Linear;
use zgrad::{GradError, Model, Tape, Var};

pub struct Mlp<B: Ops<T>, T: Element> {
    pub scales: usize,
    pub features: usize,
    pub l1: Linear<B, T>,
    pub l2: Linear<B, T>,
}

impl<B: Ops<T>, T: Element> Clone for Mlp<B, T> {
    fn clone(&self) -> Self {
        Mlp {
            scales: self.scales,
            features: self.features,
            l1: self.l1.clone(),
            l2: self.l2.clone(),
        }
    }
}

impl<B: Ops<T>, T: Element> Mlp<B, T> {
    /// PyTorch's Linear initialisation from `seed`, in one flat parameter buffer.
    pub fn new(
        b: &B,
        scales: usize,
        features: usize,
        hidden: usize,
        seed: u64,
    ) -> zgrad::Result<Self> {
        let mut p = ParameterBuilder::new(seed);
        p.linear("l1", scales * features, hidden)
            .linear("l2", hidden, 1);
        let mut vars = p.build(b)?.into_iter().map(|(_, v)| v);
        let mut next = || {
            vars.next()
                .ok_or_else(|| GradError::Config("the builder made too few parameters".into()))
        };
        let mut linear = || -> zgrad::Result<Linear<B, T>> {
            Ok(Linear {
                weight: next()?,
                bias: next()?,
            })
        };
        let (l1, l2) = (linear()?, linear()?);
        Ok(Mlp {
            scales,
            features,
            l1,
            l2,
        })
    }
}

impl<B: Ops<T> + 'static, T: Element> Model<B, T> for Mlp<B, T> {
    fn named_parameters(&self) -> Vec<(String, Var<B, T>)> {
        [
            ("l1.weight", &self.l1.weight),
            ("l1.bias", &self.l1.bias),
            ("l2.weight", &self.l2.weight),
            ("l2.bias", &self.l2.bias),
        ]
        .into_iter()
        .map(|(name, v)| (name.to_string(), v.clone()))
        .collect()
    }

    fn loss(
        &self,
        tape: &Tape<'_, B, T>,
        x: &Var<B, T>,
        y: &Var<B, T>,
    ) -> zgrad::Result<(Var<B, T>, Var<B, T>)> {
        let batch = x.shape().first().copied().unwrap_or(0);
        let flat = tape.reshape(x, &[batch, self.scales * self.features])?;
        let hidden = self.l1.forward_act(tape, &flat, Activation::Tanh)?;
        let logits = tape.reshape(&self.l2.forward(tape, &hidden)?, &[batch])?;
        Ok((tape.bce_with_logits(&logits, y)?, logits))
    }

    fn sample_shape(&self, values_per_sample: usize) -> zgrad::Result<Vec<usize>> {
        let (s, f) = (self.scales, self.features);
        if values_per_sample != s * f {
            return Err(GradError::BadInput(format!(
                "a sample of {values_per_sample} values: the MLP takes [{s}, {f}]"
            )));
        }
        Ok(vec![s, f])
    }
}

/// Deterministic data: `n` samples of `per` values for step `step`, labels from the sign of
/// the sum of each sample's first values (learnable).
pub fn data(step: u64, n: usize, per: usize) -> (Vec<f32>, Vec<f32>) {
    let mut rng = zgrad::rng::SplitMix64::new(0xC0FFEE + step);
    let x: Vec<f32> = rng
        .uniform_vec(n * per, -1.0, 1.0)
        .into_iter()
        .map(|v| v as f32)
        .collect();
    let y = x
        .chunks_exact(per)
        .map(|s| f32::from(s[..per.min(3)].iter().sum::<f32>() > 0.0))
        .collect();
    (x, y)
}
