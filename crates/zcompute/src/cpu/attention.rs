//! Attention's core on the host, per (batch, head) as the fused kernels of
//! `kernels/attention.cu` compute it: q and k rows normalised (two-pass statistics), scores
//! `qn·knᵀ/sqrt(dh)`, a max-shifted softmax, `P·v`; the backward recomputes all of that and
//! writes each (batch, head)'s share of the LayerNorm parameter gradients as a row of
//! `[B*H, 4, dh]` partials (q weight, q bias, k weight, k bias), summed afterwards in a fixed
//! order. Written over slices so the kernels' simulated twins run the same code on device
//! memory.

use super::math::{pairwise_sum, row_max};
use super::{dense, gather};
use crate::attention::{QkNorm, QkNormAttentionGrads};
use crate::element::Element;
use crate::error::Result;
use crate::storage::CpuStorage;
use crate::tensor::CpuTensor;
use crate::validate::{self, Attention};

/// The LayerNorm parameters, dense.
pub(crate) struct Params<T> {
    pub(crate) q_weight: Vec<T>,
    pub(crate) q_bias: Vec<T>,
    pub(crate) k_weight: Vec<T>,
    pub(crate) k_bias: Vec<T>,
    pub(crate) eps: T,
}

/// Index of element 0 of row `s`, part `part` (0 q, 1 k, 2 v), head `h` of batch `b` in qkv.
fn at(a: Attention, b: usize, s: usize, part: usize, h: usize) -> usize {
    ((b * a.seq + s) * 3 + part) * a.heads * a.dh + h * a.dh
}

/// `(xhat, rstd)` of one row: `(x - mean) * rstd`, `rstd = 1 / sqrt(var + eps)`.
fn normalise<T: Element>(row: &[T], eps: T) -> (Vec<T>, T) {
    let inv_n = T::ONE / T::from_f64(row.len() as f64);
    let mean = pairwise_sum(row) * inv_n;
    let sq: Vec<T> = row.iter().map(|&v| (v - mean) * (v - mean)).collect();
    let rstd = T::ONE / (pairwise_sum(&sq) * inv_n + eps).sqrt();
    (row.iter().map(|&v| (v - mean) * rstd).collect(), rstd)
}

/// One (batch, head): normalised q and k (before the affine), their rstd, the affine results,
/// v, and the softmax probabilities `[S, S]`.
struct Head<T> {
    qhat: Vec<T>,
    khat: Vec<T>,
    qrstd: Vec<T>,
    krstd: Vec<T>,
    qn: Vec<T>,
    kn: Vec<T>,
    v: Vec<T>,
    probs: Vec<T>,
}

fn head<T: Element>(qkv: &[T], a: Attention, p: &Params<T>, b: usize, h: usize) -> Head<T> {
    let (s_len, dh) = (a.seq, a.dh);
    let mut hd = Head {
        qhat: Vec::with_capacity(s_len * dh),
        khat: Vec::with_capacity(s_len * dh),
        qrstd: Vec::with_capacity(s_len),
        krstd: Vec::with_capacity(s_len),
        qn: Vec::with_capacity(s_len * dh),
        kn: Vec::with_capacity(s_len * dh),
        v: Vec::with_capacity(s_len * dh),
        probs: vec![T::ZERO; s_len * s_len],
    };
    for s in 0..s_len {
        for (part, w, bias) in [(0, &p.q_weight, &p.q_bias), (1, &p.k_weight, &p.k_bias)] {
            let start = at(a, b, s, part, h);
            let (xhat, rstd) = normalise(&qkv[start..start + dh], p.eps);
            let affine = xhat
                .iter()
                .zip(w.iter().zip(bias))
                .map(|(&x, (&w, &c))| x * w + c);
            if part == 0 {
                hd.qn.extend(affine);
                hd.qhat.extend(xhat);
                hd.qrstd.push(rstd);
            } else {
                hd.kn.extend(affine);
                hd.khat.extend(xhat);
                hd.krstd.push(rstd);
            }
        }
        let start = at(a, b, s, 2, h);
        hd.v.extend_from_slice(&qkv[start..start + dh]);
    }
    let scale = a.scale::<T>();
    for (i, row) in hd.probs.chunks_exact_mut(s_len).enumerate() {
        for (j, score) in row.iter_mut().enumerate() {
            *score = dot(&hd.qn[i * dh..(i + 1) * dh], &hd.kn[j * dh..(j + 1) * dh]) * scale;
        }
        let max = row_max(row);
        for x in row.iter_mut() {
            *x = (*x - max).exp();
        }
        let sum = pairwise_sum(row);
        for x in row.iter_mut() {
            *x = *x / sum;
        }
    }
    hd
}

