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
// One element's update, shared by the kernel's two paths. Every rounding is spelled out with
// intrinsics: left to the compiler, `beta1 * m + (1 - beta1) * g` was fused into an FMA one
// way in one loop and the other way in the other (measured: 65 of 4,099 parameters differed
// after three steps). These are the roundings the scalar kernel had before, so parameters stay
// bitwise what they were (m = fma(1 - beta1, g, m * beta1), v = fma(g, (1 - beta2) * g,
// v * beta2), p = p * decay - lr * m_hat / (sqrt(v_hat) + eps) without a fused multiply-add).
__device__ __forceinline__ void adamw_element(float& p, float& m, float& v, float g, float beta1,
                                              float beta2, float bc1, float bc2, float lr,
                                              float decay, float eps) {
    float mi = __fmaf_rn(1.0f - beta1, g, __fmul_rn(m, beta1));
    float vi = __fmaf_rn(g, __fmul_rn(1.0f - beta2, g), __fmul_rn(v, beta2));
    float m_hat = __fdiv_rn(mi, bc1);
    float v_hat = __fdiv_rn(vi, bc2);
    p = __fsub_rn(__fmul_rn(decay, p),
                  __fdiv_rn(__fmul_rn(lr, m_hat), __fadd_rn(sqrtf(v_hat), eps)));
    m = mi;
    v = vi;
}

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
    // Where all four operands are 16-byte aligned, a thread takes four elements with one
    // load of each operand (all in flight at once: the update is bound by memory, and the
    // scalar loop waited for each element's loads before the next's, 12.6 us for XAsset's
    // 840,192 parameters on an H100); the elements past the last group of four, and
    // unaligned operands, take the scalar loop.
    const bool aligned = (((u64)p | (u64)m | (u64)v | (u64)g) & 15u) == 0u;
    const u64 groups = aligned ? n / 4u : 0u;
    const float4* g4 = reinterpret_cast<const float4*>(g);
    float4* p4 = reinterpret_cast<float4*>(p);
    float4* m4 = reinterpret_cast<float4*>(m);
    float4* v4 = reinterpret_cast<float4*>(v);
    GRID_STRIDE_LOOP(j, 0, groups) {
        float4 gj = g4[j], pj = p4[j], mj = m4[j], vj = v4[j];
        adamw_element(pj.x, mj.x, vj.x, gj.x, beta1, beta2, bc1, bc2, lr, decay, eps);
        adamw_element(pj.y, mj.y, vj.y, gj.y, beta1, beta2, bc1, bc2, lr, decay, eps);
        adamw_element(pj.z, mj.z, vj.z, gj.z, beta1, beta2, bc1, bc2, lr, decay, eps);
        adamw_element(pj.w, mj.w, vj.w, gj.w, beta1, beta2, bc1, bc2, lr, decay, eps);
        p4[j] = pj;
        m4[j] = mj;
        v4[j] = vj;
    }
    GRID_STRIDE_LOOP(i, groups * 4u, n) {
        float pi = p[i], mi = m[i], vi = v[i];
        adamw_element(pi, mi, vi, g[i], beta1, beta2, bc1, bc2, lr, decay, eps);
        p[i] = pi;
        m[i] = mi;
        v[i] = vi;
    }
}

// SGD with momentum (torch.optim.SGD) over dense p, buf, g of n elements; slot = [lr, t] or
// [lr, t, gate] read at run time, as AdamW's. d = g + wd * p; with momentum (buf not read
// otherwise) buf = d at t = 1 and m * buf + (1 - dampening) * d after, then d + m * buf
// (Nesterov) or buf; p = p - lr * d. Every product and sum rounded on its own (no FMA), the
// CPU reference's roundings, so the two agree bitwise.
extern "C" __global__ void zc_sgd_f32(float* p, float* buf, const float* g, const float* slot,
                                      u64 n, float momentum, float dampening,
                                      float weight_decay, unsigned nesterov, u64 slot_len) {
    if (slot_len > 2 && !(slot[2] == 0.0f)) return;
    const float lr = slot[0];
    const bool first = slot[1] <= 1.0f;
    const float keep = __fsub_rn(1.0f, dampening);
    GRID_STRIDE_LOOP(i, 0, n) {
        float pi = p[i];
        float d = g[i];
        if (weight_decay != 0.0f) d = __fadd_rn(d, __fmul_rn(weight_decay, pi));
        if (momentum != 0.0f) {
            float b = first ? d : __fadd_rn(__fmul_rn(momentum, buf[i]), __fmul_rn(keep, d));
            buf[i] = b;
            d = nesterov ? __fadd_rn(d, __fmul_rn(momentum, b)) : b;
        }
        p[i] = __fsub_rn(pi, __fmul_rn(lr, d));
    }
}
