// LayerNorm's backward with its weight's and bias's gradients: the input gradient (plus the
// residual stream's gradient), dw += sum_rows g * xhat and db += sum_rows g. For few rows (one
// sample's) in one launch; for a batch's, chunks of rows whose sums one column reduction
// finishes (two launches). Without this the backward is the row kernel writing g * xhat, then
// a column reduction per parameter (three launches for a sample, five for a batch), each a
// dependent node of a captured graph.
//
// Blocks split the columns; every block first recomputes the per-row sums of LN' over the
// full rows it needs (rows are few, so the redundant reads are cheap), in the same lane order
// and warp tree as layer_norm_backward_row (common.cuh), so the input gradient has the same
// arithmetic as zc_layer_norm_backward_add_rows_f32. Then one thread per column walks the rows
// in row order: it writes the input gradient and sums g * xhat and g, and adds the sums into
// dw and db. Each element has one writer and every sum a fixed order: no atomics, reruns are
// bitwise equal.
#include "common.cuh"

// Threads per block (LN_PARAMS_THREADS in cuda/norm_params.rs) and the most rows a launch takes
// (LN_PARAMS_MAX_ROWS there): the per-row sums live in shared memory.
#define LN_PARAMS_THREADS 128
#define LN_PARAMS_WARPS (LN_PARAMS_THREADS / 32)
#define LN_PARAMS_MAX_ROWS 32

// gx [rows, n] (written when want_gx), dw [n] and db [n] (added into when has_dw / has_db),
// from g, x (and residual when has_residual) dense [rows, n], mean and rstd [rows], and the
// weight [n] when has_weight. Needs blocks of LN_PARAMS_THREADS threads; the grid is
// grid-strided over the columns (x) and takes LN_PARAMS_MAX_ROWS rows per block row (y).
//
// A batch's rows (more than LN_PARAMS_MAX_ROWS) come with `part` [2, gridDim.y, n]: block row c
// writes its chunk's sums there (g * xhat at part[c * n + j], g at part[(gridDim.y + c) * n +
// j]) instead of adding into dw and db, and one column reduction over the chunks finishes
// them (cuda/norm_params.rs). Without `part` the grid has one block row and rows <=
// LN_PARAMS_MAX_ROWS.
extern "C" __global__ void zc_layer_norm_backward_params_f32(
    float* __restrict__ gx, float* __restrict__ dw, float* __restrict__ db,
    const float* __restrict__ g, const float* __restrict__ residual,
    const float* __restrict__ x, const float* __restrict__ mean,
    const float* __restrict__ rstd, const float* __restrict__ weight, unsigned has_weight,
    unsigned has_residual, unsigned want_gx, unsigned has_dw, unsigned has_db, u64 all_rows,
    u64 n, float* __restrict__ part) {
    __shared__ float m1s[LN_PARAMS_MAX_ROWS];
    __shared__ float m2s[LN_PARAMS_MAX_ROWS];
    const unsigned lane = threadIdx.x % 32;
    const unsigned warp = threadIdx.x / 32;
    // This block row's chunk: the kernel below indexes rows from it.
    const u64 first = (u64)blockIdx.y * LN_PARAMS_MAX_ROWS;
    if (first >= all_rows) return;
    const u64 rows = min((u64)LN_PARAMS_MAX_ROWS, all_rows - first);
    g += first * n;
    x += first * n;
    mean += first;
    rstd += first;
    if (has_residual) residual += first * n;
    if (want_gx) gx += first * n;
    if (want_gx) {
        for (u64 row = warp; row < rows; row += LN_PARAMS_WARPS) {
            const float* gr = g + row * n;
            const float* xr = x + row * n;
            const float mu = mean[row];
            const float rs = rstd[row];
            float s1 = 0.0f;
            float s2 = 0.0f;
            for (u64 j = lane; j < n; j += 32) {
                float xh = (xr[j] - mu) * rs;
                float gh = has_weight ? gr[j] * weight[j] : gr[j];
                s1 += gh;
                s2 += gh * xh;
            }
            float m1 = warp_sum(s1) / (float)n;
            float m2 = warp_sum(s2) / (float)n;
            if (lane == 0) {
                m1s[row] = m1;
                m2s[row] = m2;
            }
        }
        __syncthreads();
    }
    for (u64 j = (u64)blockIdx.x * LN_PARAMS_THREADS + threadIdx.x; j < n;
         j += (u64)gridDim.x * LN_PARAMS_THREADS) {
        const float w = has_weight ? weight[j] : 1.0f;
        float sw = 0.0f;
        float sb = 0.0f;
        // The buffers do not alias (validate refuses it: hence __restrict__), so the loads
        // of several rows go out before the first is used.
#pragma unroll 4
        for (u64 row = 0; row < rows; ++row) {
            const u64 i = row * n + j;
            const float rs = rstd[row];
            const float xh = (x[i] - mean[row]) * rs;
            const float gj = g[i];
            if (want_gx) {
                float gh = has_weight ? gj * w : gj;
                float v = ((gh - m1s[row]) - xh * m2s[row]) * rs;
                if (has_residual) v += residual[i];
                gx[i] = v;
            }
            sw += gj * xh;
            sb += gj;
        }
        if (part) {
            part[(u64)blockIdx.y * n + j] = sw;
            part[((u64)gridDim.y + blockIdx.y) * n + j] = sb;
        } else {
            if (has_dw) dw[j] += sw;
            if (has_db) db[j] += sb;
        }
    }
}

