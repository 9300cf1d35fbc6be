//! Attention's core on the host, per (batch, head) as the fused kernels of
//! `kernels/attention.cu` compute it: q and k rows normalised (two-pass statistics), scores
//! `qn·knᵀ/sqrt(dh)`, a max-shifted softmax, `P·v`; the backward recomputes all of that and
//! writes each (batch, head)'s share of the LayerNorm parameter gradients as a row of
//! `[B*H, 4, dh]` partials (q weight, q bias, k weight, k bias), summed afterwards in a fixed
//! order. Written over slices so the kernels' simulated twins run the same code on device
//! memory. The per-head functions are inlined into each task's body, which `par::simd_op`
//! compiles for AVX2.
//!
//! Under bf16 products (`Params::bf16`, issue 42) every operand of the six products (`qn·knᵀ`,
//! `P·v`; `go·vᵀ`, `Pᵀ·go`, `dS·kn`, `dSᵀ·qn`) is rounded to bf16 (nearest-even, the formula
//! every bf16 product of the crate uses) and the products accumulate in float32 as before; the
//! LayerNorm statistics, the softmax and its backward (which read the float32 `P`) and every
//! sum stay float32. The operands are rounded where they are made, each once: the rounding
//! costs the float32 path one branch a head.

use super::math::{LANES, lanes_total, pairwise_sum, row_max};
use super::{dense, gather, par};
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
    /// The products' operands rounded to bf16 (the bf16 kernels); float32 otherwise.
    pub(crate) bf16: bool,
}

/// `v` rounded to bf16 (nearest-even) and widened back. Only f32 elements reach it (the
/// backends refuse bf16 products of other elements), for which the round trip through f64 is
/// exact.
#[inline(always)]
fn to_bf16<T: Element>(v: T) -> T {
    T::from_f64(f64::from(zdevice::rounding::round_to_bf16(
        v.to_f64() as f32
    )))
}

/// Rounds every element of `xs` to bf16 in place.
#[inline(always)]
fn round_all<T: Element>(xs: &mut [T]) {
    for x in xs {
        *x = to_bf16(*x);
    }
}

/// Index of element 0 of row `s`, part `part` (0 q, 1 k, 2 v), head `h` of batch `b` in qkv.
fn at(a: Attention, b: usize, s: usize, part: usize, h: usize) -> usize {
    ((b * a.seq + s) * 3 + part) * a.heads * a.dh + h * a.dh
}

/// Writes `xhat = (x - mean) * rstd` of one row into `xhat` and returns `rstd =
/// 1 / sqrt(var + eps)` (two passes; `sq` is scratch of the row's length).
#[inline(always)]
fn normalise<T: Element>(row: &[T], eps: T, xhat: &mut [T], sq: &mut [T]) -> T {
    let inv_n = T::ONE / T::from_f64(row.len() as f64);
    let mean = pairwise_sum(row) * inv_n;
    for (q, &v) in sq.iter_mut().zip(row) {
        *q = (v - mean) * (v - mean);
    }
    let rstd = T::ONE / (pairwise_sum(sq) * inv_n + eps).sqrt();
    for (x, &v) in xhat.iter_mut().zip(row) {
        *x = (v - mean) * rstd;
    }
    rstd
}

/// One (batch, head): normalised q and k (before the affine), their rstd, the affine results,
/// v, and the softmax probabilities `[S, S]`. Allocated once per task, refilled per head.
struct Head<T> {
    qhat: Vec<T>,
    khat: Vec<T>,
    qrstd: Vec<T>,
    krstd: Vec<T>,
    qn: Vec<T>,
    kn: Vec<T>,
    v: Vec<T>,
    probs: Vec<T>,
    /// `probs` rounded to bf16, the products' operand under bf16 (empty under float32, whose
    /// products read `probs`).
    probs_bf16: Vec<T>,
    /// Scratch: squared deviations of one row.
    sq: Vec<T>,
}

impl<T: Element> Head<T> {
    fn new(a: Attention, bf16: bool) -> Self {
        let (s, dh) = (a.seq, a.dh);
        let z = |n: usize| vec![T::ZERO; n];
        Head {
            probs_bf16: z(if bf16 { s * s } else { 0 }),
            qhat: z(s * dh),
            khat: z(s * dh),
            qrstd: z(s),
            krstd: z(s),
            qn: z(s * dh),
            kn: z(s * dh),
            v: z(s * dh),
            probs: z(s * s),
            sq: z(dh),
        }
    }

