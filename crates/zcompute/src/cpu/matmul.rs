//! Batched matrix products. Each output matrix is computed by `ndarray::linalg::general_mat_mul`
//! (matrixmultiply's packed AVX2/FMA kernels for f32 and f64, chosen at run time), with
//! transposes expressed as transposed views rather than copies, and operands read in place
//! when dense.
//!
//! Threads: a large product is split into blocks of output rows or of output columns (the side
//! whose blocks share the smaller operand, as every block packs all of it; columns when the
//! rows are few, as in one sample's product), one single-threaded product per block on the
//! backend's team of threads (`par::drain`). Every output element is then the same sum in the same order
//! (matrixmultiply's `k` blocking does not depend on where a block starts), so the result is
//! bitwise the same for any thread count.

use super::{dense, par};
use crate::backend::MatmulOpts;
use crate::element::Element;
use crate::error::{ComputeError, Result};
use crate::layout::Layout;
use crate::tensor::CpuTensor;
use crate::validate;
use ndarray::{ArrayView2, ArrayViewMut2, Axis, linalg::general_mat_mul, s};

const OP: &str = "matmul";

/// Below this many multiply-adds a product runs on the calling thread.
const MIN_PARALLEL_MACS: usize = 1 << 18;
/// Row (or column) blocks are whole multiples of this: the kernels' tile edge, so only the last
/// block has a partial tile.
const TILE: usize = 16;

fn length_error(expected: usize, got: usize) -> ComputeError {
    ComputeError::LengthMismatch {
        op: OP,
        expected,
        got,
    }
}

/// A row-major `rows x cols` view of `data`, transposed if `trans`.
fn view<T: Element>(
    data: &[T],
    rows: usize,
    cols: usize,
    trans: bool,
) -> Result<ArrayView2<'_, T>> {
    let v = ArrayView2::from_shape((rows, cols), data)
        .map_err(|_| length_error(rows * cols, data.len()))?;
    Ok(if trans { v.reversed_axes() } else { v })
}

/// How many blocks of `len` (rows or columns) to cut for `threads`, each at least `TILE * 2`.
fn blocks(len: usize, threads: usize) -> usize {
    (len / (2 * TILE)).clamp(1, threads)
}

/// `c = a · b + beta * c`, split over the pool's threads when large (see the module docs).
pub(crate) fn product<T: Element>(
    a: &ArrayView2<'_, T>,
    b: &ArrayView2<'_, T>,
    beta: T,
    c: &mut ArrayViewMut2<'_, T>,
) {
    let (m, k) = a.dim();
    let n = b.dim().1;
    let threads = par::threads();
    if threads < 2 || m * n * k < MIN_PARALLEL_MACS {
        general_mat_mul(T::ONE, a, b, beta, c);
        return;
    }
    // Each block packs the whole of the operand it shares with the others (`b`, `k x n`, for
    // blocks of rows; `a`, `m x k`, for blocks of columns): split the side that shares the
    // smaller operand, when it gives every thread a block (so a weight gradient `gᵀ·x` of
    // 256 x 3072 x 1024 is split by columns and packs `gᵀ` twice, not the 3072 x 1024 `x`).
    let (rows, cols) = (blocks(m, threads), blocks(n, threads));
    let by_rows = if rows == cols { n <= m } else { rows > cols };
    let (axis, len) = if by_rows { (Axis(0), m) } else { (Axis(1), n) };
    let parts = blocks(len, threads);
    if parts < 2 {
        general_mat_mul(T::ONE, a, b, beta, c);
        return;
    }
    let per = len.div_ceil(parts).div_ceil(TILE) * TILE;
    let pieces: Vec<(usize, ArrayViewMut2<'_, T>)> = c
        .axis_chunks_iter_mut(axis, per)
        .enumerate()
        .map(|(i, piece)| (i * per, piece))
        .collect();
    par::drain(pieces.into_iter(), |(start, mut piece)| {
        let len = piece.len_of(axis);
        if axis == Axis(0) {
            let rows = a.slice(s![start..start + len, ..]);
            general_mat_mul(T::ONE, &rows, b, beta, &mut piece);
        } else {
            let cols = b.slice(s![.., start..start + len]);
            general_mat_mul(T::ONE, a, &cols, beta, &mut piece);
        }
    });
}

pub(super) fn matmul<T: Element>(
    a: &CpuTensor<T>,
    b: &CpuTensor<T>,
    opts: MatmulOpts,
) -> Result<CpuTensor<T>> {
    let validate::MatmulShape {
        batch,
        m,
        k,
        n,
        out: out_shape,
    } = validate::matmul(a, b, opts)?;
    let (a_batch, ar, ac) = validate::split_matrix(a)?;
    let (b_batch, br, bc) = validate::split_matrix(b)?;
    let out_len = out_shape.iter().product();

    tracing::trace!(?batch, m, k, n, ?opts, "cpu matmul");
    // Every element is written (matrixmultiply with beta = 0 never reads C).
    let mut out = super::pool::overwritten(out_len);
    if m * n > 0 {
        // Matrix index of each operand per output batch element: a broadcast view over a
        // contiguous layout of the operand's batch dims (stride 0 where it repeats).
        let ia = Layout::contiguous(a_batch).broadcast_to(&batch)?;
        let ib = Layout::contiguous(b_batch).broadcast_to(&batch)?;
        let (sa, sb) = (m * k, k * n);
        super::dense::with2(a, b, |da, db| -> Result<()> {
            for ((ma, mb), c) in ia
                .offsets()
                .zip(ib.offsets())
                .zip(out.chunks_exact_mut(m * n))
            {
                let av = view(&da[ma * sa..(ma + 1) * sa], ar, ac, opts.trans_a)?;
                let bv = view(&db[mb * sb..(mb + 1) * sb], br, bc, opts.trans_b)?;
                let mut cv = ArrayViewMut2::from_shape((m, n), c)
                    .map_err(|_| length_error(m * n, out_len))?;
                product(&av, &bv, T::ZERO, &mut cv);
            }
            Ok(())
        })?;
    }
    dense(out, &out_shape)
}
