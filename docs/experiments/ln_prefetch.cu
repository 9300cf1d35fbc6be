// LayerNorm backward partials: the kernel as it was at db8e82f (old_ln_partials, copied below)
// against kernels/norm_params.cu's, [3072, n] with residual and weight: time in a graph and bits.
// Build from this folder: nvcc -O2 -std=c++17 -gencode arch=compute_80,code=compute_80 ln_prefetch.cu
// (PTX JIT-compiled by the driver, as the engine's kernels are).
#include <cstdio>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>
#include "graph_timing.cuh"
#include "../../kernels/rows.cu"
#include "../../kernels/norm_params.cu"

extern "C" __global__ void __launch_bounds__(LN_PARTIALS_THREADS) old_ln_partials(
    float* __restrict__ gx, float* __restrict__ part, const float* __restrict__ g,
    const float* __restrict__ residual, const float* __restrict__ x,
    const float* __restrict__ mean, const float* __restrict__ rstd,
    const float* __restrict__ weight, unsigned has_weight, unsigned has_residual,
    unsigned want_gx, u64 rows, u64 n, u64 rows_per_block) {
    __shared__ float sums[LN_PARTIALS_WARPS][2 * LN_PARTIALS_MAX_N];
    const unsigned lane = threadIdx.x % 32;
    const unsigned warp = threadIdx.x / 32;
    float sw[LN_PARTIALS_SLOTS];
    float sb[LN_PARTIALS_SLOTS];
#pragma unroll
    for (int k = 0; k < LN_PARTIALS_SLOTS; ++k) {
        sw[k] = 0.0f;
        sb[k] = 0.0f;
    }
    const u64 first = (u64)blockIdx.x * rows_per_block;
    const u64 last = min(first + rows_per_block, rows);
    for (u64 row = first + warp; row < last; row += LN_PARTIALS_WARPS) {
        const float* gr = g + row * n;
        const float* xr = x + row * n;
        const float mu = mean[row];
        const float rs = rstd[row];
        // The row's g and xhat in registers: every load of the row goes out at once.
        float gv[LN_PARTIALS_SLOTS];
        float xh[LN_PARTIALS_SLOTS];
#pragma unroll
        for (int k = 0; k < LN_PARTIALS_SLOTS; ++k) {
            const u64 j = lane + 32 * (u64)k;
            gv[k] = j < n ? gr[j] : 0.0f;
            xh[k] = j < n ? (xr[j] - mu) * rs : 0.0f;
        }
        if (want_gx) {
            // The sums in layer_norm_backward_row's lane order (j ascending), then its warp tree.
            float s1 = 0.0f;
            float s2 = 0.0f;
#pragma unroll
            for (int k = 0; k < LN_PARTIALS_SLOTS; ++k) {
                const u64 j = lane + 32 * (u64)k;
                if (j < n) {
                    float gh = has_weight ? gv[k] * weight[j] : gv[k];
                    s1 += gh;
                    s2 += gh * xh[k];
                }
            }
            const float m1 = warp_sum(s1) / (float)n;
            const float m2 = warp_sum(s2) / (float)n;
#pragma unroll
            for (int k = 0; k < LN_PARTIALS_SLOTS; ++k) {
                const u64 j = lane + 32 * (u64)k;
                if (j < n) {
                    float gh = has_weight ? gv[k] * weight[j] : gv[k];
                    float v = ((gh - m1) - xh[k] * m2) * rs;
                    if (has_residual) v += residual[row * n + j];
                    gx[row * n + j] = v;
                }
            }
        }
#pragma unroll
        for (int k = 0; k < LN_PARTIALS_SLOTS; ++k) {
            sw[k] += gv[k] * xh[k];
            sb[k] += gv[k];
        }
    }
#pragma unroll
    for (int k = 0; k < LN_PARTIALS_SLOTS; ++k) {
        const u64 j = lane + 32 * (u64)k;
        if (j < n) {
            sums[warp][j] = sw[k];
            sums[warp][n + j] = sb[k];
        }
    }
    __syncthreads();
    for (u64 j = threadIdx.x; j < 2 * n; j += LN_PARTIALS_THREADS) {
        float acc = 0.0f;
        for (int w = 0; w < LN_PARTIALS_WARPS; ++w) acc += sums[w][j];
        // Columns j < n hold g * xhat's sums, the rest g's.
        const u64 half = j < n ? 0 : 1;
        const u64 col = j < n ? j : j - n;
        part[(half * gridDim.x + blockIdx.x) * n + col] = acc;
    }
}
static unsigned long long cdiv(unsigned long long a, unsigned long long b){ return (a+b-1)/b; }
int main(){
  cudaDeviceProp p; cudaGetDeviceProperties(&p,0); printf("%s\n",p.name);
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s,cudaStreamNonBlocking));
  const size_t big = 64<<20;
  float *a,*b,*c,*d,*w,*e,*part;
  for (float** t: {&a,&b,&c,&d,&w,&e,&part}) CK(cudaMalloc(t,big));
  std::vector<float> h(big/4); for(size_t i=0;i<h.size();i++) h[i]=0.001f*(float)((i*2654435761u)%2001)-1.0f;
  for(float* t: {a,b,c,w}) CK(cudaMemcpy(t,h.data(),big,cudaMemcpyHostToDevice));
  std::vector<float> pos(1<<20); for(size_t i=0;i<pos.size();i++) pos[i]=0.5f+0.001f*(float)(i%777);
  CK(cudaMemcpy(d,pos.data(),pos.size()*4,cudaMemcpyHostToDevice));
  for (unsigned long long n: {256ull, 193ull, 512ull, 64ull}) for (unsigned flags: {7u, 3u, 5u}) {
    // flags: 1 weight, 2 residual, 4 want_gx
    unsigned hw = flags&1, hr = (flags>>1)&1, wg = (flags>>2)&1;
    unsigned long long rows=3072, rpb=16, blocks=cdiv(rows,rpb);
    auto k_old=[&]{ old_ln_partials<<<blocks,256,0,s>>>(e,part,a,b,c,a,d,w,hw,hr,wg,rows,n,rpb); };
    auto k_new=[&]{ zc_layer_norm_backward_partials_f32<<<blocks,256,0,s>>>(e,part,a,b,c,a,d,w,hw,hr,wg,rows,n,rpb); };
    std::vector<float> g0(rows*n), p0(2*blocks*n), g1(rows*n), p1(2*blocks*n);
    cudaMemsetAsync(e,0,rows*n*4,s); k_old(); CK(cudaStreamSynchronize(s));
    cudaMemcpy(g0.data(),e,g0.size()*4,cudaMemcpyDeviceToHost); cudaMemcpy(p0.data(),part,p0.size()*4,cudaMemcpyDeviceToHost);
    cudaMemsetAsync(e,0,rows*n*4,s); k_new(); CK(cudaStreamSynchronize(s));
    cudaMemcpy(g1.data(),e,g1.size()*4,cudaMemcpyDeviceToHost); cudaMemcpy(p1.data(),part,p1.size()*4,cudaMemcpyDeviceToHost);
    size_t dg=0, dp=0; for(size_t i=0;i<g0.size();i++) dg+=memcmp(&g0[i],&g1[i],4)!=0; for(size_t i=0;i<p0.size();i++) dp+=memcmp(&p0[i],&p1[i],4)!=0;
    float to=graph_us(s,k_old,20), tn=graph_us(s,k_new,20);
    printf("n %llu weight %u residual %u gx %u: old %.2f us, new %.2f us; %zu of %zu gx and %zu of %zu partials differ in bits\n", n, hw, hr, wg, to, tn, dg, g0.size(), dp, p0.size());
  }
  return 0;
}
