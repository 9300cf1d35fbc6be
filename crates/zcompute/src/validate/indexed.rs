//! Checks of the row ops indexed from device memory (`Backend::gather_row`,
//! `Backend::scatter_row`), shared by every backend.

use super::common::distinct;
use crate::error::{ComputeError, Result};
use crate::storage::Storage;
use crate::tensor::Tensor;

/// The rows a row op indexes and the length of each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RowTable {
    pub rows: usize,
    pub row_len: usize,
}

/// The row `value` names among `rows`: a whole number in `[0, rows)`, else none (NaN,
/// negative, fractional, too large). The kernels' `zc_row_of` applies the same rule.
pub(crate) fn row_of(value: f64, rows: usize) -> Option<usize> {
    let whole = value.is_finite() && value >= 0.0 && value.fract() == 0.0;
    // `rows as f64` is exact for every row count a device can hold (below 2^53).
    (whole && value < rows as f64).then_some(value as usize)
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

/// The shapes `gather_rows_at_cursor` works on (see [`indexed_rows_at_cursor`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CursorRows {
    /// The table the rows come from.
    pub src: RowTable,
    /// Rows gathered.
    pub n: usize,
    /// The step table's rows and their length.
    pub steps: RowTable,
    /// Elements copied from the end of the picked row into the tail (0 without one).
    pub tail: usize,
}

/// `gather_rows_at_cursor`: `src` dense of rank >= 1; `steps` dense of rank 2 (`[k, width]`);
/// `cursor` one element; `dst` dense of rank >= 1 holding `n = shape[0]` rows of `src`; `tail`
/// (if any) dense; the indices and the tail fit a row of `steps` (`n + tail <= width`); no two
/// of them sharing storage. (The cursor's and the indices' values are read when the op runs.)
pub(crate) fn indexed_rows_at_cursor<S: Storage>(
    src: &Tensor<S>,
    steps: &Tensor<S>,
    cursor: &Tensor<S>,
    dst: &Tensor<S>,
    tail: Option<&Tensor<S>>,
) -> Result<CursorRows> {
    const OP: &str = "gather_rows_at_cursor";
    let (Some((&rows, rest)), Some(&n)) = (src.shape().split_first(), dst.shape().first()) else {
        let shape = if src.shape().is_empty() { src } else { dst };
        return Err(ComputeError::RankTooLow {
            op: OP,
            min: 1,
            shape: shape.shape().into(),
        });
    };
    let [steps_rows, width] = *steps.shape() else {
        return Err(ComputeError::ShapeMismatch {
            op: OP,
            lhs: steps.shape().into(),
            rhs: [0usize, 0][..].into(),
        });
    };
    if cursor.numel() != 1 {
        return Err(ComputeError::ShapeMismatch {
            op: OP,
            lhs: cursor.shape().into(),
            rhs: [1usize][..].into(),
        });
    }
    let row_len: usize = rest.iter().product();
    let expected = n.saturating_mul(row_len);
    if dst.numel() != expected {
        return Err(ComputeError::LengthMismatch {
            op: OP,
            expected,
            got: dst.numel(),
        });
    }
    let tail_len = tail.map_or(0, Tensor::numel);
    if n.saturating_add(tail_len) > width {
        return Err(ComputeError::LengthMismatch {
            op: OP,
            expected: width,
            got: n.saturating_add(tail_len),
        });
    }
    for t in [Some(src), Some(steps), Some(dst), tail]
        .into_iter()
        .flatten()
    {
        if !t.is_contiguous() {
            return Err(ComputeError::NotContiguous {
                op: OP,
                shape: t.shape().into(),
                strides: t.layout().strides().into(),
            });
        }
    }
    let mut named = vec![
        ("src", src),
        ("steps", steps),
        ("cursor", cursor),
        ("dst", dst),
    ];
    if let Some(t) = tail {
        named.push(("tail", t));
    }
    distinct(OP, &named)?;
    Ok(CursorRows {
        src: RowTable { rows, row_len },
        n,
        steps: RowTable {
            rows: steps_rows,
            row_len: width,
        },
        tail: tail_len,
    })
}