    /// The probabilities as the products `P·v` and `Pᵀ·go` read them.
    #[inline(always)]
    fn probs_operand(&self, bf16: bool) -> &[T] {
        if bf16 { &self.probs_bf16 } else { &self.probs }
    }
}

/// Scratch of one (batch, head)'s backward, allocated once per task and refilled per head.
struct Scratch<T> {
    /// The head's output gradient rows `[S, dh]`.
    go: Vec<T>,
    /// The score gradient `[S, S]`.
    ds: Vec<T>,
    /// One row of `go·vᵀ`.
    dp: Vec<T>,
    /// Gradients of the normalised q and k `[S, dh]`.
    dqn: Vec<T>,
    dkn: Vec<T>,
    /// One row's `dn·w` and `dn·w·xhat`.
    gx: Vec<T>,
    gxx: Vec<T>,
}

impl<T: Element> Scratch<T> {
    fn new(a: Attention) -> Self {
        let (s, dh) = (a.seq, a.dh);
        let z = |n: usize| vec![T::ZERO; n];
        Scratch {
            go: z(s * dh),
            ds: z(s * s),
            dp: z(s),
            dqn: z(s * dh),
            dkn: z(s * dh),
            gx: z(dh),
            gxx: z(dh),
        }
    }
}

/// Fills `hd` with (batch `b`, head `h`).
#[inline(always)]
fn head<T: Element>(hd: &mut Head<T>, qkv: &[T], a: Attention, p: &Params<T>, b: usize, h: usize) {
    let (s_len, dh) = (a.seq, a.dh);
    for s in 0..s_len {
        let row = s * dh..(s + 1) * dh;
        let q = at(a, b, s, 0, h);
        let rstd = normalise(
            &qkv[q..q + dh],
            p.eps,
            &mut hd.qhat[row.clone()],
            &mut hd.sq,
        );
        hd.qrstd[s] = rstd;
        let k = at(a, b, s, 1, h);
        let rstd = normalise(
            &qkv[k..k + dh],
            p.eps,
            &mut hd.khat[row.clone()],
            &mut hd.sq,
        );
        hd.krstd[s] = rstd;
        let affine = |out: &mut [T], xhat: &[T], w: &[T], c: &[T]| {
            for (((o, &x), &w), &c) in out.iter_mut().zip(xhat).zip(w).zip(c) {
                *o = x * w + c;
            }
        };
        affine(
            &mut hd.qn[row.clone()],
            &hd.qhat[row.clone()],
            &p.q_weight,
            &p.q_bias,
        );
        affine(
            &mut hd.kn[row.clone()],
            &hd.khat[row.clone()],
            &p.k_weight,
            &p.k_bias,
        );
        let v = at(a, b, s, 2, h);
        hd.v[row].copy_from_slice(&qkv[v..v + dh]);
    }
    if p.bf16 {
        // qn, kn and v are read only as products' operands (qhat and khat, LayerNorm's
        // backward inputs, stay float32).
        round_all(&mut hd.qn);
        round_all(&mut hd.kn);
        round_all(&mut hd.v);
    }
    let scale = a.scale::<T>();
    for (i, row) in hd.probs.chunks_exact_mut(s_len).enumerate() {
        dots(&hd.qn[i * dh..(i + 1) * dh], &hd.kn, row);
        for score in row.iter_mut() {
            *score = *score * scale;
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
    if p.bf16 {
        for (r, &x) in hd.probs_bf16.iter_mut().zip(&hd.probs) {
            *r = to_bf16(x);
        }
    }
}

/// `Σ a[d]·b[d]`, with [`math::pairwise_sum`]'s leaf order: product `d` added into running
/// sum `d % LANES`, the running sums added as `math::lanes_total` (independent running sums
/// keep the products in vector registers, where one sum would wait on every add).
#[inline(always)]
fn dot<T: Element>(a: &[T], b: &[T]) -> T {
    let mut acc = [T::ZERO; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for ((s, &x), &y) in acc.iter_mut().zip(x).zip(y) {
            *s = *s + x * y;
        }
    }
    for ((s, &x), &y) in acc.iter_mut().zip(ra).zip(rb) {
        *s = *s + x * y;
    }
    lanes_total(&acc)
}

/// `out[j] = dot(x, row j of m)` (`m` holds `out.len()` rows of `x.len()`).
#[inline(always)]
fn dots<T: Element>(x: &[T], m: &[T], out: &mut [T]) {
    for (o, row) in out.iter_mut().zip(m.chunks_exact(x.len().max(1))) {
        *o = dot(x, row);
    }
}

/// `out[d] = Σ_j w[j] · rows[j][d]` (rows of `out.len()`), summed over `j` in order from
/// zero: the fold of each element, vectorised across `d`.
#[inline(always)]
fn combine<T: Element>(w: impl Iterator<Item = T>, rows: &[T], out: &mut [T]) {
    out.fill(T::ZERO);
    for (wj, row) in w.zip(rows.chunks_exact(out.len())) {
        for (o, &r) in out.iter_mut().zip(row) {
            *o = *o + wj * r;
        }
    }
}

/// The forward over dense `qkv`: `[B, S, D]`; batches split over the pool.
pub(crate) fn forward_slices<T: Element>(qkv: &[T], a: Attention, p: &Params<T>) -> Vec<T> {
    let (s_len, width) = (a.seq, a.heads * a.dh);
    // Every element is written (each head's rows by `combine`): no clearing pass.
    let mut out = super::pool::overwritten(a.batch * s_len * width);
    par::rows_mut(&mut out, s_len * width, |first, block| {
        // The whole body in AVX2 code (`par::simd_op`).
        par::simd_op(ForwardBlock {
            qkv,
            a,
            p,
            first,
            block,
        });
    });
    out
}

/// The forward of batches `first..` into `block` (whole batches of `[S, H*dh]`).
struct ForwardBlock<'a, T> {
    qkv: &'a [T],
    a: Attention,
    p: &'a Params<T>,
    first: usize,
    block: &'a mut [T],
}

impl<T: Element> pulp::WithSimd for ForwardBlock<'_, T> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let ForwardBlock {
            qkv,
            a,
            p,
            first,
            block,
        } = self;
        forward_block(qkv, a, p, first, block);
    }
}