fn dot<T: Element>(a: &[T], b: &[T]) -> T {
    a.iter().zip(b).fold(T::ZERO, |acc, (&x, &y)| acc + x * y)
}

/// The forward over dense `qkv`: `[B, S, D]`.
pub(crate) fn forward_slices<T: Element>(qkv: &[T], a: Attention, p: &Params<T>) -> Vec<T> {
    let (s_len, dh, width) = (a.seq, a.dh, a.heads * a.dh);
    let mut out = vec![T::ZERO; a.batch * s_len * width];
    for b in 0..a.batch {
        for h in 0..a.heads {
            let hd = head(qkv, a, p, b, h);
            for i in 0..s_len {
                for d in 0..dh {
                    let acc = (0..s_len).fold(T::ZERO, |acc, j| {
                        acc + hd.probs[i * s_len + j] * hd.v[j * dh + d]
                    });
                    out[(b * s_len + i) * width + h * dh + d] = acc;
                }
            }
        }
    }
    out
}

/// The backward over dense `g` and `qkv`: the gradient of `qkv` and the `[4, B*H, dh]`
/// parameter partials (parameter-major, as the device kernel writes them).
pub(crate) fn backward_slices<T: Element>(
    g: &[T],
    qkv: &[T],
    a: Attention,
    p: &Params<T>,
) -> (Vec<T>, Vec<T>) {
    let (s_len, dh, width) = (a.seq, a.dh, a.heads * a.dh);
    let mut g_qkv = vec![T::ZERO; qkv.len()];
    let rows = a.batch * a.heads;
    let mut partials = vec![T::ZERO; 4 * rows * dh];
    let scale = a.scale::<T>();
    for b in 0..a.batch {
        for h in 0..a.heads {
            let hd = head(qkv, a, p, b, h);
            let go: Vec<T> = (0..s_len)
                .flat_map(|i| {
                    let start = (b * s_len + i) * width + h * dh;
                    g[start..start + dh].iter().copied()
                })
                .collect();
            // dv = Pᵀ·go, dP = go·vᵀ, dS = P * (dP - rowsum(P * dP)) * scale.
            for j in 0..s_len {
                for d in 0..dh {
                    let acc = (0..s_len).fold(T::ZERO, |acc, i| {
                        acc + hd.probs[i * s_len + j] * go[i * dh + d]
                    });
                    g_qkv[at(a, b, j, 2, h) + d] = acc;
                }
            }
            let mut ds = vec![T::ZERO; s_len * s_len];
            for i in 0..s_len {
                let prow = &hd.probs[i * s_len..(i + 1) * s_len];
                let dp: Vec<T> = (0..s_len)
                    .map(|j| dot(&go[i * dh..(i + 1) * dh], &hd.v[j * dh..(j + 1) * dh]))
                    .collect();
                let row_dot = dot(prow, &dp);
                for j in 0..s_len {
                    ds[i * s_len + j] = prow[j] * (dp[j] - row_dot) * scale;
                }
            }
            // dqn = dS·kn, dkn = dSᵀ·qn.
            let mut dqn = vec![T::ZERO; s_len * dh];
            let mut dkn = vec![T::ZERO; s_len * dh];
            for i in 0..s_len {
                for d in 0..dh {
                    dqn[i * dh + d] = (0..s_len).fold(T::ZERO, |acc, j| {
                        acc + ds[i * s_len + j] * hd.kn[j * dh + d]
                    });
                    dkn[i * dh + d] = (0..s_len).fold(T::ZERO, |acc, j| {
                        acc + ds[j * s_len + i] * hd.qn[j * dh + d]
                    });
                }
            }
            let row = b * a.heads + h;
            let sides = [
                (0, &dqn, &hd.qhat, &hd.qrstd, &p.q_weight),
                (1, &dkn, &hd.khat, &hd.krstd, &p.k_weight),
            ];
            for (side, dn, xhat, rstd, w) in sides {
                for d in 0..dh {
                    let (mut gw, mut gb) = (T::ZERO, T::ZERO);
                    for i in 0..s_len {
                        gw = gw + dn[i * dh + d] * xhat[i * dh + d];
                        gb = gb + dn[i * dh + d];
                    }
                    partials[((2 * side) * rows + row) * dh + d] = gw;
                    partials[((2 * side + 1) * rows + row) * dh + d] = gb;
                }
                // LayerNorm's input gradient: rstd * (gx - mean(gx) - xhat * mean(gx * xhat)).
                let inv_n = T::ONE / T::from_f64(dh as f64);
                for i in 0..s_len {
                    let xh = &xhat[i * dh..(i + 1) * dh];
                    let gx: Vec<T> = (0..dh).map(|d| dn[i * dh + d] * w[d]).collect();
                    let m1 = pairwise_sum(&gx) * inv_n;
                    let gxx: Vec<T> = gx.iter().zip(xh).map(|(&u, &x)| u * x).collect();
                    let m2 = pairwise_sum(&gxx) * inv_n;
                    let start = at(a, b, i, side, h);
                    for d in 0..dh {
                        g_qkv[start + d] = rstd[i] * (gx[d] - m1 - xh[d] * m2);
                    }
                }
            }
        }
    }
    (g_qkv, partials)
}

