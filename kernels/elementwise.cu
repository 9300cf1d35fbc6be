// Elementwise kernels of zcompute: unary maps, binaries (dense and broadcast/strided), scalar
// forms, strided copies and fills. Dense kernels use 16-byte vector loads when every pointer is
// 16-byte aligned and finish the tail (n % 4) with scalar loads; otherwise they run scalar.
// All loops are grid-stride, so any launch covers any n.
#include "common.cuh"

template <int OP>
__device__ void unary_dense(float* out, const float* in, u64 n) {
    if (aligned16(out) && aligned16(in)) {
        u64 n4 = n / 4;
        const float4* in4 = reinterpret_cast<const float4*>(in);
        float4* out4 = reinterpret_cast<float4*>(out);
        GRID_STRIDE_LOOP(i, 0, n4) {
            float4 v = in4[i];
            v.x = unary_apply<OP>(v.x);
            v.y = unary_apply<OP>(v.y);
            v.z = unary_apply<OP>(v.z);
            v.w = unary_apply<OP>(v.w);
            out4[i] = v;
        }
        GRID_STRIDE_LOOP(i, n4 * 4, n) { out[i] = unary_apply<OP>(in[i]); }
    } else {
        GRID_STRIDE_LOOP(i, 0, n) { out[i] = unary_apply<OP>(in[i]); }
    }
}

#define DISPATCH_UNARY(op, CALL)      \
    switch (op) {                     \
        case U_NEG: CALL(U_NEG); break;         \
        case U_EXP: CALL(U_EXP); break;         \
        case U_LOG: CALL(U_LOG); break;         \
        case U_SQRT: CALL(U_SQRT); break;       \
        case U_RSQRT: CALL(U_RSQRT); break;     \
        case U_TANH: CALL(U_TANH); break;       \
        case U_SIGMOID: CALL(U_SIGMOID); break; \
        case U_RELU: CALL(U_RELU); break;       \
        default: CALL(U_GELU); break;           \
    }

#define DISPATCH_BINARY(op, CALL)   \
    switch (op) {                   \
        case B_ADD: CALL(B_ADD); break; \
        case B_SUB: CALL(B_SUB); break; \
        case B_MUL: CALL(B_MUL); break; \
        case B_DIV: CALL(B_DIV); break; \
        default: CALL(B_MAX); break;    \
    }

// out[i] = f(in[i]) for dense out and in.
extern "C" __global__ void zc_unary_f32(float* out, const float* in, unsigned op, u64 n) {
#define CALL(OP) unary_dense<OP>(out, in, n)
    DISPATCH_UNARY(op, CALL)
#undef CALL
}

template <int OP>
__device__ void unary_strided(float* out, const float* in, u64 n, const Dims& d, const u64* s) {
    if (fits32(n, d, s)) {
        GRID_STRIDE_LOOP(i, 0, n) {
            out[i] = unary_apply<OP>(in[strided_offset32((unsigned)i, d, s)]);
        }
        return;
    }
    GRID_STRIDE_LOOP(i, 0, n) { out[i] = unary_apply<OP>(in[strided_offset(i, d, s)]); }
}

// out (dense) = f(in viewed through shape/strides).
extern "C" __global__ void zc_unary_strided_f32(float* out, const float* in, unsigned op, u64 n,
                                                DIMS_PARAMS, STRIDE_PARAMS(s)) {
    MAKE_DIMS(d);
    MAKE_STRIDES(s);
#define CALL(OP) unary_strided<OP>(out, in, n, d, s)
    DISPATCH_UNARY(op, CALL)
#undef CALL
}

template <int OP>
__device__ void binary_dense(float* out, const float* a, const float* b, u64 n) {
    if (aligned16(out) && aligned16(a) && aligned16(b)) {
        u64 n4 = n / 4;
        const float4* a4 = reinterpret_cast<const float4*>(a);
        const float4* b4 = reinterpret_cast<const float4*>(b);
        float4* out4 = reinterpret_cast<float4*>(out);
        GRID_STRIDE_LOOP(i, 0, n4) {
            float4 x = a4[i];
            float4 y = b4[i];
            float4 r;
            r.x = binary_apply<OP>(x.x, y.x);
            r.y = binary_apply<OP>(x.y, y.y);
            r.z = binary_apply<OP>(x.z, y.z);
            r.w = binary_apply<OP>(x.w, y.w);
            out4[i] = r;
        }
        GRID_STRIDE_LOOP(i, n4 * 4, n) { out[i] = binary_apply<OP>(a[i], b[i]); }
    } else {
        GRID_STRIDE_LOOP(i, 0, n) { out[i] = binary_apply<OP>(a[i], b[i]); }
    }
}

