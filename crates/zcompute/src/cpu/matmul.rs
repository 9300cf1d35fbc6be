//! Batched matrix products. Operands are gathered dense, then each output matrix is one
//! `ndarray::linalg::general_mat_mul` call (matrixmultiply's packed kernels for f32/f64), with
//! transposes expressed as transposed views rather than copies.

use super::{dense, gather};
use crate::backend::MatmulOpts;
use crate::element::Element;
use crate::error::{ComputeError, Result};
use crate::layout::Layout;
use crate::tensor::CpuTensor;
use crate::validate;
use ndarray::{ArrayView2, ArrayViewMut2, linalg::general_mat_mul};

const OP: &str = "matmul";

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
    let da = gather(a);
    let db = gather(b);
    let mut out = vec![T::ZERO; out_len];
    if m * n > 0 {
        // Matrix index of each operand per output batch element: a broadcast view over a
        // contiguous layout of the operand's batch dims (stride 0 where it repeats).
        let ia = Layout::contiguous(a_batch).broadcast_to(&batch)?;
        let ib = Layout::contiguous(b_batch).broadcast_to(&batch)?;
        let (sa, sb) = (m * k, k * n);
        for ((ma, mb), c) in ia
            .offsets()
            .zip(ib.offsets())
            .zip(out.chunks_exact_mut(m * n))
        {
            let av = view(&da[ma * sa..(ma + 1) * sa], ar, ac, opts.trans_a)?;
            let bv = view(&db[mb * sb..(mb + 1) * sb], br, bc, opts.trans_b)?;
            let mut cv =
                ArrayViewMut2::from_shape((m, n), c).map_err(|_| length_error(m * n, out_len))?;
            general_mat_mul(T::ONE, &av, &bv, T::ZERO, &mut cv);
        }
    }
    dense(out, &out_shape)
}
