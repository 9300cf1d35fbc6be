//! Argument checks of attention's core (`AttentionOps::qk_norm_attention` and its backward).

use super::{same_shape, scalar_in};
use crate::attention::QkNorm;
use crate::element::Element;
use crate::error::{ComputeError, Result};
use crate::storage::Storage;
use crate::tensor::Tensor;

/// The sizes of attention's core: `qkv [batch, seq, 3 * heads * dh]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Attention {
    pub(crate) batch: usize,
    pub(crate) seq: usize,
    pub(crate) heads: usize,
    pub(crate) dh: usize,
}

impl Attention {
    /// No output element (a batch or sequence of 0).
    pub(crate) fn is_empty(self) -> bool {
        self.batch == 0 || self.seq == 0
    }

    /// The score scale `1 / sqrt(dh)`.
    pub(crate) fn scale<T: Element>(self) -> T {
        T::from_f64(1.0 / (self.dh as f64).sqrt())
    }
}

/// `qk_norm_attention`: `qkv` of rank 3 with a last axis `3 * D`, `heads` >= 1 dividing `D`
/// into heads of width `dh` >= 1, the four LayerNorm parameters `[dh]`, `eps` finite and
/// non-negative.
pub(crate) fn qk_norm_attention<S: Storage>(
    qkv: &Tensor<S>,
    norm: &QkNorm<'_, S>,
) -> Result<Attention> {
    attention("qk_norm_attention", qkv, norm)
}

/// `qk_norm_attention_backward`: the forward's checks, and `g` shaped as the forward's output
/// `[B, S, D]`.
pub(crate) fn qk_norm_attention_backward<S: Storage>(
    g: &Tensor<S>,
    qkv: &Tensor<S>,
    norm: &QkNorm<'_, S>,
) -> Result<Attention> {
    const OP: &str = "qk_norm_attention_backward";
    let a = attention(OP, qkv, norm)?;
    same_shape(OP, g.shape(), &[a.batch, a.seq, a.heads * a.dh])?;
    Ok(a)
}

fn attention<S: Storage>(
    op: &'static str,
    qkv: &Tensor<S>,
    norm: &QkNorm<'_, S>,
) -> Result<Attention> {
    let &[batch, seq, three_d] = qkv.shape() else {
        return Err(if qkv.rank() < 3 {
            ComputeError::RankTooLow {
                op,
                min: 3,
                shape: qkv.shape().into(),
            }
        } else {
            let lead: usize = qkv.shape()[..qkv.rank() - 1].iter().product();
            ComputeError::ShapeMismatch {
                op,
                lhs: qkv.shape().into(),
                rhs: [lead, qkv.shape()[qkv.rank() - 1]][..].into(),
            }
        });
    };
    if !three_d.is_multiple_of(3) {
        return Err(ComputeError::ShapeMismatch {
            op,
            lhs: qkv.shape().into(),
            rhs: [batch, seq, three_d / 3 * 3][..].into(),
        });
    }
    let width = three_d / 3;
    let heads = norm.heads;
    if heads == 0 || !width.is_multiple_of(heads) {
        return Err(ComputeError::InvalidScalar {
            op,
            arg: "heads",
            value: heads.to_string(),
            expected: "a head count >= 1 that divides the width (qkv's last axis / 3)",
        });
    }
    let dh = width / heads;
    if dh == 0 {
        return Err(ComputeError::EmptyReduction { op, axis: 2 });
    }
    for (name, t) in [
        ("qk_norm_attention q_weight", norm.q_weight),
        ("qk_norm_attention q_bias", norm.q_bias),
        ("qk_norm_attention k_weight", norm.k_weight),
        ("qk_norm_attention k_bias", norm.k_bias),
    ] {
        same_shape(name, t.shape(), &[dh])?;
    }
    scalar_in(
        op,
        "eps",
        norm.eps,
        (0.0, f64::MAX, false),
        "a finite eps >= 0",
    )?;
    Ok(Attention {
        batch,
        seq,
        heads,
        dh,
    })
}
