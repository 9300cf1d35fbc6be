// Fused epilogues and the fused tail of the model: bias + activation after a product, tanh's
// backward, the residual add with LayerNorm (and its backward with the residual gradient
// added), and mean-pool + head + BCE (forward and backward). Any width; every reduction is a
// fixed-order tree (shuffles, then shared memory in index order), so reruns are bitwise equal.
#include "common.cuh"

#define FUSED_WARPS 8
#define ACT_IDENTITY 0
#define ACT_TANH 1

#define ROW_LOOP(row, rows)                                                                  \
    for (u64 row = (u64)blockIdx.x * FUSED_WARPS + threadIdx.x / 32; row < (rows);         \
         row += (u64)gridDim.x * FUSED_WARPS)

// out = act(x + bias) over dense [rows, n] with bias [n]: one 256-thread block per row tile of
// 8 rows, threads striding the row (no per-element division).
extern "C" __global__ void zc_bias_act_f32(float* out, const float* x, const float* bias,
                                           u64 rows, u64 n, unsigned act) {
    for (u64 row = (u64)blockIdx.x * FUSED_WARPS + threadIdx.y; row < rows;
         row += (u64)gridDim.x * FUSED_WARPS) {
        const float* xr = x + row * n;
        float* yr = out + row * n;
        for (u64 j = threadIdx.x; j < n; j += 32) {
            float v = xr[j] + bias[j];
            yr[j] = act == ACT_TANH ? tanhf(v) : v;
        }
    }
}

// gx = g * (1 - y * y) over n elements.
extern "C" __global__ void zc_tanh_backward_f32(float* gx, const float* g, const float* y, u64 n) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        float v = y[i];
        gx[i] = g[i] * (1.0f - v * v);
    }
}

// h = a + b, then LayerNorm of h (two passes over h, as the LayerNorm rows): one warp per row.
// Each lane reads back only the elements of h it wrote itself.
extern "C" __global__ void zc_add_layer_norm_rows_f32(
    float* sum, float* out, float* mean_out, float* rstd_out, const float* a, const float* b,
    const float* weight, const float* bias, unsigned has_weight, unsigned has_bias, u64 rows,
    u64 n, float eps) {
    unsigned lane = threadIdx.x % 32;
    ROW_LOOP(row, rows) {
        const float* ar = a + row * n;
        const float* br = b + row * n;
        float* h = sum + row * n;
        float* y = out + row * n;
        float s = 0.0f;
        for (u64 j = lane; j < n; j += 32) {
            float v = ar[j] + br[j];
            h[j] = v;
            s += v;
        }
        float mean = warp_sum(s) * (1.0f / (float)n);
        float q = 0.0f;
        for (u64 j = lane; j < n; j += 32) {
            float c = h[j] - mean;
            q += c * c;
        }
        float var = warp_sum(q) * (1.0f / (float)n);
        float rstd = 1.0f / sqrtf(var + eps);
        for (u64 j = lane; j < n; j += 32) {
            float v = (h[j] - mean) * rstd;
            if (has_weight) v = v * weight[j];
            if (has_bias) v = v + bias[j];
            y[j] = v;
        }
        if (lane == 0) {
            mean_out[row] = mean;
            rstd_out[row] = rstd;
        }
    }
}

// LayerNorm's backward rows (zc_layer_norm_backward_rows_f32) with the residual stream's
// gradient added to the input gradient in the same pass: gx = LN'(g) + residual.
extern "C" __global__ void zc_layer_norm_backward_add_rows_f32(
    float* gx, float* g_xhat, const float* g, const float* residual, const float* x,
    const float* mean, const float* rstd, const float* weight, unsigned has_weight,
    unsigned has_residual, unsigned want_gx, unsigned want_gxhat, u64 rows, u64 n) {
    unsigned lane = threadIdx.x % 32;
    ROW_LOOP(row, rows) {
        const float* gr = g + row * n;
        const float* xr = x + row * n;
        const float mu = mean[row];
        const float rs = rstd[row];
        float s1 = 0.0f;
        float s2 = 0.0f;
        for (u64 j = lane; j < n; j += 32) {
            float xh = (xr[j] - mu) * rs;
            float gj = gr[j];
            float gh = has_weight ? gj * weight[j] : gj;
            s1 += gh;
            s2 += gh * xh;
            if (want_gxhat) g_xhat[row * n + j] = gj * xh;
        }
        if (!want_gx) continue;
        float m1 = warp_sum(s1) / (float)n;
        float m2 = warp_sum(s2) / (float)n;
        for (u64 j = lane; j < n; j += 32) {
            float xh = (xr[j] - mu) * rs;
            float gh = has_weight ? gr[j] * weight[j] : gr[j];
            float v = ((gh - m1) - xh * m2) * rs;
            if (has_residual) v += residual[row * n + j];
            gx[row * n + j] = v;
        }
    }
}

