// Kernels over a model's flat parameter and gradient buffers: the global gradient norm in two
// deterministic passes (a fixed grid of per-block partials, then one block sums them in a
// fixed order; one launch where the last block does the second pass), clipping by that norm with the coefficient computed on the device,
// and the finiteness gate of a captured AdamW step.
#include "common.cuh"

#define FLAT_THREADS 256

// Sums a block's FLAT_THREADS values in shared memory in a fixed tree order; thread 0 gets it.
__device__ __forceinline__ float block_sum(float v, float* shared) {
    shared[threadIdx.x] = v;
    __syncthreads();
    for (unsigned half = FLAT_THREADS / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
        __syncthreads();
    }
    return shared[0];
}

// First pass: partial[block] = sum of x[i]^2 over the elements i with
// (i / FLAT_THREADS) % gridDim.x == block (a grid-stride walk over FLAT_THREADS-wide tiles).
extern "C" __global__ void zc_sum_squares_partial_f32(float* partial, const float* x, u64 n) {
    __shared__ float shared[FLAT_THREADS];
    float acc = 0.0f;
    GRID_STRIDE_LOOP(i, 0, n) {
        float v = x[i];
        acc += v * v;
    }
    float total = block_sum(acc, shared);
    if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

// Second pass, one block: out[0] = sqrt(sum of partial[0..parts]).
extern "C" __global__ void zc_norm_finish_f32(float* out, const float* partial, u64 parts) {
    __shared__ float shared[FLAT_THREADS];
    float acc = 0.0f;
    for (u64 i = threadIdx.x; i < parts; i += FLAT_THREADS) acc += partial[i];
    float total = block_sum(acc, shared);
    if (threadIdx.x == 0) out[0] = sqrtf(total);
}

// Both norm passes in one launch (a graph node fewer): every block writes its partial as
// zc_sum_squares_partial_f32 does, and the last block to finish (ticket tickets[0], taken
// with an atomic after a fence) sums the partials as zc_norm_finish_f32 does, so the bits
// are the two launches'. It leaves the ticket at 0 for the next launch on the stream.
extern "C" __global__ void zc_sum_squares_norm_f32(float* out, float* partial,
                                                   unsigned* tickets, const float* x, u64 n) {
    __shared__ float shared[FLAT_THREADS];
    __shared__ bool last;
    float acc = 0.0f;
    GRID_STRIDE_LOOP(i, 0, n) {
        float v = x[i];
        acc += v * v;
    }
    float total = block_sum(acc, shared);
    if (threadIdx.x == 0) partial[blockIdx.x] = total;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(tickets, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    acc = 0.0f;
    // What other blocks just wrote: from L2, past this SM's L1.
    for (u64 i = threadIdx.x; i < gridDim.x; i += FLAT_THREADS) acc += __ldcg(partial + i);
    total = block_sum(acc, shared);
    if (threadIdx.x == 0) {
        out[0] = sqrtf(total);
        tickets[0] = 0u;
    }
}

// x[i] *= min(1, max_norm / (norm[0] + 1e-6)) (PyTorch's clip_grad_norm_ coefficient). A NaN
// norm gives a NaN coefficient, as the composed ops do (the step's gate then skips it).
extern "C" __global__ void zc_clip_scale_f32(float* x, const float* norm, float max_norm, u64 n) {
    float coef = max_norm / (norm[0] + 1e-6f);
    coef = coef > 1.0f ? 1.0f : coef;
    GRID_STRIDE_LOOP(i, 0, n) { x[i] *= coef; }
}

// dst[0] = 0 * a[0] + 0 * b[0]: 0 when both are finite, NaN otherwise (AdamW's gate).
extern "C" __global__ void zc_finite_gate_f32(float* dst, const float* a, const float* b) {
    if (blockIdx.x == 0 && threadIdx.x == 0) dst[0] = 0.0f * a[0] + 0.0f * b[0];
}