// out[i] = a[i] op b[i], all dense with the same shape.
extern "C" __global__ void zc_binary_f32(float* out, const float* a, const float* b, unsigned op,
                                         u64 n) {
#define CALL(OP) binary_dense<OP>(out, a, b, n)
    DISPATCH_BINARY(op, CALL)
#undef CALL
}

template <int OP>
__device__ void binary_strided(float* out, const float* a, const float* b, u64 n, const Dims& d,
                               const u64* sa, const u64* sb) {
    if (fits32(n, d, sa) && fits32(n, d, sb)) {
        GRID_STRIDE_LOOP(i, 0, n) {
            unsigned j = (unsigned)i;
            out[i] = binary_apply<OP>(a[strided_offset32(j, d, sa)], b[strided_offset32(j, d, sb)]);
        }
        return;
    }
    GRID_STRIDE_LOOP(i, 0, n) {
        out[i] = binary_apply<OP>(a[strided_offset(i, d, sa)], b[strided_offset(i, d, sb)]);
    }
}

// out (dense, shape d) = a op b, each read through its own strides (0 where it broadcasts).
extern "C" __global__ void zc_binary_strided_f32(float* out, const float* a, const float* b,
                                                 unsigned op, u64 n, DIMS_PARAMS,
                                                 STRIDE_PARAMS(sa), STRIDE_PARAMS(sb)) {
    MAKE_DIMS(d);
    MAKE_STRIDES(sa);
    MAKE_STRIDES(sb);
#define CALL(OP) binary_strided<OP>(out, a, b, n, d, sa, sb)
    DISPATCH_BINARY(op, CALL)
#undef CALL
}

// Row-tiled strided kernels, for views whose last (merged) axis is long: each block takes 8
// rows, 8 of its threads compute the rows' operand offsets once (the divisions of
// strided_offset), and each warp then walks one row with stride 32, so the index arithmetic is
// paid per row instead of per element.
#define ROWS_PER_TILE 8

template <int OP>
__device__ void binary_rows(float* out, const float* a, const float* b, u64 n, const Dims& d,
                            const u64* sa, const u64* sb) {
    __shared__ u64 aoff[ROWS_PER_TILE];
    __shared__ u64 boff[ROWS_PER_TILE];
    const u64 len = d.shape[d.rank - 1];
    const u64 a_in = sa[d.rank - 1];
    const u64 b_in = sb[d.rank - 1];
    Dims outer = d;
    outer.rank = d.rank - 1;
    const u64 rows = n / len;
    const unsigned tx = threadIdx.x % 32;
    const unsigned ty = threadIdx.x / 32;
    for (u64 r0 = (u64)blockIdx.x * ROWS_PER_TILE; r0 < rows;
         r0 += (u64)gridDim.x * ROWS_PER_TILE) {
        if (threadIdx.x < ROWS_PER_TILE && r0 + threadIdx.x < rows) {
            aoff[threadIdx.x] = strided_offset(r0 + threadIdx.x, outer, sa);
            boff[threadIdx.x] = strided_offset(r0 + threadIdx.x, outer, sb);
        }
        __syncthreads();
        const u64 r = r0 + ty;
        if (r < rows) {
            const float* ar = a + aoff[ty];
            const float* br = b + boff[ty];
            float* o = out + r * len;
            for (u64 j = tx; j < len; j += 32) o[j] = binary_apply<OP>(ar[j * a_in], br[j * b_in]);
        }
        __syncthreads();
    }
}

// As zc_binary_strided_f32 (same parameters), row-tiled; the host uses it for rank >= 2 views
// whose last merged axis is long (kernels.rs: row_tiles).
extern "C" __global__ void zc_binary_rows_strided_f32(float* out, const float* a, const float* b,
                                                      unsigned op, u64 n, DIMS_PARAMS,
                                                      STRIDE_PARAMS(sa), STRIDE_PARAMS(sb)) {
    MAKE_DIMS(d);
    MAKE_STRIDES(sa);
    MAKE_STRIDES(sb);
#define CALL(OP) binary_rows<OP>(out, a, b, n, d, sa, sb)
    DISPATCH_BINARY(op, CALL)
#undef CALL
}

template <int OP>
__device__ __forceinline__ float scalar_apply(float x, float s, unsigned lhs) {
    return lhs ? binary_apply<OP>(s, x) : binary_apply<OP>(x, s);
}

