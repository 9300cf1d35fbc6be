//! Checks of the ops over flat buffers (`Backend::norm2`, `clip_scale`, `finite_gate`,
//! `add_into`).

use super::common::{distinct, same_shape, scalar_in, writable};
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
        super::indexed::indexed_row(OP, rows, stats, cursor)?;
    }
    Ok(())
}
