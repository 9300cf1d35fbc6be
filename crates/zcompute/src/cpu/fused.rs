//! The fusion families' ops (`crate::linear`, `crate::norm`, `crate::pooled_loss`) on the
//! host, f32 and f64: plain loops over logical order with pairwise sums, the reference the CUDA
//! kernels and their twins are checked against. The residual add with LayerNorm reuses the
//! LayerNorm rows of `norm.rs`, so the fused op computes exactly what the unfused pair does.

use super::{dense, gather, math, norm, par, reduce};
use crate::backend::{MatmulOpts, UnaryOp};
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
    // Every element is written below (one pass: x read, the sum and activation written).
    let mut out = super::pool::overwritten(x.numel());
    let b = gather(bias);
    if n > 0 {
        super::dense::with(x, |xs| {
            par::rows_mut(&mut out, n, |first, block| {
                let src = &xs[first * n..first * n + block.len()];
                for (row, xr) in block.chunks_exact_mut(n).zip(src.chunks_exact(n)) {
                    for ((v, &x), &bj) in row.iter_mut().zip(xr).zip(&b) {
                        *v = x + bj;
                    }
                    if act == Activation::Tanh {
                        math::unary_in_place(UnaryOp::Tanh, row);
                    }
                }
            });
        });
    }
    dense(out, x.shape())
}

/// A Linear layer, `act(x · wᵀ + bias)`, plus `residual` when given: the product into a fresh
/// buffer, then the epilogue in place, one pass over the rows. The same arithmetic in the same
/// order as the product, [`bias_act`] and the add one after the other (so the same bits),
/// without the two further output buffers and passes.
pub(crate) fn linear<T: Element>(
    x: &CpuTensor<T>,
    w: &CpuTensor<T>,
    bias: &CpuTensor<T>,
    act: Activation,
    residual: Option<&CpuTensor<T>>,
) -> Result<CpuTensor<T>> {
    let shape = match residual {
        Some(r) => validate::linear_add(x, w, bias, r)?,
        None => validate::linear(x, w, bias)?,
    };
    let opts = MatmulOpts {
        trans_a: false,
        trans_b: true,
    };
    let y = super::matmul::matmul(x, w, opts)?;
    let n = shape.outputs;
    if n == 0 || shape.rows == 0 {
        return Ok(y);
    }
    let b = gather(bias);
    let epilogue = |rs: &[T]| {
        // `y` is the product's own dense buffer, shared with no one yet.
        let mut data = y.storage().write();
        par::rows_mut(&mut data[..], n, |first, block| {
            let res = rs.get(first * n..first * n + block.len());
            for (i, row) in block.chunks_exact_mut(n).enumerate() {
                for (v, &bj) in row.iter_mut().zip(&b) {
                    *v = *v + bj;
                }
                if act == Activation::Tanh {
                    math::unary_in_place(UnaryOp::Tanh, row);
                }
                if let Some(res) = res {
                    for (v, &r) in row.iter_mut().zip(&res[i * n..(i + 1) * n]) {
                        *v = *v + r;
                    }
                }
            }
        });
    };
    match residual {
        Some(r) => dense::with(r, epilogue),
        None => epilogue(&[]),
    }
    Ok(y)
}

