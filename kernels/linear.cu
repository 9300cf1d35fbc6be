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
// k-contiguous B: warps per block (one output column each) and the k chunk of A staged.
#define KMAJOR_WARPS 4
#define KMAJOR_CHUNK 256
// n-contiguous B: columns per block (lanes along n), k slices (warps split k), A's k chunk.
#define NMAJOR_COLS 8
#define NMAJOR_SLICES 32
#define NMAJOR_CHUNK 128
#define LINEAR_ACT_TANH 1

__device__ __forceinline__ float linear_epilogue(float acc, const float* bias, u64 j,
                                                 unsigned has_bias, unsigned act) {
    float v = has_bias ? acc + bias[j] : acc;
    return act == LINEAR_ACT_TANH ? tanhf(v) : v;
}

// Stages A[0..m, k0..k0+chunk) into s[r * chunk + kk] (zero past k) with the whole block.
__device__ __forceinline__ void stage_a(float* s, const float* a, unsigned m, u64 k, u64 k0,
                                        unsigned chunk, u64 a_rs, u64 a_cs) {
    const unsigned total = m * chunk;
    for (unsigned idx = threadIdx.x; idx < total; idx += blockDim.x) {
        const unsigned r = idx / chunk;
        const u64 kk = k0 + idx % chunk;
        s[idx] = kk < k ? a[r * a_rs + kk * a_cs] : 0.0f;
    }
}

// k-contiguous B (element (k,j) at b[j*ldb + k]: a Linear weight [out,in] read transposed).
// Blocks of KMAJOR_WARPS warps, grid.x = ceil(n / KMAJOR_WARPS): warp w of block x owns column
// j = x * KMAJOR_WARPS + w. Lanes run along k (coalesced reads of B's column); each lane keeps
// m partial sums against A's chunk in shared memory, then a fixed xor-shuffle tree sums the
// lanes and lane 0 writes the column's m outputs.
extern "C" __global__ void __launch_bounds__(KMAJOR_WARPS * 32)
    zc_linear_rows_kmajor_f32(float* out, const float* a, const float* b, const float* bias,
                              unsigned m, u64 k, u64 n, u64 a_rs, u64 a_cs, u64 ldb,
                              float beta, unsigned has_bias, unsigned act) {
    __shared__ float s_a[ZC_LINEAR_ROWS * KMAJOR_CHUNK];
    const unsigned lane = threadIdx.x % 32;
    const u64 j = (u64)blockIdx.x * KMAJOR_WARPS + threadIdx.x / 32;
    const bool live = j < n;
    const float* col = b + (live ? j * ldb : 0);
    float acc[ZC_LINEAR_ROWS];
#pragma unroll
    for (int r = 0; r < ZC_LINEAR_ROWS; ++r) acc[r] = 0.0f;
    for (u64 k0 = 0; k0 < k; k0 += KMAJOR_CHUNK) {
        __syncthreads();
        stage_a(s_a, a, m, k, k0, KMAJOR_CHUNK, a_rs, a_cs);
        __syncthreads();
        if (!live) continue;
        const unsigned len = (unsigned)min((u64)KMAJOR_CHUNK, k - k0);
#pragma unroll 4
        for (unsigned kk = lane; kk < len; kk += 32) {
            const float bv = col[k0 + kk];
#pragma unroll
            for (int r = 0; r < ZC_LINEAR_ROWS; ++r) {
                if (r < (int)m) acc[r] = fmaf(s_a[r * KMAJOR_CHUNK + kk], bv, acc[r]);
            }
        }
    }
    if (!live) return;
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
// reads 4 rows of 8 consecutive floats: whole 32-byte sectors). The slices' m partial sums go
// to shared memory and one thread per (row, column) adds them in slice order.
extern "C" __global__ void __launch_bounds__(NMAJOR_COLS * NMAJOR_SLICES)
    zc_linear_rows_nmajor_f32(float* out, const float* a, const float* b, const float* bias,
                              unsigned m, u64 k, u64 n, u64 a_rs, u64 a_cs, u64 ldb,
                              float beta, unsigned has_bias, unsigned act) {
    // A's chunk while summing, then the slices' partials [slice][row][column].
    __shared__ float s_buf[NMAJOR_SLICES * ZC_LINEAR_ROWS * NMAJOR_COLS];
    const unsigned c = threadIdx.x % NMAJOR_COLS;
    const unsigned slice = threadIdx.x / NMAJOR_COLS;
    const u64 j = (u64)blockIdx.x * NMAJOR_COLS + c;
    const bool live = j < n;
    float acc[ZC_LINEAR_ROWS];
#pragma unroll
    for (int r = 0; r < ZC_LINEAR_ROWS; ++r) acc[r] = 0.0f;
    for (u64 k0 = 0; k0 < k; k0 += NMAJOR_CHUNK) {
        __syncthreads();
        stage_a(s_buf, a, m, k, k0, NMAJOR_CHUNK, a_rs, a_cs);
        __syncthreads();
        if (!live) continue;
        const unsigned len = (unsigned)min((u64)NMAJOR_CHUNK, k - k0);
#pragma unroll 4
        for (unsigned kk = slice; kk < len; kk += NMAJOR_SLICES) {
            const float bv = b[(k0 + kk) * ldb + j];
#pragma unroll
            for (int r = 0; r < ZC_LINEAR_ROWS; ++r) {
                if (r < (int)m) acc[r] = fmaf(s_buf[r * NMAJOR_CHUNK + kk], bv, acc[r]);
            }
        }
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < ZC_LINEAR_ROWS; ++r) {
        if (r < (int)m) s_buf[(slice * ZC_LINEAR_ROWS + r) * NMAJOR_COLS + c] = acc[r];
    }
    __syncthreads();
    // Thread t sums (row t / NMAJOR_COLS, column t % NMAJOR_COLS): m * NMAJOR_COLS <= threads.
    const unsigned r = threadIdx.x / NMAJOR_COLS;
    const u64 jo = (u64)blockIdx.x * NMAJOR_COLS + c;
    if (r >= m || jo >= n) return;
    float v = 0.0f;
    for (unsigned s = 0; s < NMAJOR_SLICES; ++s) {
        v += s_buf[(s * ZC_LINEAR_ROWS + r) * NMAJOR_COLS + c];
    }
    v = linear_epilogue(v, bias, jo, has_bias, act);
    if (beta != 0.0f) v = fmaf(beta, out[r * n + jo], v);
    out[r * n + jo] = v;
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
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (unsigned r = 0; r < rows; ++r) {
            const float gv = gcol[r * g_rs];
            const float4 xv = reinterpret_cast<const float4*>(x + r * x_rs)[i];
            acc.x = fmaf(gv, xv.x, acc.x);
            acc.y = fmaf(gv, xv.y, acc.y);
            acc.z = fmaf(gv, xv.z, acc.z);
            acc.w = fmaf(gv, xv.w, acc.w);
        }
        float4* dst = reinterpret_cast<float4*>(dw + o * ldw) + i;
        float4 d = *dst;
        d.x += acc.x;
        d.y += acc.y;
        d.z += acc.z;
        d.w += acc.w;
        *dst = d;
    } else {
        if (i >= ins) return;
        float acc = 0.0f;
        for (unsigned r = 0; r < rows; ++r) acc = fmaf(gcol[r * g_rs], x[r * x_rs + i * x_cs], acc);
        dw[o * ldw + i] += acc;
    }
}
