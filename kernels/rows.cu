// Row-wise kernels over the last axis of a dense [rows, n] tensor: reductions, softmax and
// LayerNorm. One warp per row (8 rows per 256-thread block, grid-stride over rows); each lane
// walks the row with stride 32 and the warp combines with shuffles, a tree whose error grows
// with log(n), like the CPU's pairwise sums.
#include "common.cuh"

#define WARPS_PER_BLOCK 8

#define ROW_LOOP(row, rows)                                                                  \
    for (u64 row = (u64)blockIdx.x * WARPS_PER_BLOCK + threadIdx.x / 32; row < (rows);     \
         row += (u64)gridDim.x * WARPS_PER_BLOCK)

// op: 0 sum, 1 mean, 2 max (NaN-propagating). n >= 1.
extern "C" __global__ void zc_reduce_rows_f32(float* out, const float* in, u64 rows, u64 n,
                                              unsigned op) {
    unsigned lane = threadIdx.x % 32;
    ROW_LOOP(row, rows) {
        const float* x = in + row * n;
        float acc;
        if (op == 2) {
            acc = -INFINITY;
            for (u64 j = lane; j < n; j += 32) acc = zc_maximum(acc, x[j]);
            acc = warp_max(acc);
        } else {
            acc = 0.0f;
            for (u64 j = lane; j < n; j += 32) acc += x[j];
            acc = warp_sum(acc);
            if (op == 1) acc = acc / (float)n;
        }
        if (lane == 0) out[row] = acc;
    }
}

// out = exp(x - max) / sum(exp(x - max)) per row; one pass for the running max and rescaled
// sum (online softmax), one to write.
extern "C" __global__ void zc_softmax_rows_f32(float* out, const float* in, u64 rows, u64 n) {
    unsigned lane = threadIdx.x % 32;
    ROW_LOOP(row, rows) {
        const float* x = in + row * n;
        float* y = out + row * n;
        float m = -INFINITY;
        float s = 0.0f;
        for (u64 j = lane; j < n; j += 32) {
            float v = x[j];
            if (v > m) {
                s = s * expf(m - v) + 1.0f;
                m = v;
            } else {
                s += expf(v - m);
            }
        }
        float row_max = warp_max(m);
        // Lanes that saw nothing have m = -inf and s = 0; scaling them by 0 keeps them out.
        float scaled = (s == 0.0f) ? 0.0f : s * expf(m - row_max);
        float sum = warp_sum(scaled);
        float inv = 1.0f / sum;
        if (isnan(row_max)) {
            inv = row_max;
        }
        for (u64 j = lane; j < n; j += 32) y[j] = expf(x[j] - row_max) * inv;
    }
}

// LayerNorm with biased variance, two passes (mean, then squared deviations), as the CPU.
// weight/bias are read only when has_weight/has_bias are set.
extern "C" __global__ void zc_layer_norm_rows_f32(float* out, float* mean_out, float* rstd_out,
                                                  const float* in, const float* weight,
                                                  const float* bias, unsigned has_weight,
                                                  unsigned has_bias, u64 rows, u64 n, float eps) {
    unsigned lane = threadIdx.x % 32;
    ROW_LOOP(row, rows) {
        const float* x = in + row * n;
        float* y = out + row * n;
        float s = 0.0f;
        for (u64 j = lane; j < n; j += 32) s += x[j];
        float mean = warp_sum(s) * (1.0f / (float)n);
        float q = 0.0f;
        for (u64 j = lane; j < n; j += 32) {
            float c = x[j] - mean;
            q += c * c;
        }
        float var = warp_sum(q) * (1.0f / (float)n);
        float rstd = 1.0f / sqrtf(var + eps);
        for (u64 j = lane; j < n; j += 32) {
            float v = (x[j] - mean) * rstd;
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
