//! One function per op of `Backend`: its argument checks in the order every backend reports
//! them, returning what the op needs to know about its output (shape inference), so that a
//! backend has nothing left to decide about its inputs.

use super::common::{distinct, output_numel, same_shape, scalar_in, writable};
use crate::descriptors::{AdamWConfig, BinaryOp, MatmulOpts, ReduceOp, SgdConfig};
use crate::element::Element;
use crate::error::{ComputeError, Result};
use crate::layout::{Dims, broadcast_shapes};
use crate::storage::Storage;
use crate::tensor::Tensor;

/// The op name a binary op reports in its errors.
pub(crate) fn binary_name(op: BinaryOp) -> &'static str {
    match op {
        BinaryOp::Add => "add",
        BinaryOp::Sub => "sub",
        BinaryOp::Mul => "mul",
        BinaryOp::Div => "div",
        BinaryOp::Maximum => "maximum",
    }
}

/// The op name a reduction reports in its errors.
pub(crate) fn reduce_name(op: ReduceOp) -> &'static str {
    match op {
        ReduceOp::Sum => "sum",
        ReduceOp::Mean => "mean",
        ReduceOp::Max => "max",
    }
}

/// `upload`: `len` values for a dense tensor of `shape`; returns its element count.
pub(crate) fn upload<T: Element>(len: usize, shape: &[usize]) -> Result<usize> {
    const OP: &str = "upload";
    let n = output_numel::<T>(OP, shape)?;
    if len != n {
        return Err(ComputeError::LengthMismatch {
            op: OP,
            expected: n,
            got: len,
        });
    }
    Ok(n)
}

/// `upload_into`: `len` values written through the view `dst`.
pub(crate) fn upload_into<S: Storage>(len: usize, dst: &Tensor<S>) -> Result<()> {
    const OP: &str = "upload_into";
    if len != dst.numel() {
        return Err(ComputeError::LengthMismatch {
            op: OP,
            expected: dst.numel(),
            got: len,
        });
    }
    writable(OP, dst.layout())
}

/// `full`: returns the element count of the dense output.
pub(crate) fn full<T: Element>(shape: &[usize]) -> Result<usize> {
    output_numel::<T>("full", shape)
}

/// `fill`: the destination view must not reach an element twice.
pub(crate) fn fill<S: Storage>(dst: &Tensor<S>) -> Result<()> {
    writable("fill", dst.layout())
}

/// `copy_into`: same shapes, a writable destination (`src` may alias `dst`).
pub(crate) fn copy_into<S: Storage>(src: &Tensor<S>, dst: &Tensor<S>) -> Result<()> {
    const OP: &str = "copy_into";
    same_shape(OP, src.shape(), dst.shape())?;
    writable(OP, dst.layout())
}

/// `binary`: returns the broadcast output shape.
pub(crate) fn binary<S: Storage>(op: BinaryOp, a: &Tensor<S>, b: &Tensor<S>) -> Result<Dims> {
    let name = binary_name(op);
    let shape = broadcast_shapes(name, a.shape(), b.shape())?;
    output_numel::<S::Elem>(name, &shape)?;
    Ok(shape)
}

/// `binary_into`: `dst` shaped as the broadcast of `a` and `b`, writable, and in other memory
/// than either operand (a thread may write an element of `dst` before another thread reads
/// the operand element there).
pub(crate) fn binary_into<S: Storage>(
    op: BinaryOp,
    a: &Tensor<S>,
    b: &Tensor<S>,
    dst: &Tensor<S>,
) -> Result<()> {
    const OP: &str = "binary_into";
    let shape = binary(op, a, b)?;
    same_shape(OP, &shape, dst.shape())?;
    writable(OP, dst.layout())?;
    distinct(OP, &[("a", a), ("dst", dst)])?;
    distinct(OP, &[("b", b), ("dst", dst)])
}

/// A reduction's output.
#[derive(Debug)]
pub(crate) struct Reduced {
    /// The op name errors carry (`sum`, `mean`, `max`).
    pub(crate) name: &'static str,
    /// The output shape (the axis removed, or kept as 1).
    pub(crate) shape: Dims,
    /// The length of the reduced axis.
    pub(crate) n: usize,
}

/// `reduce`: the axis must exist; `mean` and `max` refuse an empty axis (no value to give).
pub(crate) fn reduce<S: Storage>(
    op: ReduceOp,
    x: &Tensor<S>,
    axis: usize,
    keepdim: bool,
) -> Result<Reduced> {
    let name = reduce_name(op);
    x.layout().check_axis(name, axis)?;
    let n = x.shape()[axis];
    if n == 0 && op != ReduceOp::Sum {
        return Err(ComputeError::EmptyReduction { op: name, axis });
    }
    let mut shape: Dims = x.shape().into();
    if keepdim {
        shape[axis] = 1;
    } else {
        shape.remove(axis);
    }
    Ok(Reduced { name, shape, n })
}

/// A tensor as `rows` dense rows of its last axis (`n` wide).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rows {
    pub(crate) rows: usize,
    pub(crate) n: usize,
}