__device__ __forceinline__ float bce_term(float x, float y) {
    float pos = x > 0.0f ? x : 0.0f;
    return pos - x * y + log1pf(expf(-fabsf(x)));
}

// Mean-pool over S of h [B, S, D], the head (w [D], bias [1]) and the mean BCE against y [B]:
// logits[b] = bias + (sum_j w[j] * sum_s h[b, s, j]) / S, loss[0] = mean_b bce(logits[b], y[b]).
// One block of POOL_WARPS warps (1024 threads: the whole batch's h is read by one SM, so it
// takes as many loads in flight as a block can hold); warp k takes samples k, k + 32, ...; the
// per-warp loss sums are added in warp order.
#define POOL_WARPS 32
extern "C" __global__ void zc_pool_head_bce_f32(float* loss, float* logits, const float* h,
                                                const float* w, const float* bias,
                                                const float* y, u64 batch, u64 s, u64 d) {
    __shared__ float part[POOL_WARPS];
    const unsigned lane = threadIdx.x % 32;
    const unsigned warp = threadIdx.x / 32;
    float terms = 0.0f;
    for (u64 b = warp; b < batch; b += POOL_WARPS) {
        const float* hb = h + b * s * d;
        float acc = 0.0f;
        for (u64 j = lane; j < d; j += 32) {
            float col = 0.0f;
            for (u64 i = 0; i < s; ++i) col += hb[i * d + j];
            acc += w[j] * col;
        }
        float logit = warp_sum(acc) / (float)s + bias[0];
        if (lane == 0) logits[b] = logit;
        terms += bce_term(logit, y[b]);
    }
    if (lane == 0) part[warp] = terms;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int k = 0; k < POOL_WARPS; ++k) total += part[k];
        loss[0] = total / (float)batch;
    }
}

// The backward of zc_pool_head_bce_f32 from the loss gradient g[0]: with
// d_b = g (sigmoid(logits[b]) - y[b]) / B, gh[b, s, j] = d_b w[j] / S,
// gw[j] = sum_b d_b (sum_s h[b, s, j]) / S and gb[0] = sum_b d_b. Blocks of 32 x 8 threads:
// x over 32 columns, y over samples; every block writes gh for its columns and its share of
// samples (grid y); the blocks of grid row 0 also reduce gw for their columns over all samples
// (8 partial sums per column, added in order) and block (0, 0) reduces gb.
extern "C" __global__ void zc_pool_head_bce_backward_f32(
    float* gh, float* gw, float* gb, const float* g, const float* h, const float* w,
    const float* logits, const float* y, u64 batch, u64 s, u64 d) {
    __shared__ float part[FUSED_WARPS][32];
    const u64 j = (u64)blockIdx.x * 32 + threadIdx.x;
    const float scale = g[0] / (float)batch;
    const float inv_s = 1.0f / (float)s;
    const float wj = j < d ? w[j] : 0.0f;
    for (u64 b = (u64)blockIdx.y * FUSED_WARPS + threadIdx.y; b < batch;
         b += (u64)gridDim.y * FUSED_WARPS) {
        if (j >= d) break;
        float db = (zc_sigmoid(logits[b]) - y[b]) * scale;
        float v = db * wj * inv_s;
        for (u64 i = 0; i < s; ++i) gh[(b * s + i) * d + j] = v;
    }
    if (blockIdx.y != 0) return;
    float acc = 0.0f;
    if (j < d) {
        for (u64 b = threadIdx.y; b < batch; b += FUSED_WARPS) {
            float db = (zc_sigmoid(logits[b]) - y[b]) * scale;
            const float* hb = h + b * s * d;
            float col = 0.0f;
            for (u64 i = 0; i < s; ++i) col += hb[i * d + j];
            acc += db * col * inv_s;
        }
    }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && j < d) {
        float total = 0.0f;
        for (int k = 0; k < FUSED_WARPS; ++k) total += part[k][threadIdx.x];
        gw[j] = total;
    }
    if (blockIdx.x == 0 && threadIdx.y == 1) {
        float sb = 0.0f;
        for (u64 b = threadIdx.x; b < batch; b += 32) {
            sb += (zc_sigmoid(logits[b]) - y[b]) * scale;
        }
        sb = warp_sum(sb);
        if (threadIdx.x == 0) gb[0] = sb;
    }
}
