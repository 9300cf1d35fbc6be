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

__device__ __forceinline__ float apply_act(float v, unsigned act) {
    return act == ACT_TANH ? tanhf(v) : v;
}

// out = act(x + bias) (+ residual) over dense [rows, n] with bias [n]. Threads are (column,
// row) pairs: x over columns, y over rows, both grid-strided, so each thread loads its bias
// element once and no index is divided. When n is a multiple of 4 and every pointer is 16-byte
// aligned, a column is a float4 (one 16-byte load and store per thread and row); otherwise a
// float. The host sizes the grid by the same test (cuda/fused.rs: bias_act_config). The
// residual, when given, is added after the activation: the bits of bias_act then an add.
__device__ __forceinline__ void bias_act_rows(float* out, const float* x, const float* bias,
                                              const float* residual, u64 rows, u64 n,
                                              unsigned act) {
    const bool vec4 =
        (n % 4 == 0) && ((((u64)out | (u64)x | (u64)bias | (u64)residual) & 15) == 0);
    const u64 cols = vec4 ? n / 4 : n;
    const u64 row0 = (u64)blockIdx.y * blockDim.y + threadIdx.y;
    const u64 row_step = (u64)gridDim.y * blockDim.y;
    for (u64 c = (u64)blockIdx.x * blockDim.x + threadIdx.x; c < cols;
         c += (u64)gridDim.x * blockDim.x) {
        if (vec4) {
            const float4 b = reinterpret_cast<const float4*>(bias)[c];
            for (u64 r = row0; r < rows; r += row_step) {
                float4 v = reinterpret_cast<const float4*>(x + r * n)[c];
                v.x = apply_act(v.x + b.x, act);
                v.y = apply_act(v.y + b.y, act);
                v.z = apply_act(v.z + b.z, act);
                v.w = apply_act(v.w + b.w, act);
                if (residual) {
                    const float4 h = reinterpret_cast<const float4*>(residual + r * n)[c];
                    v.x += h.x;
                    v.y += h.y;
                    v.z += h.z;
                    v.w += h.w;
                }
                reinterpret_cast<float4*>(out + r * n)[c] = v;
            }
        } else {
            const float b = bias[c];
            for (u64 r = row0; r < rows; r += row_step) {
                float v = apply_act(x[r * n + c] + b, act);
                if (residual) v += residual[r * n + c];
                out[r * n + c] = v;
            }
        }
    }
}

extern "C" __global__ void zc_bias_act_f32(float* out, const float* x, const float* bias,
                                           u64 rows, u64 n, unsigned act) {
    bias_act_rows(out, x, bias, nullptr, rows, n, act);
}

// act(x + bias) + residual in one launch (a Linear layer's epilogue with the residual stream
// added, where the add was a launch of its own).
extern "C" __global__ void zc_bias_act_add_f32(float* out, const float* x, const float* bias,
                                               const float* residual, u64 rows, u64 n,
                                               unsigned act) {
    bias_act_rows(out, x, bias, residual, rows, n, act);
}

// gx = g * (1 - y * y) over n elements.
extern "C" __global__ void zc_tanh_backward_f32(float* gx, const float* g, const float* y, u64 n) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        float v = y[i];
        gx[i] = g[i] * (1.0f - v * v);
    }
}

// zc_add_layer_norm_rows_f32 for rows up to ADD_LN_REGISTER_N wide: a lane keeps its elements
// of h (columns lane + 32 k) in registers instead of reading them back, and loads the weight
// and bias before it writes. The loop below could not move a load above the previous store
// (h and out may alias a and b as far as the compiler knows), so each element was a memory
// round trip. The sums and every expression are the loop's, in its order.
#define ADD_LN_REGISTER_N 256
__device__ __forceinline__ void add_layer_norm_row_registers(
    float* sum, float* out, float* mean_out, float* rstd_out, const float* a, const float* b,
    const float* weight, const float* bias, unsigned has_weight, unsigned has_bias, u64 rows,
    u64 n, float eps) {
    constexpr int SLOTS = ADD_LN_REGISTER_N / 32;
    const unsigned lane = threadIdx.x % 32;
    float wv[SLOTS], bv[SLOTS];
#pragma unroll
    for (int k = 0; k < SLOTS; ++k) {
        const u64 j = lane + 32 * (u64)k;
        wv[k] = has_weight && j < n ? weight[j] : 0.0f;
        bv[k] = has_bias && j < n ? bias[j] : 0.0f;
    }
    ROW_LOOP(row, rows) {
        const float* ar = a + row * n;
        const float* br = b + row * n;
        float hv[SLOTS];
#pragma unroll
        for (int k = 0; k < SLOTS; ++k) {
            const u64 j = lane + 32 * (u64)k;
            hv[k] = j < n ? ar[j] + br[j] : 0.0f;
        }
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < SLOTS; ++k) {
            const u64 j = lane + 32 * (u64)k;
            if (j < n) {
                sum[row * n + j] = hv[k];
                s += hv[k];
            }
        }
        float mean = warp_sum(s) * (1.0f / (float)n);
        float q = 0.0f;
#pragma unroll
        for (int k = 0; k < SLOTS; ++k) {
            const u64 j = lane + 32 * (u64)k;
            if (j < n) {
                float c = hv[k] - mean;
                q += c * c;
            }
        }
        float var = warp_sum(q) * (1.0f / (float)n);
        float rstd = 1.0f / sqrtf(var + eps);
#pragma unroll
        for (int k = 0; k < SLOTS; ++k) {
            const u64 j = lane + 32 * (u64)k;
            if (j < n) {
                float v = (hv[k] - mean) * rstd;
                if (has_weight) v = v * wv[k];
                if (has_bias) v = v + bv[k];
                out[row * n + j] = v;
            }
        }
        if (lane == 0) {
            mean_out[row] = mean;
            rstd_out[row] = rstd;
        }
    }
}

