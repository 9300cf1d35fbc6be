// Attention's core after the qkv product, fused: one block per (batch, head), reading q, k, v
// straight out of qkv [B, S, 3, H, dh] (q first), with QK-norm (LayerNorm of q and k over dh),
// scores scaled by 1/sqrt(dh), softmax over keys and P·v, writing the head's slice of
// out [B, S, H*dh]. For short sequences (S <= 64, dh <= 256, the host checks the shared memory
// fits); the host falls back to the composite of row kernels and gemms otherwise. Every sum
// runs in a fixed order (warp trees or plain loops): two runs give the same bits. Rows of
// [S, dh] arrays in shared memory are ld = dh | 1 floats apart (odd), so the lanes of a warp
// reading one column of different rows hit different banks.
#include "common.cuh"

// Warps per block: one per query row at S = 12 (the per-sample step), so no warp walks two
// rows one after the other (8 warps: 11.1 us forward, 16.9 backward per sample on an H100).
#define ATTN_WARPS 16

// LayerNorm of one dh-wide row by one warp: src -> dst (xhat * w + b when w is not null, else
// xhat); returns rstd. Two passes (mean, then squared deviations), as the CPU reference.
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
        dst[d] = w ? xhat * w[d] + b[d] : xhat;
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
extern "C" __global__ void zc_qk_norm_attention_f32(float* out, const float* qkv,
                                                   const float* qw, const float* qb,
                                                   const float* kw, const float* kb,
                                                   unsigned batch, unsigned seq,
                                                   unsigned heads, unsigned dh, float eps) {
    extern __shared__ float sm[];
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
        attn_norm_row(kn + r * ld, src + width, kw, kb, dh, eps, lane);
        for (unsigned d = lane; d < dh; d += 32) vs[r * ld + d] = src[2 * width + d];
    }
    __syncthreads();
    const float scale = 1.0f / sqrtf((float)dh);
    for (unsigned i = warp; i < seq; i += ATTN_WARPS) {
        attn_norm_row(qrow, base + (u64)i * row_stride, qw, qb, dh, eps, lane);
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
            for (unsigned j = 0; j < seq; ++j) acc += prow[j] * vs[j * ld + d];
            dst[d] = acc;
        }
        __syncwarp();
    }
}

// Backward, recomputing the forward. Grid: batch * heads blocks of ATTN_WARPS warps. Writes
// the head's slices of g_qkv [B, S, 3*H*dh] and its row of each of the partials [4, B*H, dh]
// (q weight, q bias, k weight, k bias gradients of this head; the host sums the rows of each
// in order, parameter-major so that each parameter's rows are one dense block the column
// reduction can add straight into that parameter's gradient buffer).
// Shared memory (floats): qhat, khat, v (later dkn), go (later dqn) [S*ld each], P and dS
// [S*S each], q and k rstd [S each], qn and kn [S*ld each].
extern "C" __global__ void zc_qk_norm_attention_backward_f32(
    float* g_qkv, float* partials, const float* g, const float* qkv, const float* qw,
    const float* qb, const float* kw, const float* kb, unsigned batch, unsigned seq,
    unsigned heads, unsigned dh, float eps) {
    extern __shared__ float sm[];
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
        float rq = attn_norm_row(qhat + r * ld, src, nullptr, nullptr, dh, eps, lane);
        float rk = attn_norm_row(khat + r * ld, src + width, nullptr, nullptr, dh, eps, lane);
        if (lane == 0) {
            qrstd[r] = rq;
            krstd[r] = rk;
        }
        for (unsigned d = lane; d < dh; d += 32) {
            qn[r * ld + d] = qhat[r * ld + d] * qw[d] + qb[d];
            kn[r * ld + d] = khat[r * ld + d] * kw[d] + kb[d];
            vs[r * ld + d] = src[2 * width + d];
            go[r * ld + d] = gin[(u64)r * width + d];
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
        for (unsigned i = 0; i < seq; ++i) acc += p[i * seq + j] * go[i * ld + d];
        gbase[(u64)j * row_stride + 2 * width + d] = acc;
    }
    for (unsigned e = threadIdx.x; e < ss; e += blockDim.x) {
        unsigned i = e / seq, j = e % seq;
        float acc = 0.0f;
        for (unsigned d = 0; d < dh; ++d) acc += go[i * ld + d] * vs[j * ld + d];
        ds[e] = acc;
    }
    __syncthreads();
    // dS = P * (dP - rowsum(P * dP)) * scale, one warp per row.
    for (unsigned i = warp; i < seq; i += ATTN_WARPS) {
        float dot = 0.0f;
        for (unsigned j = lane; j < seq; j += 32) dot += p[i * seq + j] * ds[i * seq + j];
        dot = warp_sum(dot);
        for (unsigned j = lane; j < seq; j += 32) {
            float pj = p[i * seq + j];
            ds[i * seq + j] = pj * (ds[i * seq + j] - dot) * scale;
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