#[inline(always)]
fn forward_block<T: Element>(
    qkv: &[T],
    a: Attention,
    p: &Params<T>,
    first: usize,
    block: &mut [T],
) {
    let (s_len, dh, width) = (a.seq, a.dh, a.heads * a.dh);
    let mut hd = Head::new(a, p.bf16);
    for (i, out) in block.chunks_exact_mut(s_len * width).enumerate() {
        let b = first + i;
        for h in 0..a.heads {
            head(&mut hd, qkv, a, p, b, h);
            let probs = hd.probs_operand(p.bf16);
            for i in 0..s_len {
                let prow = probs[i * s_len..(i + 1) * s_len].iter().copied();
                let at = i * width + h * dh;
                combine(prow, &hd.v, &mut out[at..at + dh]);
            }
        }
    }
}

/// The backward over dense `g` and `qkv`: the gradient of `qkv` and the `[4, B*H, dh]`
/// parameter partials (parameter-major, as the device kernel writes them). Batches split over
/// the pool, each writing its own rows of both.
pub(crate) fn backward_slices<T: Element>(
    g: &[T],
    qkv: &[T],
    a: Attention,
    p: &Params<T>,
) -> (Vec<T>, Vec<T>) {
    let (s_len, dh) = (a.seq, a.dh);
    let per_batch = s_len * 3 * a.heads * dh;
    // Every element is written (q and k rows by LayerNorm's backward, v rows by `combine`):
    // no clearing pass.
    let mut g_qkv = super::pool::overwritten(qkv.len());
    // Batch-major `[B, H, 4, dh]` first, reordered to parameter-major below.
    let mut by_batch = vec![T::ZERO; a.batch * a.heads * 4 * dh];
    par::rows_mut2(
        &mut g_qkv,
        per_batch,
        &mut by_batch,
        a.heads * 4 * dh,
        // As in the forward: the whole body in AVX2 code.
        |first, gq, part| {
            par::simd_op(BackwardBlock {
                g,
                qkv,
                a,
                p,
                first,
                gq,
                part,
            });
        },
    );
    let rows = a.batch * a.heads;
    let mut partials = vec![T::ZERO; 4 * rows * dh];
    for (row, part) in by_batch.chunks_exact(4 * dh).enumerate() {
        for (k, v) in part.chunks_exact(dh).enumerate() {
            partials[(k * rows + row) * dh..(k * rows + row + 1) * dh].copy_from_slice(v);
        }
    }
    (g_qkv, partials)
}