// h = a + b, then LayerNorm of h (two passes over h, as the LayerNorm rows): one warp per row.
// Each lane reads back only the elements of h it wrote itself.
extern "C" __global__ void zc_add_layer_norm_rows_f32(
    float* sum, float* out, float* mean_out, float* rstd_out, const float* a, const float* b,
    const float* weight, const float* bias, unsigned has_weight, unsigned has_bias, u64 rows,
    u64 n, float eps) {
    unsigned lane = threadIdx.x % 32;
    if (n <= ADD_LN_REGISTER_N) {
        add_layer_norm_row_registers(sum, out, mean_out, rstd_out, a, b, weight, bias,
                                     has_weight, has_bias, rows, n, eps);
        return;
    }
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
        layer_norm_backward_row(gx, g_xhat, g, x, has_residual ? residual : nullptr, row,
                                mean[row], rstd[row], weight, has_weight, want_gx, want_gxhat,
                                n, lane);
    }
}

__device__ __forceinline__ float bce_term(float x, float y) {
    float pos = x > 0.0f ? x : 0.0f;
    return pos - x * y + log1pf(expf(-fabsf(x)));
}

// Threads of every block of the pooled head's kernels (POOL_THREADS in cuda/fused.rs).
#define POOL_THREADS 256
#define POOL_WARPS (POOL_THREADS / 32)

// The sum of one value per thread of a POOL_THREADS block in a fixed order (warp trees, then
// the warp sums in warp order); the result is valid in thread tid 0 (tid: the linear thread
// index). Every thread must call it.
__device__ __forceinline__ float block_sum_fixed(float v, float* part, unsigned tid) {
    v = warp_sum(v);
    if (tid % 32 == 0) part[tid / 32] = v;
    __syncthreads();
    float total = 0.0f;
    if (tid == 0) {
        for (int k = 0; k < POOL_WARPS; ++k) total += part[k];
    }
    __syncthreads();
    return total;
}

// Mean-pool over S of h [B, S, D], the head (w [D], bias [1]) and each sample's BCE term
// against y [B]: logits[b] = bias + (sum_j w[j] * sum_s h[b, s, j]) / S and
// terms[b] = bce(logits[b], y[b]). One block of POOL_THREADS per sample (grid-strided), its
// threads over columns; zc_pool_head_bce_finish_f32 then takes the mean of the terms. A grid
// of one block (the host's choice for small batches: one graph node fewer) takes the mean
// itself into loss[0], exactly as the finishing kernel does.
__device__ __forceinline__ void mean_of_terms(float* loss, const float* terms, u64 batch,
                                              float* part) {
    float acc = 0.0f;
    // __ldcg: the last block of the ticketed kernel reads what other blocks just wrote (from
    // L2, past this SM's L1); the same value and order either way.
    for (u64 b = threadIdx.x; b < batch; b += POOL_THREADS) acc += __ldcg(terms + b);
    float total = block_sum_fixed(acc, part, threadIdx.x);
    if (threadIdx.x == 0) loss[0] = total / (float)batch;
}

__device__ __forceinline__ void pool_head_bce_rows(float* terms, float* logits, const float* h,
                                                   const float* w, const float* bias,
                                                   const float* y, u64 batch, u64 s, u64 d,
                                                   float* part) {
    for (u64 b = blockIdx.x; b < batch; b += gridDim.x) {
        const float* hb = h + b * s * d;
        float acc = 0.0f;
        for (u64 j = threadIdx.x; j < d; j += POOL_THREADS) {
            float col = 0.0f;
            for (u64 i = 0; i < s; ++i) col += hb[i * d + j];
            acc += w[j] * col;
        }
        float total = block_sum_fixed(acc, part, threadIdx.x);
        if (threadIdx.x == 0) {
            float logit = total / (float)s + bias[0];
            logits[b] = logit;
            terms[b] = bce_term(logit, y[b]);
        }
    }
}

