// Element-wise kernels that prove the PTX path end to end (build, embed, load, launch).
// Grid-stride loops: any grid size covers any n, so the launcher may cap the grid.

extern "C" __global__ void fill_f32(float* out, float value, unsigned long long n) {
    unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        out[i] = value;
    }
}

// y <- a * x + y
extern "C" __global__ void axpy_f32(float* y, const float* x, float a, unsigned long long n) {
    unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        y[i] = a * x[i] + y[i];
    }
}
