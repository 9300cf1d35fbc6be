// Attention's core for short sequences (S <= 16) and heads of 32 or 64: the same operation,
// inputs, outputs and launch grid as attention.cu's kernels (one block per (batch, head)), with
// fewer instructions. A lane holds the d-slices d = lane + 32 t (t < DPL, dh = 32 * DPL) of the
// row it works on; every row access is lanes over d (consecutive addresses, no bank conflicts).
// Scores (and in the backward dP) are per-lane partial dot products over the lane's d, summed
// across the warp for all keys at once by a transpose reduction that leaves key j's total in
// the lane pair (2j, 2j + 1). Any number of warps a block (blockDim.x = 32 * W, W <= 32): warp
// w takes rows r with r % W == w, and a row's arithmetic does not depend on W, so the bits do
// not either. Every sum has a fixed order: two runs give the same bits. Against attention.cu
// only the order of the d-sums of the scores and of dP differs (the others run in the same
// order), so the results agree to float32 rounding, not bit for bit. Each kernel has a float32
// entry (`_f32`) and a bf16 one (`_bf16`): the products' operands rounded to bf16 where they
// are made, as attention.cu's bf16 forms do (template parameter BF16).
#include "common.cuh"

#define ATTN_SHORT_MAX_SEQ 16
#define ATTN_FULL 0xffffffffu

// Sum over the warp of 16 per-lane values (one per key); returns the total of key j = lane >> 1
// (both lanes of a pair hold the same bits). Each step halves the values a lane keeps and adds
// its partner's half: 16 shuffles for 16 sums.
__device__ __forceinline__ float attn_keys_sum(const float (&v)[ATTN_SHORT_MAX_SEQ],
                                               unsigned lane) {
    float a[8], b[4], c[2];
    bool up = lane & 16;
#pragma unroll
    for (int t = 0; t < 8; ++t)
        a[t] = (up ? v[t + 8] : v[t]) + __shfl_xor_sync(ATTN_FULL, up ? v[t] : v[t + 8], 16);
    up = lane & 8;
#pragma unroll
    for (int t = 0; t < 4; ++t)
        b[t] = (up ? a[t + 4] : a[t]) + __shfl_xor_sync(ATTN_FULL, up ? a[t] : a[t + 4], 8);
    up = lane & 4;
#pragma unroll
    for (int t = 0; t < 2; ++t)
        c[t] = (up ? b[t + 2] : b[t]) + __shfl_xor_sync(ATTN_FULL, up ? b[t] : b[t + 2], 4);
    up = lane & 2;
    float d = (up ? c[1] : c[0]) + __shfl_xor_sync(ATTN_FULL, up ? c[0] : c[1], 2);
    return d + __shfl_xor_sync(ATTN_FULL, d, 1);
}
// Sum over the 16 distinct keys when lane pairs hold the same value (masks 16..2).
__device__ __forceinline__ float attn_distinct_sum(float v) {
    for (int o = 16; o > 1; o >>= 1) v += __shfl_xor_sync(ATTN_FULL, v, o);
    return v;
}
// LayerNorm statistics of a row held as DPL values a lane: the same sums in the same order as
// attn_norm_row. Writes xhat into x; returns rstd.
template <int DPL>
__device__ __forceinline__ float attn_norm_lanes(float (&x)[DPL], unsigned dh, float eps) {
    float sum = 0.0f;
#pragma unroll
    for (int t = 0; t < DPL; ++t) sum += x[t];
    float mean = warp_sum(sum) / (float)dh;
    float sq = 0.0f;
#pragma unroll
    for (int t = 0; t < DPL; ++t) { float c = x[t] - mean; sq += c * c; }
    float rstd = 1.0f / sqrtf(warp_sum(sq) / (float)dh + eps);
#pragma unroll
    for (int t = 0; t < DPL; ++t) x[t] = (x[t] - mean) * rstd;
    return rstd;
}
template <int DPL>
__device__ __forceinline__ void attn_lanes_load(float (&x)[DPL], const float* src, unsigned lane) {
#pragma unroll
    for (int t = 0; t < DPL; ++t) x[t] = src[lane + 32 * t];
}
// Softmax over the keys of one query row, the score of key lane >> 1 in `s` (lanes past the
// sequence pass valid = false): returns that key's probability. The same operations as
// attn_softmax_row.
__device__ __forceinline__ float attn_softmax_keys(float s, bool valid) {
    float m = warp_max(valid ? s : -INFINITY);
    float e = valid ? expf(s - m) : 0.0f;
    float sum = attn_distinct_sum(e);
    float inv = 1.0f / sum;
    return e * inv;
}

