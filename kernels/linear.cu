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
// k-contiguous B: columns per block, and warps per column (each takes every
// KMAJOR_SPLIT-th run of 32 lanes x 4 k, so a column's k is spread over KMAJOR_SPLIT warps
// and an SM has enough warps to hide latency); loads of B a lane issues before using any.
#define KMAJOR_COLS 8
#define KMAJOR_SPLIT 2
#define KMAJOR_BATCH 4
// n-contiguous B: columns per block (lanes along n), k slices (the rest of the block), loads
// of B a thread issues before using any. Columns per block, both kernels: every block stages
// all of A, so more blocks mean more L2 traffic and fewer mean fewer SMs reading B; at m = 12
// on an H100 the per-sample step took 33.7 ms at 4 columns a block, 32.2-32.6 at 8, 33.8-34.2
// at 16, 35.9 at 2.
#define NMAJOR_COLS 8
#define NMAJOR_SLICES 64
#define NMAJOR_BATCH 8
#define NMAJOR_WARPS (NMAJOR_COLS * NMAJOR_SLICES / 32)
#define LINEAR_ACT_TANH 1
// Rows of g and x the parameter-gradient kernel loads at once.
#define GRADS_GROUP 16

// A is staged in shared memory, a chunk of its columns at a time (all of it at m = 12, k <=
// 1024), padded with zero rows up to a compile-time row count MR (1, 2, 4, 8, 12, 16, 24 or
// 32, the least >= m), so the inner loops run MR rows unrolled with no test per row. Measured
// on an H100 (ncu, m = 12): read through the L1 cache, every warp's loads of A waited on the
// L2 one after another (12-26 us a product); with A staged but 32 rows tested one by one the
// warps were instruction-bound (8 cycles an instruction, 4 warps an SM).
#define ZC_A_SMEM 12288
// Loads a thread issues at once while staging A.
#define STAGE_BATCH 8
// The partial sums reuse the staged A's memory.
static_assert(NMAJOR_WARPS * ZC_LINEAR_ROWS * NMAJOR_COLS <= ZC_A_SMEM, "partials fit s_a");
static_assert(KMAJOR_SPLIT * ZC_LINEAR_ROWS * KMAJOR_COLS <= ZC_A_SMEM, "partials fit s_a");
static_assert(ZC_LINEAR_ROWS * KMAJOR_COLS <= KMAJOR_COLS * KMAJOR_SPLIT * 32, "a thread per output");

// idx / d for the small operands of the staging loops (idx < 2^20, d >= 1), from d's
// reciprocal `inv` and one correction each way: a 32-bit division is tens of instructions,
// and the staging loops did eight a thread (ncu: the products were instruction-bound).
__device__ __forceinline__ unsigned div_small(unsigned idx, unsigned d, float inv) {
    unsigned q = __float2uint_rz((float)idx * inv);
    if (q * d > idx) --q;
    if ((q + 1) * d <= idx) ++q;
    return q;
}

// s_a[r * kn + c] = op(A)[r, k0 + c] for r < m, c < kn, and 0 for m <= r < MR (row pitch
// kn). Every thread of the block takes part; the caller synchronises before (the previous
// chunk is consumed) and after.
template <int MR>
__device__ __forceinline__ void stage_a(float* s_a, const float* a, unsigned m, u64 k0,
                                        unsigned kn, u64 a_rs, u64 a_cs) {
    const unsigned nt = blockDim.x, tid = threadIdx.x;
    const bool vec = a_cs == 1 && kn % 4 == 0 && a_rs % 4 == 0 && k0 % 4 == 0 &&
                     (((u64)a & 15) == 0);
    if (vec) {
        const unsigned kn4 = kn / 4, total = MR * kn4;
        const float inv4 = 1.0f / (float)kn4;
        for (unsigned base = tid; base < total; base += nt * STAGE_BATCH) {
            float4 v[STAGE_BATCH];
#pragma unroll
            for (int u = 0; u < STAGE_BATCH; ++u) {
                const unsigned idx = base + u * nt;
                const unsigned r = div_small(idx, kn4, inv4), c = idx - r * kn4;
                v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (idx < total && r < m) {
                    v[u] = __ldg(reinterpret_cast<const float4*>(a + r * a_rs + k0) + c);
                }
            }
#pragma unroll
            for (int u = 0; u < STAGE_BATCH; ++u) {
                const unsigned idx = base + u * nt;
                if (idx < total) reinterpret_cast<float4*>(s_a)[idx] = v[u];
            }
        }
    } else {
        const unsigned total = MR * kn;
        const float inv = 1.0f / (float)kn;
        for (unsigned base = tid; base < total; base += nt * STAGE_BATCH) {
            float v[STAGE_BATCH];
#pragma unroll
            for (int u = 0; u < STAGE_BATCH; ++u) {
                const unsigned idx = base + u * nt;
                const unsigned r = div_small(idx, kn, inv), c = idx - r * kn;
                v[u] = idx < total && r < m ? __ldg(a + r * a_rs + (k0 + c) * a_cs) : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < STAGE_BATCH; ++u) {
                const unsigned idx = base + u * nt;
                if (idx < total) s_a[idx] = v[u];
            }
        }
    }
}

