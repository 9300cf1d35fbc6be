//! Argument checks of attention's core (`AttentionOps::qk_norm_attention` and its backward).

use super::common::{same_shape, scalar_in};
use crate::descriptors::QkNorm;
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

/// The sizes of key-padding attention: `q [batch, q_len, dk]`, `k [batch, k_len, dk]`,
/// `v [batch, k_len, dv]`, the key mask `[batch, k_len]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KeyPadding {
    pub(crate) batch: usize,
    pub(crate) q_len: usize,
    pub(crate) k_len: usize,
    pub(crate) dk: usize,
    pub(crate) dv: usize,
}

impl KeyPadding {
    /// No score to compute (an empty batch, no query or no key): every output and gradient is
    /// zero (a query with no key attends to nothing, as one whose keys are all padding).
    pub(crate) fn is_empty(self) -> bool {
        self.batch == 0 || self.q_len == 0 || self.k_len == 0
    }
}

/// `key_padding_attention`: q, k, v of rank 3 with one batch, k and v one key length, q and k
/// one width; the mask, when given, `[batch, k_len]`; the scale finite.
pub(crate) fn key_padding_attention<S: Storage>(
    op: &'static str,
    q: &Tensor<S>,
    k: &Tensor<S>,
    v: &Tensor<S>,
    key_keep: Option<&Tensor<S>>,
    scale: S::Elem,
) -> Result<KeyPadding> {
    for t in [q, k, v] {
        if t.rank() < 3 {
            return Err(ComputeError::RankTooLow {
                op,
                min: 3,
                shape: t.shape().into(),
            });
        }
        if t.rank() > 3 {
            // Rank 3 exactly: the leading axes folded into one batch is the shape it takes.
            let r = t.rank();
            let lead: usize = t.shape()[..r - 2].iter().product();
            return Err(ComputeError::ShapeMismatch {
                op,
                lhs: t.shape().into(),
                rhs: [lead, t.shape()[r - 2], t.shape()[r - 1]][..].into(),
            });
        }
    }
    let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
    let a = KeyPadding {
        batch: qs[0],
        q_len: qs[1],
        k_len: ks[1],
        dk: qs[2],
        dv: vs[2],
    };
    same_shape(op, ks, &[a.batch, a.k_len, a.dk])?;
    same_shape(op, vs, &[a.batch, a.k_len, a.dv])?;
    if let Some(m) = key_keep {
        same_shape(op, m.shape(), &[a.batch, a.k_len])?;
    }
    scalar_in(
        op,
        "scale",
        scale,
        (f64::MIN, f64::MAX, false),
        "a finite scale",
    )?;
    Ok(a)
}

/// `key_padding_attention_backward`: the forward's checks, and `g` shaped as the forward's
/// output `[batch, q_len, dv]`.
pub(crate) fn key_padding_attention_backward<S: Storage>(
    g: &Tensor<S>,
    q: &Tensor<S>,
    k: &Tensor<S>,
    v: &Tensor<S>,
    key_keep: Option<&Tensor<S>>,
    scale: S::Elem,
) -> Result<KeyPadding> {
    const OP: &str = "key_padding_attention_backward";
    let a = key_padding_attention(OP, q, k, v, key_keep, scale)?;
    same_shape(OP, g.shape(), &[a.batch, a.q_len, a.dv])?;
    Ok(a)
}
