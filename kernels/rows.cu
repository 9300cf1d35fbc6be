// Row-wise kernels over the last axis of a dense [rows, n] tensor: reductions, softmax and
// LayerNorm. One warp per row (8 rows per 256-thread block, grid-stride over rows); each lane
// walks the row with stride 32 and the warp combines with shuffles, a tree whose error grows
// with log(n), like the CPU's pairwise sums. Softmax and LayerNorm also have register-resident
// variants for narrow rows (see "Rows in registers" below).
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

// First pass over few long rows of a dense [rows, n] (a whole-tensor sum, e.g. a gradient's
// squared norm, would otherwise be one warp walking millions of elements): block (p, r) of
// 256 threads reduces segment p (`seg` elements) of row r and writes its partial to
// out[p * rows + r]; the host reduces the [parts, rows] partials with zc_reduce_cols_f32.
// op: 2 max (NaN-propagating), else sum.
extern "C" __global__ void zc_reduce_rows_split_f32(float* out, const float* in, u64 rows, u64 n,
                                                    u64 seg, unsigned op) {
    __shared__ float part[WARPS_PER_BLOCK];
    const bool is_max = op == 2;
    const unsigned lane = threadIdx.x % 32;
    const unsigned warp = threadIdx.x / 32;
    const u64 j0 = (u64)blockIdx.x * seg;
    const u64 j1 = min(j0 + seg, n);
    for (u64 row = blockIdx.y; row < rows; row += gridDim.y) {
        const float* x = in + row * n;
        float acc = is_max ? -INFINITY : 0.0f;
        for (u64 j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
            acc = is_max ? zc_maximum(acc, x[j]) : acc + x[j];
        }
        acc = is_max ? warp_max(acc) : warp_sum(acc);
        if (lane == 0) part[warp] = acc;
        __syncthreads();
        if (warp == 0) {
            acc = lane < WARPS_PER_BLOCK ? part[lane] : (is_max ? -INFINITY : 0.0f);
            acc = is_max ? warp_max(acc) : warp_sum(acc);
            if (lane == 0) out[(u64)blockIdx.x * rows + row] = acc;
        }
        __syncthreads();
    }
}

// Reduces the middle axis of a dense [outer, n, inner] tensor (inner > 1: a reduction over a
// leading or batch axis, e.g. a bias gradient) without transposing it first. Block of 256
// threads = 32 adjacent columns (coalesced loads) x 8 row lanes; blockIdx.x walks the
// (outer, 32-column tile) pairs, blockIdx.y the chunks of `chunk` rows. Rows of a chunk are
// read by the 8 row lanes in turn and combined through shared memory, and chunk c writes its
// result to out + c * outer * inner, so a reduction with several chunks leaves a
// [chunks, outer * inner] tensor of partials that the host reduces again (same kernel), in a
// fixed order: no atomics, the same bits on every run. op: 2 max (NaN-propagating), else sum;
// sums are divided by `div` (n for a mean's last pass, else 1). op 3 sums and adds the result
// into `out` (out += sum / div: a parameter gradient accumulated in place); the host passes it
// only to a single-chunk pass (gridDim.y == 1).
extern "C" __global__ void zc_reduce_cols_f32(float* out, const float* in, u64 outer, u64 n,
                                              u64 inner, u64 chunk, unsigned op, float div) {
    __shared__ float part[WARPS_PER_BLOCK][33];
    const unsigned tx = threadIdx.x % 32;
    const unsigned ty = threadIdx.x / 32;
    const u64 tiles = (inner + 31) / 32;
    const u64 r0 = (u64)blockIdx.y * chunk;
    const u64 r1 = min(r0 + chunk, n);
    const bool is_max = op == 2;
    for (u64 t = blockIdx.x; t < outer * tiles; t += gridDim.x) {
        const u64 o = t / tiles;
        const u64 col = (t % tiles) * 32 + tx;
        float acc = is_max ? -INFINITY : 0.0f;
        if (col < inner) {
            const float* x = in + o * n * inner + col;
#pragma unroll 8
            for (u64 r = r0 + ty; r < r1; r += WARPS_PER_BLOCK) {
                float v = x[r * inner];
                acc = is_max ? zc_maximum(acc, v) : acc + v;
            }
        }
        part[ty][tx] = acc;
        __syncthreads();
        if (ty == 0 && col < inner) {
            for (int k = 1; k < WARPS_PER_BLOCK; ++k) {
                acc = is_max ? zc_maximum(acc, part[k][tx]) : acc + part[k][tx];
            }
            float* dst = out + (u64)blockIdx.y * outer * inner + o * inner + col;
            *dst = is_max ? acc : (op == 3 ? *dst + acc / div : acc / div);
        }
        __syncthreads();
    }
}

