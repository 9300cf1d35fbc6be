//! Row-wise ops over the last axis: softmax and LayerNorm.

use super::{dense, gather, math};
use crate::backend::LayerNormOut;
use crate::element::Element;
use crate::error::Result;
use crate::tensor::CpuTensor;
use crate::validate;

pub(crate) fn softmax_last<T: Element>(x: &CpuTensor<T>) -> Result<CpuTensor<T>> {
    let validate::Rows { n, .. } = validate::softmax(x)?;
    let mut data = gather(x);
    if n > 0 {
        for row in data.chunks_exact_mut(n) {
            let max = math::row_max(row);
            for v in row.iter_mut() {
                *v = (*v - max).exp();
            }
            let sum = math::pairwise_sum(row);
            for v in row.iter_mut() {
                *v = *v / sum;
            }
        }
    }
    dense(data, x.shape())
}

pub(crate) fn layer_norm<T: Element>(
    x: &CpuTensor<T>,
    weight: Option<&CpuTensor<T>>,
    bias: Option<&CpuTensor<T>>,
    eps: T,
) -> Result<LayerNormOut<crate::storage::CpuStorage<T>>> {
    let validate::Rows { n, .. } = validate::layer_norm(x, weight, bias, eps)?;
    let w = weight.map(gather);
    let b = bias.map(gather);

    let mut data = gather(x);
    let rows = data.len() / n;
    let mut means = Vec::with_capacity(rows);
    let mut rstds = Vec::with_capacity(rows);
    let inv_n = T::ONE / T::from_f64(n as f64);
    let mut centred = vec![T::ZERO; n];
    for row in data.chunks_exact_mut(n) {
        // Two passes (mean, then squared deviations): no cancellation, unlike E[x²] - E[x]².
        let mean = math::pairwise_sum(row) * inv_n;
        for (c, &v) in centred.iter_mut().zip(row.iter()) {
            *c = (v - mean) * (v - mean);
        }
        let var = math::pairwise_sum(&centred) * inv_n;
        let rstd = T::ONE / (var + eps).sqrt();
        for (j, v) in row.iter_mut().enumerate() {
            let mut y = (*v - mean) * rstd;
            if let Some(w) = &w {
                y = y * w[j];
            }
            if let Some(b) = &b {
                y = y + b[j];
            }
            *v = y;
        }
        means.push(mean);
        rstds.push(rstd);
    }
    let stat_shape = validate::stat_shape(x);
    Ok(LayerNormOut {
        out: dense(data, x.shape())?,
        mean: dense(means, &stat_shape)?,
        rstd: dense(rstds, &stat_shape)?,
    })
}
