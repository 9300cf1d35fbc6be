// Device helpers shared by the small-row product kernels (linear.cu, their bf16 forms in
// linear_bf16.cu) and a Linear layer's fused backward (linear_backward.cu): staging of A in
// shared memory, the n-contiguous product at a compile-time row class, and the
// parameter-gradient sums. Every sum runs in
// an order fixed by the shape (no atomics), so the kernels that share them agree bitwise.
#pragma once
#include "common.cuh"

// Most rows of A (the host falls back to cuBLAS above it; LINEAR_ROW_LIMIT in linear.rs).
#define ZC_LINEAR_ROWS 32
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

// k-contiguous B (linear.cu, linear_bf16.cu): columns per block, and warps per column (each
// takes every KMAJOR_SPLIT-th run of 32 lanes x 4 k, so a column's k is spread over
// KMAJOR_SPLIT warps and an SM has enough warps to hide latency); loads of B a lane issues
// before using any.
#define KMAJOR_COLS 8
#define KMAJOR_SPLIT 2
#define KMAJOR_BATCH 4

// The k-contiguous partial sums reuse the staged A's memory too.
static_assert(KMAJOR_SPLIT * ZC_LINEAR_ROWS * KMAJOR_COLS <= ZC_A_SMEM, "partials fit s_a");
static_assert(ZC_LINEAR_ROWS * KMAJOR_COLS <= KMAJOR_COLS * KMAJOR_SPLIT * 32, "a thread per output");

// A float4 of shared memory in one ld.shared.v4.f32 (volatile: kept in place across the
// barriers that restage s_a), for the k-contiguous products' reads of the staged A. A plain
// float4 read let nvcc split some of these loads into v4 + v2 at random from one run to the
// next: the PTX was not reproducible (linear_bf16.cu's form, session 31; linear.cu's float32
// form after an edit of this header, session 33: 6 of 24 compilations differed).
__device__ __forceinline__ float4 lds4(const float* p) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
        : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
        : "r"((unsigned)__cvta_generic_to_shared(p)));
    return v;
}

// idx / d for the small operands of the staging loops (idx < 2^20, d >= 1), from d's
// reciprocal `inv` and one correction each way: a 32-bit division is tens of instructions,
// and the staging loops did eight a thread (ncu: the products were instruction-bound).
__device__ __forceinline__ unsigned div_small(unsigned idx, unsigned d, float inv) {
    unsigned q = __float2uint_rz((float)idx * inv);
    if (q * d > idx) --q;
    if ((q + 1) * d <= idx) ++q;
    return q;
}

// A bf16 form's operand (the `_bf16` entries, issue 42), its form a compile-time choice:
// Bf16Op<false> reads float32 elements and rounds them to bf16 (nearest-even, zc_round_bf16),
// Bf16Op<true> reads a bf16 copy (two bf16 a float, as kernels/convert.cu packs them) and
// widens it. The values are the same either way, so a product on copies equals the one that
// rounds as it reads, bit for bit, where the order of the sums is the same: the bf16 forms
// choose it from the shape alone, never from an address. Loads return the raw bits (`raw`,
// `raw4`) and `cvt` converts them, so a kernel issues a batch of loads before it converts any
// (the float32 kernels' shape: a runtime choice of form inside the batch made ptxas wait on
// each load before issuing the next).
template <bool COPY>
struct Bf16Op;

template <>
struct Bf16Op<false> {
    using raw = float;
    using raw4 = float4;
    static __device__ __forceinline__ raw load(const float* p, u64 i) { return __ldg(p + i); }
    // Elements i .. i + 3 in one load (p 16-byte aligned, i a multiple of 4).
    static __device__ __forceinline__ raw4 load4(const float* p, u64 i) {
        return __ldg(reinterpret_cast<const float4*>(p + i));
    }
    static __device__ __forceinline__ raw4 zero4() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
    static __device__ __forceinline__ float cvt(raw v) { return zc_round_bf16(v); }
    static __device__ __forceinline__ float4 cvt4(raw4 v) {
        return make_float4(zc_round_bf16(v.x), zc_round_bf16(v.y), zc_round_bf16(v.z),
                           zc_round_bf16(v.w));
    }
    // Whether load4 may read from `p`.
    static __device__ __forceinline__ bool aligned(const float* p) { return ((u64)p & 15) == 0; }
    // `p` advanced by `off` elements.
    static __device__ __forceinline__ const float* at(const float* p, u64 off) { return p + off; }
};

