//! Key-padding attention on the host (`AttentionOps::key_padding_attention`), one query row at
//! a time as `kernels/attention.cu`'s `zc_key_padding_attention*` kernels compute it: the
//! scaled scores of the kept keys (each dot product in index order), their max, `e = exp(s -
//! max)`, `p = e · (1 / Σe)` (the sum in key order), `Σ p·v` in key order. The backward runs
//! the kernels' two passes: per query row `dS = P·(dP - Σ P·dP)·scale` and dq summed over keys,
//! leaving the row's stats; per key row `P` and `dS` recomputed from them and dk, dv summed over
//! queries, each sum in index order (no atomics: two runs give the same bits). Written over
//! slices so the kernels' simulated twins run the same code on device memory.

use super::{dense, gather};
use crate::attention::KeyPaddingAttentionGrads;
use crate::element::Element;
use crate::error::Result;
use crate::storage::CpuStorage;
use crate::tensor::CpuTensor;
use crate::validate::{self, KeyPadding};

/// The operands, dense: `q [B, Sq, dk]`, `k [B, Sk, dk]`, `v [B, Sk, dv]`, the mask `[B, Sk]`.
pub(crate) struct Operands<'a, T> {
    pub(crate) q: &'a [T],
    pub(crate) k: &'a [T],
    pub(crate) v: &'a [T],
    pub(crate) keep: Option<&'a [T]>,
    pub(crate) scale: T,
}

impl<T: Element> Operands<'_, T> {
    /// Key `j` of batch `b` is attended to (a mask value other than 0, or no mask).
    fn kept(&self, a: KeyPadding, b: usize, j: usize) -> bool {
        self.keep.is_none_or(|m| m[b * a.k_len + j] != T::ZERO)
    }
}

fn dot<T: Element>(x: &[T], y: &[T]) -> T {
    x.iter().zip(y).fold(T::ZERO, |acc, (&a, &b)| acc + a * b)
}

/// Row `i` of batch `b`'s probabilities into `p` (`Sk`; 0 at padded keys, all 0 when every key
/// is padding); returns the row's max score and `1 / Σe` (both 0 when every key is padding).
fn row_probs<T: Element>(
    o: &Operands<'_, T>,
    a: KeyPadding,
    b: usize,
    i: usize,
    p: &mut [T],
) -> (T, T) {
    let qi = &o.q[(b * a.q_len + i) * a.dk..][..a.dk];
    let mut max = None::<T>;
    for (j, pj) in p.iter_mut().enumerate() {
        *pj = T::ZERO;
        if o.kept(a, b, j) {
            let kj = &o.k[(b * a.k_len + j) * a.dk..][..a.dk];
            *pj = o.scale * dot(qi, kj);
            max = Some(max.map_or(*pj, |m| if *pj > m { *pj } else { m }));
        }
    }
    let Some(max) = max else {
        return (T::ZERO, T::ZERO);
    };
    let mut sum = T::ZERO;
    for (j, &s) in p.iter().enumerate() {
        if o.kept(a, b, j) {
            sum = sum + (s - max).exp();
        }
    }
    let inv = T::ONE / sum;
    for (j, pj) in p.iter_mut().enumerate() {
        if o.kept(a, b, j) {
            *pj = (*pj - max).exp() * inv;
        }
    }
    (max, inv)
}

/// The forward: `[B, Sq, dv]`.
pub(crate) fn forward_slices<T: Element>(o: &Operands<'_, T>, a: KeyPadding) -> Vec<T> {
    let mut out = vec![T::ZERO; a.batch * a.q_len * a.dv];
    if a.is_empty() {
        return out;
    }
    let mut p = vec![T::ZERO; a.k_len];
    for b in 0..a.batch {
        for i in 0..a.q_len {
            row_probs(o, a, b, i, &mut p);
            let row = &mut out[(b * a.q_len + i) * a.dv..][..a.dv];
            for (j, &pj) in p.iter().enumerate() {
                if !o.kept(a, b, j) {
                    continue;
                }
                let vj = &o.v[(b * a.k_len + j) * a.dv..][..a.dv];
                for (y, &x) in row.iter_mut().zip(vj) {
                    *y = *y + pj * x;
                }
            }
        }
    }
    out
}

/// The backward's query pass (`zc_key_padding_attention_backward_q_f32`), from
/// `g [B, Sq, dv]`: dq `[B, Sq, dk]`, and each query row's stats `[B·Sq, 3]` (max, `1 / Σe`,
/// `Σ P·dP`) for the key pass.
pub(crate) fn query_pass<T: Element>(
    g: &[T],
    o: &Operands<'_, T>,
    a: KeyPadding,
) -> (Vec<T>, Vec<T>) {
    let mut dq = vec![T::ZERO; a.batch * a.q_len * a.dk];
    let mut stats = vec![T::ZERO; a.batch * a.q_len * 3];
    let (mut p, mut ds) = (vec![T::ZERO; a.k_len], vec![T::ZERO; a.k_len]);
    for b in 0..a.batch {
        for i in 0..a.q_len {
            let row = b * a.q_len + i;
            let (max, inv) = row_probs(o, a, b, i, &mut p);
            let gi = &g[row * a.dv..][..a.dv];
            let mut total = T::ZERO;
            for (j, dsj) in ds.iter_mut().enumerate() {
                *dsj = T::ZERO;
                if o.kept(a, b, j) {
                    *dsj = dot(gi, &o.v[(b * a.k_len + j) * a.dv..][..a.dv]);
                    total = total + p[j] * *dsj;
                }
            }
            stats[row * 3..][..3].copy_from_slice(&[max, inv, total]);
            for (j, dsj) in ds.iter_mut().enumerate() {
                if o.kept(a, b, j) {
                    *dsj = p[j] * (*dsj - total) * o.scale;
                }
            }
            let out = &mut dq[row * a.dk..][..a.dk];
            for (j, &d) in ds.iter().enumerate() {
                if o.kept(a, b, j) {
                    let kj = &o.k[(b * a.k_len + j) * a.dk..][..a.dk];
                    for (y, &x) in out.iter_mut().zip(kj) {
                        *y = *y + d * x;
                    }
                }
            }
        }
    }
    (dq, stats)
}