// zc_reduce_cols_f32's two passes in one launch (a graph node and a launch gap fewer): block
// (t, c) of a grid (outer * tiles, chunks) reduces chunk c of column tile t into
// partials[c, outer * inner] exactly as the first pass does, and the last block of tile t to
// finish (a ticket per tile, counted with an atomic after a fence: the classic "last block"
// reduction) adds the tile's chunks exactly as the second pass does (8 row lanes over the
// chunks in order, then the lanes in order): the same bits as the two launches, whichever
// block comes last. It leaves its ticket at 0 for the next launch on the stream, so the
// host's ticket array (zeroed once) never needs clearing. The host takes this path only for
// one tile per block (grid.x == outer * tiles) and at most 256 chunks.
__device__ __forceinline__ float cols_tile_sum(const float* x, u64 stride, u64 r0, u64 r1,
                                               bool is_max, bool through_l2) {
    const unsigned ty = threadIdx.x / 32;
    float acc = is_max ? -INFINITY : 0.0f;
#pragma unroll 8
    for (u64 r = r0 + ty; r < r1; r += WARPS_PER_BLOCK) {
        // The finish reads what other blocks just wrote: from L2, past this SM's L1.
        float v = through_l2 ? __ldcg(x + r * stride) : x[r * stride];
        acc = is_max ? zc_maximum(acc, v) : acc + v;
    }
    return acc;
}

__device__ __forceinline__ float cols_lanes_combine(float acc, float (*part)[33], bool is_max) {
    const unsigned tx = threadIdx.x % 32;
    const unsigned ty = threadIdx.x / 32;
    part[ty][tx] = acc;
    __syncthreads();
    if (ty == 0) {
        for (int k = 1; k < WARPS_PER_BLOCK; ++k) {
            acc = is_max ? zc_maximum(acc, part[k][tx]) : acc + part[k][tx];
        }
    }
    return acc;
}

extern "C" __global__ void zc_reduce_cols_last_f32(float* out, float* partials,
                                                   unsigned* tickets, const float* in,
                                                   u64 outer, u64 n, u64 inner, u64 chunk,
                                                   unsigned op, float div) {
    __shared__ float part[WARPS_PER_BLOCK][33];
    __shared__ bool last;
    const unsigned tx = threadIdx.x % 32;
    const unsigned ty = threadIdx.x / 32;
    const u64 tiles = (inner + 31) / 32;
    const u64 t = blockIdx.x;
    const u64 o = t / tiles;
    const u64 col = (t % tiles) * 32 + tx;
    const u64 chunks = gridDim.y;
    const u64 width = outer * inner;
    const bool is_max = op == 2;
    const bool live = col < inner;
    const u64 r0 = (u64)blockIdx.y * chunk;
    float acc = is_max ? -INFINITY : 0.0f;
    if (live) acc = cols_tile_sum(in + o * n * inner + col, inner, r0, min(r0 + chunk, n), is_max, false);
    acc = cols_lanes_combine(acc, part, is_max);
    if (ty == 0 && live) partials[(u64)blockIdx.y * width + o * inner + col] = acc;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(tickets + t, 1u) == (unsigned)(chunks - 1);
    __syncthreads();
    if (!last) return;
    acc = is_max ? -INFINITY : 0.0f;
    if (live) acc = cols_tile_sum(partials + o * inner + col, width, 0, chunks, is_max, true);
    acc = cols_lanes_combine(acc, part, is_max);
    if (ty == 0 && live) {
        float* dst = out + o * inner + col;
        *dst = is_max ? acc : (op == 3 ? *dst + acc / div : acc / div);
    }
    if (threadIdx.x == 0) tickets[t] = 0u;
}

