//! One encoder block (docs/xasset.md steps 2-7): `h + attention(LayerNorm(h))`, then
//! `h + ff(LayerNorm(h))`, with the fused forms the device runs: `ln1` as the residual-stream
//! LayerNorm (its gradient joins the stream's in one kernel), the first residual add and `ln2`
//! as one op, and the second add as the `f2` product's epilogue.

use super::{FeedForward, LayerNorm, Linear, QkNormAttention};
use crate::error::{GradError, Result};
use crate::rng::SplitMix64;
use crate::tape::Tape;
use crate::var::Var;
use zcompute::{Element, prelude::*};

/// The names of a block's 16 parameters, in the order of [`EncoderBlock::parameters`] (and of
/// PyTorch's `state_dict`).
pub const BLOCK_PARAMETER_NAMES: [&str; 16] = [
    "ln1.weight",
    "ln1.bias",
    "qkv.weight",
    "qkv.bias",
    "qn.weight",
    "qn.bias",
    "kn.weight",
    "kn.bias",
    "o.weight",
    "o.bias",
    "ln2.weight",
    "ln2.bias",
    "f1.weight",
    "f1.bias",
    "f2.weight",
    "f2.bias",
];

/// The shapes of a block's parameters in [`BLOCK_PARAMETER_NAMES`] order (PyTorch's
/// `[out, in]`), for width D, H heads and feed-forward width FF.
#[must_use]
pub fn block_shapes(width: usize, heads: usize, hidden: usize) -> Vec<Vec<usize>> {
    let (d, ff) = (width, hidden);
    let dh = d / heads.max(1);
    vec![
        vec![d],
        vec![d],
        vec![3 * d, d],
        vec![3 * d],
        vec![dh],
        vec![dh],
        vec![dh],
        vec![dh],
        vec![d, d],
        vec![d],
        vec![d],
        vec![d],
        vec![ff, d],
        vec![ff],
        vec![d, ff],
        vec![d],
    ]
}

pub struct EncoderBlock<B: Ops<T>, T: Element> {
    pub ln1: LayerNorm<B, T>,
    pub attn: QkNormAttention<B, T>,
    pub ln2: LayerNorm<B, T>,
    pub ff: FeedForward<B, T>,
}

impl<B: Ops<T>, T: Element> Clone for EncoderBlock<B, T> {
    fn clone(&self) -> Self {
        EncoderBlock {
            ln1: self.ln1.clone(),
            attn: self.attn.clone(),
            ln2: self.ln2.clone(),
            ff: self.ff.clone(),
        }
    }
}

impl<B: Ops<T>, T: Element> std::fmt::Debug for EncoderBlock<B, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncoderBlock")
            .field("attn", &self.attn)
            .field("ff", &self.ff)
            .finish()
    }
}

impl<B: Ops<T>, T: Element> EncoderBlock<B, T> {
    /// PyTorch's defaults, drawing from `rng` in the order qkv, o, f1, f2 (weight, then bias).
    pub fn init(
        b: &B,
        width: usize,
        heads: usize,
        hidden: usize,
        rng: &mut SplitMix64,
    ) -> Result<Self> {
        let ln1 = LayerNorm::init(b, width)?;
        let attn = QkNormAttention::init(b, width, heads, rng)?;
        let ln2 = LayerNorm::init(b, width)?;
        let ff = FeedForward::init(b, width, hidden, rng)?;
        Ok(EncoderBlock { ln1, attn, ln2, ff })
    }

    /// The parameters' shapes in [`BLOCK_PARAMETER_NAMES`] order (PyTorch's `[out, in]`).
    #[must_use]
    pub fn shapes(width: usize, heads: usize, hidden: usize) -> Vec<Vec<usize>> {
        block_shapes(width, heads, hidden)
    }

    /// The block over existing parameters, in [`BLOCK_PARAMETER_NAMES`] order.
    pub fn from_parameters(vars: Vec<Var<B, T>>, heads: usize) -> Result<Self> {
        let n = vars.len();
        let v: [Var<B, T>; 16] = vars.try_into().map_err(|_| {
            GradError::Config(format!("an encoder block has 16 parameters, got {n}"))
        })?;
        let [
            l1w,
            l1b,
            qw,
            qb,
            qnw,
            qnb,
            knw,
            knb,
            ow,
            ob,
            l2w,
            l2b,
            f1w,
            f1b,
            f2w,
            f2b,
        ] = v;
        let linear = |weight, bias| Linear { weight, bias };
        let ln = |weight, bias| LayerNorm {
            weight,
            bias,
            eps: super::LN_EPS,
        };
        Ok(EncoderBlock {
            ln1: ln(l1w, l1b),
            attn: QkNormAttention {
                qkv: linear(qw, qb),
                qn: ln(qnw, qnb),
                kn: ln(knw, knb),
                o: linear(ow, ob),
                heads,
            },
            ln2: ln(l2w, l2b),
            ff: FeedForward {
                f1: linear(f1w, f1b),
                f2: linear(f2w, f2b),
            },
        })
    }

    /// The parameters in [`BLOCK_PARAMETER_NAMES`] order.
    #[must_use]
    pub fn parameters(&self) -> Vec<Var<B, T>> {
        let a = &self.attn;
        [
            &self.ln1.weight,
            &self.ln1.bias,
            &a.qkv.weight,
            &a.qkv.bias,
            &a.qn.weight,
            &a.qn.bias,
            &a.kn.weight,
            &a.kn.bias,
            &a.o.weight,
            &a.o.bias,
            &self.ln2.weight,
            &self.ln2.bias,
            &self.ff.f1.weight,
            &self.ff.f1.bias,
            &self.ff.f2.weight,
            &self.ff.f2.bias,
        ]
        .into_iter()
        .cloned()
        .collect()
    }

    /// The parameters named `<prefix><name>` (`prefix` "blocks.1." or "").
    #[must_use]
    pub fn named_parameters(&self, prefix: &str) -> Vec<(String, Var<B, T>)> {
        BLOCK_PARAMETER_NAMES
            .iter()
            .map(|n| format!("{prefix}{n}"))
            .zip(self.parameters())
            .collect()
    }

    /// The residual stream `h [B, S, D]` after the block.
    pub fn forward(&self, tape: &Tape<'_, B, T>, h: &Var<B, T>) -> Result<Var<B, T>> {
        // h goes on past ln1: its gradient from the residual add joins ln1's in one kernel.
        let (h, u) = self.ln1.forward_stream(tape, h)?;
        let attended = self.attn.forward(tape, &u)?;
        let eps = T::from_f64(self.ln2.eps);
        let (h, u) = tape.add_layer_norm(&h, &attended, &self.ln2.weight, &self.ln2.bias, eps)?;
        // h + ff(u): the add is the f2 product's epilogue.
        self.ff.forward_add(tape, &u, &h)
    }
}
