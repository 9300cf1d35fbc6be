// How long reads of one page-locked host word from the device take when many blocks issue them
// (session 28, issue 44): one a block made zc_exchange_sum_norm_f32 8.8 -> 422 us on an H200.
// Build and run on the GPU machine: nvcc -O2 -arch=sm_90 -o host_read_probe host_read_probe.cu
#include <cstdio>
#include <cuda_runtime.h>
__device__ __forceinline__ unsigned host_flag(const unsigned* p) {
    unsigned v; asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v;
}
__global__ void k(const unsigned* flag, float* x, int mode) {
    __shared__ unsigned s;
    unsigned h = 0;
    if (mode == 1 && threadIdx.x == 0) h = host_flag(flag);
    if (mode == 2 && threadIdx.x == 0 && blockIdx.x == 0) h = host_flag(flag);
    if (mode == 3) h = host_flag(flag);  // every thread
    float a = x[blockIdx.x * blockDim.x + threadIdx.x];
    a = a * a + 1.0f;
    if (threadIdx.x == 0) s = h;
    __syncthreads();
    x[blockIdx.x * blockDim.x + threadIdx.x] = a + (float)s;
}
int main() {
    unsigned* flag; cudaHostAlloc(&flag, 4096, cudaHostAllocDefault); *flag = 0;
    float* x; cudaMalloc(&x, 1024 * 256 * 4); cudaMemset(x, 0, 1024 * 256 * 4);
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    int grids[] = {1, 132, 410, 1024};
    const char* names[] = {"no host read", "thread 0 of every block", "block 0 only", "every thread"};
    for (int mode = 0; mode < 4; ++mode) for (int g : grids) {
        for (int w = 0; w < 5; ++w) k<<<g, 256>>>(flag, x, mode);
        cudaEventRecord(a);
        for (int i = 0; i < 50; ++i) k<<<g, 256>>>(flag, x, mode);
        cudaEventRecord(b); cudaEventSynchronize(b);
        float ms; cudaEventElapsedTime(&ms, a, b);
        printf("%-26s grid %5d: %8.2f us a launch\n", names[mode], g, ms * 1000 / 50);
    }
    printf("err: %s\n", cudaGetErrorString(cudaGetLastError()));
}