/// The backward of batches `first..`: their rows of `g_qkv` (`gq`) and their `[H, 4, dh]`
/// partials (`part`).
struct BackwardBlock<'a, T> {
    g: &'a [T],
    qkv: &'a [T],
    a: Attention,
    p: &'a Params<T>,
    first: usize,
    gq: &'a mut [T],
    part: &'a mut [T],
}

impl<T: Element> pulp::WithSimd for BackwardBlock<'_, T> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let BackwardBlock {
            g,
            qkv,
            a,
            p,
            first,
            gq,
            part,
        } = self;
        backward_block(g, qkv, a, p, first, gq, part);
    }
}

#[inline(always)]
fn backward_block<T: Element>(
    g: &[T],
    qkv: &[T],
    a: Attention,
    p: &Params<T>,
    first: usize,
    gq: &mut [T],
    part: &mut [T],
) {
    let dh = a.dh;
    let per_batch = a.seq * 3 * a.heads * dh;
    let (mut hd, mut sc) = (Head::new(a, p.bf16), Scratch::new(a));
    for (i, (gq, part)) in gq
        .chunks_exact_mut(per_batch)
        .zip(part.chunks_exact_mut(a.heads * 4 * dh))
        .enumerate()
    {
        for (h, part) in part.chunks_exact_mut(4 * dh).enumerate() {
            head(&mut hd, qkv, a, p, first + i, h);
            backward_head(g, &hd, &mut sc, a, p, (first + i, h), gq, part);
        }
    }
}