// Forward. Shared (floats): kn (normalised k with its weight and bias) and v [S*dh], filled by
// all warps; then each warp's query rows: q normalised in registers, scores, softmax, P·v.
// The block's key rows into shared memory, a warp a row: kn = LayerNorm(k) * w + b and v, and,
// where the pointers are given (the backward), xhat of k and its rstd.
template <int DPL, bool BF16>
__device__ __forceinline__ void attn_short_keys(float* kn_s, float* v_s, float* khat_s,
                                                float* krs_s, const float* base, u64 row_stride,
                                                unsigned width, const float (&w_k)[DPL],
                                                const float (&b_k)[DPL], unsigned seq,
                                                float eps) {
    const unsigned dh = 32 * DPL;
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    // The warp's next key row is loaded while this one is normalised and stored: its rows
    // were a chain of dependent memory round trips.
    float k[DPL], v[DPL];
    if (warp < seq) {
        attn_lanes_load(k, base + (u64)warp * row_stride + width, lane);
        attn_lanes_load(v, base + (u64)warp * row_stride + 2 * width, lane);
    }
    for (unsigned j = warp; j < seq; j += nw) {
        float k_next[DPL], v_next[DPL];
        if (j + nw < seq) {
            attn_lanes_load(k_next, base + (u64)(j + nw) * row_stride + width, lane);
            attn_lanes_load(v_next, base + (u64)(j + nw) * row_stride + 2 * width, lane);
        }
        float rk = attn_norm_lanes(k, dh, eps);
        if (krs_s && lane == 0) krs_s[j] = rk;
#pragma unroll
        for (int t = 0; t < DPL; ++t) {
            if (khat_s) khat_s[j * dh + lane + 32 * t] = k[t];
            kn_s[j * dh + lane + 32 * t] = zc_operand<BF16>(k[t] * w_k[t] + b_k[t]);
            v_s[j * dh + lane + 32 * t] = zc_operand<BF16>(v[t]);
            k[t] = k_next[t];
            v[t] = v_next[t];
        }
    }
}

// LayerNorm's input gradient of a row held a lane's DPL values at a time: dst = rstd * (dn*w -
// mean(dn*w) - xh * mean(dn*w*xh)), the sums in attention.cu's order (lanes, then the warp tree).
template <int DPL>
__device__ __forceinline__ void attn_norm_backward_lanes(float* dst, const float (&dn)[DPL],
                                                         const float (&xh)[DPL],
                                                         const float (&w)[DPL], float rstd,
                                                         unsigned lane) {
    const unsigned dh = 32 * DPL;
    float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
    for (int t = 0; t < DPL; ++t) {
        float gx = dn[t] * w[t];
        s1 += gx;
        s2 += gx * xh[t];
    }
    float m1 = warp_sum(s1) / (float)dh, m2 = warp_sum(s2) / (float)dh;
#pragma unroll
    for (int t = 0; t < DPL; ++t) dst[lane + 32 * t] = rstd * (dn[t] * w[t] - m1 - xh[t] * m2);
}

