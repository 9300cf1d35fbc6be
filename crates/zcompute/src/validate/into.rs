//! Checks of the backward ops that add parameter gradients into the caller's buffers
//! (`qk_norm_attention_backward_into`, `pool_head_bce_backward_into`): the op's own checks,
//! then each buffer shaped as its parameter, writable, in other memory than the activations
//! the op reads, and overlapping no other buffer or parameter the op touches (gradient buffers
//! are usually views of one flat buffer, so sharing storage alone is allowed).

use super::attention::{Attention, qk_norm_attention_backward};
use super::common::{distinct, same_shape, writable};
use super::fused::{PoolDims, pool_head_bce_backward};
use crate::descriptors::QkNorm;
use crate::error::{ComputeError, Result};
use crate::storage::Storage;
use crate::tensor::Tensor;

/// The element range `[first, last]` a view reaches in its storage (`None` when empty).
fn reach<S: Storage>(t: &Tensor<S>) -> Option<(usize, usize)> {
    let last = t.layout().max_offset()?;
    Some((t.layout().offset(), last))
}

/// Refuses `a` and `b` when they can reach a common element of one storage.
fn disjoint<S: Storage>(
    op: &'static str,
    (lhs, a): (&'static str, &Tensor<S>),
    (rhs, b): (&'static str, &Tensor<S>),
) -> Result<()> {
    let (Some((a0, a1)), Some((b0, b1))) = (reach(a), reach(b)) else {
        return Ok(());
    };
    if a.shares_storage(b) && a0 <= b1 && b0 <= a1 {
        return Err(ComputeError::Aliased { op, lhs, rhs });
    }
    Ok(())
}

/// `qk_norm_attention_backward_into`: the backward's checks, each given buffer `[dh]`,
/// writable, in other memory than `g` and `qkv`, overlapping no other given buffer and none
/// of the four parameters.
pub(crate) fn qk_norm_attention_backward_into<S: Storage>(
    g: &Tensor<S>,
    qkv: &Tensor<S>,
    norm: &QkNorm<'_, S>,
    param_grads: [Option<&Tensor<S>>; 4],
) -> Result<Attention> {
    const OP: &str = "qk_norm_attention_backward_into";
    const NAMES: [&str; 4] = [
        "q_weight grad",
        "q_bias grad",
        "k_weight grad",
        "k_bias grad",
    ];
    let a = qk_norm_attention_backward(g, qkv, norm)?;
    let params = [
        ("q_weight", norm.q_weight),
        ("q_bias", norm.q_bias),
        ("k_weight", norm.k_weight),
        ("k_bias", norm.k_bias),
    ];
    for (i, dst) in param_grads.iter().enumerate() {
        let Some(dst) = dst else { continue };
        let named = (NAMES[i], *dst);
        same_shape(OP, dst.shape(), &[a.dh])?;
        writable(OP, dst.layout())?;
        distinct(OP, &[("g", g), named])?;
        distinct(OP, &[("qkv", qkv), named])?;
        for param in params {
            disjoint(OP, param, named)?;
        }
        for (j, other) in param_grads.iter().enumerate().skip(i + 1) {
            if let Some(other) = other {
                disjoint(OP, named, (NAMES[j], *other))?;
            }
        }
    }
    Ok(a)
}

/// `pool_head_bce_backward_into`: the backward's checks, `dw` shaped as the weight `[1, D]`
/// and `db` as the bias `[1]`, both writable, in other memory than `g`, `h`, the logits and
/// the targets, overlapping neither each other nor the weight.
pub(crate) fn pool_head_bce_backward_into<S: Storage>(
    g: &Tensor<S>,
    h: &Tensor<S>,
    weight: &Tensor<S>,
    logits: &Tensor<S>,
    targets: &Tensor<S>,
    [dw, db]: [&Tensor<S>; 2],
) -> Result<PoolDims> {
    const OP: &str = "pool_head_bce_backward_into";
    let d = pool_head_bce_backward(g, h, weight, logits, targets)?;
    same_shape(OP, dw.shape(), &[1, d.width])?;
    same_shape(OP, db.shape(), &[1])?;
    for named in [("dw", dw), ("db", db)] {
        writable(OP, named.1.layout())?;
        for read in [("g", g), ("h", h), ("logits", logits), ("targets", targets)] {
            distinct(OP, &[read, named])?;
        }
        disjoint(OP, ("weight", weight), named)?;
    }
    disjoint(OP, ("dw", dw), ("db", db))?;
    Ok(d)
}
