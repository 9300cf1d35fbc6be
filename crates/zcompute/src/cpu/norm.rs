//! Row-wise ops over the last axis: softmax and LayerNorm, rows split over the pool.

use super::common::{dense, gather};
use super::{math, par};
use crate::backend::LayerNormOut;
use crate::element::Element;
use crate::error::Result;
use crate::tensor::CpuTensor;
use crate::validate;

/// Softmax of one row in place, shifted by its maximum.
pub(crate) fn softmax_row<T: Element>(row: &mut [T]) {
    let max = math::row_max(row);
    for v in row.iter_mut() {
        *v = (*v - max).exp();
    }
    let sum = math::pairwise_sum(row);
    for v in row.iter_mut() {
        *v = *v / sum;
    }
}

pub(crate) fn softmax_last<T: Element>(x: &CpuTensor<T>) -> Result<CpuTensor<T>> {
    let validate::Rows { n, .. } = validate::softmax(x)?;
    let mut data = gather(x);
    if n > 0 {
        par::rows_mut(&mut data, n, |_, block| {
            block.chunks_exact_mut(n).for_each(softmax_row);
        });
    }
    dense(data, x.shape())
}

/// LayerNorm of one row in place (two passes: mean, then squared deviations, so no
/// cancellation as in E[x²] - E[x]²); returns `(mean, rstd)`. `centred` is scratch of the
/// row's length.
pub(crate) fn layer_norm_row<T: Element>(
    row: &mut [T],
    w: Option<&[T]>,
    b: Option<&[T]>,
    eps: T,
    centred: &mut [T],
) -> (T, T) {
    let inv_n = T::ONE / T::from_f64(row.len() as f64);
    let mean = math::pairwise_sum(row) * inv_n;
    for (c, &v) in centred.iter_mut().zip(row.iter()) {
        *c = (v - mean) * (v - mean);
    }
    let var = math::pairwise_sum(centred) * inv_n;
    let rstd = T::ONE / (var + eps).sqrt();
    match (w, b) {
        (Some(w), Some(b)) => {
            for ((v, &w), &b) in row.iter_mut().zip(w).zip(b) {
                *v = (*v - mean) * rstd * w + b;
            }
        }
        (Some(w), None) => {
            for (v, &w) in row.iter_mut().zip(w) {
                *v = (*v - mean) * rstd * w;
            }
        }
        (None, Some(b)) => {
            for (v, &b) in row.iter_mut().zip(b) {
                *v = (*v - mean) * rstd + b;
            }
        }
        (None, None) => {
            for v in row.iter_mut() {
                *v = (*v - mean) * rstd;
            }
        }
    }
    (mean, rstd)
}

/// LayerNorm over rows of `n` of `src` into `out` (each row copied, then normalised in place
/// while in cache), the statistics into `means` and `rstds`.
pub(crate) fn layer_norm_rows<T: Element>(
    src: &[T],
    out: &mut [T],
    n: usize,
    w: Option<&[T]>,
    b: Option<&[T]>,
    eps: T,
) -> (Vec<T>, Vec<T>) {
    let rows = out.len() / n.max(1);
    let mut stats = vec![(T::ZERO, T::ZERO); rows];
    par::rows_mut2(out, n, &mut stats, 1, |first, block, st| {
        let mut centred = vec![T::ZERO; n];
        let src = &src[first * n..first * n + block.len()];
        for ((row, s), x) in block.chunks_exact_mut(n).zip(st).zip(src.chunks_exact(n)) {
            row.copy_from_slice(x);
            *s = layer_norm_row(row, w, b, eps, &mut centred);
        }
    });
    stats.into_iter().unzip()
}

/// LayerNorm of the dense rows `xs` of a tensor shaped `shape`, with the (gathered) weight
/// and bias.
pub(crate) fn layer_norm_of<T: Element>(
    xs: &[T],
    shape: &[usize],
    w: Option<&[T]>,
    b: Option<&[T]>,
    eps: T,
) -> Result<LayerNormOut<crate::storage::CpuStorage<T>>> {
    let n = shape.last().copied().unwrap_or(1);
    // Every element is written (each row copied in before it is normalised).
    let mut out = super::pool::overwritten(xs.len());
    let (means, rstds) = layer_norm_rows(xs, &mut out, n, w, b, eps);
    // The statistics keep the rank, the last axis 1 (`validate::stat_shape`).
    let mut stat_shape = shape.to_vec();
    if let Some(last) = stat_shape.last_mut() {
        *last = 1;
    }
    Ok(LayerNormOut {
        out: dense(out, shape)?,
        mean: dense(means, &stat_shape)?,
        rstd: dense(rstds, &stat_shape)?,
    })
}

pub(crate) fn layer_norm<T: Element>(
    x: &CpuTensor<T>,
    weight: Option<&CpuTensor<T>>,
    bias: Option<&CpuTensor<T>>,
    eps: T,
) -> Result<LayerNormOut<crate::storage::CpuStorage<T>>> {
    validate::layer_norm(x, weight, bias, eps)?;
    // Gathered before `x` is read: no second lock of a storage they may share.
    let w = weight.map(gather);
    let b = bias.map(gather);
    super::dense::with(x, |xs| {
        layer_norm_of(xs, x.shape(), w.as_deref(), b.as_deref(), eps)
    })
}
