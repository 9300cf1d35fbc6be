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
