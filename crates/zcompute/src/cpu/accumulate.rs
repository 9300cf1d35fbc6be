//! The CPU backend's own bodies for the provided ops that accumulate into a buffer
//! (`add_into`, `matmul_into`, `sum_rows_into`) and for the row-wise backward ops
//! (`layer_norm_backward(_add)`, `softmax_backward`): the same formulas as the provided
//! composites, element by element, in one pass over the rows instead of one op (and one fresh
//! tensor) per term. Each gives the composite's bits, except `matmul_into`, which adds the
//! product into `dst` block by block of `k` (matrixmultiply's `beta = 1`) where the composite
//! adds the finished product once: a difference of rounding only.

use super::common::{dense, gather};
use super::dense::{with, with2};
use super::matmul::product;
use super::{math, par, reduce};
use crate::backend::{LayerNormBackward, LayerNormGrads, MatmulOpts, ReduceOp};
use crate::element::Element;
use crate::error::Result;
use crate::storage::CpuStorage;
use crate::tensor::CpuTensor;
use crate::validate;
use ndarray::{ArrayView2, ArrayViewMut2};

/// `dst[i] = dst[i] + values[i]` through the (writable, validated) view `dst`.
fn add_values<T: Element>(values: &[T], dst: &CpuTensor<T>) {
    let mut data = dst.storage().write();
    if dst.is_contiguous() {
        let start = dst.layout().offset();
        let d = &mut data[start..start + dst.numel()];
        par::chunks_mut(d, |first, chunk| {
            for (d, &v) in chunk.iter_mut().zip(&values[first..]) {
                *d = *d + v;
            }
        });
    } else {
        for (o, &v) in dst.layout().offsets().zip(values) {
            data[o] = data[o] + v;
        }
    }
}

pub(crate) fn add_into<T: Element>(src: &CpuTensor<T>, dst: &CpuTensor<T>) -> Result<()> {
    validate::add_into(src, dst)?;
    with(src, |s| add_values(s, dst));
    Ok(())
}

pub(crate) fn sum_rows_into<T: Element>(x: &CpuTensor<T>, dst: &CpuTensor<T>) -> Result<()> {
    let validate::Rows { rows, n } = validate::sum_rows_into(x, dst)?;
    let mut sums = vec![T::ZERO; n];
    with(x, |xs| {
        reduce::reduce_dense(ReduceOp::Sum, xs, rows, n, &mut sums)
    });
    add_values(&sums, dst);
    Ok(())
}

pub(crate) fn matmul_into<T: Element>(
    a: &CpuTensor<T>,
    b: &CpuTensor<T>,
    opts: MatmulOpts,
    dst: &CpuTensor<T>,
) -> Result<()> {
    let shape = validate::matmul_into(a, b, opts, dst)?;
    let (m, k, n) = (shape.m, shape.k, shape.n);
    let one_matrix = shape.batch.iter().product::<usize>() == 1;
    if !(one_matrix && dst.is_contiguous() && a.rank() == 2 && b.rank() == 2) {
        let p = super::matmul::matmul(a, b, opts)?;
        return add_into(&p, dst);
    }
    if m * n == 0 {
        return Ok(());
    }
    with2(a, b, |da, db| {
        let av = ArrayView2::from_shape((a.shape()[0], a.shape()[1]), da);
        let bv = ArrayView2::from_shape((b.shape()[0], b.shape()[1]), db);
        let mut data = dst.storage().write();
        let start = dst.layout().offset();
        let cv = ArrayViewMut2::from_shape((m, n), &mut data[start..start + m * n]);
        if let (Ok(av), Ok(bv), Ok(mut cv)) = (av, bv, cv) {
            let av = if opts.trans_a { av.reversed_axes() } else { av };
            let bv = if opts.trans_b { bv.reversed_axes() } else { bv };
            debug_assert_eq!((av.dim(), bv.dim()), ((m, k), (k, n)));
            product(&av, &bv, T::ONE, &mut cv);
        }
    });
    Ok(())
}

/// LayerNorm's backward per row: the weight, which outputs are wanted (input gradient,
/// `g * xhat`), the row length.
struct LnBackward<'a, T> {
    w: Option<&'a [T]>,
    want: [bool; 2],
    n: usize,
}

impl<T: Element> LnBackward<'_, T> {
    /// One row: `dx` (when wanted) `((g·w - mean(g·w)) - xhat·mean(g·w·xhat))·rstd (+ res)`
    /// and `gx` (when wanted) `g·xhat`, `xhat = (x - mean)·rstd`, as the composite computes.
    #[allow(clippy::too_many_arguments)]
    fn row(
        &self,
        g: &[T],
        x: &[T],
        mean: T,
        rstd: T,
        res: Option<&[T]>,
        dx: &mut [T],
        gx: &mut [T],
        tmp: &mut [T],
    ) {
        let n_t = T::from_f64(self.n as f64);
        let xhat = |j: usize| (x[j] - mean) * rstd;
        if self.want[1] {
            for (j, o) in gx.iter_mut().enumerate() {
                *o = g[j] * xhat(j);
            }
        }
        if !self.want[0] {
            return;
        }
        // tmp = g·w (gxhat), dx = gxhat·xhat, for their means.
        match self.w {
            Some(w) => tmp
                .iter_mut()
                .zip(g)
                .zip(w)
                .for_each(|((t, &g), &w)| *t = g * w),
            None => tmp.copy_from_slice(g),
        }
        for (j, o) in dx.iter_mut().enumerate() {
            *o = tmp[j] * xhat(j);
        }
        let m1 = math::pairwise_sum(tmp) / n_t;
        let m2 = math::pairwise_sum(dx) / n_t;
        for (j, o) in dx.iter_mut().enumerate() {
            let v = ((tmp[j] - m1) - xhat(j) * m2) * rstd;
            *o = match res {
                Some(r) => v + r[j],
                None => v,
            };
        }
    }
}

