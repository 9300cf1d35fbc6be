//! Checks of the row ops indexed from device memory (`Backend::gather_row`,
//! `Backend::scatter_row`), shared by every backend.

use super::distinct;
use crate::error::{ComputeError, Result};
use crate::storage::Storage;
use crate::tensor::Tensor;

/// The rows a row op indexes and the length of each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RowTable {
    pub rows: usize,
    pub row_len: usize,
}

/// `gather_row` (`table` read, `row` written) and `scatter_row` (`row` read, `table` written,
/// `index` written when it advances): `table` dense of rank >= 1, `row` dense with the
/// element count of one row of `table` (`numel / shape[0]`, whatever its shape), `index` one
/// element, no two of them sharing storage. (The index's value lives in memory the op reads
/// when it runs, a captured graph's on each replay, so it is not checked here: a value that
/// names no row makes a gather write NaN and a scatter write nothing.)
pub(crate) fn indexed_row<S: Storage>(
    op: &'static str,
    table: &Tensor<S>,
    row: &Tensor<S>,
    index: &Tensor<S>,
) -> Result<RowTable> {
    let Some((&rows, rest)) = table.shape().split_first() else {
        return Err(ComputeError::RankTooLow {
            op,
            min: 1,
            shape: table.shape().into(),
        });
    };
    if index.numel() != 1 {
        return Err(ComputeError::ShapeMismatch {
            op,
            lhs: index.shape().into(),
            rhs: [1usize][..].into(),
        });
    }
    let row_len: usize = rest.iter().product();
    if row.numel() != row_len {
        return Err(ComputeError::LengthMismatch {
            op,
            expected: row_len,
            got: row.numel(),
        });
    }
    for t in [table, row] {
        if !t.is_contiguous() {
            return Err(ComputeError::NotContiguous {
                op,
                shape: t.shape().into(),
                strides: t.layout().strides().into(),
            });
        }
    }
    distinct(op, &[("table", table), ("row", row), ("index", index)])?;
    Ok(RowTable { rows, row_len })
}

/// `gather_rows`: `table` dense of rank >= 1, `index` dense with one element per gathered row
/// (`n` of them), `rows` dense with `n` rows' elements (`n * numel / shape[0]`, whatever its
/// shape), no two of them sharing storage. Returns the table and `n`. (The indices' values
/// are read when the op runs, as `indexed_row` says.)
pub(crate) fn indexed_rows<S: Storage>(
    op: &'static str,
    table: &Tensor<S>,
    rows: &Tensor<S>,
    index: &Tensor<S>,
) -> Result<(RowTable, usize)> {
    let Some((&n_rows, rest)) = table.shape().split_first() else {
        return Err(ComputeError::RankTooLow {
            op,
            min: 1,
            shape: table.shape().into(),
        });
    };
    let row_len: usize = rest.iter().product();
    let n = index.numel();
    let expected = n.checked_mul(row_len).ok_or(ComputeError::LengthMismatch {
        op,
        expected: usize::MAX,
        got: rows.numel(),
    })?;
    if rows.numel() != expected {
        return Err(ComputeError::LengthMismatch {
            op,
            expected,
            got: rows.numel(),
        });
    }
    for t in [table, rows, index] {
        if !t.is_contiguous() {
            return Err(ComputeError::NotContiguous {
                op,
                shape: t.shape().into(),
                strides: t.layout().strides().into(),
            });
        }
    }
    distinct(op, &[("table", table), ("rows", rows), ("index", index)])?;
    Ok((
        RowTable {
            rows: n_rows,
            row_len,
        },
        n,
    ))
}
