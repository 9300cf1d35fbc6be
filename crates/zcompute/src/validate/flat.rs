//! Checks of the ops over flat buffers (`Backend::norm2`, `sum_squares_into`, `norm_of_parts`,
//! `clip_scale`, `finite_gate`, `add_into`).

use super::{distinct, same_shape, scalar_in, writable};
use crate::error::Result;
use crate::storage::Storage;
use crate::tensor::Tensor;

/// Refuses a tensor that is not exactly one element (a rank-0 or `[1]`-like scalar).
fn one_element<S: Storage>(op: &'static str, t: &Tensor<S>) -> Result<()> {
    if t.numel() == 1 {
        Ok(())
    } else {
        same_shape(op, t.shape(), &[1])
    }
}

/// A dense (contiguous) operand of a flat-buffer op.
fn dense<S: Storage>(op: &'static str, t: &Tensor<S>) -> Result<()> {
    if t.is_contiguous() {
        Ok(())
    } else {
        Err(crate::error::ComputeError::NotContiguous {
            op,
            shape: t.shape().into(),
            strides: t.layout().strides().into(),
        })
    }
}

/// `sum_squares_into`: a dense `x`, a dense `parts` of 1 to `MAX_NORM_PARTS` elements in other
/// memory.
pub(crate) fn sum_squares_into<S: Storage>(x: &Tensor<S>, parts: &Tensor<S>) -> Result<()> {
    const OP: &str = "sum_squares_into";
    dense(OP, x)?;
    dense(OP, parts)?;
    let got = parts.numel();
    let most = crate::backend::MAX_NORM_PARTS;
    if !(1..=most).contains(&got) {
        return Err(crate::error::ComputeError::LengthMismatch {
            op: OP,
            expected: got.clamp(1, most),
            got,
        });
    }
    distinct(OP, &[("x", x), ("parts", parts)])
}

/// `norm_of_parts`: as `sum_squares_into` into `parts[first..first + want]`, `parts` one axis.
pub(crate) fn norm_of_parts<S: Storage>(
    x: &Tensor<S>,
    parts: &Tensor<S>,
    first: usize,
    want: usize,
) -> Result<()> {
    const OP: &str = "norm_of_parts";
    dense(OP, x)?;
    dense(OP, parts)?;
    if parts.shape().len() != 1 {
        return Err(crate::error::ComputeError::ShapeMismatch {
            op: OP,
            lhs: parts.shape().into(),
            rhs: [parts.numel()][..].into(),
        });
    }
    let len = parts.numel();
    if first.checked_add(want).is_none_or(|end| end > len) {
        return Err(crate::error::ComputeError::NarrowOutOfRange {
            axis: 0,
            start: first,
            len: want,
            size: len,
        });
    }
    distinct(OP, &[("x", x), ("parts", parts)])
}

/// `clip_scale`: a writable `x`, a one-element `norm` in other memory, a finite `max_norm >= 0`.
pub(crate) fn clip_scale<S: Storage>(
    x: &Tensor<S>,
    norm: &Tensor<S>,
    max_norm: S::Elem,
) -> Result<()> {
    const OP: &str = "clip_scale";
    one_element(OP, norm)?;
    writable(OP, x.layout())?;
    distinct(OP, &[("x", x), ("norm", norm)])?;
    scalar_in(
        OP,
        "max_norm",
        max_norm,
        (0.0, f64::MAX, false),
        "a finite max_norm >= 0",
    )
}

/// `finite_gate`: three one-element tensors, `dst` in other memory than `a` and `b`.
pub(crate) fn finite_gate<S: Storage>(a: &Tensor<S>, b: &Tensor<S>, dst: &Tensor<S>) -> Result<()> {
    const OP: &str = "finite_gate";
    for t in [a, b, dst] {
        one_element(OP, t)?;
    }
    distinct(OP, &[("a", a), ("dst", dst)])?;
    distinct(OP, &[("b", b), ("dst", dst)])
}

/// `add_into`: `src` shaped as `dst`, a writable `dst` in other memory.
pub(crate) fn add_into<S: Storage>(src: &Tensor<S>, dst: &Tensor<S>) -> Result<()> {
    const OP: &str = "add_into";
    same_shape(OP, src.shape(), dst.shape())?;
    writable(OP, dst.layout())?;
    distinct(OP, &[("src", src), ("dst", dst)])
}

/// `step_tail`: one-element `loss`, `norm`, `gate` (and `sticky`), a writable two-element
/// `stats`, the gate in other memory than what it is made from, and a history table of
/// two-element rows with a one-element cursor.
pub(crate) fn step_tail<S: Storage>(
    [loss, norm]: [&Tensor<S>; 2],
    stats: &Tensor<S>,
    gate: &Tensor<S>,
    sticky: Option<&Tensor<S>>,
    history: Option<(&Tensor<S>, &Tensor<S>)>,
) -> Result<()> {
    const OP: &str = "step_tail";
    finite_gate(loss, norm, gate)?;
    same_shape(OP, &[stats.numel()], &[2])?;
    writable(OP, stats.layout())?;
    distinct(OP, &[("loss", loss), ("stats", stats)])?;
    distinct(OP, &[("norm", norm), ("stats", stats)])?;
    distinct(OP, &[("gate", gate), ("stats", stats)])?;
    if let Some(sticky) = sticky {
        one_element(OP, sticky)?;
        distinct(OP, &[("gate", gate), ("sticky", sticky)])?;
    }
    if let Some((rows, cursor)) = history {
        super::indexed_row(OP, rows, stats, cursor)?;
    }
    Ok(())
}
