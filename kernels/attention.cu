// Attention's core after the qkv product, fused: one block per (batch, head), reading q, k, v
// straight out of qkv [B, S, 3, H, dh] (q first), with QK-norm (LayerNorm of q and k over dh),
// scores scaled by 1/sqrt(dh), softmax over keys and P·v, writing the head's slice of
// out [B, S, H*dh]. For short sequences (S <= 64, dh <= 256, the host checks the shared memory
// fits); the host falls back to the composite of row kernels and gemms otherwise. Every sum
// runs in a fixed order (warp trees or plain loops): two runs give the same bits. Rows of
// [S, dh] arrays in shared memory are ld = dh | 1 floats apart (odd), so the lanes of a warp
// reading one column of different rows hit different banks.
//
// Each kernel is a template over BF16 with two entries: `_f32` (float32 products) and `_bf16`
// (issue 42's bf16 policy: every operand of the products Q·Kᵀ, P·V, dO·Vᵀ, Pᵀ·dO, dS·K and
// dSᵀ·Q rounded to bf16, nearest-even, where it is made; float32 accumulation; LayerNorm, the
// softmax and its backward, which read the float32 P, and every other sum in float32). The
// CPU backend (crates/zcompute/src/cpu/attention.rs) rounds the same values.
#include "common.cuh"

// Warps per block: one per query row at S = 12 (the per-sample step), so no warp walks two
// rows one after the other (8 warps: 11.1 us forward, 16.9 backward per sample on an H100).
#define ATTN_WARPS 16

// LayerNorm of one dh-wide row by one warp: src -> dst (xhat * w + b when w is not null, else
// xhat); returns rstd. Two passes (mean, then squared deviations), as the CPU reference. In the
// bf16 form the affine result (a product's operand) is rounded to bf16.
template <bool BF16>
__device__ __forceinline__ float attn_norm_row(float* dst, const float* src, const float* w,
                                               const float* b, unsigned dh, float eps,
                                               unsigned lane) {
    float sum = 0.0f;
    for (unsigned d = lane; d < dh; d += 32) {
        float x = src[d];
        dst[d] = x;
        sum += x;
    }
    float mean = warp_sum(sum) / (float)dh;
    float sq = 0.0f;
    for (unsigned d = lane; d < dh; d += 32) {
        float c = dst[d] - mean;
        sq += c * c;
    }
    float rstd = 1.0f / sqrtf(warp_sum(sq) / (float)dh + eps);
    for (unsigned d = lane; d < dh; d += 32) {
        float xhat = (dst[d] - mean) * rstd;
        dst[d] = w ? zc_operand<BF16>(xhat * w[d] + b[d]) : xhat;
    }
    return rstd;
}

// Softmax of one S-wide row in shared memory by one warp, in place.
__device__ __forceinline__ void attn_softmax_row(float* p, unsigned seq, unsigned lane) {
    float m = -INFINITY;
    for (unsigned j = lane; j < seq; j += 32) m = zc_maximum(m, p[j]);
    m = warp_max(m);
    float sum = 0.0f;
    for (unsigned j = lane; j < seq; j += 32) {
        float e = expf(p[j] - m);
        p[j] = e;
        sum += e;
    }
    sum = warp_sum(sum);
    __syncwarp();
    float inv = 1.0f / sum;
    for (unsigned j = lane; j < seq; j += 32) p[j] *= inv;
    __syncwarp();
}