/// The rows of `x`'s last axis, refusing rank 0.
pub(crate) fn rows<S: Storage>(op: &'static str, x: &Tensor<S>) -> Result<Rows> {
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

/// The rows of `x`'s last axis, refusing rank 0 and an empty last axis (a normalisation has
/// no mean over it).
fn nonempty_rows<S: Storage>(op: &'static str, x: &Tensor<S>) -> Result<Rows> {
    let r = rows(op, x)?;
    if r.n == 0 {
        return Err(ComputeError::EmptyReduction {
            op,
            axis: x.rank() - 1,
        });
    }
    Ok(r)
}

/// `x`'s shape with the last axis 1: the shape of a per-row statistic.
pub(crate) fn stat_shape<S: Storage>(x: &Tensor<S>) -> Dims {
    let mut s: Dims = x.shape().into();
    if let Some(last) = s.last_mut() {
        *last = 1;
    }
    s
}

/// `softmax_last`: rank >= 1 (an empty last axis gives an empty output).
pub(crate) fn softmax<S: Storage>(x: &Tensor<S>) -> Result<Rows> {
    rows("softmax", x)
}

/// `layer_norm`: rank >= 1, a non-empty last axis, weight and bias `[n]`, `eps` finite and
/// non-negative.
pub(crate) fn layer_norm<S: Storage>(
    x: &Tensor<S>,
    weight: Option<&Tensor<S>>,
    bias: Option<&Tensor<S>>,
    eps: S::Elem,
) -> Result<Rows> {
    const OP: &str = "layer_norm";
    let r = nonempty_rows(OP, x)?;
    if let Some(w) = weight {
        same_shape("layer_norm weight", w.shape(), &[r.n])?;
    }
    if let Some(b) = bias {
        same_shape("layer_norm bias", b.shape(), &[r.n])?;
    }
    scalar_in(OP, "eps", eps, (0.0, f64::MAX, false), "a finite eps >= 0")?;
    Ok(r)
}

/// `softmax_backward`: `g` and `y` of one shape, rank >= 1.
pub(crate) fn softmax_backward<S: Storage>(g: &Tensor<S>, y: &Tensor<S>) -> Result<Rows> {
    const OP: &str = "softmax_backward";
    same_shape(OP, g.shape(), y.shape())?;
    rows(OP, y)
}

/// `layer_norm_backward`: `g` shaped as `x`, rank >= 1 with a non-empty last axis (as the
/// forward), `mean` and `rstd` shaped as the forward returns them, the weight `[n]`.
pub(crate) fn layer_norm_backward<S: Storage>(
    g: &Tensor<S>,
    x: &Tensor<S>,
    mean: &Tensor<S>,
    rstd: &Tensor<S>,
    weight: Option<&Tensor<S>>,
) -> Result<Rows> {
    const OP: &str = "layer_norm_backward";
    same_shape(OP, g.shape(), x.shape())?;
    let r = nonempty_rows(OP, x)?;
    let stats = stat_shape(x);
    same_shape(OP, mean.shape(), &stats)?;
    same_shape(OP, rstd.shape(), &stats)?;
    if let Some(w) = weight {
        same_shape("layer_norm_backward weight", w.shape(), &[r.n])?;
    }
    Ok(r)
}

/// A matrix product's sizes: `[batch.., m, k] x [batch.., k, n] -> out = [batch.., m, n]`.
#[derive(Debug)]
pub(crate) struct MatmulShape {
    /// The broadcast batch axes.
    pub(crate) batch: Dims,
    pub(crate) m: usize,
    pub(crate) k: usize,
    pub(crate) n: usize,
    /// `batch` then `[m, n]`.
    pub(crate) out: Dims,
}

/// Splits `[..., r, c]` into (batch axes, r, c), refusing rank < 2.
pub(crate) fn split_matrix<S: Storage>(x: &Tensor<S>) -> Result<(&[usize], usize, usize)> {
    match x.shape() {
        [batch @ .., r, c] => Ok((batch, *r, *c)),
        _ => Err(ComputeError::RankTooLow {
            op: "matmul",
            min: 2,
            shape: x.shape().into(),
        }),
    }
}

/// `matmul`: both operands of rank >= 2, inner sizes equal (after the transpose flags), batch
/// axes broadcastable, an output that fits in memory.
pub(crate) fn matmul<S: Storage>(
    a: &Tensor<S>,
    b: &Tensor<S>,
    opts: MatmulOpts,
) -> Result<MatmulShape> {
    const OP: &str = "matmul";
    let (a_batch, ar, ac) = split_matrix(a)?;
    let (b_batch, br, bc) = split_matrix(b)?;
    let (m, ka) = if opts.trans_a { (ac, ar) } else { (ar, ac) };
    let (kb, n) = if opts.trans_b { (bc, br) } else { (br, bc) };
    if ka != kb {
        return Err(ComputeError::ShapeMismatch {
            op: OP,
            lhs: a.shape().into(),
            rhs: b.shape().into(),
        });
    }
    let batch = broadcast_shapes(OP, a_batch, b_batch)?;
    let mut out = batch.clone();
    out.extend([m, n]);
    output_numel::<S::Elem>(OP, &out)?;
    Ok(MatmulShape {
        batch,
        m,
        k: ka,
        n,
        out,
    })
}

/// `bce_with_logits_mean`: logits and targets of one shape, at least one element (a mean of
/// nothing has no value); returns the element count.
pub(crate) fn bce<S: Storage>(logits: &Tensor<S>, targets: &Tensor<S>) -> Result<usize> {
    const OP: &str = "bce_with_logits";
    same_shape(OP, logits.shape(), targets.shape())?;
    let n = logits.numel();
    if n == 0 {
        return Err(ComputeError::EmptyReduction { op: OP, axis: 0 });
    }
    Ok(n)
}

/// `sgd_step`: `g` (and `buf`) shaped as `p`; `buf` present when momentum is non-zero;
/// `slot` is `[lr, t]` or `[lr, t, gate]`; no two share storage; `p` and `buf` writable;
/// momentum, dampening and weight decay finite and non-negative; Nesterov only with momentum
/// and no dampening.
pub(crate) fn sgd<S: Storage>(
    p: &Tensor<S>,
    buf: Option<&Tensor<S>>,
    g: &Tensor<S>,
    slot: &Tensor<S>,
    cfg: &SgdConfig<S::Elem>,
) -> Result<()> {
    const OP: &str = "sgd";
    same_shape(OP, g.shape(), p.shape())?;
    if slot.shape() != [3] {
        same_shape(OP, slot.shape(), &[2])?;
    }
    let non_negative = (0.0, f64::MAX, false);
    let finite = |arg, value, expected| scalar_in(OP, arg, value, non_negative, expected);
    finite("momentum", cfg.momentum, "a finite momentum >= 0")?;
    finite("dampening", cfg.dampening, "a finite dampening >= 0")?;
    finite(
        "weight_decay",
        cfg.weight_decay,
        "a finite weight decay >= 0",
    )?;
    let (momentum, dampening) = (cfg.momentum.to_f64(), cfg.dampening.to_f64());
    if cfg.nesterov && momentum <= 0.0 {
        return Err(ComputeError::InvalidScalar {
            op: OP,
            arg: "momentum",
            value: format!("{momentum:?}"),
            expected: "a momentum > 0 with Nesterov",
        });
    }
    if cfg.nesterov && dampening != 0.0 {
        return Err(ComputeError::InvalidScalar {
            op: OP,
            arg: "dampening",
            value: format!("{dampening:?}"),
            expected: "a dampening of 0 with Nesterov",
        });
    }
    writable(OP, p.layout())?;
    match buf {
        Some(buf) => {
            same_shape(OP, buf.shape(), p.shape())?;
            writable(OP, buf.layout())?;
            distinct(OP, &[("p", p), ("buf", buf), ("g", g), ("slot", slot)])
        }
        None if momentum != 0.0 => Err(ComputeError::InvalidScalar {
            op: OP,
            arg: "momentum",
            value: format!("{momentum:?}"),
            expected: "a momentum buffer beside a non-zero momentum",
        }),
        None => distinct(OP, &[("p", p), ("g", g), ("slot", slot)]),
    }
}

/// `adamw_step`: `m`, `v`, `g` shaped as `p`; `slot` is `[lr, t]` or `[lr, t, gate]`; no two
/// of them share storage; `p`, `m`, `v` writable; the betas in `[0, 1)`, `eps` and the weight
/// decay finite and non-negative. (The slot's values live in memory the op reads when it runs,
/// a captured graph's on each replay, so they are not checked here.)
pub(crate) fn adamw<S: Storage>(
    p: &Tensor<S>,
    m: &Tensor<S>,
    v: &Tensor<S>,
    g: &Tensor<S>,
    slot: &Tensor<S>,
    cfg: &AdamWConfig<S::Elem>,
) -> Result<()> {
    const OP: &str = "adamw";
    same_shape(OP, m.shape(), p.shape())?;
    same_shape(OP, v.shape(), p.shape())?;
    same_shape(OP, g.shape(), p.shape())?;
    if slot.shape() != [3] {
        same_shape(OP, slot.shape(), &[2])?;
    }
    distinct(
        OP,
        &[("p", p), ("m", m), ("v", v), ("g", g), ("slot", slot)],
    )?;
    for t in [p, m, v] {
        writable(OP, t.layout())?;
    }
    let beta = (0.0, 1.0, true);
    let non_negative = (0.0, f64::MAX, false);
    scalar_in(OP, "beta1", cfg.beta1, beta, "a beta1 in [0, 1)")?;
    scalar_in(OP, "beta2", cfg.beta2, beta, "a beta2 in [0, 1)")?;
    scalar_in(OP, "eps", cfg.eps, non_negative, "a finite eps >= 0")?;
    scalar_in(
        OP,
        "weight_decay",
        cfg.weight_decay,
        non_negative,
        "a finite weight decay >= 0",
    )
}
