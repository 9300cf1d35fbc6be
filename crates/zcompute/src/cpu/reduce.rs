//! Reductions over one axis. The input, read densely, is `[outer, n, inner]` around the axis;
//! every output element reduces its `n` values with the pairwise sum (or the running maximum)
//! of `math`, in the same order whether `inner` is 1 (a dense row) or not: for `inner > 1` the
//! pairwise tree runs over rows of `inner` values at once (`columns`), which is the same tree
//! per column, vectorised. Output elements are split over the pool; none is split itself.

use super::{dense, math, par};
use crate::backend::ReduceOp;
use crate::element::Element;
use crate::error::Result;
use crate::tensor::CpuTensor;
use crate::validate;

/// Below this, `math::pairwise_sum` folds in order; the same leaf size here.
const LEAF: usize = 32;

/// `acc[c] = Σ_j rows[j * stride + c]` for `j` in `0..n`, pairwise as `math::pairwise_sum`
/// over each column `c` (`acc.len()` columns from the start of each row).
fn column_sums<T: Element>(rows: &[T], stride: usize, n: usize, acc: &mut [T]) {
    if n <= LEAF {
        acc.fill(T::ZERO);
        for j in 0..n {
            let row = &rows[j * stride..j * stride + acc.len()];
            for (a, &v) in acc.iter_mut().zip(row) {
                *a = *a + v;
            }
        }
    } else {
        let half = n / 2;
        let mut hi = vec![T::ZERO; acc.len()];
        column_sums(rows, stride, half, acc);
        column_sums(&rows[half * stride..], stride, n - half, &mut hi);
        for (a, &h) in acc.iter_mut().zip(&hi) {
            *a = *a + h;
        }
    }
}

/// `acc[c] = max_j rows[j * stride + c]`, NaN-propagating, as `math::row_max` per column.
fn column_max<T: Element>(rows: &[T], stride: usize, n: usize, acc: &mut [T]) {
    acc.fill(T::NEG_INFINITY);
    for j in 0..n {
        let row = &rows[j * stride..j * stride + acc.len()];
        for (a, &v) in acc.iter_mut().zip(row) {
            *a = math::maximum(*a, v);
        }
    }
}

/// Reduces dense `x` `[outer, n, inner]` over `n` into `out` `[outer, inner]`.
pub(crate) fn reduce_dense<T: Element>(
    op: ReduceOp,
    x: &[T],
    n: usize,
    inner: usize,
    out: &mut [T],
) {
    if n == 0 {
        out.fill(T::ZERO);
        return;
    }
    if inner == 1 {
        par::rows_mut(out, 1, |first, block| {
            for (i, o) in block.iter_mut().enumerate() {
                let row = &x[(first + i) * n..(first + i + 1) * n];
                *o = match op {
                    ReduceOp::Sum => math::pairwise_sum(row),
                    // As before: the sum divided by n (not multiplied by 1/n).
                    ReduceOp::Mean => math::pairwise_sum(row) / T::from_f64(n as f64),
                    ReduceOp::Max => math::row_max(row),
                };
            }
        });
        return;
    }
    // Split every outer slice's `inner` columns into blocks; one task per block.
    // Narrow enough that a 256-wide bias gradient still makes a task per thread.
    const BLOCK: usize = 64;
    let blocks_per = inner.div_ceil(BLOCK);
    let results = par::ranges(
        out.len().div_ceil(inner) * blocks_per,
        n * BLOCK,
        |start, len| {
            let mut parts = Vec::with_capacity(len);
            for t in start..start + len {
                let (o, blk) = (t / blocks_per, t % blocks_per);
                let c0 = blk * BLOCK;
                let width = BLOCK.min(inner - c0);
                let mut acc = vec![T::ZERO; width];
                let rows = &x[o * n * inner + c0..];
                match op {
                    ReduceOp::Sum => column_sums(rows, inner, n, &mut acc),
                    ReduceOp::Mean => {
                        column_sums(rows, inner, n, &mut acc);
                        let n = T::from_f64(n as f64);
                        acc.iter_mut().for_each(|v| *v = *v / n);
                    }
                    ReduceOp::Max => column_max(rows, inner, n, &mut acc),
                }
                parts.push((o * inner + c0, acc));
            }
            parts
        },
    );
    for (at, acc) in results.into_iter().flatten() {
        out[at..at + acc.len()].copy_from_slice(&acc);
    }
}

pub(crate) fn reduce<T: Element>(
    op: ReduceOp,
    x: &CpuTensor<T>,
    axis: usize,
    keepdim: bool,
) -> Result<CpuTensor<T>> {
    let validate::Reduced { shape, n, .. } = validate::reduce(op, x, axis, keepdim)?;
    let inner: usize = x.shape()[axis + 1..].iter().product();
    let outer: usize = shape.iter().product();
    let mut out = vec![T::ZERO; outer];
    if outer > 0 {
        super::dense::with(x, |xs| reduce_dense(op, xs, n, inner.max(1), &mut out));
    }
    dense(out, &shape)
}