// Threads per block of zc_layer_norm_backward_partials_f32 (LN_PARTIALS_THREADS in
// cuda/norm_params.rs), the widest row it takes (LN_PARTIALS_MAX_N) and its column slots per
// lane.
#define LN_PARTIALS_THREADS 256
#define LN_PARTIALS_WARPS (LN_PARTIALS_THREADS / 32)
#define LN_PARTIALS_MAX_N 512
#define LN_PARTIALS_SLOTS (LN_PARTIALS_MAX_N / 32)

// The end of the batch kernel: each warp's column sums (a lane's columns lane + 32 k) through
// shared memory, added in warp order into the block's row of part [2, gridDim.x, n] (g * xhat
// at part[b * n + j], g at part[(gridDim.x + b) * n + j]).
template <int SLOTS>
__device__ __forceinline__ void ln_partials_store(float* __restrict__ part,
                                                  const float (&sw)[SLOTS],
                                                  const float (&sb)[SLOTS], u64 n,
                                                  float (*sums)[2 * LN_PARTIALS_MAX_N]) {
    const unsigned lane = threadIdx.x % 32;
    const unsigned warp = threadIdx.x / 32;
#pragma unroll
    for (int k = 0; k < SLOTS; ++k) {
        const u64 j = lane + 32 * (u64)k;
        if (j < n) {
            sums[warp][j] = sw[k];
            sums[warp][n + j] = sb[k];
        }
    }
    __syncthreads();
    for (u64 j = threadIdx.x; j < 2 * n; j += LN_PARTIALS_THREADS) {
        float acc = 0.0f;
        for (int w = 0; w < LN_PARTIALS_WARPS; ++w) acc += sums[w][j];
        // Columns j < n hold g * xhat's sums, the rest g's.
        const u64 half = j < n ? 0 : 1;
        const u64 col = j < n ? j : j - n;
        part[(half * gridDim.x + blockIdx.x) * n + col] = acc;
    }
}

// One row of the batch kernel as a lane holds it: g, x and the residual stream's gradient at
// columns lane + 32 k, and the row's mean and rstd.
template <int SLOTS>
struct LnRowLanes {
    float g[SLOTS];
    float x[SLOTS];
    float r[SLOTS];
    float mu;
    float rs;
};

template <int SLOTS>
__device__ __forceinline__ void ln_row_load(LnRowLanes<SLOTS>& t, const float* __restrict__ g,
                                            const float* __restrict__ x,
                                            const float* __restrict__ residual,
                                            const float* __restrict__ mean,
                                            const float* __restrict__ rstd, u64 row, u64 n,
                                            unsigned lane, bool with_residual) {
    t.mu = mean[row];
    t.rs = rstd[row];
#pragma unroll
    for (int k = 0; k < SLOTS; ++k) {
        const u64 j = lane + 32 * (u64)k;
        t.g[k] = j < n ? g[row * n + j] : 0.0f;
        t.x[k] = j < n ? x[row * n + j] : 0.0f;
        t.r[k] = j < n && with_residual ? residual[row * n + j] : 0.0f;
    }
}