template <int DPL, bool BF16>
__device__ __forceinline__ void attn_short_forward(float* out, const float* qkv, const float* qw,
                                                   const float* qb, const float* kw,
                                                   const float* kb, unsigned batch, unsigned seq,
                                                   unsigned heads, float eps) {
    const unsigned dh = 32 * DPL;
    const unsigned bh = blockIdx.x;
    if (bh >= batch * heads) return;
    const unsigned b = bh / heads, h = bh % heads;
    const unsigned width = heads * dh;
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    const u64 row_stride = 3ull * width;
    const float* base = qkv + (u64)b * seq * row_stride + (u64)h * dh;
    float w_q[DPL], b_q[DPL], w_k[DPL], b_k[DPL];
    attn_lanes_load(w_q, qw, lane);
    attn_lanes_load(b_q, qb, lane);
    attn_lanes_load(w_k, kw, lane);
    attn_lanes_load(b_k, kb, lane);
    extern __shared__ float sm[];
    float* kn_s = sm;
    float* v_s = kn_s + seq * dh;
    attn_short_keys<DPL, BF16>(kn_s, v_s, nullptr, nullptr, base, row_stride, width, w_k, b_k,
                               seq, eps);
    __syncthreads();
    const float scale = 1.0f / sqrtf((float)dh);
    const bool valid = (lane >> 1) < seq;
    for (unsigned i = warp; i < seq; i += nw) {
        float q[DPL];
        attn_lanes_load(q, base + (u64)i * row_stride, lane);
        attn_norm_lanes(q, dh, eps);
#pragma unroll
        for (int t = 0; t < DPL; ++t) q[t] = zc_operand<BF16>(q[t] * w_q[t] + b_q[t]);
        float part[ATTN_SHORT_MAX_SEQ];
#pragma unroll
        for (int j = 0; j < ATTN_SHORT_MAX_SEQ; ++j) {
            float s = 0.0f;
            if (j < seq) {
#pragma unroll
                for (int t = 0; t < DPL; ++t) s += q[t] * kn_s[j * dh + lane + 32 * t];
            }
            part[j] = s;
        }
        // The probability as P·v reads it.
        float p = zc_operand<BF16>(attn_softmax_keys(attn_keys_sum(part, lane) * scale, valid));
        float acc[DPL];
#pragma unroll
        for (int t = 0; t < DPL; ++t) acc[t] = 0.0f;
#pragma unroll
        for (int j = 0; j < ATTN_SHORT_MAX_SEQ; ++j) {
            if (j < seq) {
                float pj = __shfl_sync(ATTN_FULL, p, 2 * j);
#pragma unroll
                for (int t = 0; t < DPL; ++t) acc[t] += pj * v_s[j * dh + lane + 32 * t];
            }
        }
        float* dst = out + ((u64)b * seq + i) * width + (u64)h * dh;
#pragma unroll
        for (int t = 0; t < DPL; ++t) dst[lane + 32 * t] = acc[t];
    }
}

