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

// One AdamW element: the update of p, m, v from g (the same expressions on both paths).
__device__ __forceinline__ void adamw_element(float& p, float& m, float& v, float g, float beta1,
                                              float beta2, float bc1, float bc2, float lr,
                                              float decay, float eps) {
    float mi = beta1 * m + (1.0f - beta1) * g;
    float vi = beta2 * v + (1.0f - beta2) * g * g;
    float m_hat = mi / bc1;
    float v_hat = vi / bc2;
    p = p * decay - lr * m_hat / (sqrtf(v_hat) + eps);
    m = mi;
    v = vi;
}

// Fused AdamW over dense p, m, v, g of n elements. slot = [lr, t] is read from device memory
// at run time, so a captured step replays with the current learning rate and step count. When
// n is a multiple of 4 and every buffer is 16-byte aligned, each thread updates float4s (a
// quarter of the loads and of the per-thread setup); the arithmetic per element is the same.
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
    const bool vec4 = (n % 4 == 0) && ((((u64)p | (u64)m | (u64)v | (u64)g) & 15) == 0);
    if (vec4) {
        float4* p4 = reinterpret_cast<float4*>(p);
        float4* m4 = reinterpret_cast<float4*>(m);
        float4* v4 = reinterpret_cast<float4*>(v);
        const float4* g4 = reinterpret_cast<const float4*>(g);
        GRID_STRIDE_LOOP(i, 0, n / 4) {
            float4 pi = p4[i], mi = m4[i], vi = v4[i];
            const float4 gi = g4[i];
            adamw_element(pi.x, mi.x, vi.x, gi.x, beta1, beta2, bc1, bc2, lr, decay, eps);
            adamw_element(pi.y, mi.y, vi.y, gi.y, beta1, beta2, bc1, bc2, lr, decay, eps);
            adamw_element(pi.z, mi.z, vi.z, gi.z, beta1, beta2, bc1, bc2, lr, decay, eps);
            adamw_element(pi.w, mi.w, vi.w, gi.w, beta1, beta2, bc1, bc2, lr, decay, eps);
            p4[i] = pi;
            m4[i] = mi;
            v4[i] = vi;
        }
        return;
    }
    GRID_STRIDE_LOOP(i, 0, n) {
        float pi = p[i], mi = m[i], vi = v[i];
        adamw_element(pi, mi, vi, g[i], beta1, beta2, bc1, bc2, lr, decay, eps);
        p[i] = pi;
        m[i] = mi;
        v[i] = vi;
    }
}