/// LayerNorm's backward (`NormOps::layer_norm_backward_add`'s formula; `residual` added to
/// the input gradient when given), validated by the caller.
fn ln_backward<T: Element>(
    ln: &LayerNormBackward<'_, CpuStorage<T>>,
    want: [bool; 2],
) -> Result<LayerNormGrads<CpuStorage<T>>> {
    let LayerNormBackward {
        g,
        residual,
        x,
        mean,
        rstd,
        weight,
    } = *ln;
    let n = x.shape().last().copied().unwrap_or(1);
    let (mv, rv) = (mean.to_vec(), rstd.to_vec());
    let w = weight.map(CpuTensor::to_vec);
    let res = residual.map(gather);
    let spec = LnBackward {
        w: w.as_deref(),
        want,
        n,
    };
    // Every wanted element is written by `LnBackward::row`.
    let mut dx = super::pool::overwritten(if want[0] { x.numel() } else { 0 });
    let mut gx = super::pool::overwritten(if want[1] { x.numel() } else { 0 });
    // A row of `v`, or nothing when `v` is not computed.
    fn row_of<T>(v: &mut [T], r: usize, n: usize) -> &mut [T] {
        if v.is_empty() {
            v
        } else {
            &mut v[r * n..(r + 1) * n]
        }
    }
    with2(g, x, |gv, xv| {
        // Rows from `first` of whichever outputs are wanted (the other empty).
        let rows = |first: usize, d: &mut [T], q: &mut [T]| {
            let count = d.len().max(q.len()) / n.max(1);
            let mut tmp = vec![T::ZERO; n];
            for r in 0..count {
                let at = (first + r) * n..(first + r + 1) * n;
                let res_row = res.as_deref().map(|v| &v[at.clone()]);
                let (m, rs) = (mv[first + r], rv[first + r]);
                let (d, q) = (row_of(d, r, n), row_of(q, r, n));
                spec.row(&gv[at.clone()], &xv[at], m, rs, res_row, d, q, &mut tmp);
            }
        };
        match want {
            [true, true] => par::rows_mut2(&mut dx, n, &mut gx, n, rows),
            [true, false] => par::rows_mut(&mut dx, n, |first, d| rows(first, d, &mut [])),
            [false, true] => par::rows_mut(&mut gx, n, |first, q| rows(first, &mut [], q)),
            [false, false] => {}
        }
    });
    if let Some(r) = res {
        super::pool::give(r);
    }
    Ok(LayerNormGrads {
        input: if want[0] {
            Some(dense(dx, x.shape())?)
        } else {
            None
        },
        g_xhat: if want[1] {
            Some(dense(gx, x.shape())?)
        } else {
            None
        },
    })
}

pub(crate) fn layer_norm_backward<T: Element>(
    g: &CpuTensor<T>,
    x: &CpuTensor<T>,
    mean: &CpuTensor<T>,
    rstd: &CpuTensor<T>,
    weight: Option<&CpuTensor<T>>,
    want: [bool; 2],
) -> Result<LayerNormGrads<CpuStorage<T>>> {
    validate::layer_norm_backward(g, x, mean, rstd, weight)?;
    let ln = LayerNormBackward {
        g,
        residual: None,
        x,
        mean,
        rstd,
        weight,
    };
    ln_backward(&ln, want)
}

pub(crate) fn layer_norm_backward_add<T: Element>(
    ln: &LayerNormBackward<'_, CpuStorage<T>>,
    want: [bool; 2],
) -> Result<LayerNormGrads<CpuStorage<T>>> {
    let LayerNormBackward {
        g,
        residual,
        x,
        mean,
        rstd,
        weight,
    } = *ln;
    validate::layer_norm_backward_add(g, residual, x, mean, rstd, weight)?;
    ln_backward(ln, want)
}

/// `y * (g - sum(g * y))` over the last axis, the composite's terms row by row.
pub(crate) fn softmax_backward<T: Element>(
    g: &CpuTensor<T>,
    y: &CpuTensor<T>,
) -> Result<CpuTensor<T>> {
    validate::softmax_backward(g, y)?;
    let n = y.shape().last().copied().unwrap_or(1);
    let mut out = super::pool::zeroed(y.numel());
    if n > 0 {
        with2(g, y, |gs, ys| {
            par::rows_mut(&mut out, n, |first, block| {
                for (i, o) in block.chunks_exact_mut(n).enumerate() {
                    let at = (first + i) * n..(first + i + 1) * n;
                    let (g, y) = (&gs[at.clone()], &ys[at]);
                    for ((o, &g), &y) in o.iter_mut().zip(g).zip(y) {
                        *o = g * y;
                    }
                    let dot = math::pairwise_sum(o);
                    for ((o, &g), &y) in o.iter_mut().zip(g).zip(y) {
                        *o = y * (g - dot);
                    }
                }
            });
        });
    }
    dense(out, y.shape())
}
