// The loss and the optimiser step.
#include "common.cuh"

#define BCE_THREADS 256

// out[0] = mean over i < n of max(x,0) - x*y + log1p(exp(-|x|)). One block of BCE_THREADS:
// each thread sums a strided share, then a shared-memory tree (deterministic order).
extern "C" __global__ void zc_bce_mean_f32(float* out, const float* logits, const float* targets,
                                           u64 n) {
    __shared__ float partial[BCE_THREADS];
    float acc = 0.0f;
    for (u64 i = threadIdx.x; i < n; i += BCE_THREADS) {
        float x = logits[i];
        float y = targets[i];
        float pos = x > 0.0f ? x : 0.0f;
        acc += pos - x * y + log1pf(expf(-fabsf(x)));
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (unsigned half = BCE_THREADS / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[0] = partial[0] / (float)n;
}

// Fused AdamW over dense p, m, v, g of n elements. slot = [lr, t] is read from device memory
// at run time, so a captured step replays with the current learning rate and step count.
extern "C" __global__ void zc_adamw_f32(float* p, float* m, float* v, const float* g,
                                        const float* slot, u64 n, float beta1, float beta2,
                                        float eps, float weight_decay, u64 slot_len) {
    // A 3-element slot carries a gate: only exactly 0 updates (NaN or anything else skips, so
    // a captured step whose loss or gradient norm is not finite leaves p, m, v untouched).
    if (slot_len > 2 && !(slot[2] == 0.0f)) return;
    float lr = slot[0];
    float t = slot[1];
    float bc1 = 1.0f - powf(beta1, t);
    float bc2 = 1.0f - powf(beta2, t);
    float decay = 1.0f - lr * weight_decay;
    GRID_STRIDE_LOOP(i, 0, n) {
        float gi = g[i];
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        float m_hat = mi / bc1;
        float v_hat = vi / bc2;
        p[i] = p[i] * decay - lr * m_hat / (sqrtf(v_hat) + eps);
        m[i] = mi;
        v[i] = vi;
    }
}
