//! Linear and LayerNorm, the layers the other building blocks (attention, the feed-forward
//! block, the encoder block, the head) are made of, with LayerNorm's epsilon and the upload of
//! a parameter leaf. Below the blocks that use them; re-exported at `crate::nn::*`.

use crate::error::Result;
use crate::rng::SplitMix64;
use crate::tape::Tape;
use crate::var::Var;
use zcompute::{Activation, Element, prelude::*};

/// LayerNorm's epsilon everywhere in XAsset.
pub const LN_EPS: f64 = 1e-5;

/// Uploads host values as a trainable leaf.
pub(crate) fn leaf<B: Ops<T>, T: Element>(
    b: &B,
    data: &[f64],
    shape: &[usize],
) -> Result<Var<B, T>> {
    let data: Vec<T> = data.iter().map(|&v| T::from_f64(v)).collect();
    Var::parameter_from(b, &data, shape)
}

/// `y = x · Wᵀ + b` with a PyTorch-layout weight `[out, in]`.
pub struct Linear<B: Ops<T>, T: Element> {
    pub weight: Var<B, T>,
    pub bias: Var<B, T>,
}

impl<B: Ops<T>, T: Element> Clone for Linear<B, T> {
    fn clone(&self) -> Self {
        Linear {
            weight: self.weight.clone(),
            bias: self.bias.clone(),
        }
    }
}

impl<B: Ops<T>, T: Element> std::fmt::Debug for Linear<B, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Linear({:?})", self.weight.shape())
    }
}

impl<B: Ops<T>, T: Element> Linear<B, T> {
    /// PyTorch's default: weight and bias uniform in ±1/sqrt(in).
    pub fn init(b: &B, inputs: usize, outputs: usize, rng: &mut SplitMix64) -> Result<Self> {
        let bound = 1.0 / (inputs as f64).sqrt();
        let w = rng.uniform_vec(inputs * outputs, -bound, bound);
        let bias = rng.uniform_vec(outputs, -bound, bound);
        Ok(Linear {
            weight: leaf(b, &w, &[outputs, inputs])?,
            bias: leaf(b, &bias, &[outputs])?,
        })
    }

    #[must_use]
    pub fn in_features(&self) -> usize {
        self.weight.shape()[1]
    }

    #[must_use]
    pub fn out_features(&self) -> usize {
        self.weight.shape()[0]
    }

    /// `x [..., in] -> [..., out]`: the leading axes are folded into the rows of one
    /// `Tape::linear` node.
    pub fn forward(&self, tape: &Tape<'_, B, T>, x: &Var<B, T>) -> Result<Var<B, T>> {
        self.forward_act(tape, x, Activation::Identity)
    }

    /// `act(x · Wᵀ + b)`: one `Tape::linear` node (the product with bias and activation as its
    /// epilogue; one backward node for the input's, weight's and bias's gradients).
    pub fn forward_act(
        &self,
        tape: &Tape<'_, B, T>,
        x: &Var<B, T>,
        act: Activation,
    ) -> Result<Var<B, T>> {
        self.rows_node(tape, x, |flat| {
            tape.linear(flat, &self.weight, &self.bias, act)
        })
    }

    /// `residual + (x · Wᵀ + b)` for `residual [..., out]` (a skip connection): one
    /// `Tape::linear_add` node (the add is the product's epilogue on the device).
    pub fn forward_add(
        &self,
        tape: &Tape<'_, B, T>,
        x: &Var<B, T>,
        residual: &Var<B, T>,
    ) -> Result<Var<B, T>> {
        let residual = if residual.value().is_contiguous() {
            residual.clone()
        } else {
            tape.contiguous(residual)?
        };
        let rows = residual.value().numel() / self.out_features().max(1);
        let residual = tape.reshape(&residual, &[rows, self.out_features()])?;
        self.rows_node(tape, x, |flat| {
            tape.linear_add(flat, &self.weight, &self.bias, &residual)
        })
    }

    /// `node(x [rows, in]) [rows, out]` with `x`'s leading axes folded into the rows and
    /// unfolded again in the result.
    fn rows_node(
        &self,
        tape: &Tape<'_, B, T>,
        x: &Var<B, T>,
        node: impl FnOnce(&Var<B, T>) -> Result<Var<B, T>>,
    ) -> Result<Var<B, T>> {
        let shape = x.shape().to_vec();
        let inputs = self.in_features();
        let rows = x.value().numel() / inputs.max(1);
        let x = if x.value().is_contiguous() {
            x.clone()
        } else {
            tape.contiguous(x)?
        };
        let flat = tape.reshape(&x, &[rows, inputs])?;
        let y = node(&flat)?;
        let mut out_shape = shape;
        if let Some(last) = out_shape.last_mut() {
            *last = self.out_features();
        }
        tape.reshape(&y, &out_shape)
    }
}

/// LayerNorm over the last axis with affine weight and bias.
pub struct LayerNorm<B: Ops<T>, T: Element> {
    pub weight: Var<B, T>,
    pub bias: Var<B, T>,
    pub eps: f64,
}

impl<B: Ops<T>, T: Element> Clone for LayerNorm<B, T> {
    fn clone(&self) -> Self {
        LayerNorm {
            weight: self.weight.clone(),
            bias: self.bias.clone(),
            eps: self.eps,
        }
    }
}

impl<B: Ops<T>, T: Element> std::fmt::Debug for LayerNorm<B, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LayerNorm({:?}, eps {})", self.weight.shape(), self.eps)
    }
}

impl<B: Ops<T>, T: Element> LayerNorm<B, T> {
    /// PyTorch's default: weight 1, bias 0.
    pub fn init(b: &B, width: usize) -> Result<Self> {
        Ok(LayerNorm {
            weight: leaf(b, &vec![1.0; width], &[width])?,
            bias: leaf(b, &vec![0.0; width], &[width])?,
            eps: LN_EPS,
        })
    }

    pub fn forward(&self, tape: &Tape<'_, B, T>, x: &Var<B, T>) -> Result<Var<B, T>> {
        tape.layer_norm(
            x,
            Some(&self.weight),
            Some(&self.bias),
            T::from_f64(self.eps),
        )
    }

    /// `(x, LayerNorm(x))` for a residual stream `x` that goes on (`Tape::layer_norm_stream`):
    /// use the returned stream downstream instead of `x`.
    pub fn forward_stream(
        &self,
        tape: &Tape<'_, B, T>,
        x: &Var<B, T>,
    ) -> Result<(Var<B, T>, Var<B, T>)> {
        tape.layer_norm_stream(
            x,
            Some(&self.weight),
            Some(&self.bias),
            T::from_f64(self.eps),
        )
    }
}
