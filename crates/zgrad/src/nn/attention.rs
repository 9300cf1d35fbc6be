//! QK-normalised multi-head self-attention (docs/xasset.md steps 3-6, without the residual add):
//! `[q|k|v] = x·qkvᵀ + b` split as 3 x H x dh (q first; head-major within each), LayerNorm of
//! q and k over dh, `softmax(q·kᵀ/sqrt(dh))·v` per batch and head, heads concatenated, `·oᵀ + b`.

use super::{LayerNorm, Linear};
use crate::error::{GradError, Result};
use crate::rng::SplitMix64;
use crate::tape::Tape;
use crate::var::Var;
use zcompute::{Element, MatmulOpts, prelude::*};

pub struct QkNormAttention<B: Ops<T>, T: Element> {
    pub qkv: Linear<B, T>,
    pub qn: LayerNorm<B, T>,
    pub kn: LayerNorm<B, T>,
    pub o: Linear<B, T>,
    pub heads: usize,
}

impl<B: Ops<T>, T: Element> Clone for QkNormAttention<B, T> {
    fn clone(&self) -> Self {
        QkNormAttention {
            qkv: self.qkv.clone(),
            qn: self.qn.clone(),
            kn: self.kn.clone(),
            o: self.o.clone(),
            heads: self.heads,
        }
    }
}

impl<B: Ops<T>, T: Element> std::fmt::Debug for QkNormAttention<B, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QkNormAttention")
            .field("width", &self.o.out_features())
            .field("heads", &self.heads)
            .finish()
    }
}

impl<B: Ops<T>, T: Element> QkNormAttention<B, T> {
    /// `width` must be divisible by `heads`.
    pub fn init(b: &B, width: usize, heads: usize, rng: &mut SplitMix64) -> Result<Self> {
        if heads == 0 || !width.is_multiple_of(heads) {
            return Err(GradError::Config(format!(
                "width {width} is not divisible by {heads} heads"
            )));
        }
        let dh = width / heads;
        Ok(QkNormAttention {
            qkv: Linear::init(b, width, 3 * width, rng)?,
            qn: LayerNorm::init(b, dh)?,
            kn: LayerNorm::init(b, dh)?,
            o: Linear::init(b, width, width, rng)?,
            heads,
        })
    }

    /// `x [B, S, D] -> [B, S, D]`: the qkv product, attention's core as one tape node
    /// (`Tape::qk_norm_attention`: fused on the device for short sequences), the o product.
    pub fn forward(&self, tape: &Tape<'_, B, T>, x: &Var<B, T>) -> Result<Var<B, T>> {
        self.check_input(x)?;
        let qkv = self.qkv.forward(tape, x)?;
        let a = tape.qk_norm_attention(
            &qkv,
            &self.qn.weight,
            &self.qn.bias,
            &self.kn.weight,
            &self.kn.bias,
            self.heads,
            T::from_f64(self.qn.eps),
        )?;
        self.o.forward(tape, &a)
    }

    /// The same function as [`Self::forward`] composed of separate tape ops (reshape and
    /// permute copies, two LayerNorms, batched products, softmax), as the model ran before the
    /// fused core: kept as the reference the fused path is tested and measured against.
    pub fn forward_composite(&self, tape: &Tape<'_, B, T>, x: &Var<B, T>) -> Result<Var<B, T>> {
        let (batch, seq, width) = self.check_input(x)?;
        let h = self.heads;
        let dh = width / h;
        let qkv = self.qkv.forward(tape, x)?;
        // [B, S, 3, H, dh] -> [3, B, H, S, dh]; the split along the first axis gives q, k, v.
        let qkv = tape.reshape(&qkv, &[batch, seq, 3, h, dh])?;
        let qkv = tape.permute(&qkv, &[2, 0, 3, 1, 4])?;
        let parts = tape.split(&qkv, 0, &[1, 1, 1])?;
        let heads_shape = [batch, h, seq, dh];
        let q = tape.reshape(&self.qn.forward(tape, &parts[0])?, &heads_shape)?;
        let k = tape.reshape(&self.kn.forward(tape, &parts[1])?, &heads_shape)?;
        let v = tape.reshape(&tape.contiguous(&parts[2])?, &heads_shape)?;
        let nt = MatmulOpts {
            trans_a: false,
            trans_b: true,
        };
        let scores = tape.matmul(&q, &k, nt)?;
        let scores = tape.scale(&scores, T::from_f64(1.0 / (dh as f64).sqrt()))?;
        let weights = tape.softmax_last(&scores)?;
        let a = tape.matmul(&weights, &v, MatmulOpts::default())?;
        // [B, H, S, dh] -> [B, S, H, dh] -> [B, S, D]
        let a = tape.contiguous(&tape.permute(&a, &[0, 2, 1, 3])?)?;
        let a = tape.reshape(&a, &[batch, seq, width])?;
        self.o.forward(tape, &a)
    }

    /// `(B, S, D)` of an input `[B, S, D]` whose width is this block's.
    fn check_input(&self, x: &Var<B, T>) -> Result<(usize, usize, usize)> {
        match *x.shape() {
            [batch, seq, width] if width == self.o.out_features() => Ok((batch, seq, width)),
            _ => Err(GradError::BadInput(format!(
                "attention input must be [B, S, {}], got {:?}",
                self.o.out_features(),
                x.shape()
            ))),
        }
    }
}