// Forward. Grid: batch * heads blocks of ATTN_WARPS warps. Shared memory (floats):
// kn [S*ld], v [S*ld], one q row [dh] and one probability row [S] per warp.
// `sm`: the block's dynamic shared memory (declared by the entries).
template <bool BF16>
__device__ __forceinline__ void attn_forward(float* sm, float* out, const float* qkv,
                                             const float* qw, const float* qb, const float* kw,
                                             const float* kb, unsigned batch, unsigned seq,
                                             unsigned heads, unsigned dh, float eps) {
    const unsigned bh = blockIdx.x;
    if (bh >= batch * heads) return;
    const unsigned b = bh / heads, h = bh % heads;
    const unsigned width = heads * dh;
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const unsigned ld = dh | 1u;
    float* kn = sm;
    float* vs = kn + seq * ld;
    float* qrow = vs + seq * ld + warp * dh;
    float* prow = vs + seq * ld + ATTN_WARPS * dh + warp * seq;
    const u64 row_stride = 3ull * width;
    const float* base = qkv + (u64)b * seq * row_stride + (u64)h * dh;
    for (unsigned r = warp; r < seq; r += ATTN_WARPS) {
        const float* src = base + (u64)r * row_stride;
        attn_norm_row<BF16>(kn + r * ld, src + width, kw, kb, dh, eps, lane);
        for (unsigned d = lane; d < dh; d += 32)
            vs[r * ld + d] = zc_operand<BF16>(src[2 * width + d]);
    }
    __syncthreads();
    const float scale = 1.0f / sqrtf((float)dh);
    for (unsigned i = warp; i < seq; i += ATTN_WARPS) {
        attn_norm_row<BF16>(qrow, base + (u64)i * row_stride, qw, qb, dh, eps, lane);
        __syncwarp();
        for (unsigned j = lane; j < seq; j += 32) {
            float s = 0.0f;
            for (unsigned d = 0; d < dh; ++d) s += qrow[d] * kn[j * ld + d];
            prow[j] = s * scale;
        }
        __syncwarp();
        attn_softmax_row(prow, seq, lane);
        float* dst = out + ((u64)b * seq + i) * width + (u64)h * dh;
        for (unsigned d = lane; d < dh; d += 32) {
            float acc = 0.0f;
            for (unsigned j = 0; j < seq; ++j)
                acc += zc_operand<BF16>(prow[j]) * vs[j * ld + d];
            dst[d] = acc;
        }
        __syncwarp();
    }
}
extern "C" __global__ void zc_qk_norm_attention_f32(float* out, const float* qkv,
                                                   const float* qw, const float* qb,
                                                   const float* kw, const float* kb,
                                                   unsigned batch, unsigned seq,
                                                   unsigned heads, unsigned dh, float eps) {
    extern __shared__ float sm[];
    attn_forward<false>(sm, out, qkv, qw, qb, kw, kb, batch, seq, heads, dh, eps);
}
extern "C" __global__ void zc_qk_norm_attention_bf16(float* out, const float* qkv,
                                                    const float* qw, const float* qb,
                                                    const float* kw, const float* kb,
                                                    unsigned batch, unsigned seq,
                                                    unsigned heads, unsigned dh, float eps) {
    extern __shared__ float sm[];
    attn_forward<true>(sm, out, qkv, qw, qb, kw, kb, batch, seq, heads, dh, eps);
}

