//! Checks of the selection and random families (`SelectOps`, `RandomOps`), shared by every
//! backend.

use super::common::{distinct, output_numel};
use super::indexed::RowTable;
use super::ops::{Rows, rows};
use crate::error::{ComputeError, Result};
use crate::layout::{Dims, broadcast_shapes};
use crate::storage::Storage;
use crate::tensor::Tensor;

/// `select`: the broadcast of the three shapes.
pub(crate) fn select<S: Storage>(cond: &Tensor<S>, a: &Tensor<S>, b: &Tensor<S>) -> Result<Dims> {
    let ab = broadcast_shapes("select", a.shape(), b.shape())?;
    let shape = broadcast_shapes("select", cond.shape(), &ab)?;
    output_numel::<S::Elem>("select", &shape)?;
    Ok(shape)
}

/// `argmax`: rank >= 1, a non-empty last axis; the rows and the output shape.
pub(crate) fn argmax<S: Storage>(x: &Tensor<S>) -> Result<(Rows, Dims)> {
    let r = rows("argmax", x)?;
    if r.n == 0 {
        return Err(ComputeError::EmptyReduction {
            op: "argmax",
            axis: x.rank() - 1,
        });
    }
    Ok((r, x.shape()[..x.rank() - 1].into()))
}

/// `concat`: at least one part, `axis` below the (common) rank, equal sizes elsewhere; the
/// output shape.
pub(crate) fn concat<S: Storage>(parts: &[&Tensor<S>], axis: usize) -> Result<Dims> {
    let Some(first) = parts.first() else {
        return Err(ComputeError::LengthMismatch {
            op: "concat",
            expected: 1,
            got: 0,
        });
    };
    if axis >= first.rank() {
        return Err(ComputeError::AxisOutOfRange {
            op: "concat",
            axis,
            rank: first.rank(),
        });
    }
    let mut shape: Dims = first.shape().into();
    shape[axis] = 0;
    for p in parts {
        let same_rank = p.rank() == first.rank();
        let same_rest =
            same_rank && (0..p.rank()).all(|i| i == axis || p.shape()[i] == first.shape()[i]);
        if !same_rest {
            return Err(ComputeError::ShapeMismatch {
                op: "concat",
                lhs: first.shape().into(),
                rhs: p.shape().into(),
            });
        }
        shape[axis] =
            shape[axis]
                .checked_add(p.shape()[axis])
                .ok_or_else(|| ComputeError::SizeOverflow {
                    op: "concat",
                    shape: p.shape().into(),
                })?;
    }
    output_numel::<S::Elem>("concat", &shape)?;
    Ok(shape)
}

/// `embedding`: `table` dense of rank >= 1; the output shape `index ++ table[1..]`.
pub(crate) fn embedding<S: Storage>(table: &Tensor<S>, index: &Tensor<S>) -> Result<Dims> {
    if table.rank() == 0 {
        return Err(ComputeError::RankTooLow {
            op: "embedding",
            min: 1,
            shape: table.shape().into(),
        });
    }
    if !table.is_contiguous() {
        return Err(ComputeError::NotContiguous {
            op: "embedding",
            shape: table.shape().into(),
            strides: table.layout().strides().into(),
        });
    }
    let mut shape: Dims = index.shape().into();
    shape.extend_from_slice(&table.shape()[1..]);
    output_numel::<S::Elem>("embedding", &shape)?;
    Ok(shape)
}

/// `index_add_rows`: `dst` dense `[rows, ...]`, `src` dense with `index.numel()` rows of
/// `dst`'s row length, no two sharing storage; the table and the number of source rows.
pub(crate) fn index_add_rows<S: Storage>(
    src: &Tensor<S>,
    index: &Tensor<S>,
    dst: &Tensor<S>,
) -> Result<(RowTable, usize)> {
    const OP: &str = "index_add_rows";
    let Some((&rows, rest)) = dst.shape().split_first() else {
        return Err(ComputeError::RankTooLow {
            op: OP,
            min: 1,
            shape: dst.shape().into(),
        });
    };
    let row_len: usize = rest.iter().product();
    let n = index.numel();
    let expected = n
        .checked_mul(row_len)
        .ok_or_else(|| ComputeError::SizeOverflow {
            op: OP,
            shape: index.shape().into(),
        })?;
    if src.numel() != expected {
        return Err(ComputeError::LengthMismatch {
            op: OP,
            expected,
            got: src.numel(),
        });
    }
    for t in [src, index, dst] {
        if !t.is_contiguous() {
            return Err(ComputeError::NotContiguous {
                op: OP,
                shape: t.shape().into(),
                strides: t.layout().strides().into(),
            });
        }
    }
    distinct(OP, &[("src", src), ("index", index), ("dst", dst)])?;
    Ok((RowTable { rows, row_len }, n))
}

/// A step tensor: one element.
pub(crate) fn dropout_step_tensor<S: Storage>(op: &'static str, step: &Tensor<S>) -> Result<()> {
    if step.numel() == 1 {
        Ok(())
    } else {
        Err(ComputeError::ShapeMismatch {
            op,
            lhs: step.shape().into(),
            rhs: [1usize][..].into(),
        })
    }
}

/// `dropout_mask`: `p` in `[0, 1)`, a one-element step; the mask's element count.
pub(crate) fn dropout_mask<S: Storage>(shape: &[usize], p: f64, step: &Tensor<S>) -> Result<usize> {
    const OP: &str = "dropout_mask";
    if !(p.is_finite() && (0.0..1.0).contains(&p)) {
        return Err(ComputeError::InvalidScalar {
            op: OP,
            arg: "p",
            value: format!("{p:?}"),
            expected: "a drop probability in [0, 1)",
        });
    }
    dropout_step_tensor(OP, step)?;
    output_numel::<S::Elem>(OP, shape)
}

/// The CPU backend's check of indices it can read: each a whole number in `[0, rows)`.
pub(crate) fn indices_in_range(op: &'static str, values: &[f64], rows: usize) -> Result<()> {
    for (position, &v) in values.iter().enumerate() {
        if super::indexed::row_of(v, rows).is_none() {
            return Err(ComputeError::IndexOutOfRange {
                op,
                position,
                value: format!("{v:?}"),
                rows,
            });
        }
    }
    Ok(())
}
