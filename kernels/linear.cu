// Matrix products with few rows (one sample's scales: m = 12), where cuBLAS picks big tiles
// and launches a handful of CTAs. The floor there is latency, so these kernels spread the
// weight matrix over many CTAs, one node each, with the bias epilogue inside:
//   C[m,n] = act(op(A)[m,k] · op(B)[k,n] + bias[n]) + R[m,n] + beta · C,   m <= ZC_LINEAR_ROWS,
// with R an optional dense residual (null: none; the feed-forward block's skip connection),
// and a Linear layer's parameter gradients, dw[o,i] += Σ_r g[r,o]·x[r,i], db[o] += Σ_r g[r,o].
// op(A) and op(B) are read through their strides (element (r,k) of A at a[r*a_rs + k*a_cs]);
// C is dense [m,n]. Deterministic: no atomics, every sum in an order fixed by the shape, so
// reruns are bitwise equal. Launch shapes: crates/zcompute/src/cuda/linear.rs. The products'
// bf16 forms are linear_bf16.cu.
#include "linear_rows.cuh"

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
                    const float4 av = lds4(s_a + r * kn + kk);
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
                                            float beta, unsigned has_bias, unsigned act,
                                            const float* residual) {
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
    if (residual != nullptr) v += residual[r * n + jj];
    if (beta != 0.0f) v = fmaf(beta, out[r * n + jj], v);
    out[r * n + jj] = v;
}

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
                              float beta, unsigned has_bias, unsigned act,
                              const float* residual) {
    __shared__ __align__(16) float s_a[ZC_A_SMEM];
    ZC_ROW_CLASSES(kmajor_rows, s_a, out, a, b, bias, m, k, n, a_rs, a_cs, ldb, beta, has_bias,
                   act, residual);
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
                              unsigned has_bias, unsigned act, const float* residual) {
    __shared__ __align__(16) float s_a[ZC_A_SMEM];
    ZC_ROW_CLASSES(nmajor_rows, s_a, out, a, b, bias, m, k, n, a_rs, a_cs, ldb, beta, has_bias,
                   act, residual);
}

// dw[o, i] += Σ_r g[r, o] · x[r, i] (r in row order) and, when has_db, db[o] += Σ_r g[r, o]:
// param_grads_block (linear_rows.cuh) over a 2-D grid (ceil(cols / blockDim.x),
// ceil(outs / blockDim.y)), as the host sizes it (linear_grads_vec4 decides cols).
extern "C" __global__ void zc_linear_param_grads_f32(float* dw, float* db, const float* g,
                                                     const float* x, unsigned rows, u64 outs,
                                                     u64 ins, u64 g_rs, u64 g_cs, u64 x_rs,
                                                     u64 x_cs, u64 ldw, u64 db_stride,
                                                     unsigned has_db) {
    param_grads_block(dw, db, g, x, rows, outs, ins, g_rs, g_cs, x_rs, x_cs, ldw, db_stride,
                      has_db, dim3(blockIdx.x, blockIdx.y), threadIdx, blockDim);
}
