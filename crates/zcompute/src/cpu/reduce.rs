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

use math::{LANES, LEAF};

/// `acc[c] = Σ_j rows[j * stride + c]` for `j` in `0..n`, each column summed exactly as
/// `math::pairwise_sum` sums a row (`acc.len()` columns from the start of each row): the same
/// halving tree, and at a leaf, row `j` added into the column's running sum `j % LANES`, the
/// running sums then added as `math::lanes_total`. Vectorised across the columns.
pub(crate) fn column_sums<T: Element>(rows: &[T], stride: usize, n: usize, acc: &mut [T]) {
    let width = acc.len();
    // One spare row of sums per level of the tree (the upper half's, while the lower half's
    // is in `acc`), and the running sums of a leaf.
    let mut levels = 0;
    let mut len = n;
    while len > LEAF {
        len -= len / 2;
        levels += 1;
    }
    let mut spare = vec![T::ZERO; levels * width];
    let mut lanes = vec![T::ZERO; LANES * width];
    column_tree(rows, stride, n, acc, &mut spare, &mut lanes);
}

fn column_tree<T: Element>(
    rows: &[T],
    stride: usize,
    n: usize,
    acc: &mut [T],
    spare: &mut [T],
    lanes: &mut [T],
) {
    if n <= LEAF {
        column_leaf(rows, stride, n, acc, lanes);
        return;
    }
    let half = n / 2;
    column_tree(rows, stride, half, acc, spare, lanes);
    let (hi, spare) = spare.split_at_mut(acc.len());
    column_tree(&rows[half * stride..], stride, n - half, hi, spare, lanes);
    for (a, &h) in acc.iter_mut().zip(hi.iter()) {
        *a = *a + h;
    }
}

/// One leaf (`n <= LEAF` rows) of [`column_sums`]; `lanes` is scratch of `LANES` rows.
fn column_leaf<T: Element>(rows: &[T], stride: usize, n: usize, acc: &mut [T], lanes: &mut [T]) {
    let width = acc.len();
    lanes.fill(T::ZERO);
    for j in 0..n {
        let lane = &mut lanes[(j % LANES) * width..(j % LANES + 1) * width];
        for (a, &v) in lane.iter_mut().zip(&rows[j * stride..j * stride + width]) {
            *a = *a + v;
        }
    }
    let l: [&[T]; LANES] = std::array::from_fn(|k| &lanes[k * width..(k + 1) * width]);
    for (c, a) in acc.iter_mut().enumerate() {
        *a = math::lanes_total(&std::array::from_fn(|k| l[k][c]));
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
    // Split every outer slice's `inner` columns into blocks; one task per block. A block is
    // a thread's share of the columns (so a 256-wide bias gradient still makes a task per
    // thread), at most what keeps a leaf's running sums in L1 (16 KiB): each task then sweeps
    // the rows once. Each column's sum is the same whatever the block.
    let most = ((16 << 10) / (LANES * size_of::<T>())).max(16);
    let block = inner
        .div_ceil(par::threads())
        .next_multiple_of(16)
        .clamp(16, most);
    let blocks_per = inner.div_ceil(block);
    let results = par::ranges(
        out.len().div_ceil(inner) * blocks_per,
        n * block,
        |start, len| {
            let mut parts = Vec::with_capacity(len);
            for t in start..start + len {
                let (o, blk) = (t / blocks_per, t % blocks_per);
                let c0 = blk * block;
                let width = block.min(inner - c0);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A column's sum is bitwise the sum of the same values as a row (the same tree and the
    /// same running sums at a leaf), for lengths around the leaf and lane sizes.
    #[test]
    fn column_sums_equal_row_sums_bitwise() {
        let width = 37;
        for n in [1, 5, 8, 9, 31, 32, 33, 63, 64, 65, 100, 257, 3072] {
            let rows: Vec<f32> = (0..n * width)
                .map(|i| ((i * 7919) % 1013) as f32 * 0.001 - 0.5)
                .collect();
            let mut acc = vec![0.0f32; width];
            column_sums(&rows, width, n, &mut acc);
            for (c, &got) in acc.iter().enumerate() {
                let column: Vec<f32> = (0..n).map(|j| rows[j * width + c]).collect();
                let want = math::pairwise_sum(&column);
                assert_eq!(got.to_bits(), want.to_bits(), "n {n}, column {c}");
            }
        }
    }
}
