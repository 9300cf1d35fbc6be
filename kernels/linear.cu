// Matrix products with few rows (one sample's scales: m = 12), where cuBLAS picks big tiles
// and launches a handful of CTAs. The floor there is latency, so these kernels spread the
// weight matrix over many CTAs, one node each, with the bias epilogue inside:
//   C[m,n] = act(op(A)[m,k] · op(B)[k,n] + bias[n]) + beta · C,   m <= ZC_LINEAR_ROWS,
// and a Linear layer's parameter gradients, dw[o,i] += Σ_r g[r,o]·x[r,i], db[o] += Σ_r g[r,o].
// op(A) and op(B) are read through their strides (element (r,k) of A at a[r*a_rs + k*a_cs]);
// C is dense [m,n]. Deterministic: no atomics, every sum in an order fixed by the shape, so
// reruns are bitwise equal. Launch shapes: crates/zcompute/src/cuda/linear.rs.
#include "common.cuh"

// Most rows of A (the host falls back to cuBLAS above it; LINEAR_ROW_LIMIT in linear.rs).
#define ZC_LINEAR_ROWS 32
// k-contiguous B: warps per block (one output column each); loads of B a lane issues before
// using any (a float4 each on the vector path: 32 x 4 x 8 = 1024 k per batch).
#define KMAJOR_WARPS 4
#define KMAJOR_BATCH 8
// n-contiguous B: columns per block (lanes along n), k slices (the rest of the block), loads
// of B a thread issues before using any (128 slices x 8 = 1024 k per batch; 8 keeps the
// partial sums of 32 rows in registers without spills). 4 columns (half a 32-byte sector per
// row) so that a 256-wide product still spreads over 64 CTAs: latency, not bytes, is the floor.
#define NMAJOR_COLS 4
#define NMAJOR_SLICES 128
#define NMAJOR_BATCH 8
#define NMAJOR_WARPS (NMAJOR_COLS * NMAJOR_SLICES / 32)
#define LINEAR_ACT_TANH 1

// Why no shared-memory staging of A: the floor is the latency of reading the weights once, so
// every thread issues a whole batch of independent loads of B before it uses any; staging A
// in chunks would put a barrier (and a round trip) between the batches. A is small (rows x k,
// 48 KiB at 12 x 1024) and read through the L1 cache instead, by every warp of an SM.

__device__ __forceinline__ float linear_epilogue(float acc, const float* bias, u64 j,
                                                 unsigned has_bias, unsigned act) {
    float v = has_bias ? acc + bias[j] : acc;
    return act == LINEAR_ACT_TANH ? tanhf(v) : v;
}

