//! Checks of a Linear layer's fused ops (`LinearOps::linear`,
//! `LinearOps::linear_param_grads_into`): a matrix of rows in, `[out, in]` weights, an `[out]`
//! bias.

use super::common::{distinct, same_shape, writable};
use crate::descriptors::Activation;
use crate::error::{ComputeError, Result};
use crate::storage::Storage;
use crate::tensor::Tensor;

/// The sizes of one Linear product: `rows` input rows of `inputs` features, `outputs` out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LinearShape {
    pub rows: usize,
    pub inputs: usize,
    pub outputs: usize,
}

fn matrix<S: Storage>(op: &'static str, x: &Tensor<S>) -> Result<(usize, usize)> {
    match x.shape() {
        [r, c] => Ok((*r, *c)),
        other if other.len() < 2 => Err(ComputeError::RankTooLow {
            op,
            min: 2,
            shape: other.into(),
        }),
        other => Err(ComputeError::Unsupported {
            op,
            reason: format!(
                "takes a matrix [rows, features], got shape {other:?}: fold the leading axes into the rows first (reshape)"
            ),
        }),
    }
}

/// `linear`: `x [rows, in]`, `w [out, in]`, `bias [out]`.
pub(crate) fn linear<S: Storage>(
    x: &Tensor<S>,
    w: &Tensor<S>,
    bias: &Tensor<S>,
) -> Result<LinearShape> {
    const OP: &str = "linear";
    let (rows, inputs) = matrix(OP, x)?;
    let (outputs, w_in) = matrix("linear weight", w)?;
    same_shape(OP, &[inputs], &[w_in])?;
    same_shape("linear bias", bias.shape(), &[outputs])?;
    Ok(LinearShape {
        rows,
        inputs,
        outputs,
    })
}

/// `linear_add`: `linear`'s checks, and the residual shaped as the output `[rows, out]`.
pub(crate) fn linear_add<S: Storage>(
    x: &Tensor<S>,
    w: &Tensor<S>,
    bias: &Tensor<S>,
    residual: &Tensor<S>,
) -> Result<LinearShape> {
    let shape = linear(x, w, bias)?;
    same_shape(
        "linear_add residual",
        residual.shape(),
        &[shape.rows, shape.outputs],
    )?;
    Ok(shape)
}

/// Refuses two views whose element ranges meet; views of one buffer that do not (a weight's
/// and a bias's gradient in a model's flat gradient buffer) are fine.
pub(crate) fn disjoint_views<S: Storage>(
    op: &'static str,
    (lhs, l): (&'static str, &Tensor<S>),
    (rhs, r): (&'static str, &Tensor<S>),
) -> Result<()> {
    if !l.shares_storage(r) {
        return Ok(());
    }
    let span = |t: &Tensor<S>| {
        t.layout()
            .max_offset()
            .map(|end| (t.layout().offset(), end))
    };
    match (span(l), span(r)) {
        (Some((l0, l1)), Some((r0, r1))) if l1 >= r0 && r1 >= l0 => {
            Err(ComputeError::Aliased { op, lhs, rhs })
        }
        _ => Ok(()),
    }
}

/// `linear_param_grads_into`: `g [rows, out]`, `x [rows, in]`, `dw [out, in]` and `db [out]`
/// writable and in other memory than `g` and `x`; `dw` and `db` may be disjoint views of one
/// buffer (a flat gradient buffer), not overlapping ones.
pub(crate) fn linear_param_grads_into<S: Storage>(
    g: &Tensor<S>,
    x: &Tensor<S>,
    dw: &Tensor<S>,
    db: Option<&Tensor<S>>,
) -> Result<LinearShape> {
    param_grads("linear_param_grads_into", g, x, dw, db)
}

/// `PrecisionOps::linear_param_grads_into_bf16`: `linear_param_grads_into`'s checks on `g`,
/// `x` (a shape stand-in of its copy), `dw` and `db`, and `g`'s copy of `g`'s shape.
pub(crate) fn linear_param_grads_into_bf16<S: Storage>(
    g: &Tensor<S>,
    g_copy: &[usize],
    x: &Tensor<S>,
    dw: &Tensor<S>,
    db: Option<&Tensor<S>>,
) -> Result<LinearShape> {
    const OP: &str = "linear_param_grads_into_bf16";
    let shape = param_grads(OP, g, x, dw, db)?;
    same_shape(OP, g_copy, g.shape())?;
    Ok(shape)
}

fn param_grads<S: Storage>(
    op: &'static str,
    g: &Tensor<S>,
    x: &Tensor<S>,
    dw: &Tensor<S>,
    db: Option<&Tensor<S>>,
) -> Result<LinearShape> {
    let (rows, outputs) = matrix(op, g)?;
    let (x_rows, inputs) = matrix(op, x)?;
    same_shape(op, &[rows], &[x_rows])?;
    same_shape(op, dw.shape(), &[outputs, inputs])?;
    writable(op, dw.layout())?;
    distinct(op, &[("g", g), ("dw", dw)])?;
    distinct(op, &[("x", x), ("dw", dw)])?;
    if let Some(db) = db {
        same_shape(op, db.shape(), &[outputs])?;
        writable(op, db.layout())?;
        distinct(op, &[("g", g), ("db", db)])?;
        distinct(op, &[("x", x), ("db", db)])?;
        disjoint_views(op, ("dw", dw), ("db", db))?;
    }
    Ok(LinearShape {
        rows,
        inputs,
        outputs,
    })
}

/// `linear_backward_into`: the parameter-gradient checks of [`linear_param_grads_into`] with
/// `g` the output's gradient `[rows, out]`; the weight `w [out, in]` when the input's gradient
/// is wanted; tanh's saved output `y`, shaped as `g`, exactly when the activation is tanh. The
/// buffers `dw`/`db` share no memory with any input (one launch reads the inputs while it
/// writes them).
pub(crate) fn linear_backward_into<S: Storage>(
    g: &Tensor<S>,
    x: &Tensor<S>,
    w: Option<&Tensor<S>>,
    (act, y): (Activation, Option<&Tensor<S>>),
    dw: &Tensor<S>,
    db: Option<&Tensor<S>>,
) -> Result<LinearShape> {
    const OP: &str = "linear_backward_into";
    let shape = param_grads(OP, g, x, dw, db)?;
    if let Some(w) = w {
        same_shape(
            "linear_backward_into weight",
            w.shape(),
            &[shape.outputs, shape.inputs],
        )?;
        distinct(OP, &[("w", w), ("dw", dw)])?;
        if let Some(db) = db {
            distinct(OP, &[("w", w), ("db", db)])?;
        }
    }
    match (act, y) {
        (Activation::Tanh, Some(y)) => {
            same_shape("linear_backward_into output", y.shape(), g.shape())?;
            distinct(OP, &[("y", y), ("dw", dw)])?;
            if let Some(db) = db {
                distinct(OP, &[("y", y), ("db", db)])?;
            }
        }
        (Activation::Identity, None) => {}
        (Activation::Tanh, None) => {
            return Err(ComputeError::Unsupported {
                op: OP,
                reason: "tanh's backward needs the layer's saved output `y`".into(),
            });
        }
        (Activation::Identity, Some(_)) => {
            return Err(ComputeError::Unsupported {
                op: OP,
                reason: "the identity has no saved output: pass `y` only with tanh".into(),
            });
        }
    }
    Ok(shape)
}