// Tanh's backward with the bias gradient of the Linear layer before it, in one launch:
// gx = g * (1 - y * y) over dense [rows, n] (zc_tanh_backward_f32's arithmetic), and
// db += the column sums of gx, summed as zc_reduce_cols_last_f32 sums a [1, rows, n]
// reduction into a buffer (the same chunks, lanes and last-block finish, so db gets the bits
// of tanh_backward followed by sum_rows_into), without reading gx back.
extern "C" __global__ void zc_tanh_backward_cols_f32(float* gx, float* partials, float* db,
                                                     unsigned* tickets, const float* g,
                                                     const float* y, u64 rows, u64 n,
                                                     u64 chunk) {
    __shared__ float part[WARPS_PER_BLOCK][33];
    __shared__ bool last;
    const unsigned tx = threadIdx.x % 32;
    const unsigned ty = threadIdx.x / 32;
    const u64 t = blockIdx.x;
    const u64 col = t * 32 + tx;
    const u64 chunks = gridDim.y;
    const bool live = col < n;
    const u64 r0 = (u64)blockIdx.y * chunk;
    const u64 r1 = min(r0 + chunk, rows);
    float acc = 0.0f;
    if (live) {
        // Four of the lane's rows loaded before any is written: gx may be g itself, so the
        // compiler could not move a row's loads above the previous row's store, and each row
        // was a memory round trip of its own. The arithmetic and its order are unchanged.
        constexpr u64 GROUP = 4;
        u64 r = r0 + ty;
        for (; r + (GROUP - 1) * WARPS_PER_BLOCK < r1; r += GROUP * WARPS_PER_BLOCK) {
            float yv[GROUP], gv[GROUP];
#pragma unroll
            for (u64 q = 0; q < GROUP; ++q) {
                const u64 i = (r + q * WARPS_PER_BLOCK) * n + col;
                yv[q] = y[i];
                gv[q] = g[i];
            }
#pragma unroll
            for (u64 q = 0; q < GROUP; ++q) {
                const float d = gv[q] * (1.0f - yv[q] * yv[q]);
                gx[(r + q * WARPS_PER_BLOCK) * n + col] = d;
                acc += d;
            }
        }
        for (; r < r1; r += WARPS_PER_BLOCK) {
            const u64 i = r * n + col;
            const float v = y[i];
            const float d = g[i] * (1.0f - v * v);
            gx[i] = d;
            acc += d;
        }
    }
    acc = cols_lanes_combine(acc, part, false);
    if (ty == 0 && live) partials[(u64)blockIdx.y * n + col] = acc;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(tickets + t, 1u) == (unsigned)(chunks - 1);
    __syncthreads();
    if (!last) return;
    acc = live ? cols_tile_sum(partials + col, n, 0, chunks, false, true) : 0.0f;
    acc = cols_lanes_combine(acc, part, false);
    if (ty == 0 && live) db[col] += acc;
    if (threadIdx.x == 0) tickets[t] = 0u;
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
            } else if (!(v == -INFINITY)) {
                // A -inf (a masked score) adds nothing; skipping it also keeps a lane that has
                // seen only -inf from computing expf(-inf - -inf) = NaN (found on an H200 by
                // the masked-fill oracle test). A NaN still goes in and propagates.
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

// Backward of softmax over dense [rows, n]: gx = y * (g - sum(g * y)) per row, the composite
// formula (mul, row sum, sub, mul) in one pass over the row for the sum and one to write.
extern "C" __global__ void zc_softmax_backward_rows_f32(float* gx, const float* g, const float* y,
                                                        u64 rows, u64 n) {
    unsigned lane = threadIdx.x % 32;
    ROW_LOOP(row, rows) {
        const float* gr = g + row * n;
        const float* yr = y + row * n;
        float s = 0.0f;
        for (u64 j = lane; j < n; j += 32) s += gr[j] * yr[j];
        float dot = warp_sum(s);
        for (u64 j = lane; j < n; j += 32) gx[row * n + j] = yr[j] * (gr[j] - dot);
    }
}

// Backward of LayerNorm over dense [rows, n] from the forward's per-row mean and rstd, the
// composite formula in one kernel: xhat = (x - mean) * rstd, gxhat = g * weight,
// gx = ((gxhat - mean(gxhat)) - xhat * mean(gxhat * xhat)) * rstd (written if want_gx), and
// g * xhat (written if want_gxhat; its column sums are the weight's gradient).
extern "C" __global__ void zc_layer_norm_backward_rows_f32(
    float* gx, float* g_xhat, const float* g, const float* x, const float* mean,
    const float* rstd, const float* weight, unsigned has_weight, unsigned want_gx,
    unsigned want_gxhat, u64 rows, u64 n) {
    unsigned lane = threadIdx.x % 32;
    ROW_LOOP(row, rows) {
        layer_norm_backward_row(gx, g_xhat, g, x, nullptr, row, mean[row], rstd[row], weight,
                                has_weight, want_gx, want_gxhat, n, lane);
    }
}

// ---- Rows in registers ----------------------------------------------------------------------
// For rows with n % 4 == 0, n <= 128 * V and 16-byte aligned base pointers (the host checks all
// three): each lane holds up to V float4s of its row (float4 index lane + 32 * i), so the row is
// read from global memory once, with 16-byte loads, and written once. One entry per V, so each
// instance gets the register budget of its own width (a single kernel with a runtime switch
// over V would carry the widest variant's registers and lose occupancy). Each warp handles R
// rows at a time so that narrow rows still keep enough loads in flight.

__device__ __forceinline__ float4 float4_splat(float v) { return make_float4(v, v, v, v); }

template <int V, int R>
__device__ __forceinline__ void softmax_rows_vec(float* out, const float* in, u64 rows, u64 n) {
    const unsigned lane = threadIdx.x % 32;
    const u64 n4 = n / 4;
    const u64 warps = (u64)gridDim.x * WARPS_PER_BLOCK;
    for (u64 first = ((u64)blockIdx.x * WARPS_PER_BLOCK + threadIdx.x / 32) * R; first < rows;
         first += warps * R) {
        float4 v[R][V];
        float m[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float4* x = reinterpret_cast<const float4*>(in + (first + r) * n);
            bool live = first + r < rows;
            m[r] = -INFINITY;
#pragma unroll
            for (int i = 0; i < V; ++i) {
                u64 j = lane + 32ull * i;
                v[r][i] = (live && j < n4) ? __ldcs(x + j) : float4_splat(-INFINITY);
                m[r] = zc_maximum(m[r], zc_maximum(zc_maximum(v[r][i].x, v[r][i].y),
                                                   zc_maximum(v[r][i].z, v[r][i].w)));
            }
        }
        float s[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            m[r] = warp_max(m[r]);
            s[r] = 0.0f;
#pragma unroll
            for (int i = 0; i < V; ++i) {
                u64 j = lane + 32ull * i;
                if (j < n4) {
                    float4 e;
                    e.x = expf(v[r][i].x - m[r]);
                    e.y = expf(v[r][i].y - m[r]);
                    e.z = expf(v[r][i].z - m[r]);
                    e.w = expf(v[r][i].w - m[r]);
                    v[r][i] = e;
                    s[r] += (e.x + e.y) + (e.z + e.w);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            // A NaN anywhere makes the max, every exp and the sum NaN, so the row is NaN, as in
            // the general kernel.
            float inv = 1.0f / warp_sum(s[r]);
            if (first + r >= rows) continue;
            float4* y = reinterpret_cast<float4*>(out + (first + r) * n);
#pragma unroll
            for (int i = 0; i < V; ++i) {
                u64 j = lane + 32ull * i;
                if (j < n4) {
                    float4 o = v[r][i];
                    o.x *= inv;
                    o.y *= inv;
                    o.z *= inv;
                    o.w *= inv;
                    __stcs(y + j, o);
                }
            }
        }
    }
}

template <int V, int R>
__device__ __forceinline__ void layer_norm_rows_vec(float* out, float* mean_out, float* rstd_out,
                                                    const float* in, const float* weight,
                                                    const float* bias, unsigned has_weight,
                                                    unsigned has_bias, u64 rows, u64 n,
                                                    float eps) {
    const unsigned lane = threadIdx.x % 32;
    const u64 n4 = n / 4;
    const u64 warps = (u64)gridDim.x * WARPS_PER_BLOCK;
    const float inv_n = 1.0f / (float)n;
    for (u64 first = ((u64)blockIdx.x * WARPS_PER_BLOCK + threadIdx.x / 32) * R; first < rows;
         first += warps * R) {
        float4 v[R][V];
        float mean[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float4* x = reinterpret_cast<const float4*>(in + (first + r) * n);
            bool live = first + r < rows;
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < V; ++i) {
                u64 j = lane + 32ull * i;
                v[r][i] = (live && j < n4) ? __ldcs(x + j) : float4_splat(0.0f);
                s += (v[r][i].x + v[r][i].y) + (v[r][i].z + v[r][i].w);
            }
            mean[r] = s;
        }
        float rstd[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            mean[r] = warp_sum(mean[r]) * inv_n;
            // Two passes as the CPU: squared deviations from the mean, from registers.
            float q = 0.0f;
#pragma unroll
            for (int i = 0; i < V; ++i) {
                u64 j = lane + 32ull * i;
                if (j < n4) {
                    float4 c = v[r][i];
                    c.x -= mean[r];
                    c.y -= mean[r];
                    c.z -= mean[r];
                    c.w -= mean[r];
                    q += (c.x * c.x + c.y * c.y) + (c.z * c.z + c.w * c.w);
                }
            }
            rstd[r] = q;
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            float var = warp_sum(rstd[r]) * inv_n;
            rstd[r] = 1.0f / sqrtf(var + eps);
        }
        const float4* w4 = reinterpret_cast<const float4*>(weight);
        const float4* b4 = reinterpret_cast<const float4*>(bias);
#pragma unroll
        for (int i = 0; i < V; ++i) {
            u64 j = lane + 32ull * i;
            if (j >= n4) continue;
            float4 w = has_weight ? w4[j] : float4_splat(1.0f);
            float4 b = has_bias ? b4[j] : float4_splat(0.0f);
#pragma unroll
            for (int r = 0; r < R; ++r) {
                if (first + r >= rows) continue;
                float4 o = v[r][i];
                o.x = (o.x - mean[r]) * rstd[r];
                o.y = (o.y - mean[r]) * rstd[r];
                o.z = (o.z - mean[r]) * rstd[r];
                o.w = (o.w - mean[r]) * rstd[r];
                if (has_weight) {
                    o.x *= w.x;
                    o.y *= w.y;
                    o.z *= w.z;
                    o.w *= w.w;
                }
                if (has_bias) {
                    o.x += b.x;
                    o.y += b.y;
                    o.z += b.z;
                    o.w += b.w;
                }
                __stcs(reinterpret_cast<float4*>(out + (first + r) * n) + j, o);
            }
        }
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < R; ++r) {
                if (first + r < rows) {
                    mean_out[first + r] = mean[r];
                    rstd_out[first + r] = rstd[r];
                }
            }
        }
    }
}