// Backward, recomputing the forward. Grid: batch * heads blocks of ATTN_WARPS warps. Writes
// the head's slices of g_qkv [B, S, 3*H*dh] and its row of each of the partials [4, B*H, dh]
// (q weight, q bias, k weight, k bias gradients of this head; the host sums the rows of each
// in order, parameter-major so that each parameter's rows are one dense block the column
// reduction can add straight into that parameter's gradient buffer).
// Shared memory (floats): qhat, khat, v (later dkn), go (later dqn) [S*ld each], P and dS
// [S*S each], q and k rstd [S each], qn and kn [S*ld each].
template <bool BF16>
__device__ __forceinline__ void attn_backward(
    float* sm, float* g_qkv, float* partials, const float* g, const float* qkv, const float* qw,
    const float* qb, const float* kw, const float* kb, unsigned batch, unsigned seq,
    unsigned heads, unsigned dh, float eps) {
    const unsigned bh = blockIdx.x;
    if (bh >= batch * heads) return;
    const unsigned b = bh / heads, h = bh % heads;
    const unsigned width = heads * dh;
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const unsigned ld = dh | 1u;
    const unsigned sd = seq * dh, ss = seq * seq;
    float* qhat = sm;
    float* khat = qhat + seq * ld;
    float* vs = khat + seq * ld;  // v, then dkn
    float* go = vs + seq * ld;    // the output gradient, then dqn
    float* p = go + seq * ld;
    float* ds = p + ss;
    float* qrstd = ds + ss;
    float* krstd = qrstd + seq;
    // qn = qhat * qw + qb and kn likewise, computed once (the products below read them S
    // times a row: two shared loads a term instead of two shared and four global ones).
    float* qn = krstd + seq;
    float* kn = qn + seq * ld;
    const u64 row_stride = 3ull * width;
    const float* base = qkv + (u64)b * seq * row_stride + (u64)h * dh;
    float* gbase = g_qkv + (u64)b * seq * row_stride + (u64)h * dh;
    const float* gin = g + (u64)b * seq * width + (u64)h * dh;
    for (unsigned r = warp; r < seq; r += ATTN_WARPS) {
        const float* src = base + (u64)r * row_stride;
        float rq = attn_norm_row<BF16>(qhat + r * ld, src, nullptr, nullptr, dh, eps, lane);
        float rk =
            attn_norm_row<BF16>(khat + r * ld, src + width, nullptr, nullptr, dh, eps, lane);
        if (lane == 0) {
            qrstd[r] = rq;
            krstd[r] = rk;
        }
        for (unsigned d = lane; d < dh; d += 32) {
            // The products' operands (qn, kn, v, go): rounded in the bf16 form.
            qn[r * ld + d] = zc_operand<BF16>(qhat[r * ld + d] * qw[d] + qb[d]);
            kn[r * ld + d] = zc_operand<BF16>(khat[r * ld + d] * kw[d] + kb[d]);
            vs[r * ld + d] = zc_operand<BF16>(src[2 * width + d]);
            go[r * ld + d] = zc_operand<BF16>(gin[(u64)r * width + d]);
        }
    }
    __syncthreads();
    const float scale = 1.0f / sqrtf((float)dh);
    for (unsigned e = threadIdx.x; e < ss; e += blockDim.x) {
        unsigned i = e / seq, j = e % seq;
        float s = 0.0f;
        for (unsigned d = 0; d < dh; ++d) {
            s += qn[i * ld + d] * kn[j * ld + d];
        }
        p[e] = s * scale;
    }
    __syncthreads();
    for (unsigned i = warp; i < seq; i += ATTN_WARPS) attn_softmax_row(p + i * seq, seq, lane);
    __syncthreads();
    // dv = Pᵀ·go (to global), dP = go·vᵀ (into ds).
    for (unsigned e = threadIdx.x; e < sd; e += blockDim.x) {
        unsigned j = e / dh, d = e % dh;
        float acc = 0.0f;
        for (unsigned i = 0; i < seq; ++i)
            acc += zc_operand<BF16>(p[i * seq + j]) * go[i * ld + d];
        gbase[(u64)j * row_stride + 2 * width + d] = acc;
    }
    for (unsigned e = threadIdx.x; e < ss; e += blockDim.x) {
        unsigned i = e / seq, j = e % seq;
        float acc = 0.0f;
        for (unsigned d = 0; d < dh; ++d) acc += go[i * ld + d] * vs[j * ld + d];
        ds[e] = acc;
    }
    __syncthreads();
    // dS = P * (dP - rowsum(P * dP)) * scale, one warp per row (the float32 P; dS, the
    // operand of the two products below, rounded in the bf16 form).
    for (unsigned i = warp; i < seq; i += ATTN_WARPS) {
        float dot = 0.0f;
        for (unsigned j = lane; j < seq; j += 32) dot += p[i * seq + j] * ds[i * seq + j];
        dot = warp_sum(dot);
        for (unsigned j = lane; j < seq; j += 32) {
            float pj = p[i * seq + j];
            ds[i * seq + j] = zc_operand<BF16>(pj * (ds[i * seq + j] - dot) * scale);
        }
    }
    __syncthreads();
    // dqn = dS·kn (into go), dkn = dSᵀ·qn (into vs): go and v are no longer read.
    for (unsigned e = threadIdx.x; e < sd; e += blockDim.x) {
        unsigned i = e / dh, d = e % dh;
        float aq = 0.0f, ak = 0.0f;
        for (unsigned j = 0; j < seq; ++j) {
            aq += ds[i * seq + j] * kn[j * ld + d];
            ak += ds[j * seq + i] * qn[j * ld + d];
        }
        go[i * ld + d] = aq;
        vs[i * ld + d] = ak;
    }
    __syncthreads();
    // This head's parameter partials, one thread per column, rows in order.
    const u64 pstride = (u64)batch * heads * dh;
    float* part = partials + (u64)bh * dh;
    for (unsigned d = threadIdx.x; d < dh; d += blockDim.x) {
        float gwq = 0.0f, gbq = 0.0f, gwk = 0.0f, gbk = 0.0f;
        for (unsigned i = 0; i < seq; ++i) {
            gwq += go[i * ld + d] * qhat[i * ld + d];
            gbq += go[i * ld + d];
            gwk += vs[i * ld + d] * khat[i * ld + d];
            gbk += vs[i * ld + d];
        }
        part[d] = gwq;
        part[pstride + d] = gbq;
        part[2 * pstride + d] = gwk;
        part[3 * pstride + d] = gbk;
    }
    // LayerNorm's input gradients, one warp per row (q rows, then k rows):
    // rstd * (gx - mean(gx) - xhat * mean(gx * xhat)), gx = dn * w.
    for (unsigned r = warp; r < 2 * seq; r += ATTN_WARPS) {
        const bool is_k = r >= seq;
        const unsigned i = is_k ? r - seq : r;
        const float* dn = (is_k ? vs : go) + i * ld;
        const float* xh = (is_k ? khat : qhat) + i * ld;
        const float* w = is_k ? kw : qw;
        float s1 = 0.0f, s2 = 0.0f;
        for (unsigned d = lane; d < dh; d += 32) {
            float gx = dn[d] * w[d];
            s1 += gx;
            s2 += gx * xh[d];
        }
        float m1 = warp_sum(s1) / (float)dh;
        float m2 = warp_sum(s2) / (float)dh;
        float rstd = is_k ? krstd[i] : qrstd[i];
        float* dst = gbase + (u64)i * row_stride + (is_k ? width : 0);
        for (unsigned d = lane; d < dh; d += 32) {
            dst[d] = rstd * (dn[d] * w[d] - m1 - xh[d] * m2);
        }
    }
}
extern "C" __global__ void zc_qk_norm_attention_backward_f32(
    float* g_qkv, float* partials, const float* g, const float* qkv, const float* qw,
    const float* qb, const float* kw, const float* kb, unsigned batch, unsigned seq,
    unsigned heads, unsigned dh, float eps) {
    extern __shared__ float sm[];
    attn_backward<false>(sm, g_qkv, partials, g, qkv, qw, qb, kw, kb, batch, seq, heads, dh,
                        eps);
}
extern "C" __global__ void zc_qk_norm_attention_backward_bf16(
    float* g_qkv, float* partials, const float* g, const float* qkv, const float* qw,
    const float* qb, const float* kw, const float* kb, unsigned batch, unsigned seq,
    unsigned heads, unsigned dh, float eps) {
    extern __shared__ float sm[];
    attn_backward<true>(sm, g_qkv, partials, g, qkv, qw, qb, kw, kb, batch, seq, heads, dh,
                        eps);
}