/// One (batch, head) of the backward: its share of `g_qkv` (the batch's rows, `gq`) and its
/// four partials `[q weight, q bias, k weight, k bias]` of `dh` each (`part`).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn backward_head<T: Element>(
    g: &[T],
    hd: &Head<T>,
    sc: &mut Scratch<T>,
    a: Attention,
    p: &Params<T>,
    (b, h): (usize, usize),
    gq: &mut [T],
    part: &mut [T],
) {
    let (s_len, dh, width) = (a.seq, a.dh, a.heads * a.dh);
    let base = at(a, b, 0, 0, 0);
    let scale = a.scale::<T>();
    for (i, go) in sc.go.chunks_exact_mut(dh).enumerate() {
        let start = (b * s_len + i) * width + h * dh;
        go.copy_from_slice(&g[start..start + dh]);
        if p.bf16 {
            // go is read only by the products dv = Pᵀ·go and dP = go·vᵀ.
            round_all(go);
        }
    }
    // dv = Pᵀ·go, dP = go·vᵀ, dS = P * (dP - rowsum(P * dP)) * scale (the softmax backward
    // on the float32 P; under bf16 dS rounded, an operand of the two products below).
    let probs = hd.probs_operand(p.bf16);
    for j in 0..s_len {
        let pcol = (0..s_len).map(|i| probs[i * s_len + j]);
        let start = at(a, b, j, 2, h) - base;
        combine(pcol, &sc.go, &mut gq[start..start + dh]);
    }
    for i in 0..s_len {
        let prow = &hd.probs[i * s_len..(i + 1) * s_len];
        dots(&sc.go[i * dh..(i + 1) * dh], &hd.v, &mut sc.dp);
        let row_dot = dot(prow, &sc.dp);
        let ds = &mut sc.ds[i * s_len..(i + 1) * s_len];
        for ((d, &p), &dp) in ds.iter_mut().zip(prow).zip(&sc.dp) {
            *d = p * (dp - row_dot) * scale;
        }
        if p.bf16 {
            round_all(ds);
        }
    }
    // dqn = dS·kn, dkn = dSᵀ·qn.
    for i in 0..s_len {
        let ds_row = sc.ds[i * s_len..(i + 1) * s_len].iter().copied();
        combine(ds_row, &hd.kn, &mut sc.dqn[i * dh..(i + 1) * dh]);
        let ds_col = (0..s_len).map(|j| sc.ds[j * s_len + i]);
        combine(ds_col, &hd.qn, &mut sc.dkn[i * dh..(i + 1) * dh]);
    }
    let sides = [
        (0, &sc.dqn, &hd.qhat, &hd.qrstd, &p.q_weight),
        (1, &sc.dkn, &hd.khat, &hd.krstd, &p.k_weight),
    ];
    let (gx, gxx) = (&mut sc.gx, &mut sc.gxx);
    for (side, dn, xhat, rstd, w) in sides {
        // Σ_i dn·xhat and Σ_i dn per d, over i in order from zero.
        let (gw, gb) = part[2 * side * dh..(2 * side + 2) * dh].split_at_mut(dh);
        gw.fill(T::ZERO);
        gb.fill(T::ZERO);
        for (dn, xh) in dn.chunks_exact(dh).zip(xhat.chunks_exact(dh)) {
            for (((w, b), &g), &x) in gw.iter_mut().zip(gb.iter_mut()).zip(dn).zip(xh) {
                *w = *w + g * x;
                *b = *b + g;
            }
        }
        // LayerNorm's input gradient: rstd * (gx - mean(gx) - xhat * mean(gx * xhat)).
        let inv_n = T::ONE / T::from_f64(dh as f64);
        for i in 0..s_len {
            let xh = &xhat[i * dh..(i + 1) * dh];
            for ((u, &d), &w) in gx.iter_mut().zip(&dn[i * dh..(i + 1) * dh]).zip(w) {
                *u = d * w;
            }
            let m1 = pairwise_sum(gx) * inv_n;
            for ((v, &u), &x) in gxx.iter_mut().zip(gx.iter()).zip(xh) {
                *v = u * x;
            }
            let m2 = pairwise_sum(gxx) * inv_n;
            let start = at(a, b, i, side, h) - base;
            for (((o, &u), &x), r) in gq[start..start + dh]
                .iter_mut()
                .zip(gx.iter())
                .zip(xh)
                .zip(std::iter::repeat(rstd[i]))
            {
                *o = r * (u - m1 - x * m2);
            }
        }
    }
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

fn params<T: Element>(norm: &QkNorm<'_, CpuStorage<T>>, bf16: bool) -> Params<T> {
    Params {
        bf16,
        q_weight: gather(norm.q_weight),
        q_bias: gather(norm.q_bias),
        k_weight: gather(norm.k_weight),
        k_bias: gather(norm.k_bias),
        eps: norm.eps,
    }
}

/// The forward; `bf16`: the products' operands rounded to bf16 (f32 elements only: the
/// caller refuses the others).
pub(crate) fn forward<T: Element>(
    qkv: &CpuTensor<T>,
    norm: &QkNorm<'_, CpuStorage<T>>,
    bf16: bool,
) -> Result<CpuTensor<T>> {
    let a = validate::qk_norm_attention(qkv, norm)?;
    let out = super::dense::with(qkv, |q| forward_slices(q, a, &params(norm, bf16)));
    dense(out, &[a.batch, a.seq, a.heads * a.dh])
}

/// The backward; `bf16` as for [`forward`].
pub(crate) fn backward<T: Element>(
    g: &CpuTensor<T>,
    qkv: &CpuTensor<T>,
    norm: &QkNorm<'_, CpuStorage<T>>,
    bf16: bool,
) -> Result<QkNormAttentionGrads<CpuStorage<T>>> {
    let a = validate::qk_norm_attention_backward(g, qkv, norm)?;
    let p = params(norm, bf16);
    let (g_qkv, partials) = super::dense::with2(g, qkv, |g, q| backward_slices(g, q, a, &p));
    let [qw, qb, kw, kb] = sum_partials(&partials, a.dh);
    Ok(QkNormAttentionGrads {
        qkv: dense(g_qkv, qkv.shape())?,
        q_weight: dense(qw, &[a.dh])?,
        q_bias: dense(qb, &[a.dh])?,
        k_weight: dense(kw, &[a.dh])?,
        k_bias: dense(kb, &[a.dh])?,
    })
}