__device__ __forceinline__ float linear_epilogue(float acc, const float* bias, u64 j,
                                                 unsigned has_bias, unsigned act) {
    float v = has_bias ? acc + bias[j] : acc;
    return act == LINEAR_ACT_TANH ? tanhf(v) : v;
}

// One lane's partial sums of the staged chunk (kn columns of A in s_a, MR rows) against
// `col`, the chunk's part of a k-contiguous column of B: warp `part` of the column takes the
// runs k = ((u * KMAJOR_SPLIT + part) * 32 + lane) * W + {0..W-1}, W = 4 on the vector path.
template <int MR, bool VEC>
__device__ __forceinline__ void kmajor_sums(float (&acc)[MR], const float* s_a,
                                            const float* __restrict__ col, unsigned kn,
                                            unsigned lane, unsigned part) {
    const unsigned w = VEC ? 4 : 1;
    const unsigned step = KMAJOR_SPLIT * 32 * w;
    for (unsigned k0 = 0; k0 < kn; k0 += step * KMAJOR_BATCH) {
        float4 bv[KMAJOR_BATCH];
#pragma unroll
        for (int u = 0; u < KMAJOR_BATCH; ++u) {
            const unsigned kk = k0 + u * step + (part * 32 + lane) * w;
            bv[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (kk < kn) {
                if (VEC) {
                    bv[u] = __ldg(reinterpret_cast<const float4*>(col + kk));
                } else {
                    bv[u].x = __ldg(col + kk);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < KMAJOR_BATCH; ++u) {
            const unsigned kk = k0 + u * step + (part * 32 + lane) * w;
            if (kk >= kn) break;
#pragma unroll
            for (int r = 0; r < MR; ++r) {
                if (VEC) {
                    const float4 av = *reinterpret_cast<const float4*>(s_a + r * kn + kk);
                    acc[r] = fmaf(av.x, bv[u].x, acc[r]);
                    acc[r] = fmaf(av.y, bv[u].y, acc[r]);
                    acc[r] = fmaf(av.z, bv[u].z, acc[r]);
                    acc[r] = fmaf(av.w, bv[u].w, acc[r]);
                } else {
                    acc[r] = fmaf(s_a[r * kn + kk], bv[u].x, acc[r]);
                }
            }
        }
    }
}

// The k-contiguous product at MR rows (see zc_linear_rows_kmajor_f32).
template <int MR>
__device__ __forceinline__ void kmajor_rows(float* s_a, float* out, const float* a,
                                            const float* b, const float* bias, unsigned m,
                                            u64 k, u64 n, u64 a_rs, u64 a_cs, u64 ldb,
                                            float beta, unsigned has_bias, unsigned act) {
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const unsigned c = warp % KMAJOR_COLS, part = warp / KMAJOR_COLS;
    const u64 j = (u64)blockIdx.x * KMAJOR_COLS + c;
    const bool live = j < n;
    const bool vec4 = k % 4 == 0 && ldb % 4 == 0 && (((u64)b & 15) == 0);
    const unsigned kcap = (ZC_A_SMEM / MR) & ~3u;
    const float* col = b + (live ? j : 0) * ldb;
    float acc[MR];
#pragma unroll
    for (int r = 0; r < MR; ++r) acc[r] = 0.0f;
    for (u64 k0 = 0; k0 < k; k0 += kcap) {
        const unsigned kn = (unsigned)(k - k0 < kcap ? k - k0 : kcap);
        __syncthreads();
        stage_a<MR>(s_a, a, m, k0, kn, a_rs, a_cs);
        __syncthreads();
        if (!live) continue;
        if (vec4) {
            kmajor_sums<MR, true>(acc, s_a, col + k0, kn, lane, part);
        } else {
            kmajor_sums<MR, false>(acc, s_a, col + k0, kn, lane, part);
        }
    }
    // A fixed xor-shuffle tree per warp, then the column's KMAJOR_SPLIT warps in order.
    if (live) {
#pragma unroll
        for (int r = 0; r < MR; ++r) {
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
            }
        }
    }
    float* s_part = s_a;
    __syncthreads();
    if (live && lane == 0) {
#pragma unroll
        for (int r = 0; r < MR; ++r) s_part[(part * MR + r) * KMAJOR_COLS + c] = acc[r];
    }
    __syncthreads();
    const unsigned r = threadIdx.x / KMAJOR_COLS, cc = threadIdx.x % KMAJOR_COLS;
    const u64 jj = (u64)blockIdx.x * KMAJOR_COLS + cc;
    if (r >= m || jj >= n) return;
    float v = 0.0f;
#pragma unroll
    for (int p = 0; p < KMAJOR_SPLIT; ++p) v += s_part[(p * MR + r) * KMAJOR_COLS + cc];
    v = linear_epilogue(v, bias, jj, has_bias, act);
    if (beta != 0.0f) v = fmaf(beta, out[r * n + jj], v);
    out[r * n + jj] = v;
}

// The n-contiguous product at MR rows (see zc_linear_rows_nmajor_f32).
template <int MR>
__device__ __forceinline__ void nmajor_rows(float* s_a, float* out, const float* a,
                                            const float* __restrict__ b, const float* bias,
                                            unsigned m, u64 k, u64 n, u64 a_rs, u64 a_cs,
                                            u64 ldb, float beta, unsigned has_bias,
                                            unsigned act) {
    const unsigned c = threadIdx.x % NMAJOR_COLS;
    const unsigned slice = threadIdx.x / NMAJOR_COLS;
    const u64 j = (u64)blockIdx.x * NMAJOR_COLS + c;
    const bool live = j < n;
    const unsigned kcap = (ZC_A_SMEM / MR) & ~3u;
    float acc[MR];
#pragma unroll
    for (int r = 0; r < MR; ++r) acc[r] = 0.0f;
    for (u64 k0 = 0; k0 < k; k0 += kcap) {
        const unsigned kn = (unsigned)(k - k0 < kcap ? k - k0 : kcap);
        __syncthreads();
        stage_a<MR>(s_a, a, m, k0, kn, a_rs, a_cs);
        __syncthreads();
        for (unsigned kb = 0; live && kb < kn; kb += NMAJOR_SLICES * NMAJOR_BATCH) {
            float bv[NMAJOR_BATCH];
#pragma unroll
            for (int u = 0; u < NMAJOR_BATCH; ++u) {
                const unsigned kk = kb + u * NMAJOR_SLICES + slice;
                bv[u] = kk < kn ? __ldg(b + (k0 + kk) * ldb + j) : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < NMAJOR_BATCH; ++u) {
                const unsigned kk = kb + u * NMAJOR_SLICES + slice;
                if (kk >= kn) break;
#pragma unroll
                for (int r = 0; r < MR; ++r) acc[r] = fmaf(s_a[r * kn + kk], bv[u], acc[r]);
            }
        }
    }
    // Lanes c, c + NMAJOR_COLS, ... of a warp hold column c's slices (every lane takes part:
    // the masks are full); the warps' sums go to shared memory over the staged A.
    const unsigned warp = threadIdx.x / 32;
    float* s_part = s_a;
    __syncthreads();
#pragma unroll
    for (int r = 0; r < MR; ++r) {
        float v = acc[r];
#pragma unroll
        for (int off = NMAJOR_COLS; off < 32; off <<= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (threadIdx.x % 32 < NMAJOR_COLS) s_part[(warp * MR + r) * NMAJOR_COLS + c] = v;
    }
    __syncthreads();
    // Thread t sums (row t / NMAJOR_COLS, column t % NMAJOR_COLS) over the warps in order.
    const unsigned r = threadIdx.x / NMAJOR_COLS;
    if (r >= m || !live) return;
    float v = 0.0f;
    for (unsigned w = 0; w < NMAJOR_WARPS; ++w) v += s_part[(w * MR + r) * NMAJOR_COLS + c];
    v = linear_epilogue(v, bias, j, has_bias, act);
    if (beta != 0.0f) v = fmaf(beta, out[r * n + j], v);
    out[r * n + j] = v;
}

// Calls BODY<MR>(...) for the least row class MR >= m.
#define ZC_ROW_CLASSES(BODY, ...)                                                       \
    if (m <= 1) BODY<1>(__VA_ARGS__);                                                   \
    else if (m <= 2) BODY<2>(__VA_ARGS__);                                              \
    else if (m <= 4) BODY<4>(__VA_ARGS__);                                              \
    else if (m <= 8) BODY<8>(__VA_ARGS__);                                              \
    else if (m <= 12) BODY<12>(__VA_ARGS__);                                            \
    else if (m <= 16) BODY<16>(__VA_ARGS__);                                            \
    else if (m <= 24) BODY<24>(__VA_ARGS__);                                            \
    else BODY<ZC_LINEAR_ROWS>(__VA_ARGS__)

// k-contiguous B (element (k,j) at b[j*ldb + k]: a Linear weight [out,in] read transposed).
// Blocks of KMAJOR_COLS x KMAJOR_SPLIT warps, grid.x = ceil(n / KMAJOR_COLS): warp w of
// block x works on column j = x * KMAJOR_COLS + w % KMAJOR_COLS. Chunk by chunk of k, the
// block stages A, then lanes run along k (coalesced reads of B's column, float4s when k and
// ldb are multiples of 4 and B is 16-byte aligned), each lane keeping MR partial sums; a
// fixed xor-shuffle tree sums a warp's lanes, and one thread per (row, column) adds the
// column's warps in order and writes the output.
extern "C" __global__ void __launch_bounds__(KMAJOR_COLS * KMAJOR_SPLIT * 32)
    zc_linear_rows_kmajor_f32(float* out, const float* a, const float* b, const float* bias,
                              unsigned m, u64 k, u64 n, u64 a_rs, u64 a_cs, u64 ldb,
                              float beta, unsigned has_bias, unsigned act) {
    __shared__ __align__(16) float s_a[ZC_A_SMEM];
    ZC_ROW_CLASSES(kmajor_rows, s_a, out, a, b, bias, m, k, n, a_rs, a_cs, ldb, beta, has_bias,
                   act);
}

// n-contiguous B (element (k,j) at b[k*ldb + j]: a weight [k,n] read as stored). Blocks of
// NMAJOR_COLS x NMAJOR_SLICES threads, grid.x = ceil(n / NMAJOR_COLS): thread (c, s) of
// block x owns column j = x * NMAJOR_COLS + c and, within each staged chunk of A, the k with
// k % NMAJOR_SLICES == s (a warp reads 8 rows of 4 consecutive floats), NMAJOR_BATCH loads at
// a time. A fixed shuffle tree adds each warp's 8 slices of a column, the warps' partial sums
// go to shared memory, and one thread per (row, column) adds them in warp order.
extern "C" __global__ void __launch_bounds__(NMAJOR_COLS * NMAJOR_SLICES)
    zc_linear_rows_nmajor_f32(float* out, const float* __restrict__ a,
                              const float* __restrict__ b, const float* bias, unsigned m, u64 k,
                              u64 n, u64 a_rs, u64 a_cs, u64 ldb, float beta,
                              unsigned has_bias, unsigned act) {
    __shared__ __align__(16) float s_a[ZC_A_SMEM];
    ZC_ROW_CLASSES(nmajor_rows, s_a, out, a, b, bias, m, k, n, a_rs, a_cs, ldb, beta, has_bias,
                   act);
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
        // Rows in groups of GRADS_GROUP, every load of a group issued before any is used
        // (ncu: the loop waited on the L2 once per row), in row order.
        for (unsigned r0 = 0; r0 < rows; r0 += GRADS_GROUP) {
            float gv[GRADS_GROUP];
            float4 xv[GRADS_GROUP];
#pragma unroll
            for (int u = 0; u < GRADS_GROUP; ++u) {
                const unsigned r = r0 + u;
                gv[u] = r < rows ? gcol[r * g_rs] : 0.0f;
                xv[u] = r < rows ? reinterpret_cast<const float4*>(x + r * x_rs)[i]
                                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int u = 0; u < GRADS_GROUP; ++u) {
                if (r0 + u >= rows) break;
                acc.x = fmaf(gv[u], xv[u].x, acc.x);
                acc.y = fmaf(gv[u], xv[u].y, acc.y);
                acc.z = fmaf(gv[u], xv[u].z, acc.z);
                acc.w = fmaf(gv[u], xv[u].w, acc.w);
            }
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
