//! The fusion families' ops (`crate::linear`, `crate::norm`, `crate::pooled_loss`) on the
//! host, f32 and f64: plain loops over logical order with pairwise sums, the reference the CUDA
//! kernels and their twins are checked against. The residual add with LayerNorm reuses the
//! LayerNorm rows of `norm.rs`, so the fused op computes exactly what the unfused pair does.

use super::{dense, gather, math, norm, par};
use crate::backend::UnaryOp;
use crate::element::Element;
use crate::error::Result;
use crate::linear::Activation;
use crate::norm::AddLayerNormOut;
use crate::pooled_loss::{PoolHeadBceGrads, PoolHeadBceOut};
use crate::tensor::CpuTensor;
use crate::validate;

pub(crate) fn bias_act<T: Element>(
    x: &CpuTensor<T>,
    bias: &CpuTensor<T>,
    act: Activation,
) -> Result<CpuTensor<T>> {
    let validate::Rows { n, .. } = validate::bias_act(x, bias)?;
    let mut data = gather(x);
    let b = gather(bias);
    if n > 0 {
        par::rows_mut(&mut data, n, |_, block| {
            for row in block.chunks_exact_mut(n) {
                for (v, &bj) in row.iter_mut().zip(&b) {
                    *v = *v + bj;
                }
                if act == Activation::Tanh {
                    math::unary_in_place(UnaryOp::Tanh, row);
                }
            }
        });
    }
    dense(data, x.shape())
}

pub(crate) fn tanh_backward<T: Element>(
    g: &CpuTensor<T>,
    y: &CpuTensor<T>,
) -> Result<CpuTensor<T>> {
    validate::tanh_backward(g, y)?;
    let mut out = gather(g);
    super::dense::with(y, |ys| {
        par::chunks_mut(&mut out, |start, chunk| {
            for (g, &y) in chunk.iter_mut().zip(&ys[start..]) {
                *g = *g * (T::ONE - y * y);
            }
        });
    });
    dense(out, y.shape())
}

pub(crate) fn add_layer_norm<T: Element>(
    a: &CpuTensor<T>,
    b: &CpuTensor<T>,
    weight: Option<&CpuTensor<T>>,
    bias: Option<&CpuTensor<T>>,
    eps: T,
) -> Result<AddLayerNormOut<crate::storage::CpuStorage<T>>> {
    validate::add_layer_norm(a, b, weight, bias, eps)?;
    let mut sum = gather(a);
    super::dense::with(b, |bs| {
        par::chunks_mut(&mut sum, |start, chunk| {
            for (x, &y) in chunk.iter_mut().zip(&bs[start..]) {
                *x = *x + y;
            }
        });
    });
    let sum = dense(sum, a.shape())?;
    let norm = norm::layer_norm(&sum, weight, bias, eps)?;
    Ok(AddLayerNormOut { sum, norm })
}

/// Per sample of `h` `[B, S, D]`: the mean over S `[B, D]` and the logit `[B]`.
fn pooled_logits<T: Element>(h: &[T], w: &[T], bias: T, s: usize, d: usize) -> (Vec<T>, Vec<T>) {
    let inv_s = T::ONE / T::from_f64(s as f64);
    let mut pooled = Vec::with_capacity(h.len() / s.max(1));
    let mut logits = Vec::new();
    let mut column = vec![T::ZERO; s];
    let mut prods = vec![T::ZERO; d];
    for sample in h.chunks_exact(s * d) {
        for (j, p) in prods.iter_mut().enumerate() {
            for (i, c) in column.iter_mut().enumerate() {
                *c = sample[i * d + j];
            }
            let m = math::pairwise_sum(&column) * inv_s;
            pooled.push(m);
            *p = m * w[j];
        }
        logits.push(math::pairwise_sum(&prods) + bias);
    }
    (pooled, logits)
}

pub(crate) fn pool_head_bce<T: Element>(
    h: &CpuTensor<T>,
    weight: &CpuTensor<T>,
    bias: &CpuTensor<T>,
    targets: &CpuTensor<T>,
) -> Result<PoolHeadBceOut<crate::storage::CpuStorage<T>>> {
    let validate::PoolDims {
        batch,
        scales,
        width,
    } = validate::pool_head_bce(h, weight, bias, targets)?;
    let (_, logits) = pooled_logits(&gather(h), &gather(weight), gather(bias)[0], scales, width);
    let terms: Vec<T> = logits
        .iter()
        .zip(gather(targets))
        .map(|(&x, y)| math::bce_with_logits(x, y))
        .collect();
    let loss = math::pairwise_sum(&terms) / T::from_f64(batch as f64);
    Ok(PoolHeadBceOut {
        loss: CpuTensor::scalar(loss),
        logits: dense(logits, &[batch])?,
    })
}

pub(crate) fn pool_head_bce_backward<T: Element>(
    g: &CpuTensor<T>,
    h: &CpuTensor<T>,
    weight: &CpuTensor<T>,
    logits: &CpuTensor<T>,
    targets: &CpuTensor<T>,
) -> Result<PoolHeadBceGrads<crate::storage::CpuStorage<T>>> {
    let validate::PoolDims {
        batch,
        scales,
        width,
    } = validate::pool_head_bce_backward(g, h, weight, logits, targets)?;
    let scale = gather(g)[0] / T::from_f64(batch as f64);
    let d: Vec<T> = gather(logits)
        .into_iter()
        .zip(gather(targets))
        .map(|(l, y)| (math::sigmoid(l) - y) * scale)
        .collect();
    let w = gather(weight);
    let (pooled, _) = pooled_logits(&gather(h), &w, T::ZERO, scales, width);
    let inv_s = T::ONE / T::from_f64(scales as f64);
    let mut gh = Vec::with_capacity(batch * scales * width);
    for &db in &d {
        for _ in 0..scales {
            gh.extend(w.iter().map(|&wj| db * wj * inv_s));
        }
    }
    let mut column = vec![T::ZERO; batch];
    let mut gw = Vec::with_capacity(width);
    for j in 0..width {
        for (b, c) in column.iter_mut().enumerate() {
            *c = d[b] * pooled[b * width + j];
        }
        gw.push(math::pairwise_sum(&column));
    }
    Ok(PoolHeadBceGrads {
        h: dense(gh, h.shape())?,
        weight: dense(gw, &[1, width])?,
        bias: dense(vec![math::pairwise_sum(&d)], &[1])?,
    })
}
