//! Checks of a Linear layer's fused ops (`Backend::linear`, `Backend::linear_param_grads_into`):
//! a matrix of rows in, `[out, in]` weights, an `[out]` bias.

use super::{distinct, same_shape, writable};
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
    const OP: &str = "linear_param_grads_into";
    let (rows, outputs) = matrix(OP, g)?;
    let (x_rows, inputs) = matrix(OP, x)?;
    same_shape(OP, &[rows], &[x_rows])?;
    same_shape(OP, dw.shape(), &[outputs, inputs])?;
    writable(OP, dw.layout())?;
    distinct(OP, &[("g", g), ("dw", dw)])?;
    distinct(OP, &[("x", x), ("dw", dw)])?;
    if let Some(db) = db {
        same_shape(OP, db.shape(), &[outputs])?;
        writable(OP, db.layout())?;
        distinct(OP, &[("g", g), ("db", db)])?;
        distinct(OP, &[("x", x), ("db", db)])?;
        disjoint_views(OP, ("dw", dw), ("db", db))?;
    }
    Ok(LinearShape {
        rows,
        inputs,
        outputs,
    })
}