// Rows per warp of the V = 1, 2, 4, 8 entries (kernels.rs: vec_rows_per_warp mirrors it). Measured
// on H200 at [65536, 256] / [65536, 128]: 2 rows per warp helps 128-wide rows, costs ~2% at 256.
#define ROWS_PER_WARP(V) ((V) == 1 ? 2 : 1)

#define SOFTMAX_VEC_ENTRY(V)                                                                 \
    extern "C" __global__ void zc_softmax_rows_v##V##_f32(float* out, const float* in,       \
                                                          u64 rows, u64 n) {                 \
        softmax_rows_vec<V, ROWS_PER_WARP(V)>(out, in, rows, n);                             \
    }
SOFTMAX_VEC_ENTRY(1)
SOFTMAX_VEC_ENTRY(2)
SOFTMAX_VEC_ENTRY(4)
SOFTMAX_VEC_ENTRY(8)

#define LAYER_NORM_VEC_ENTRY(V)                                                              \
    extern "C" __global__ void zc_layer_norm_rows_v##V##_f32(                                \
        float* out, float* mean_out, float* rstd_out, const float* in, const float* weight,  \
        const float* bias, unsigned has_weight, unsigned has_bias, u64 rows, u64 n,          \
        float eps) {                                                                         \
        layer_norm_rows_vec<V, ROWS_PER_WARP(V)>(out, mean_out, rstd_out, in, weight, bias,  \
                                                 has_weight, has_bias, rows, n, eps);        \
    }
LAYER_NORM_VEC_ENTRY(1)
LAYER_NORM_VEC_ENTRY(2)
LAYER_NORM_VEC_ENTRY(4)
LAYER_NORM_VEC_ENTRY(8)