// ---------------------------------------------------------------------------------------------
// Plain scaled dot-product attention with a key-padding mask (no QK-norm): q [B, Sq, dk],
// k [B, Sk, dk], v [B, Sk, dv], keep [B, Sk] (1 keep, 0 padding; a null pointer: every key
// kept) to out [B, Sq, dv]. A query whose keys are all padding gets zeros and zero gradients.
// One block per query row (forward, backward of q) or per key row (backward of k and v); each
// dot product runs in index order by one thread, the max and the sums of a row by thread 0 in
// key order, dq over keys and dk, dv over queries in index order: no atomics, two runs give
// the same bits (the host's `cpu::key_padding` is the same algorithm). Sq and Sk up to 4096
// (the rows' probabilities live in shared memory); the host falls back to the composite
// otherwise.

__device__ __forceinline__ bool kpa_kept(const float* keep, unsigned j) {
    return keep == nullptr || keep[j] != 0.0f;
}

__device__ __forceinline__ float kpa_dot(const float* a, const float* b, unsigned n) {
    float s = 0.0f;
    for (unsigned d = 0; d < n; ++d) s += a[d] * b[d];
    return s;
}

// The probabilities of query row qi against batch b's keys kb into p[0, sk) (0 at padded keys,
// all 0 when every key is padding); stat[0] = the row's max, stat[1] = 1 / its sum (0 when
// no key is kept). Every thread of the block calls it; it ends with a barrier.
__device__ void kpa_row_probs(float* p, float* stat, const float* qi, const float* kb,
                              const float* keep, unsigned sk, unsigned dk, float scale) {
    for (unsigned j = threadIdx.x; j < sk; j += blockDim.x)
        p[j] = kpa_kept(keep, j) ? scale * kpa_dot(qi, kb + (u64)j * dk, dk) : 0.0f;
    __syncthreads();
    if (threadIdx.x == 0) {
        bool any = false;
        float m = 0.0f;
        for (unsigned j = 0; j < sk; ++j) {
            if (!kpa_kept(keep, j)) continue;
            m = any ? fmaxf(m, p[j]) : p[j];
            any = true;
        }
        float sum = 0.0f;
        for (unsigned j = 0; j < sk; ++j)
            if (kpa_kept(keep, j)) sum += expf(p[j] - m);
        stat[0] = m;
        stat[1] = any ? 1.0f / sum : 0.0f;
    }
    __syncthreads();
    float m = stat[0], inv = stat[1];
    for (unsigned j = threadIdx.x; j < sk; j += blockDim.x)
        p[j] = kpa_kept(keep, j) ? expf(p[j] - m) * inv : 0.0f;
    __syncthreads();
}