// Whether this block is the last of the grid to get here (`ticket` counts arrivals; taken
// after a fence, so every other block's writes are visible to the last one). The last block
// must put the ticket back to 0 for the next launch on the stream.
__device__ __forceinline__ bool last_block(unsigned* ticket, bool* last, unsigned tid) {
    __threadfence();
    __syncthreads();
    const unsigned blocks = gridDim.x * gridDim.y * gridDim.z;
    if (tid == 0) *last = atomicAdd(ticket, 1u) == blocks - 1;
    __syncthreads();
    return *last;
}

extern "C" __global__ void zc_pool_head_bce_f32(float* loss, float* terms, float* logits,
                                                const float* h, const float* w,
                                                const float* bias, const float* y, u64 batch,
                                                u64 s, u64 d) {
    __shared__ float part[POOL_WARPS];
    pool_head_bce_rows(terms, logits, h, w, bias, y, batch, s, d, part);
    // block_sum_fixed ended on a barrier: thread 0's terms are visible to the block.
    if (gridDim.x == 1) mean_of_terms(loss, terms, batch, part);
}

// zc_pool_head_bce_f32 and zc_pool_head_bce_finish_f32 in one launch (a graph node fewer):
// the last block to finish (tickets[0]) takes the mean of the terms, as the finish does.
extern "C" __global__ void zc_pool_head_bce_last_f32(float* loss, float* terms, float* logits,
                                                     unsigned* tickets, const float* h,
                                                     const float* w, const float* bias,
                                                     const float* y, u64 batch, u64 s, u64 d) {
    __shared__ float part[POOL_WARPS];
    __shared__ bool last;
    pool_head_bce_rows(terms, logits, h, w, bias, y, batch, s, d, part);
    if (!last_block(tickets, &last, threadIdx.x)) return;
    mean_of_terms(loss, terms, batch, part);
    if (threadIdx.x == 0) tickets[0] = 0u;
}

// loss[0] = mean of terms[0..B] in a fixed order: one block of POOL_THREADS, thread t adding
// terms t, t + POOL_THREADS, ... in order, then block_sum_fixed.
extern "C" __global__ void zc_pool_head_bce_finish_f32(float* loss, const float* terms,
                                                       u64 batch) {
    __shared__ float part[POOL_WARPS];
    mean_of_terms(loss, terms, batch, part);
}

// The backward of the pooled head from the loss gradient g[0], with
// d_b = g (sigmoid(logits[b]) - y[b]) / B: gh[b, s, j] = d_b w[j] / S for every element, and
// each block's share of gw[j] = sum_b d_b (sum_s h[b, s, j]) / S. Blocks of 32 x 8 threads:
// x over 32 columns (grid-strided), y over the B * S rows of h, block row p (grid y) taking
// rows p * 8 + ty, stepping gridDim.y * 8. The 8 row sums of a column are added in ty order
// and written to partials[p, j]; zc_pool_head_bce_backward_finish_f32 adds them in p order.
// With one block row (the host's choice for small batches: one graph node fewer) the
// partials are gw itself, and block (0, 0) also writes gb[0] (same order as the finish).
// `accumulate` (set by the host only with one block row) adds into gw and gb instead of
// writing them: a parameter's gradient buffer takes the result with no separate add (each
// element has one writer, so no atomics).
__device__ __forceinline__ float bias_grad_sum(const float* g, const float* logits,
                                               const float* y, u64 batch, unsigned tid,
                                               float* part) {
    const float scale = g[0] / (float)batch;
    float acc = 0.0f;
    for (u64 b = tid; b < batch; b += POOL_THREADS) {
        acc += (zc_sigmoid(logits[b]) - y[b]) * scale;
    }
    return block_sum_fixed(acc, part, tid);
}