pub(crate) fn tanh_backward<T: Element>(
    g: &CpuTensor<T>,
    y: &CpuTensor<T>,
) -> Result<CpuTensor<T>> {
    validate::tanh_backward(g, y)?;
    let mut out = super::pool::overwritten(y.numel());
    super::dense::with2(g, y, |gs, ys| {
        par::chunks_mut(&mut out, |start, chunk| {
            let (gs, ys) = (&gs[start..], &ys[start..]);
            for ((o, &g), &y) in chunk.iter_mut().zip(gs).zip(ys) {
                *o = g * (T::ONE - y * y);
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
    let mut sum = super::pool::overwritten(a.numel());
    super::dense::with2(a, b, |xs, ys| {
        par::chunks_mut(&mut sum, |start, chunk| {
            for ((o, &x), &y) in chunk.iter_mut().zip(&xs[start..]).zip(&ys[start..]) {
                *o = x + y;
            }
        });
    });
    // The sum's LayerNorm as `norm::layer_norm` computes it, read from the buffer in hand.
    let (w, b) = (weight.map(gather), bias.map(gather));
    let norm = norm::layer_norm_of(&sum, a.shape(), w.as_deref(), b.as_deref(), eps)?;
    Ok(AddLayerNormOut {
        sum: dense(sum, a.shape())?,
        norm,
    })
}

/// Per sample of `h` `[B, S, D]`: the mean over S `[B, D]` and the logit `[B]`; samples split
/// over the pool.
fn pooled_logits<T: Element>(h: &[T], w: &[T], bias: T, s: usize, d: usize) -> (Vec<T>, Vec<T>) {
    let inv_s = T::ONE / T::from_f64(s as f64);
    let per = s * d;
    let samples = h.len().checked_div(per).unwrap_or(0);
    let parts = par::ranges(samples, per, |first, count| {
        let mut pooled = vec![T::ZERO; count * d];
        let mut logits = Vec::with_capacity(count);
        let mut prods = vec![T::ZERO; d];
        let samples = h[first * per..(first + count) * per].chunks_exact(per);
        for (sample, mean) in samples.zip(pooled.chunks_exact_mut(d)) {
            // Each column's sum is bitwise `pairwise_sum` of the column, vectorised across
            // the columns.
            reduce::column_sums(sample, d, s, mean);
            for ((m, p), &wj) in mean.iter_mut().zip(&mut prods).zip(w) {
                *m = *m * inv_s;
                *p = *m * wj;
            }
            logits.push(math::pairwise_sum(&prods) + bias);
        }
        (pooled, logits)
    });
    let mut pooled = Vec::with_capacity(samples * d);
    let mut logits = Vec::with_capacity(samples);
    for (p, l) in parts {
        pooled.extend(p);
        logits.extend(l);
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
    let (w, bias) = (gather(weight), gather(bias)[0]);
    // `h` read in place (a large activation; `gather` would copy it).
    let (_, logits) = dense::with(h, |hs| pooled_logits(hs, &w, bias, scales, width));
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
    let (pooled, _) = dense::with(h, |hs| pooled_logits(hs, &w, T::ZERO, scales, width));
    let inv_s = T::ONE / T::from_f64(scales as f64);
    // Every element is written: sample b's rows are all `d_b * w * inv_s`.
    let per = scales * width;
    let mut gh = super::pool::overwritten(batch * per);
    if width > 0 {
        par::rows_mut(&mut gh, per, |first, block| {
            for (sample, &db) in block.chunks_exact_mut(per).zip(&d[first..]) {
                for row in sample.chunks_exact_mut(width) {
                    for (o, &wj) in row.iter_mut().zip(&w) {
                        *o = db * wj * inv_s;
                    }
                }
            }
        });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend;
    use crate::cpu::{CpuBackend, with_threads};

    fn t<T: Element>(shape: &[usize], seed: usize) -> CpuTensor<T> {
        let n = shape.iter().product();
        let v = (0..n)
            .map(|i| T::from_f64(((i * 7919 + seed * 104_729) % 2003) as f64 / 1001.0 - 1.0))
            .collect();
        CpuTensor::from_vec(v, shape).unwrap()
    }

    /// The in-place epilogue gives the bits of the product, `bias_act` and the add run one
    /// after the other (the provided composites), split or not.
    fn linear_equals_its_composite<T: Element>() {
        // 300 x 130 outputs: above MIN_PARALLEL, so the product and the epilogue both split.
        let (x, w, b, r) = (
            t::<T>(&[300, 70], 1),
            t::<T>(&[130, 70], 2),
            t::<T>(&[130], 3),
            t::<T>(&[300, 130], 4),
        );
        let bits = |v: CpuTensor<T>| v.to_vec().iter().map(|x| x.to_f64().to_bits()).collect();
        for threads in [1, 2, 3] {
            with_threads(threads, || {
                for act in [Activation::Identity, Activation::Tanh] {
                    let plain = crate::linear::linear(&CpuBackend, &x, &w, &b, act).unwrap();
                    let added = CpuBackend.add(&plain, &r).unwrap();
                    let got: Vec<u64> = bits(linear(&x, &w, &b, act, None).unwrap());
                    assert_eq!(got, bits(plain), "{act:?} at {threads} threads");
                    let got: Vec<u64> = bits(linear(&x, &w, &b, act, Some(&r)).unwrap());
                    assert_eq!(got, bits(added), "{act:?} + residual at {threads}");
                }
            })
            .unwrap();
        }
    }

    #[test]
    fn linear_equals_its_composite_f32() {
        linear_equals_its_composite::<f32>();
    }

    #[test]
    fn linear_equals_its_composite_f64() {
        linear_equals_its_composite::<f64>();
    }

    #[test]
    fn linear_refuses_a_residual_of_another_shape() {
        let (x, w, b) = (
            t::<f32>(&[4, 3], 1),
            t::<f32>(&[5, 3], 2),
            t::<f32>(&[5], 3),
        );
        let r = t::<f32>(&[4, 4], 4);
        assert!(linear(&x, &w, &b, Activation::Identity, Some(&r)).is_err());
    }
}