// One lane's partial sums of column `col` of B (k-contiguous) against every row of A: the
// lane takes k = (u * 32 + lane) * W + {0..W-1} of each batch, W = 4 on the vector path.
template <bool VEC>
__device__ __forceinline__ void kmajor_sums(float (&acc)[ZC_LINEAR_ROWS],
                                            const float* __restrict__ a,
                                            const float* __restrict__ col, unsigned m, u64 k,
                                            u64 a_rs, u64 a_cs, unsigned lane) {
    const u64 w = VEC ? 4 : 1;
    for (u64 k0 = 0; k0 < k; k0 += 32 * w * KMAJOR_BATCH) {
        float4 bv[KMAJOR_BATCH];
#pragma unroll
        for (int u = 0; u < KMAJOR_BATCH; ++u) {
            const u64 kk = k0 + (u * 32 + lane) * w;
            bv[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (kk < k) {
                if (VEC) {
                    bv[u] = __ldg(reinterpret_cast<const float4*>(col + kk));
                } else {
                    bv[u].x = __ldg(col + kk);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < KMAJOR_BATCH; ++u) {
            const u64 kk = k0 + (u * 32 + lane) * w;
            if (kk >= k) break;
#pragma unroll
            for (int r = 0; r < ZC_LINEAR_ROWS; ++r) {
                if (r < (int)m) {
                    if (VEC) {
                        const float4 av = __ldg(reinterpret_cast<const float4*>(a + r * a_rs + kk));
                        acc[r] = fmaf(av.x, bv[u].x, acc[r]);
                        acc[r] = fmaf(av.y, bv[u].y, acc[r]);
                        acc[r] = fmaf(av.z, bv[u].z, acc[r]);
                        acc[r] = fmaf(av.w, bv[u].w, acc[r]);
                    } else {
                        acc[r] = fmaf(__ldg(a + r * a_rs + kk * a_cs), bv[u].x, acc[r]);
                    }
                }
            }
        }
    }
}

// k-contiguous B (element (k,j) at b[j*ldb + k]: a Linear weight [out,in] read transposed).
// Blocks of KMAJOR_WARPS warps, grid.x = ceil(n / KMAJOR_WARPS): warp w of block x owns column
// j = x * KMAJOR_WARPS + w. Lanes run along k (coalesced reads of B's column, float4s when k,
// ldb and A's row stride are multiples of 4, A's rows are dense and A and B are 16-byte
// aligned); each lane keeps m partial sums, then a fixed xor-shuffle tree sums the lanes and
// lane 0 writes the column's m outputs.
extern "C" __global__ void __launch_bounds__(KMAJOR_WARPS * 32)
    zc_linear_rows_kmajor_f32(float* out, const float* a, const float* b, const float* bias,
                              unsigned m, u64 k, u64 n, u64 a_rs, u64 a_cs, u64 ldb,
                              float beta, unsigned has_bias, unsigned act) {
    const unsigned lane = threadIdx.x % 32;
    const u64 j = (u64)blockIdx.x * KMAJOR_WARPS + threadIdx.x / 32;
    if (j >= n) return;
    const bool vec4 = k % 4 == 0 && ldb % 4 == 0 && a_cs == 1 && a_rs % 4 == 0 &&
                      ((((u64)a | (u64)b) & 15) == 0);
    float acc[ZC_LINEAR_ROWS];
#pragma unroll
    for (int r = 0; r < ZC_LINEAR_ROWS; ++r) acc[r] = 0.0f;
    if (vec4) {
        kmajor_sums<true>(acc, a, b + j * ldb, m, k, a_rs, a_cs, lane);
    } else {
        kmajor_sums<false>(acc, a, b + j * ldb, m, k, a_rs, a_cs, lane);
    }
#pragma unroll
    for (int r = 0; r < ZC_LINEAR_ROWS; ++r) {
        if (r < (int)m) {
            float v = acc[r];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
            acc[r] = v;
        }
    }
    if (lane != 0) return;
#pragma unroll
    for (int r = 0; r < ZC_LINEAR_ROWS; ++r) {
        if (r < (int)m) {
            float v = linear_epilogue(acc[r], bias, j, has_bias, act);
            if (beta != 0.0f) v = fmaf(beta, out[r * n + j], v);
            out[r * n + j] = v;
        }
    }
}

// n-contiguous B (element (k,j) at b[k*ldb + j]: a weight [k,n] read as stored). Blocks of
// NMAJOR_COLS x NMAJOR_SLICES threads, grid.x = ceil(n / NMAJOR_COLS): thread (c, s) of
// block x owns column j = x * NMAJOR_COLS + c and the k with k % NMAJOR_SLICES == s (a warp
// reads 8 rows of 4 consecutive floats), NMAJOR_BATCH loads at a time. A fixed shuffle tree
// adds each warp's 8 slices of a column, the warps' m partial sums go to shared memory, and
// one thread per (row, column) adds them in warp order.
extern "C" __global__ void __launch_bounds__(NMAJOR_COLS * NMAJOR_SLICES)
    zc_linear_rows_nmajor_f32(float* out, const float* __restrict__ a,
                              const float* __restrict__ b, const float* bias, unsigned m, u64 k,
                              u64 n, u64 a_rs, u64 a_cs, u64 ldb, float beta,
                              unsigned has_bias, unsigned act) {
    // The warps' partials [warp][row][column].
    __shared__ float s_part[NMAJOR_WARPS * ZC_LINEAR_ROWS * NMAJOR_COLS];
    const unsigned c = threadIdx.x % NMAJOR_COLS;
    const unsigned slice = threadIdx.x / NMAJOR_COLS;
    const u64 j = (u64)blockIdx.x * NMAJOR_COLS + c;
    const bool live = j < n;
    float acc[ZC_LINEAR_ROWS];
#pragma unroll
    for (int r = 0; r < ZC_LINEAR_ROWS; ++r) acc[r] = 0.0f;
    for (u64 k0 = 0; live && k0 < k; k0 += NMAJOR_SLICES * NMAJOR_BATCH) {
        float bv[NMAJOR_BATCH];
#pragma unroll
        for (int u = 0; u < NMAJOR_BATCH; ++u) {
            const u64 kk = k0 + u * NMAJOR_SLICES + slice;
            bv[u] = kk < k ? __ldg(b + kk * ldb + j) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < NMAJOR_BATCH; ++u) {
            const u64 kk = k0 + u * NMAJOR_SLICES + slice;
            if (kk >= k) break;
#pragma unroll
            for (int r = 0; r < ZC_LINEAR_ROWS; ++r) {
                if (r < (int)m) acc[r] = fmaf(__ldg(a + r * a_rs + kk * a_cs), bv[u], acc[r]);
            }
        }
    }
    // Lanes c, c + NMAJOR_COLS, ... of a warp hold column c's slices (every lane takes part:
    // the masks are full).
    const unsigned warp = threadIdx.x / 32;
#pragma unroll
    for (int r = 0; r < ZC_LINEAR_ROWS; ++r) {
        if (r < (int)m) {
            float v = acc[r];
#pragma unroll
            for (int off = NMAJOR_COLS; off < 32; off <<= 1) {
                v += __shfl_xor_sync(0xffffffffu, v, off);
            }
            if (threadIdx.x % 32 < NMAJOR_COLS) {
                s_part[(warp * ZC_LINEAR_ROWS + r) * NMAJOR_COLS + c] = v;
            }
        }
    }
    __syncthreads();
    // Thread t sums (row t / NMAJOR_COLS, column t % NMAJOR_COLS): m * NMAJOR_COLS <= threads.
    const unsigned r = threadIdx.x / NMAJOR_COLS;
    if (r >= m || !live) return;
    float v = 0.0f;
    for (unsigned w = 0; w < NMAJOR_WARPS; ++w) {
        v += s_part[(w * ZC_LINEAR_ROWS + r) * NMAJOR_COLS + c];
    }
    v = linear_epilogue(v, bias, j, has_bias, act);
    if (beta != 0.0f) v = fmaf(beta, out[r * n + j], v);
    out[r * n + j] = v;
}

// dw[o, i] += Σ_r g[r, o] · x[r, i] (r in row order) and, when has_db, db[o] += Σ_r g[r, o].
// dw's rows are ldw apart with a dense last axis. Blocks are 2-D: x along i (a float4 of i
// per thread when ins, ldw and x's row stride are multiples of 4, x's last axis is dense and
// dw and x are 16-byte aligned; else a float), y along o; grid (ceil(cols / blockDim.x),
// ceil(outs / blockDim.y)), as the host sizes it by the same test (linear_grads_vec4). Thread
// x = 0 of the first block column sums db[o], so each db element has one fixed writer.
extern "C" __global__ void zc_linear_param_grads_f32(float* dw, float* db, const float* g,
                                                     const float* x, unsigned rows, u64 outs,
                                                     u64 ins, u64 g_rs, u64 g_cs, u64 x_rs,
                                                     u64 x_cs, u64 ldw, u64 db_stride,
                                                     unsigned has_db) {
    const u64 o = (u64)blockIdx.y * blockDim.y + threadIdx.y;
    if (o >= outs) return;
    const float* gcol = g + o * g_cs;
    if (has_db && blockIdx.x == 0 && threadIdx.x == 0) {
        float s = 0.0f;
        for (unsigned r = 0; r < rows; ++r) s += gcol[r * g_rs];
        db[o * db_stride] += s;
    }
    const bool vec4 = ins % 4 == 0 && ldw % 4 == 0 && x_cs == 1 && x_rs % 4 == 0 &&
                      ((((u64)dw | (u64)x) & 15) == 0);
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (vec4) {
        if (i >= ins / 4) return;
        float4* dst = reinterpret_cast<float4*>(dw + o * ldw) + i;
        float4 d = *dst;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
        for (unsigned r = 0; r < rows; ++r) {
            const float gv = gcol[r * g_rs];
            const float4 xv = reinterpret_cast<const float4*>(x + r * x_rs)[i];
            acc.x = fmaf(gv, xv.x, acc.x);
            acc.y = fmaf(gv, xv.y, acc.y);
            acc.z = fmaf(gv, xv.z, acc.z);
            acc.w = fmaf(gv, xv.w, acc.w);
        }
        d.x += acc.x;
        d.y += acc.y;
        d.z += acc.z;
        d.w += acc.w;
        *dst = d;
    } else {
        if (i >= ins) return;
        const float d = dw[o * ldw + i];
        float acc = 0.0f;
#pragma unroll 8
        for (unsigned r = 0; r < rows; ++r) acc = fmaf(gcol[r * g_rs], x[r * x_rs + i * x_cs], acc);
        dw[o * ldw + i] = d + acc;
    }
}