/// Sums `[4, rows, dh]` partials over rows in order: `[q_weight, q_bias, k_weight, k_bias]`.
pub(crate) fn sum_partials<T: Element>(partials: &[T], dh: usize) -> [Vec<T>; 4] {
    let mut sums: [Vec<T>; 4] = std::array::from_fn(|_| vec![T::ZERO; dh]);
    let per_param = partials.len() / 4;
    for (k, sum) in sums.iter_mut().enumerate() {
        for row in partials[k * per_param..(k + 1) * per_param].chunks_exact(dh.max(1)) {
            for (s, &v) in sum.iter_mut().zip(row) {
                *s = *s + v;
            }
        }
    }
    sums
}

fn params<T: Element>(norm: &QkNorm<'_, CpuStorage<T>>) -> Params<T> {
    Params {
        q_weight: gather(norm.q_weight),
        q_bias: gather(norm.q_bias),
        k_weight: gather(norm.k_weight),
        k_bias: gather(norm.k_bias),
        eps: norm.eps,
    }
}

pub(crate) fn forward<T: Element>(
    qkv: &CpuTensor<T>,
    norm: &QkNorm<'_, CpuStorage<T>>,
) -> Result<CpuTensor<T>> {
    let a = validate::qk_norm_attention(qkv, norm)?;
    let out = forward_slices(&gather(qkv), a, &params(norm));
    dense(out, &[a.batch, a.seq, a.heads * a.dh])
}

pub(crate) fn backward<T: Element>(
    g: &CpuTensor<T>,
    qkv: &CpuTensor<T>,
    norm: &QkNorm<'_, CpuStorage<T>>,
) -> Result<QkNormAttentionGrads<CpuStorage<T>>> {
    let a = validate::qk_norm_attention_backward(g, qkv, norm)?;
    let (g_qkv, partials) = backward_slices(&gather(g), &gather(qkv), a, &params(norm));
    let [qw, qb, kw, kb] = sum_partials(&partials, a.dh);
    Ok(QkNormAttentionGrads {
        qkv: dense(g_qkv, qkv.shape())?,
        q_weight: dense(qw, &[a.dh])?,
        q_bias: dense(qb, &[a.dh])?,
        k_weight: dense(kw, &[a.dh])?,
        k_bias: dense(kb, &[a.dh])?,
    })
}