// A batch's LayerNorm backward (rows in blocks of `rows_per_block`), the form the chunked path
// above takes for rows up to LN_PARTIALS_MAX_N wide: one warp a row, as the row kernel, so
// many more rows are in flight. Warp w of block b walks rows b * rows_per_block + w, + 8, ...
// in order, writes each row's input gradient (same arithmetic and lane order as
// layer_norm_backward_row) and keeps its columns' sums of g * xhat and g in registers; the
// block then adds its warps' sums in warp order and writes them to part [2, gridDim.x, n]
// (g * xhat at part[b * n + j], g at part[(gridDim.x + b) * n + j]). Fixed orders throughout:
// reruns are bitwise equal. Rows up to 256 wide (8 slots a lane) load the warp's next row
// while this one's arithmetic runs: a warp's rows were a chain of dependent memory round
// trips, and this kernel took 7.1 us where it takes 4.2 (H100, [3072, 256]).
template <int SLOTS>
__device__ __forceinline__ void ln_backward_partials_prefetch(
    float* __restrict__ gx, float* __restrict__ part, const float* __restrict__ g,
    const float* __restrict__ residual, const float* __restrict__ x,
    const float* __restrict__ mean, const float* __restrict__ rstd,
    const float* __restrict__ weight, bool has_weight, bool has_residual, bool want_gx, u64 rows,
    u64 n, u64 rows_per_block, float (*sums)[2 * LN_PARTIALS_MAX_N]) {
    const unsigned lane = threadIdx.x % 32;
    const unsigned warp = threadIdx.x / 32;
    float sw[SLOTS];
    float sb[SLOTS];
#pragma unroll
    for (int k = 0; k < SLOTS; ++k) {
        sw[k] = 0.0f;
        sb[k] = 0.0f;
    }
    const bool with_residual = want_gx && has_residual;
    const u64 first = (u64)blockIdx.x * rows_per_block;
    const u64 last = min(first + rows_per_block, rows);
    LnRowLanes<SLOTS> cur;
    u64 row = first + warp;
    if (row < last) ln_row_load(cur, g, x, residual, mean, rstd, row, n, lane, with_residual);
    for (; row < last; row += LN_PARTIALS_WARPS) {
        LnRowLanes<SLOTS> next;
        if (row + LN_PARTIALS_WARPS < last)
            ln_row_load(next, g, x, residual, mean, rstd, row + LN_PARTIALS_WARPS, n, lane,
                        with_residual);
        const float mu = cur.mu;
        const float rs = cur.rs;
        float xh[SLOTS];
#pragma unroll
        for (int k = 0; k < SLOTS; ++k) {
            const u64 j = lane + 32 * (u64)k;
            xh[k] = j < n ? (cur.x[k] - mu) * rs : 0.0f;
        }
        if (want_gx) {
            // The sums in layer_norm_backward_row's lane order (j ascending), then its warp tree.
            float s1 = 0.0f;
            float s2 = 0.0f;
#pragma unroll
            for (int k = 0; k < SLOTS; ++k) {
                const u64 j = lane + 32 * (u64)k;
                if (j < n) {
                    float gh = has_weight ? cur.g[k] * weight[j] : cur.g[k];
                    s1 += gh;
                    s2 += gh * xh[k];
                }
            }
            const float m1 = warp_sum(s1) / (float)n;
            const float m2 = warp_sum(s2) / (float)n;
#pragma unroll
            for (int k = 0; k < SLOTS; ++k) {
                const u64 j = lane + 32 * (u64)k;
                if (j < n) {
                    float gh = has_weight ? cur.g[k] * weight[j] : cur.g[k];
                    float v = ((gh - m1) - xh[k] * m2) * rs;
                    if (has_residual) v += cur.r[k];
                    gx[row * n + j] = v;
                }
            }
        }
#pragma unroll
        for (int k = 0; k < SLOTS; ++k) {
            sw[k] += cur.g[k] * xh[k];
            sb[k] += cur.g[k];
        }
        cur = next;
    }
    ln_partials_store(part, sw, sb, n, sums);
}