// Backward, recomputing the forward. Shared (floats): qn, go, qhat, dqn, khat, dkn, kn, v
// [S*dh each], P and dS [S*S], k's rstd [S]. Query rows first (P, dP, dS in the key lanes,
// dqn = dS·kn, q's LayerNorm input gradient), then key rows (dv = Pᵀ·go, dkn = dSᵀ·qn, k's
// input gradient), then the parameter partials as attention.cu writes them.
template <int DPL, bool BF16>
__device__ __forceinline__ void attn_short_backward(float* g_qkv, float* partials, const float* g,
                                                    const float* qkv, const float* qw,
                                                    const float* qb, const float* kw,
                                                    const float* kb, unsigned batch, unsigned seq,
                                                    unsigned heads, float eps) {
    extern __shared__ float sm[];
    const unsigned dh = 32 * DPL;
    const unsigned bh = blockIdx.x;
    if (bh >= batch * heads) return;
    const unsigned b = bh / heads, h = bh % heads;
    const unsigned width = heads * dh;
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    const unsigned sd = seq * dh;
    float* qn_s = sm;
    float* go_s = qn_s + sd;
    float* qhat_s = go_s + sd;
    float* dqn_s = qhat_s + sd;
    float* khat_s = dqn_s + sd;
    float* dkn_s = khat_s + sd;
    float* p_s = dkn_s + sd;
    float* ds_s = p_s + seq * seq;
    float* kn_s = ds_s + seq * seq;
    float* v_s = kn_s + sd;
    float* krs_s = v_s + sd;
    const u64 row_stride = 3ull * width;
    const float* base = qkv + (u64)b * seq * row_stride + (u64)h * dh;
    float* gbase = g_qkv + (u64)b * seq * row_stride + (u64)h * dh;
    const float* gin = g + (u64)b * seq * width + (u64)h * dh;
    float w_q[DPL], b_q[DPL], w_k[DPL], b_k[DPL];
    attn_lanes_load(w_q, qw, lane);
    attn_lanes_load(b_q, qb, lane);
    attn_lanes_load(w_k, kw, lane);
    attn_lanes_load(b_k, kb, lane);
    // The warp's first query row and its gradient in flight while the key rows are stored, the
    // next ones while this one runs (23.5 -> 19.7 us at 1024 heads of 64, S = 12, on an H100).
    float qh[DPL], go[DPL];
    if (warp < seq) {
        attn_lanes_load(qh, base + (u64)warp * row_stride, lane);
        attn_lanes_load(go, gin + (u64)warp * width, lane);
    }
    attn_short_keys<DPL, BF16>(kn_s, v_s, khat_s, krs_s, base, row_stride, width, w_k, b_k,
                               seq, eps);
    __syncthreads();
    const float scale = 1.0f / sqrtf((float)dh);
    const bool valid = (lane >> 1) < seq;
    const unsigned jo = lane >> 1;
    for (unsigned i = warp; i < seq; i += nw) {
        float qn[DPL], qh_next[DPL], go_next[DPL];
        if (i + nw < seq) {
            attn_lanes_load(qh_next, base + (u64)(i + nw) * row_stride, lane);
            attn_lanes_load(go_next, gin + (u64)(i + nw) * width, lane);
        }
        float rq = attn_norm_lanes(qh, dh, eps);
#pragma unroll
        for (int t = 0; t < DPL; ++t) {
            // qn and go are read only as products' operands: rounded in the bf16 form.
            qn[t] = zc_operand<BF16>(qh[t] * w_q[t] + b_q[t]);
            go[t] = zc_operand<BF16>(go[t]);
            qn_s[i * dh + lane + 32 * t] = qn[t];
            go_s[i * dh + lane + 32 * t] = go[t];
            qhat_s[i * dh + lane + 32 * t] = qh[t];
        }
        float ps[ATTN_SHORT_MAX_SEQ], pd[ATTN_SHORT_MAX_SEQ];
#pragma unroll
        for (int j = 0; j < ATTN_SHORT_MAX_SEQ; ++j) {
            float s = 0.0f, d = 0.0f;
#pragma unroll
            for (int t = 0; t < DPL; ++t) {
                if (j < seq) {
                    s += qn[t] * kn_s[j * dh + lane + 32 * t];
                    d += go[t] * v_s[j * dh + lane + 32 * t];
                }
            }
            ps[j] = s;
            pd[j] = d;
        }
        float p = attn_softmax_keys(attn_keys_sum(ps, lane) * scale, valid);
        float dp = attn_keys_sum(pd, lane);
        float dot = attn_distinct_sum(valid ? p * dp : 0.0f);
        // The softmax backward reads the float32 P; P (for dv = Pᵀ·go) and dS (for dq and dk)
        // are stored as the products read them.
        float ds = zc_operand<BF16>(p * (dp - dot) * scale);
        if (valid && !(lane & 1)) {
            p_s[i * seq + jo] = zc_operand<BF16>(p);
            ds_s[i * seq + jo] = ds;
        }
        float dq[DPL];
#pragma unroll
        for (int t = 0; t < DPL; ++t) dq[t] = 0.0f;
#pragma unroll
        for (int j = 0; j < ATTN_SHORT_MAX_SEQ; ++j) {
            if (j < seq) {
                float dsj = __shfl_sync(ATTN_FULL, ds, 2 * j);
#pragma unroll
                for (int t = 0; t < DPL; ++t) dq[t] += dsj * kn_s[j * dh + lane + 32 * t];
            }
        }
#pragma unroll
        for (int t = 0; t < DPL; ++t) dqn_s[i * dh + lane + 32 * t] = dq[t];
        attn_norm_backward_lanes<DPL>(gbase + (u64)i * row_stride, dq, qh, w_q, rq, lane);
#pragma unroll
        for (int t = 0; t < DPL; ++t) {
            qh[t] = qh_next[t];
            go[t] = go_next[t];
        }
    }
    __syncthreads();
    // Key rows: dv = Pᵀ·go, dkn = dSᵀ·qn, then k's LayerNorm input gradient.
    for (unsigned j = warp; j < seq; j += nw) {
        float dv[DPL], dk[DPL], kh[DPL];
#pragma unroll
        for (int t = 0; t < DPL; ++t) {
            dv[t] = 0.0f;
            dk[t] = 0.0f;
            kh[t] = khat_s[j * dh + lane + 32 * t];
        }
        for (unsigned i = 0; i < seq; ++i) {
            float pij = p_s[i * seq + j], dsij = ds_s[i * seq + j];
#pragma unroll
            for (int t = 0; t < DPL; ++t) {
                dv[t] += pij * go_s[i * dh + lane + 32 * t];
                dk[t] += dsij * qn_s[i * dh + lane + 32 * t];
            }
        }
        float* dst = gbase + (u64)j * row_stride;
#pragma unroll
        for (int t = 0; t < DPL; ++t) {
            dkn_s[j * dh + lane + 32 * t] = dk[t];
            dst[2 * width + lane + 32 * t] = dv[t];
        }
        attn_norm_backward_lanes<DPL>(dst + width, dk, kh, w_k, krs_s[j], lane);
    }
    __syncthreads();
    const u64 pstride = (u64)batch * heads * dh;
    float* part = partials + (u64)bh * dh;
    for (unsigned d = threadIdx.x; d < dh; d += blockDim.x) {
        float gwq = 0.0f, gbq = 0.0f, gwk = 0.0f, gbk = 0.0f;
        for (unsigned i = 0; i < seq; ++i) {
            gwq += dqn_s[i * dh + d] * qhat_s[i * dh + d];
            gbq += dqn_s[i * dh + d];
            gwk += dkn_s[i * dh + d] * khat_s[i * dh + d];
            gbk += dkn_s[i * dh + d];
        }
        part[d] = gwq;
        part[pstride + d] = gbq;
        part[2 * pstride + d] = gwk;
        part[3 * pstride + d] = gbk;
    }
}

