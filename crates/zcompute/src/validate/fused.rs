//! Argument checks of the fusion families' ops (`crate::linear`, `crate::norm`,
//! `crate::pooled_loss`), in the order every backend reports them.

use super::common::same_shape;
use super::ops::{Rows, layer_norm, layer_norm_backward};
use crate::error::{ComputeError, Result};
use crate::storage::Storage;
use crate::tensor::Tensor;

/// The rows of `x`'s last axis, refusing rank 0 (as every row op).
fn last_rows<S: Storage>(op: &'static str, x: &Tensor<S>) -> Result<Rows> {
    let n = x
        .shape()
        .last()
        .copied()
        .ok_or_else(|| ComputeError::RankTooLow {
            op,
            min: 1,
            shape: x.shape().into(),
        })?;
    Ok(Rows {
        rows: x.numel() / n.max(1),
        n,
    })
}

/// `bias_act`: rank >= 1, the bias `[n]` for a last axis of `n`.
pub(crate) fn bias_act<S: Storage>(x: &Tensor<S>, bias: &Tensor<S>) -> Result<Rows> {
    const OP: &str = "bias_act";
    let r = last_rows(OP, x)?;
    same_shape("bias_act bias", bias.shape(), &[r.n])?;
    Ok(r)
}

/// `tanh_backward`: `g` shaped as `y`.
pub(crate) fn tanh_backward<S: Storage>(g: &Tensor<S>, y: &Tensor<S>) -> Result<usize> {
    same_shape("tanh_backward", g.shape(), y.shape())?;
    Ok(y.numel())
}

/// `add_layer_norm`: `a` and `b` of one shape, then LayerNorm's checks on it.
pub(crate) fn add_layer_norm<S: Storage>(
    a: &Tensor<S>,
    b: &Tensor<S>,
    weight: Option<&Tensor<S>>,
    bias: Option<&Tensor<S>>,
    eps: S::Elem,
) -> Result<Rows> {
    same_shape("add_layer_norm", a.shape(), b.shape())?;
    layer_norm(a, weight, bias, eps)
}

/// `layer_norm_backward_add`: LayerNorm backward's checks, the residual gradient shaped as `x`.
pub(crate) fn layer_norm_backward_add<S: Storage>(
    g: &Tensor<S>,
    residual: Option<&Tensor<S>>,
    x: &Tensor<S>,
    mean: &Tensor<S>,
    rstd: &Tensor<S>,
    weight: Option<&Tensor<S>>,
) -> Result<Rows> {
    let r = layer_norm_backward(g, x, mean, rstd, weight)?;
    if let Some(res) = residual {
        same_shape("layer_norm_backward residual", res.shape(), x.shape())?;
    }
    Ok(r)
}

/// The sizes of a pooled head: `h` is `[batch, scales, width]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PoolDims {
    pub(crate) batch: usize,
    pub(crate) scales: usize,
    pub(crate) width: usize,
}

/// `h` `[B, S, D]` with B, S, D >= 1, the head weight `[1, D]`, the targets `[B]`.
fn pool_dims<S: Storage>(
    op: &'static str,
    h: &Tensor<S>,
    weight: &Tensor<S>,
    targets: &Tensor<S>,
) -> Result<PoolDims> {
    let &[batch, scales, width] = h.shape() else {
        return Err(ComputeError::RankTooLow {
            op,
            min: 3,
            shape: h.shape().into(),
        });
    };
    for (axis, size) in [batch, scales, width].into_iter().enumerate() {
        if size == 0 {
            return Err(ComputeError::EmptyReduction { op, axis });
        }
    }
    same_shape(op, weight.shape(), &[1, width])?;
    same_shape(op, targets.shape(), &[batch])?;
    Ok(PoolDims {
        batch,
        scales,
        width,
    })
}

/// `pool_head_bce`: `h` `[B, S, D]` (exactly rank 3, no empty axis), the weight `[1, D]`, the
/// targets `[B]`, the bias `[1]`.
pub(crate) fn pool_head_bce<S: Storage>(
    h: &Tensor<S>,
    weight: &Tensor<S>,
    bias: &Tensor<S>,
    targets: &Tensor<S>,
) -> Result<PoolDims> {
    const OP: &str = "pool_head_bce";
    let d = pool_dims(OP, h, weight, targets)?;
    same_shape(OP, bias.shape(), &[1])?;
    Ok(d)
}

/// `pool_head_bce_backward`: the forward's checks, the logits `[B]` and a rank-0 output
/// gradient.
pub(crate) fn pool_head_bce_backward<S: Storage>(
    g: &Tensor<S>,
    h: &Tensor<S>,
    weight: &Tensor<S>,
    logits: &Tensor<S>,
    targets: &Tensor<S>,
) -> Result<PoolDims> {
    const OP: &str = "pool_head_bce_backward";
    let d = pool_dims(OP, h, weight, targets)?;
    same_shape(OP, logits.shape(), &[d.batch])?;
    same_shape(OP, g.shape(), &[])?;
    Ok(d)
}