// Rows wider than 256: the loads of a row, then its arithmetic (no prefetch: twice the
// registers would cost occupancy at 16 slots a lane).
__device__ __forceinline__ void ln_backward_partials_wide(
    float* __restrict__ gx, float* __restrict__ part, const float* __restrict__ g,
    const float* __restrict__ residual, const float* __restrict__ x,
    const float* __restrict__ mean, const float* __restrict__ rstd,
    const float* __restrict__ weight, unsigned has_weight, unsigned has_residual,
    unsigned want_gx, u64 rows, u64 n, u64 rows_per_block,
    float (*sums)[2 * LN_PARTIALS_MAX_N]) {
    const unsigned lane = threadIdx.x % 32;
    const unsigned warp = threadIdx.x / 32;
    float sw[LN_PARTIALS_SLOTS];
    float sb[LN_PARTIALS_SLOTS];
#pragma unroll
    for (int k = 0; k < LN_PARTIALS_SLOTS; ++k) {
        sw[k] = 0.0f;
        sb[k] = 0.0f;
    }
    const u64 first = (u64)blockIdx.x * rows_per_block;
    const u64 last = min(first + rows_per_block, rows);
    for (u64 row = first + warp; row < last; row += LN_PARTIALS_WARPS) {
        const float* gr = g + row * n;
        const float* xr = x + row * n;
        const float mu = mean[row];
        const float rs = rstd[row];
        // The row's g and xhat in registers: every load of the row goes out at once.
        float gv[LN_PARTIALS_SLOTS];
        float xh[LN_PARTIALS_SLOTS];
#pragma unroll
        for (int k = 0; k < LN_PARTIALS_SLOTS; ++k) {
            const u64 j = lane + 32 * (u64)k;
            gv[k] = j < n ? gr[j] : 0.0f;
            xh[k] = j < n ? (xr[j] - mu) * rs : 0.0f;
        }
        if (want_gx) {
            // The sums in layer_norm_backward_row's lane order (j ascending), then its warp tree.
            float s1 = 0.0f;
            float s2 = 0.0f;
#pragma unroll
            for (int k = 0; k < LN_PARTIALS_SLOTS; ++k) {
                const u64 j = lane + 32 * (u64)k;
                if (j < n) {
                    float gh = has_weight ? gv[k] * weight[j] : gv[k];
                    s1 += gh;
                    s2 += gh * xh[k];
                }
            }
            const float m1 = warp_sum(s1) / (float)n;
            const float m2 = warp_sum(s2) / (float)n;
#pragma unroll
            for (int k = 0; k < LN_PARTIALS_SLOTS; ++k) {
                const u64 j = lane + 32 * (u64)k;
                if (j < n) {
                    float gh = has_weight ? gv[k] * weight[j] : gv[k];
                    float v = ((gh - m1) - xh[k] * m2) * rs;
                    if (has_residual) v += residual[row * n + j];
                    gx[row * n + j] = v;
                }
            }
        }
#pragma unroll
        for (int k = 0; k < LN_PARTIALS_SLOTS; ++k) {
            sw[k] += gv[k] * xh[k];
            sb[k] += gv[k];
        }
    }
    ln_partials_store(part, sw, sb, n, sums);
}

extern "C" __global__ void __launch_bounds__(LN_PARTIALS_THREADS) zc_layer_norm_backward_partials_f32(
    float* __restrict__ gx, float* __restrict__ part, const float* __restrict__ g,
    const float* __restrict__ residual, const float* __restrict__ x,
    const float* __restrict__ mean, const float* __restrict__ rstd,
    const float* __restrict__ weight, unsigned has_weight, unsigned has_residual,
    unsigned want_gx, u64 rows, u64 n, u64 rows_per_block) {
    __shared__ float sums[LN_PARTIALS_WARPS][2 * LN_PARTIALS_MAX_N];
    if (n <= LN_PARTIALS_MAX_N / 2)
        ln_backward_partials_prefetch<LN_PARTIALS_SLOTS / 2>(
            gx, part, g, residual, x, mean, rstd, weight, has_weight != 0, has_residual != 0,
            want_gx != 0, rows, n, rows_per_block, sums);
    else
        ln_backward_partials_wide(gx, part, g, residual, x, mean, rstd, weight, has_weight,
                                  has_residual, want_gx, rows, n, rows_per_block, sums);
}
