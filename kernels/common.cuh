// Shared pieces of the zcompute kernels: scalar formulas (the same ones as
// crates/zcompute/src/cpu/math.rs), strided indexing, warp reductions.
#pragma once

typedef unsigned long long u64;

// Most axes a strided kernel takes; the host merges adjacent axes first, so views of higher
// rank usually fit.
#define ZC_MAX_RANK 6

// Unary op codes (crates/zcompute/src/cuda/kernels.rs: unary_code).
#define U_NEG 0
#define U_EXP 1
#define U_LOG 2
#define U_SQRT 3
#define U_RSQRT 4
#define U_TANH 5
#define U_SIGMOID 6
#define U_RELU 7
#define U_GELU 8

// Binary op codes (binary_code).
#define B_ADD 0
#define B_SUB 1
#define B_MUL 2
#define B_DIV 3
#define B_MAX 4

__device__ __forceinline__ float zc_sigmoid(float x) {
    if (x >= 0.0f) {
        return 1.0f / (1.0f + expf(-x));
    }
    float e = expf(x);
    return e / (1.0f + e);
}

template <int OP>
__device__ __forceinline__ float unary_apply(float x) {
    if (OP == U_NEG) return -x;
    if (OP == U_EXP) return expf(x);
    if (OP == U_LOG) return logf(x);
    if (OP == U_SQRT) return sqrtf(x);
    if (OP == U_RSQRT) return 1.0f / sqrtf(x);
    if (OP == U_TANH) return tanhf(x);
    if (OP == U_SIGMOID) return zc_sigmoid(x);
    if (OP == U_RELU) return x < 0.0f ? 0.0f : x;
    // Exact GELU (erf form).
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f));
}

// NaN-propagating maximum: NaN in either operand gives NaN.
__device__ __forceinline__ float zc_maximum(float a, float b) {
    return (isnan(a) || a >= b) ? a : b;
}

template <int OP>
__device__ __forceinline__ float binary_apply(float a, float b) {
    if (OP == B_ADD) return a + b;
    if (OP == B_SUB) return a - b;
    if (OP == B_MUL) return a * b;
    if (OP == B_DIV) return a / b;
    return zc_maximum(a, b);
}

// Shape and strides (in elements) of a strided operand, as passed by the host: rank, then
// ZC_MAX_RANK sizes, then ZC_MAX_RANK strides per operand.
struct Dims {
    unsigned rank;
    u64 shape[ZC_MAX_RANK];
};

// Offset of logical (row-major) element `i` through `stride`.
__device__ __forceinline__ u64 strided_offset(u64 i, const Dims& d, const u64* stride) {
    u64 off = 0;
    for (int ax = (int)d.rank - 1; ax >= 0; --ax) {
        u64 s = d.shape[ax];
        off += (i % s) * stride[ax];
        i /= s;
    }
    return off;
}

// The same in 32-bit arithmetic (64-bit division is a long software sequence on the GPU; 32-bit
// is a few instructions), for views whose every offset fits (see fits32).
__device__ __forceinline__ unsigned strided_offset32(unsigned i, const Dims& d, const u64* stride) {
    unsigned off = 0;
    for (int ax = (int)d.rank - 1; ax >= 0; --ax) {
        unsigned s = (unsigned)d.shape[ax];
        off += (i % s) * (unsigned)stride[ax];
        i /= s;
    }
    return off;
}

// Whether `n` elements and every offset of the view (shape d, `stride`) fit in 32 bits.
__device__ __forceinline__ bool fits32(u64 n, const Dims& d, const u64* stride) {
    if (n > 0xffffffffull) return false;
    u64 last = 0;
    for (unsigned ax = 0; ax < d.rank; ++ax) {
        if (d.shape[ax] > 0xffffffffull || stride[ax] > 0xffffffffull) return false;
        last += (d.shape[ax] - 1) * stride[ax];
    }
    return last <= 0xffffffffull;
}

#define DIMS_PARAMS unsigned rank, u64 d0, u64 d1, u64 d2, u64 d3, u64 d4, u64 d5
#define STRIDE_PARAMS(p) u64 p##0, u64 p##1, u64 p##2, u64 p##3, u64 p##4, u64 p##5
#define MAKE_DIMS(d) Dims d = {rank, {d0, d1, d2, d3, d4, d5}}
#define MAKE_STRIDES(p) const u64 p[ZC_MAX_RANK] = {p##0, p##1, p##2, p##3, p##4, p##5}

#define GRID_STRIDE_LOOP(i, start, n)                                                       \
    for (u64 i = (start) + (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n);            \
         i += (u64)blockDim.x * gridDim.x)

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// One warp's LayerNorm backward of row `row` (`lane` its lane): g_xhat = g * xhat when
// want_gxhat (its column sums are the weight's gradient) and, when want_gx,
// gx = LN'(g) (+ residual when `residual` is not null). Shared by the plain kernel (rows.cu)
// and the one that adds the residual stream's gradient in the same pass (fused.cu).
__device__ __forceinline__ void layer_norm_backward_row(
    float* gx, float* g_xhat, const float* g, const float* x, const float* residual, u64 row,
    float mu, float rs, const float* weight, unsigned has_weight, unsigned want_gx,
    unsigned want_gxhat, u64 n, unsigned lane) {
    const float* gr = g + row * n;
    const float* xr = x + row * n;
    float s1 = 0.0f;
    float s2 = 0.0f;
    for (u64 j = lane; j < n; j += 32) {
        float xh = (xr[j] - mu) * rs;
        float gj = gr[j];
        float gh = has_weight ? gj * weight[j] : gj;
        s1 += gh;
        s2 += gh * xh;
        if (want_gxhat) g_xhat[row * n + j] = gj * xh;
    }
    if (!want_gx) return;
    float m1 = warp_sum(s1) / (float)n;
    float m2 = warp_sum(s2) / (float)n;
    for (u64 j = lane; j < n; j += 32) {
        float xh = (xr[j] - mu) * rs;
        float gh = has_weight ? gr[j] * weight[j] : gr[j];
        float v = ((gh - m1) - xh * m2) * rs;
        if (residual) v += residual[row * n + j];
        gx[row * n + j] = v;
    }
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = zc_maximum(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ bool aligned16(const void* p) {
    return (((unsigned long long)p) & 15ull) == 0;
}

// x rounded to bf16 (nearest, ties to even) and widened back to float: convert.cu's integer
// formula (and zdevice's `rounding::bf16_bits`), so a kernel's bf16 operands have the CPU
// emulation's bits. A NaN stays a quiet NaN of its sign; past bf16's largest, an infinity.
__device__ __forceinline__ float zc_round_bf16(float x) {
    unsigned int b = __float_as_uint(x);
    unsigned int r = (b & 0x7fffffffu) > 0x7f800000u ? ((b >> 16) | 0x0040u)
                                                      : ((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
    return __uint_as_float(r << 16);
}

// A product's operand under a kernel's precision: rounded to bf16 in its bf16 form, else as is.
template <bool BF16>
__device__ __forceinline__ float zc_operand(float x) {
    return BF16 ? zc_round_bf16(x) : x;
}
