// XAsset's five Linear backward products at 1,536, 3,072 and 6,144 rows (the per-rank batch of
// two GPUs at a global 256, one GPU's 256, 512), cuBLAS fp32 as the engine runs them, captured
// in one graph four ways: serial; each input-gradient product on a second stream with its own
// cuBLAS handle and workspace, beside the weight-gradient product; serial with the bias
// gradients' column sums; the column sums on the second stream beside both products.
// Microseconds a replay, median of 5 x 200. (The tenth session's pair.cu measured the first
// two at 3,072 rows.) nvcc -O2 -arch=sm_90 lanes_small_batch.cu -o lanes -lcublas && ./lanes
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>
#include <algorithm>
#define CK(x) do { auto rc_ = (x); if (rc_ != 0) { printf("%s:%d error %d\n", __FILE__, __LINE__, (int)rc_); exit(1);} } while (0)
__global__ void colsum(float* db, const float* g, int rows, int n) {
  int c = blockIdx.x * 32 + threadIdx.x;
  if (c >= n) return;
  int per = (rows + gridDim.y - 1) / gridDim.y;
  int r0 = blockIdx.y * per, r1 = min(rows, r0 + per);
  float acc = 0.0f;
  for (int r = r0 + threadIdx.y; r < r1; r += blockDim.y) acc += g[(size_t)r * n + c];
  atomicAdd(db + c, acc);
}
struct L { int out, in; bool dx; };
int main(int argc, char** argv) {
  const L layers[] = {{256, 1024, true}, {1024, 256, true}, {256, 256, true}, {768, 256, true}, {256, 193, false}};
  cudaStream_t s1, s2; CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking)); CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  cublasHandle_t h1, h2; CK(cublasCreate(&h1)); CK(cublasCreate(&h2));
  void *w1, *w2; CK(cudaMalloc(&w1, 32 << 20)); CK(cudaMalloc(&w2, 32 << 20));
  CK(cublasSetWorkspace(h1, w1, 32 << 20)); CK(cublasSetWorkspace(h2, w2, 32 << 20));
  CK(cublasSetStream(h1, s1)); CK(cublasSetStream(h2, s2));
  cudaEvent_t fork[8], join[8]; for (int i = 0; i < 8; ++i) { CK(cudaEventCreateWithFlags(&fork[i], cudaEventDisableTiming)); CK(cudaEventCreateWithFlags(&join[i], cudaEventDisableTiming)); }
  for (int rows : {1536, 3072, 6144}) {
    std::vector<float*> gz, x, w, dx, dw, db;
    for (auto& l : layers) {
      float *a, *b, *c, *d, *e, *f;
      CK(cudaMalloc(&a, sizeof(float) * rows * l.out)); CK(cudaMalloc(&b, sizeof(float) * rows * l.in));
      CK(cudaMalloc(&c, sizeof(float) * l.out * l.in)); CK(cudaMalloc(&d, sizeof(float) * rows * l.in));
      CK(cudaMalloc(&e, sizeof(float) * l.out * l.in));
      CK(cudaMemset(a, 0, sizeof(float) * rows * l.out)); CK(cudaMemset(b, 0, sizeof(float) * rows * l.in));
      CK(cudaMemset(c, 0, sizeof(float) * l.out * l.in)); CK(cudaMemset(e, 0, sizeof(float) * l.out * l.in));
      CK(cudaMalloc(&f, sizeof(float) * l.out)); db.push_back(f);
      gz.push_back(a); x.push_back(b); w.push_back(c); dx.push_back(d); dw.push_back(e);
    }
    for (int mode = 0; mode < 4; ++mode) {  // 0 serial, 1 dx beside dw, 2 serial, 3 db beside
      const float one = 1.0f, zero = 0.0f;
      cudaGraph_t g; cudaGraphExec_t ge;
      CK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < 5; ++i) {
        const L& l = layers[i];
        bool side = mode == 1 && l.dx;
        if (side) { CK(cudaEventRecord(fork[i], s1)); CK(cudaStreamWaitEvent(s2, fork[i], 0)); }
        if (mode == 3) { CK(cudaEventRecord(fork[i], s1)); CK(cudaStreamWaitEvent(s2, fork[i], 0));
          colsum<<<dim3((l.out + 31) / 32, 24), dim3(32, 8), 0, s2>>>(db[i], gz[i], rows, l.out); }
        if (l.dx) CK(cublasSgemm(side ? h2 : h1, CUBLAS_OP_N, CUBLAS_OP_N, l.in, rows, l.out, &one, w[i], l.in, gz[i], l.out, &zero, dx[i], l.in));
        CK(cublasSgemm(h1, CUBLAS_OP_N, CUBLAS_OP_T, l.in, l.out, rows, &one, x[i], l.in, gz[i], l.out, &one, dw[i], l.in));
        if (mode == 2) colsum<<<dim3((l.out + 31) / 32, 24), dim3(32, 8), 0, s1>>>(db[i], gz[i], rows, l.out);
        if (mode == 3) { CK(cudaEventRecord(join[i], s2)); CK(cudaStreamWaitEvent(s1, join[i], 0)); }
        if (side) { CK(cudaEventRecord(join[i], s2)); CK(cudaStreamWaitEvent(s1, join[i], 0)); }
      }
      CK(cudaStreamEndCapture(s1, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
      cudaEvent_t t0, t1; CK(cudaEventCreate(&t0)); CK(cudaEventCreate(&t1));
      for (int i = 0; i < 50; ++i) CK(cudaGraphLaunch(ge, s1));
      std::vector<float> ms;
      for (int r = 0; r < 5; ++r) {
        CK(cudaEventRecord(t0, s1));
        for (int i = 0; i < 200; ++i) CK(cudaGraphLaunch(ge, s1));
        CK(cudaEventRecord(t1, s1)); CK(cudaEventSynchronize(t1));
        float m; CK(cudaEventElapsedTime(&m, t0, t1)); ms.push_back(m * 1000.0f / 200);
      }
      std::sort(ms.begin(), ms.end());
      size_t nodes; CK(cudaGraphGetNodes(g, nullptr, &nodes));
      printf("rows %d mode %s nodes %zu us/replay median %.1f (min %.1f max %.1f)\n", rows, mode == 1 ? "dx-beside" : mode == 3 ? "db-beside" : mode == 2 ? "serial+db" : "serial", nodes, ms[2], ms[0], ms[4]);
      CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g));
    }
    for (auto v : {gz, x, w, dx, dw, db}) for (auto p : v) CK(cudaFree(p));
  }
  return 0;
}