/// The backward's key pass (`zc_key_padding_attention_backward_kv_f32`): dk `[B, Sk, dk]` and
/// dv `[B, Sk, dv]` from the query pass's `stats`, each query's probability of a key
/// recomputed as the query pass computed it (the same bits); a padded key's rows are zeros.
pub(crate) fn key_pass<T: Element>(
    g: &[T],
    o: &Operands<'_, T>,
    a: KeyPadding,
    stats: &[T],
) -> (Vec<T>, Vec<T>) {
    let mut dk = vec![T::ZERO; a.batch * a.k_len * a.dk];
    let mut dv = vec![T::ZERO; a.batch * a.k_len * a.dv];
    let (mut p, mut ds) = (vec![T::ZERO; a.q_len], vec![T::ZERO; a.q_len]);
    for b in 0..a.batch {
        for j in (0..a.k_len).filter(|&j| o.kept(a, b, j)) {
            let key = b * a.k_len + j;
            let (kj, vj) = (&o.k[key * a.dk..][..a.dk], &o.v[key * a.dv..][..a.dv]);
            for i in 0..a.q_len {
                let row = b * a.q_len + i;
                let st = &stats[row * 3..][..3];
                let s = o.scale * dot(&o.q[row * a.dk..][..a.dk], kj);
                p[i] = (s - st[0]).exp() * st[1];
                let dp = dot(&g[row * a.dv..][..a.dv], vj);
                ds[i] = p[i] * (dp - st[2]) * o.scale;
            }
            let out = &mut dk[key * a.dk..][..a.dk];
            for (i, &d) in ds.iter().enumerate() {
                let qi = &o.q[(b * a.q_len + i) * a.dk..][..a.dk];
                for (y, &x) in out.iter_mut().zip(qi) {
                    *y = *y + d * x;
                }
            }
            let out = &mut dv[key * a.dv..][..a.dv];
            for (i, &w) in p.iter().enumerate() {
                let gi = &g[(b * a.q_len + i) * a.dv..][..a.dv];
                for (y, &x) in out.iter_mut().zip(gi) {
                    *y = *y + w * x;
                }
            }
        }
    }
    (dk, dv)
}

/// The backward from `g [B, Sq, dv]`: the gradients of q, k and v (dense, their shapes).
pub(crate) fn backward_slices<T: Element>(
    g: &[T],
    o: &Operands<'_, T>,
    a: KeyPadding,
) -> [Vec<T>; 3] {
    if a.is_empty() {
        return [
            vec![T::ZERO; a.batch * a.q_len * a.dk],
            vec![T::ZERO; a.batch * a.k_len * a.dk],
            vec![T::ZERO; a.batch * a.k_len * a.dv],
        ];
    }
    let (dq, stats) = query_pass(g, o, a);
    let (dk, dv) = key_pass(g, o, a, &stats);
    [dq, dk, dv]
}

pub(crate) fn forward<T: Element>(
    q: &CpuTensor<T>,
    k: &CpuTensor<T>,
    v: &CpuTensor<T>,
    key_keep: Option<&CpuTensor<T>>,
    scale: T,
) -> Result<CpuTensor<T>> {
    let a = validate::key_padding_attention("key_padding_attention", q, k, v, key_keep, scale)?;
    let (q, k, v, keep) = (gather(q), gather(k), gather(v), key_keep.map(gather));
    let o = Operands {
        q: &q,
        k: &k,
        v: &v,
        keep: keep.as_deref(),
        scale,
    };
    dense(forward_slices(&o, a), &[a.batch, a.q_len, a.dv])
}

pub(crate) fn backward<T: Element>(
    g: &CpuTensor<T>,
    q: &CpuTensor<T>,
    k: &CpuTensor<T>,
    v: &CpuTensor<T>,
    key_keep: Option<&CpuTensor<T>>,
    scale: T,
) -> Result<KeyPaddingAttentionGrads<CpuStorage<T>>> {
    let a = validate::key_padding_attention_backward(g, q, k, v, key_keep, scale)?;
    let (shapes, g) = ([q.shape(), k.shape(), v.shape()], gather(g));
    let (q, k, v, keep) = (gather(q), gather(k), gather(v), key_keep.map(gather));
    let o = Operands {
        q: &q,
        k: &k,
        v: &v,
        keep: keep.as_deref(),
        scale,
    };
    let [dq, dk, dv] = backward_slices(&g, &o, a);
    Ok(KeyPaddingAttentionGrads {
        q: dense(dq, shapes[0])?,
        k: dense(dk, shapes[1])?,
        v: dense(dv, shapes[2])?,
    })
}