// Forward: one block per query row (grid B*Sq); shared memory sk + 2 floats.
extern "C" __global__ void zc_key_padding_attention_f32(float* out, const float* q, const float* k,
                                                        const float* v, const float* keep,
                                                        unsigned batch, unsigned sq, unsigned sk,
                                                        unsigned dk, unsigned dv, float scale) {
    extern __shared__ float sm[];
    float* p = sm;
    float* stat = sm + sk;
    unsigned row = blockIdx.x, b = row / sq;
    const float* keep_b = keep ? keep + (u64)b * sk : nullptr;
    const float* vb = v + (u64)b * sk * dv;
    kpa_row_probs(p, stat, q + (u64)row * dk, k + (u64)b * sk * dk, keep_b, sk, dk, scale);
    for (unsigned c = threadIdx.x; c < dv; c += blockDim.x) {
        float acc = 0.0f;
        for (unsigned j = 0; j < sk; ++j)
            if (kpa_kept(keep_b, j)) acc += p[j] * vb[(u64)j * dv + c];
        out[(u64)row * dv + c] = acc;
    }
}

// Backward, queries: one block per query row (grid B*Sq); shared memory 2*sk + 2 floats. Writes
// dq's row and the row's stats [max, 1/sum, Σ P·dP] for the key kernel.
extern "C" __global__ void zc_key_padding_attention_backward_q_f32(
    float* dq, float* stats, const float* g, const float* q, const float* k, const float* v,
    const float* keep, unsigned batch, unsigned sq, unsigned sk, unsigned dk, unsigned dv,
    float scale) {
    extern __shared__ float sm[];
    float* p = sm;
    float* ds = sm + sk;
    float* stat = sm + 2 * sk;
    unsigned row = blockIdx.x, b = row / sq;
    const float* keep_b = keep ? keep + (u64)b * sk : nullptr;
    const float* kb = k + (u64)b * sk * dk;
    const float* vb = v + (u64)b * sk * dv;
    const float* gi = g + (u64)row * dv;
    kpa_row_probs(p, stat, q + (u64)row * dk, kb, keep_b, sk, dk, scale);
    for (unsigned j = threadIdx.x; j < sk; j += blockDim.x)
        ds[j] = kpa_kept(keep_b, j) ? kpa_dot(gi, vb + (u64)j * dv, dv) : 0.0f;
    __syncthreads();
    __shared__ float total;
    if (threadIdx.x == 0) {
        float t = 0.0f;
        for (unsigned j = 0; j < sk; ++j)
            if (kpa_kept(keep_b, j)) t += p[j] * ds[j];
        total = t;
        stats[(u64)row * 3] = stat[0];
        stats[(u64)row * 3 + 1] = stat[1];
        stats[(u64)row * 3 + 2] = t;
    }
    __syncthreads();
    for (unsigned j = threadIdx.x; j < sk; j += blockDim.x)
        ds[j] = kpa_kept(keep_b, j) ? p[j] * (ds[j] - total) * scale : 0.0f;
    __syncthreads();
    for (unsigned d = threadIdx.x; d < dk; d += blockDim.x) {
        float acc = 0.0f;
        for (unsigned j = 0; j < sk; ++j)
            if (kpa_kept(keep_b, j)) acc += ds[j] * kb[(u64)j * dk + d];
        dq[(u64)row * dk + d] = acc;
    }
}