template <>
struct Bf16Op<true> {
    using raw = unsigned;
    using raw4 = uint2;
    static __device__ __forceinline__ raw load(const float* p, u64 i) {
        return __ldg(reinterpret_cast<const unsigned short*>(p) + i);
    }
    static __device__ __forceinline__ raw4 load4(const float* p, u64 i) {
        return __ldg(
            reinterpret_cast<const uint2*>(reinterpret_cast<const unsigned short*>(p) + i));
    }
    static __device__ __forceinline__ raw4 zero4() { return make_uint2(0u, 0u); }
    static __device__ __forceinline__ float cvt(raw v) { return __uint_as_float(v << 16); }
    static __device__ __forceinline__ float4 cvt4(raw4 u) {
        return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                           __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
    }
    static __device__ __forceinline__ bool aligned(const float* p) { return ((u64)p & 7) == 0; }
    static __device__ __forceinline__ const float* at(const float* p, u64 off) {
        return reinterpret_cast<const float*>(reinterpret_cast<const unsigned short*>(p) + off);
    }
};

// stage_a for a bf16 form (defined in linear_bf16.cu: with its body here, nvcc numbered
// linear.cu's PTX registers differently, though linear.cu never instantiates it). TANH (A in
// float32 only): tanh's backward of A from y, rounded after the product g · (1 - y²).
template <int MR, bool COPY, bool TANH = false>
__device__ __forceinline__ void stage_a_bf16(float* s_a, const float* a, unsigned m, u64 k0,
                                             unsigned kn, u64 a_rs, u64 a_cs,
                                             const float* y = nullptr, u64 y_rs = 0,
                                             u64 y_cs = 0);

