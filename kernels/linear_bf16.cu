// The bf16 forms of linear.cu's small-row products and of its weight gradient (issue 42's
// bf16 policy; launched from crates/zcompute/src/cuda/linear.rs under MathMode::Bf16, each
// with a simulated twin in cuda/twins/linear.rs): every element of op(A) and op(B)
// rounded to bf16 (nearest-even, zc_round_bf16) as it is read, or read from a bf16 copy where
// `packed` says (bit 0: A, bit 1: B; kernels/convert.cu's packing, as PrecisionOps' copies
// hold it), float32 products and sums in the float32 forms' order, and the same float32
// epilogue (bias, activation, residual, beta). A file of their own, so linear.cu's float32
// entries compile to the PTX they had (beside these entries nvcc scheduled a shared-memory
// load of the float32 k-contiguous entry differently).
#include "linear_rows.cuh"

// kmajor_sums for the bf16 forms: B read through bf16_in (a bf16 copy when `copy`), four at a
// time in one load when `aligned`, else one by one along the same runs, so the order of the
// sums follows the shape only.
template <int MR, bool VEC>
__device__ __forceinline__ void kmajor_sums_bf16(float (&acc)[MR], const float* s_a,
                                                 const float* __restrict__ col, bool copy,
                                                 bool aligned, unsigned kn, unsigned lane,
                                                 unsigned part) {
    const unsigned w = VEC ? 4 : 1;
    const unsigned step = KMAJOR_SPLIT * 32 * w;
    for (unsigned k0 = 0; k0 < kn; k0 += step * KMAJOR_BATCH) {
        float4 bv[KMAJOR_BATCH];
#pragma unroll
        for (int u = 0; u < KMAJOR_BATCH; ++u) {
            const unsigned kk = k0 + u * step + (part * 32 + lane) * w;
            bv[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (kk < kn) {
                if (VEC && aligned) {
                    bv[u] = bf16_in4(col, copy, kk);
                } else if (VEC) {
                    bv[u] = make_float4(bf16_in(col, copy, kk), bf16_in(col, copy, kk + 1),
                                        bf16_in(col, copy, kk + 2), bf16_in(col, copy, kk + 3));
                } else {
                    bv[u].x = bf16_in(col, copy, kk);
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

// kmajor_rows for the bf16 forms: A staged through stage_a_bf16, B summed by
// kmajor_sums_bf16, whose vector runs are taken whenever k and ldb are multiples of 4 (the
// float32 form also asks for an aligned B, which a copy and the tensor it was made from need
// not share), then kmajor_rows' reduction and epilogue.
template <int MR>
__device__ __forceinline__ void kmajor_rows_bf16(float* s_a, float* out, const float* a,
                                                 const float* b, const float* bias, unsigned m,
                                                 u64 k, u64 n, u64 a_rs, u64 a_cs, u64 ldb,
                                                 float beta, unsigned has_bias, unsigned act,
                                                 const float* residual, unsigned packed) {
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const unsigned c = warp % KMAJOR_COLS, part = warp / KMAJOR_COLS;
    const u64 j = (u64)blockIdx.x * KMAJOR_COLS + c;
    const bool live = j < n;
    const bool copy_a = packed & 1, copy_b = packed & 2;
    const bool vec4 = k % 4 == 0 && ldb % 4 == 0;
    const bool aligned = bf16_in4_aligned(b, copy_b);
    const unsigned kcap = (ZC_A_SMEM / MR) & ~3u;
    const u64 col0 = (live ? j : 0) * ldb;
    float acc[MR];
#pragma unroll
    for (int r = 0; r < MR; ++r) acc[r] = 0.0f;
    for (u64 k0 = 0; k0 < k; k0 += kcap) {
        const unsigned kn = (unsigned)(k - k0 < kcap ? k - k0 : kcap);
        __syncthreads();
        stage_a_bf16<MR>(s_a, a, copy_a, m, k0, kn, a_rs, a_cs);
        __syncthreads();
        if (!live) continue;
        const float* col = bf16_at(b, copy_b, col0 + k0);
        if (vec4) {
            kmajor_sums_bf16<MR, true>(acc, s_a, col, copy_b, aligned, kn, lane, part);
        } else {
            kmajor_sums_bf16<MR, false>(acc, s_a, col, copy_b, aligned, kn, lane, part);
        }
    }
    // kmajor_rows' reduction: a fixed xor-shuffle tree per warp, then the column's
    // KMAJOR_SPLIT warps in order.
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

template <int MR>
__device__ __forceinline__ void nmajor_rows_bf16(float* s_a, float* out, const float* a,
                                                 const float* b, const float* bias, unsigned m,
                                                 u64 k, u64 n, u64 a_rs, u64 a_cs, u64 ldb,
                                                 float beta, unsigned has_bias, unsigned act,
                                                 const float* residual, unsigned packed) {
    nmajor_rows<MR, false, true>(s_a, out, a, b, bias, m, k, n, a_rs, a_cs, ldb, beta, has_bias,
                                 act, residual, nullptr, 0, 0, packed);
}

// zc_linear_rows_kmajor_f32's bf16 form: its parameters and launch shape, then `packed`.
extern "C" __global__ void __launch_bounds__(KMAJOR_COLS * KMAJOR_SPLIT * 32)
    zc_linear_rows_kmajor_bf16(float* out, const float* a, const float* b, const float* bias,
                               unsigned m, u64 k, u64 n, u64 a_rs, u64 a_cs, u64 ldb,
                               float beta, unsigned has_bias, unsigned act,
                               const float* residual, unsigned packed) {
    __shared__ __align__(16) float s_a[ZC_A_SMEM];
    ZC_ROW_CLASSES(kmajor_rows_bf16, s_a, out, a, b, bias, m, k, n, a_rs, a_cs, ldb, beta,
                   has_bias, act, residual, packed);
}

// zc_linear_rows_nmajor_f32's bf16 form: its parameters and launch shape, then `packed`.
extern "C" __global__ void __launch_bounds__(NMAJOR_COLS * NMAJOR_SLICES)
    zc_linear_rows_nmajor_bf16(float* out, const float* a, const float* b, const float* bias,
                               unsigned m, u64 k, u64 n, u64 a_rs, u64 a_cs, u64 ldb,
                               float beta, unsigned has_bias, unsigned act,
                               const float* residual, unsigned packed) {
    __shared__ __align__(16) float s_a[ZC_A_SMEM];
    ZC_ROW_CLASSES(nmajor_rows_bf16, s_a, out, a, b, bias, m, k, n, a_rs, a_cs, ldb, beta,
                   has_bias, act, residual, packed);
}

// The bf16 form of zc_linear_param_grads_f32's weight gradient, for a product `dw += op(A) ·
// op(B)` of few rows (k <= ZC_LINEAR_ROWS) and many columns of op(A) (m, a Linear layer's
// outputs, past the row kernels' limit): dw[o, i] += Σ_r g'[r, o] · x'[r, i], r in row order,
// g[r, o] = op(A)[o, r] and x = op(B) through their strides, each element rounded to bf16 as
// it is read or read from a bf16 copy where `packed` says (bit 0: g, bit 1: x). One element of
// dw a thread (the float32 kernel's float4 path sums each element in the same order), grid
// (ceil(ins / blockDim.x), ceil(outs / blockDim.y)); dw's rows ldw apart, last axis dense. No
// bias gradient: under bf16 it is a float32 sum of the unrounded gradient, which the host
// runs apart (PrecisionOps::linear_backward_into_mode).
extern "C" __global__ void zc_linear_param_grads_bf16(float* dw, const float* g, const float* x,
                                                      unsigned rows, u64 outs, u64 ins,
                                                      u64 g_rs, u64 g_cs, u64 x_rs, u64 x_cs,
                                                      u64 ldw, unsigned packed) {
    const u64 o = (u64)blockIdx.y * blockDim.y + threadIdx.y;
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= outs || i >= ins) return;
    const bool copy_g = packed & 1, copy_x = packed & 2;
    const float d = dw[o * ldw + i];
    float acc = 0.0f;
#pragma unroll 8
    for (unsigned r = 0; r < rows; ++r) {
        acc = fmaf(bf16_in(g, copy_g, r * g_rs + o * g_cs), bf16_in(x, copy_x, r * x_rs + i * x_cs),
                   acc);
    }
    dw[o * ldw + i] = d + acc;
}