// The entries take attention.cu's parameter lists (dh included, which must be 32 * DPL: the
// host launches these only for such heads); SUFFIX names the form (f32 or bf16).
#define ATTN_SHORT_ENTRY(DH, DPL, SUFFIX, BF16)                                                \
    extern "C" __global__ void zc_qk_norm_attention_dh##DH##_##SUFFIX(                         \
        float* out, const float* qkv, const float* qw, const float* qb, const float* kw,      \
        const float* kb, unsigned batch, unsigned seq, unsigned heads, unsigned dh,           \
        float eps) {                                                                           \
        if (dh != DH || seq > ATTN_SHORT_MAX_SEQ) return;                                      \
        attn_short_forward<DPL, BF16>(out, qkv, qw, qb, kw, kb, batch, seq, heads, eps);       \
    }                                                                                          \
    extern "C" __global__ void zc_qk_norm_attention_backward_dh##DH##_##SUFFIX(                \
        float* g_qkv, float* partials, const float* g, const float* qkv, const float* qw,     \
        const float* qb, const float* kw, const float* kb, unsigned batch, unsigned seq,      \
        unsigned heads, unsigned dh, float eps) {                                              \
        if (dh != DH || seq > ATTN_SHORT_MAX_SEQ) return;                                      \
        attn_short_backward<DPL, BF16>(g_qkv, partials, g, qkv, qw, qb, kw, kb, batch, seq,    \
                                       heads, eps);                                            \
    }
ATTN_SHORT_ENTRY(32, 1, f32, false)
ATTN_SHORT_ENTRY(64, 2, f32, false)
ATTN_SHORT_ENTRY(32, 1, bf16, true)
ATTN_SHORT_ENTRY(64, 2, bf16, true)