// s_a[r * kn + c] = op(A)[r, k0 + c] for r < m, c < kn, and 0 for m <= r < MR (row pitch
// kn). Every thread of the block takes part; the caller synchronises before (the previous
// chunk is consumed) and after. TANH: what is staged is tanh's backward of A from tanh's
// saved output y (read through its own strides), A · (1 - y²), the formula of
// zc_tanh_backward_f32 (fused.cu), so a Linear layer's fused backward stages the gradient
// before the activation as the composite's separate launch would have written it.
template <int MR, bool TANH = false>
__device__ __forceinline__ void stage_a(float* s_a, const float* a, unsigned m, u64 k0,
                                        unsigned kn, u64 a_rs, u64 a_cs,
                                        const float* y = nullptr, u64 y_rs = 0,
                                        u64 y_cs = 0) {
    const unsigned nt = blockDim.x, tid = threadIdx.x;
    const bool vec = a_cs == 1 && kn % 4 == 0 && a_rs % 4 == 0 && k0 % 4 == 0 &&
                     (((u64)a & 15) == 0) &&
                     (!TANH || (y_cs == 1 && y_rs % 4 == 0 && (((u64)y & 15) == 0)));
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
                    if (TANH) {
                        const float4 t =
                            __ldg(reinterpret_cast<const float4*>(y + r * y_rs + k0) + c);
                        v[u].x = v[u].x * (1.0f - t.x * t.x);
                        v[u].y = v[u].y * (1.0f - t.y * t.y);
                        v[u].z = v[u].z * (1.0f - t.z * t.z);
                        v[u].w = v[u].w * (1.0f - t.w * t.w);
                    }
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
                if (TANH && idx < total && r < m) {
                    const float t = __ldg(y + r * y_rs + (k0 + c) * y_cs);
                    v[u] = v[u] * (1.0f - t * t);
                }
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

// The n-contiguous product at MR rows (see zc_linear_rows_nmajor_f32); TANH: A staged as
// tanh's backward from y (see stage_a). `residual` (dense [m, n], or null) is added after the
// activation. BF16: the bf16 form, A read through Bf16Op<COPY_A> (TANH: staged as tanh's
// backward, then rounded) and B through Bf16Op<COPY_B> (a bf16 copy when set); B's loads are
// scalar either way, so the order of the sums is the float32 form's.
template <int MR, bool TANH = false, bool BF16 = false, bool COPY_A = false, bool COPY_B = false>
__device__ __forceinline__ void nmajor_rows(float* s_a, float* out, const float* a,
                                            const float* __restrict__ b, const float* bias,
                                            unsigned m, u64 k, u64 n, u64 a_rs, u64 a_cs,
                                            u64 ldb, float beta, unsigned has_bias,
                                            unsigned act, const float* residual,
                                            const float* y = nullptr, u64 y_rs = 0,
                                            u64 y_cs = 0) {
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
        if constexpr (BF16) {
            stage_a_bf16<MR, COPY_A, TANH>(s_a, a, m, k0, kn, a_rs, a_cs, y, y_rs, y_cs);
        } else {
            stage_a<MR, TANH>(s_a, a, m, k0, kn, a_rs, a_cs, y, y_rs, y_cs);
        }
        __syncthreads();
        if constexpr (BF16) {
            // The float32 loop's shape: the batch's raw loads, then conversions and FFMAs.
            using Op = Bf16Op<COPY_B>;
            for (unsigned kb = 0; live && kb < kn; kb += NMAJOR_SLICES * NMAJOR_BATCH) {
                typename Op::raw bv[NMAJOR_BATCH];
#pragma unroll
                for (int u = 0; u < NMAJOR_BATCH; ++u) {
                    const unsigned kk = kb + u * NMAJOR_SLICES + slice;
                    bv[u] = kk < kn ? Op::load(b, (k0 + kk) * ldb + j) : (typename Op::raw)0;
                }
#pragma unroll
                for (int u = 0; u < NMAJOR_BATCH; ++u) {
                    const unsigned kk = kb + u * NMAJOR_SLICES + slice;
                    if (kk >= kn) break;
                    const float bf = Op::cvt(bv[u]);
#pragma unroll
                    for (int r = 0; r < MR; ++r) acc[r] = fmaf(s_a[r * kn + kk], bf, acc[r]);
                }
            }
        } else {
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
    if (residual != nullptr) v += residual[r * n + j];
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


// dw[o, i] += Σ_r gz[r, o] · x[r, i] (r in row order) and, when has_db, db[o] += Σ_r gz[r, o],
// for block `blk` of a 2-D grid of `bdim` blocks (x along i, y along o), thread `tid`. gz is g,
// or (TANH) tanh's backward g · (1 - y²) from the saved output y, computed as it is read.
// dw's rows are ldw apart with a dense last axis. A thread takes a float4 of i when ins, ldw
// and x's row stride are multiples of 4, x's last axis is dense and dw and x are 16-byte
// aligned (the host makes the same test: linear_grads_vec4), else a float. Thread x = 0 of
// the first block column sums db[o], so each db element has one fixed writer.
template <bool TANH = false>
__device__ __forceinline__ void param_grads_block(float* dw, float* db, const float* g,
                                                  const float* x, unsigned rows, u64 outs,
                                                  u64 ins, u64 g_rs, u64 g_cs, u64 x_rs,
                                                  u64 x_cs, u64 ldw, u64 db_stride,
                                                  unsigned has_db, dim3 blk, dim3 tid,
                                                  dim3 bdim, const float* y = nullptr,
                                                  u64 y_rs = 0, u64 y_cs = 0) {
    const u64 o = (u64)blk.y * bdim.y + tid.y;
    if (o >= outs) return;
    const float* gcol = g + o * g_cs;
    const float* ycol = TANH ? y + o * y_cs : nullptr;
    // The gradient before the activation at row r of column o.
    auto gz = [&](unsigned r) {
        const float v = gcol[r * g_rs];
        if (!TANH) return v;
        const float t = ycol[r * y_rs];
        return v * (1.0f - t * t);
    };
    if (has_db && blk.x == 0 && tid.x == 0) {
        float s = 0.0f;
        for (unsigned r = 0; r < rows; ++r) s += gz(r);
        db[o * db_stride] += s;
    }
    const bool vec4 = ins % 4 == 0 && ldw % 4 == 0 && x_cs == 1 && x_rs % 4 == 0 &&
                      ((((u64)dw | (u64)x) & 15) == 0);
    const u64 i = (u64)blk.x * bdim.x + tid.x;
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
                gv[u] = r < rows ? gz(r) : 0.0f;
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
        for (unsigned r = 0; r < rows; ++r) acc = fmaf(gz(r), x[r * x_rs + i * x_cs], acc);
        dw[o * ldw + i] = d + acc;
    }
}
