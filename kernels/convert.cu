// Element-type conversions for the mixed-precision products of issue 42 (crates/zcompute/src/
// precision.rs, launched from crates/zcompute/src/cuda/precision.rs). Integer arithmetic only,
// the same as zdevice's `rounding::bf16_bits`, so the GPU, the simulated twins
// (crates/zcompute/src/cuda/twins/convert.rs) and the CPU backend agree bit for bit on every
// input; dense operands, one element per thread step.
#include "common.cuh"

// out[i] = in[i] rounded to bf16 (nearest, ties to even). A NaN stays a NaN of its sign, made
// quiet with its top payload bits kept; a value past bf16's largest by half an ulp or more
// becomes an infinity.
extern "C" __global__ void zc_f32_to_bf16(unsigned short* out, const float* in, u64 n) {
    GRID_STRIDE_LOOP(i, 0, n) {
        unsigned int b = __float_as_uint(in[i]);
        unsigned int r;
        if ((b & 0x7fffffffu) > 0x7f800000u) {
            r = (b >> 16) | 0x0040u;
        } else {
            r = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
        }
        out[i] = (unsigned short)r;
    }
}

// out[i] = the float32 value of bf16 in[i] (exact).
extern "C" __global__ void zc_bf16_to_f32(float* out, const unsigned short* in, u64 n) {
    GRID_STRIDE_LOOP(i, 0, n) {
        out[i] = __uint_as_float(((unsigned int)in[i]) << 16);
    }
}

// zc_tanh_backward_f32 (fused.cu) and zc_f32_to_bf16 in one pass, for a Linear layer's
// backward under bf16: gz[i] = g[i] * (1 - y[i]²), tanh's backward with that kernel's
// expression, and out[i] its bf16 copy (zc_f32_to_bf16's formula).
extern "C" __global__ void zc_tanh_backward_bf16(float* gz, unsigned short* out, const float* g,
                                                 const float* y, u64 n) {
    GRID_STRIDE_LOOP(i, 0, n) {
        float v = y[i];
        float r = g[i] * (1.0f - v * v);
        gz[i] = r;
        unsigned int b = __float_as_uint(r);
        unsigned int h;
        if ((b & 0x7fffffffu) > 0x7f800000u) {
            h = (b >> 16) | 0x0040u;
        } else {
            h = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
        }
        out[i] = (unsigned short)h;
    }
}