// Backward, keys and values: one block per key row (grid B*Sk); shared memory 2*sq floats.
// Recomputes each query's probability of this key from the stats the query kernel wrote (the
// same expressions, so the same bits), then dk = Σ_i dS·q_i and dv = Σ_i P·g_i in query
// order; a padded key's rows are zeros.
extern "C" __global__ void zc_key_padding_attention_backward_kv_f32(
    float* dk_out, float* dv_out, const float* stats, const float* g, const float* q,
    const float* k, const float* v, const float* keep, unsigned batch, unsigned sq, unsigned sk,
    unsigned dk, unsigned dv, float scale) {
    extern __shared__ float sm[];
    float* p = sm;
    float* ds = sm + sq;
    unsigned row = blockIdx.x, b = row / sk;
    if (keep && keep[row] == 0.0f) {
        for (unsigned d = threadIdx.x; d < dk; d += blockDim.x) dk_out[(u64)row * dk + d] = 0.0f;
        for (unsigned c = threadIdx.x; c < dv; c += blockDim.x) dv_out[(u64)row * dv + c] = 0.0f;
        return;
    }
    const float* kj = k + (u64)row * dk;
    const float* vj = v + (u64)row * dv;
    const float* qb = q + (u64)b * sq * dk;
    const float* gb = g + (u64)b * sq * dv;
    const float* sb = stats + (u64)b * sq * 3;
    for (unsigned i = threadIdx.x; i < sq; i += blockDim.x) {
        float s = scale * kpa_dot(qb + (u64)i * dk, kj, dk);
        float pi = expf(s - sb[i * 3]) * sb[i * 3 + 1];
        float dp = kpa_dot(gb + (u64)i * dv, vj, dv);
        p[i] = pi;
        ds[i] = pi * (dp - sb[i * 3 + 2]) * scale;
    }
    __syncthreads();
    for (unsigned d = threadIdx.x; d < dk; d += blockDim.x) {
        float acc = 0.0f;
        for (unsigned i = 0; i < sq; ++i) acc += ds[i] * qb[(u64)i * dk + d];
        dk_out[(u64)row * dk + d] = acc;
    }
    for (unsigned c = threadIdx.x; c < dv; c += blockDim.x) {
        float acc = 0.0f;
        for (unsigned i = 0; i < sq; ++i) acc += p[i] * gb[(u64)i * dv + c];
        dv_out[(u64)row * dv + c] = acc;
    }
}