__device__ __forceinline__ void pool_head_bce_backward_cols(
    float* gh, float* partials, const float* g, const float* h, const float* w,
    const float* logits, const float* y, u64 batch, u64 s, u64 d, unsigned accumulate,
    float (*part)[32]) {
    const float scale = g[0] / (float)batch;
    const float inv_s = 1.0f / (float)s;
    const u64 rows = batch * s;
    for (u64 j0 = (u64)blockIdx.x * 32; j0 < d; j0 += (u64)gridDim.x * 32) {
        const u64 j = j0 + threadIdx.x;
        float acc = 0.0f;
        if (j < d) {
            const float wj = w[j];
            for (u64 r = (u64)blockIdx.y * FUSED_WARPS + threadIdx.y; r < rows;
                 r += (u64)gridDim.y * FUSED_WARPS) {
                const u64 b = r / s;
                const float db = (zc_sigmoid(logits[b]) - y[b]) * scale;
                gh[r * d + j] = db * wj * inv_s;
                acc += db * h[r * d + j];
            }
        }
        part[threadIdx.y][threadIdx.x] = acc;
        __syncthreads();
        if (threadIdx.y == 0 && j < d) {
            float total = 0.0f;
            for (int k = 0; k < FUSED_WARPS; ++k) total += part[k][threadIdx.x];
            // Rounded product first (no fma with the buffer): the same bits as writing the
            // gradient and adding it into the buffer afterwards.
            const float gwj = __fmul_rn(total, inv_s);
            float* dst = partials + (u64)blockIdx.y * d + j;
            *dst = accumulate ? *dst + gwj : gwj;
        }
        __syncthreads();
    }
}

// gw[j] = sum over p < parts of partials[p, j] in p order, for j = first, first + stride, ..
// (__ldcg: the ticketed kernel's last block reads what other blocks just wrote; unrolled so
// the loads are in flight together, the adds still in p order).
__device__ __forceinline__ void pool_head_gw_from_partials(float* gw, const float* partials,
                                                           u64 parts, u64 d, unsigned accumulate,
                                                           u64 first, u64 stride) {
    for (u64 j = first; j < d; j += stride) {
        float total = 0.0f;
#pragma unroll 8
        for (u64 p = 0; p < parts; ++p) total += __ldcg(partials + p * d + j);
        gw[j] = accumulate ? gw[j] + total : total;
    }
}

extern "C" __global__ void zc_pool_head_bce_backward_f32(
    float* gh, float* partials, float* gb, const float* g, const float* h, const float* w,
    const float* logits, const float* y, u64 batch, u64 s, u64 d, unsigned accumulate) {
    __shared__ float part[FUSED_WARPS][32];
    pool_head_bce_backward_cols(gh, partials, g, h, w, logits, y, batch, s, d, accumulate, part);
    if (gridDim.y == 1 && blockIdx.x == 0) {
        __shared__ float bpart[POOL_WARPS];
        const unsigned tid = threadIdx.y * 32 + threadIdx.x;
        float total = bias_grad_sum(g, logits, y, batch, tid, bpart);
        if (tid == 0) gb[0] = accumulate ? gb[0] + total : total;
    }
}

// zc_pool_head_bce_backward_f32 (with several block rows: partials never accumulated) and
// zc_pool_head_bce_backward_finish_f32 in one launch (a graph node fewer): the last block
// to finish (tickets[0]) adds the partials into gw and sums gb exactly as the finish's
// threads do (thread tid of 32 x 8 taking the finish's thread tid's columns and bias share).
extern "C" __global__ void zc_pool_head_bce_backward_last_f32(
    float* gh, float* partials, float* gw, float* gb, unsigned* tickets, const float* g,
    const float* h, const float* w, const float* logits, const float* y, u64 batch, u64 s,
    u64 d, unsigned accumulate) {
    __shared__ float part[FUSED_WARPS][32];
    __shared__ float bpart[POOL_WARPS];
    __shared__ bool last;
    pool_head_bce_backward_cols(gh, partials, g, h, w, logits, y, batch, s, d, 0u, part);
    const unsigned tid = threadIdx.y * 32 + threadIdx.x;
    if (!last_block(tickets, &last, tid)) return;
    pool_head_gw_from_partials(gw, partials, gridDim.y, d, accumulate, tid, POOL_THREADS);
    float total = bias_grad_sum(g, logits, y, batch, tid, bpart);
    if (tid == 0) {
        gb[0] = accumulate ? gb[0] + total : total;
        tickets[0] = 0u;
    }
}

// gw[j] = sum over p < parts of partials[p, j] in p order (threads over columns), and, in
// block 0, gb[0] = sum_b d_b in a fixed order (block_sum_fixed). Blocks of POOL_THREADS.
// `accumulate` adds both into gw and gb (the parameters' gradient buffers) instead.
extern "C" __global__ void zc_pool_head_bce_backward_finish_f32(
    float* gw, float* gb, const float* partials, const float* g, const float* logits,
    const float* y, u64 batch, u64 parts, u64 d, unsigned accumulate) {
    __shared__ float part[POOL_WARPS];
    pool_head_gw_from_partials(gw, partials, parts, d, accumulate,
                               (u64)blockIdx.x * POOL_THREADS + threadIdx.x,
                               (u64)gridDim.x * POOL_THREADS);
    if (blockIdx.x != 0) return;
    float total = bias_grad_sum(g, logits, y, batch, threadIdx.x, part);
    if (threadIdx.x == 0) gb[0] = accumulate ? gb[0] + total : total;
}