template <int OP>
__device__ void scalar_dense(float* out, const float* in, float s, unsigned lhs, u64 n) {
    if (aligned16(out) && aligned16(in)) {
        u64 n4 = n / 4;
        const float4* in4 = reinterpret_cast<const float4*>(in);
        float4* out4 = reinterpret_cast<float4*>(out);
        GRID_STRIDE_LOOP(i, 0, n4) {
            float4 v = in4[i];
            v.x = scalar_apply<OP>(v.x, s, lhs);
            v.y = scalar_apply<OP>(v.y, s, lhs);
            v.z = scalar_apply<OP>(v.z, s, lhs);
            v.w = scalar_apply<OP>(v.w, s, lhs);
            out4[i] = v;
        }
        GRID_STRIDE_LOOP(i, n4 * 4, n) { out[i] = scalar_apply<OP>(in[i], s, lhs); }
    } else {
        GRID_STRIDE_LOOP(i, 0, n) { out[i] = scalar_apply<OP>(in[i], s, lhs); }
    }
}

// out[i] = in[i] op s (lhs == 0) or s op in[i] (lhs == 1), dense.
extern "C" __global__ void zc_binary_scalar_f32(float* out, const float* in, float s,
                                                unsigned op, unsigned lhs, u64 n) {
#define CALL(OP) scalar_dense<OP>(out, in, s, lhs, n)
    DISPATCH_BINARY(op, CALL)
#undef CALL
}

// dst (through ds) = src (through ss), both of shape d. The host never passes overlapping
// operands (aliased copies go through a temporary).
extern "C" __global__ void zc_copy_strided_f32(float* dst, const float* src, u64 n, DIMS_PARAMS,
                                               STRIDE_PARAMS(ss), STRIDE_PARAMS(ds)) {
    MAKE_DIMS(d);
    MAKE_STRIDES(ss);
    MAKE_STRIDES(ds);
    if (fits32(n, d, ss) && fits32(n, d, ds)) {
        GRID_STRIDE_LOOP(i, 0, n) {
            unsigned j = (unsigned)i;
            dst[strided_offset32(j, d, ds)] = src[strided_offset32(j, d, ss)];
        }
        return;
    }
    GRID_STRIDE_LOOP(i, 0, n) { dst[strided_offset(i, d, ds)] = src[strided_offset(i, d, ss)]; }
}

// Every element of dst (through ds) = value.
extern "C" __global__ void zc_fill_strided_f32(float* dst, float value, u64 n, DIMS_PARAMS,
                                               STRIDE_PARAMS(ds)) {
    MAKE_DIMS(d);
    MAKE_STRIDES(ds);
    GRID_STRIDE_LOOP(i, 0, n) { dst[strided_offset(i, d, ds)] = value; }
}

// As zc_copy_strided_f32 (same parameters), row-tiled (see binary_rows).
extern "C" __global__ void zc_copy_rows_strided_f32(float* dst, const float* src, u64 n,
                                                    DIMS_PARAMS, STRIDE_PARAMS(ss),
                                                    STRIDE_PARAMS(ds)) {
    MAKE_DIMS(d);
    MAKE_STRIDES(ss);
    MAKE_STRIDES(ds);
    __shared__ u64 soff[ROWS_PER_TILE];
    __shared__ u64 doff[ROWS_PER_TILE];
    const u64 len = d.shape[d.rank - 1];
    const u64 s_in = ss[d.rank - 1];
    const u64 d_in = ds[d.rank - 1];
    Dims outer = d;
    outer.rank = d.rank - 1;
    const u64 rows = n / len;
    const unsigned tx = threadIdx.x % 32;
    const unsigned ty = threadIdx.x / 32;
    for (u64 r0 = (u64)blockIdx.x * ROWS_PER_TILE; r0 < rows;
         r0 += (u64)gridDim.x * ROWS_PER_TILE) {
        if (threadIdx.x < ROWS_PER_TILE && r0 + threadIdx.x < rows) {
            soff[threadIdx.x] = strided_offset(r0 + threadIdx.x, outer, ss);
            doff[threadIdx.x] = strided_offset(r0 + threadIdx.x, outer, ds);
        }
        __syncthreads();
        if (r0 + ty < rows) {
            const float* sr = src + soff[ty];
            float* dr = dst + doff[ty];
            for (u64 j = tx; j < len; j += 32) dr[j * d_in] = sr[j * s_in];
        }
        __syncthreads();
    }
}
