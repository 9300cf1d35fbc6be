// Why a replayed graph holding an NCCL kernel starts its second node 4-6 us after its first
// (docs/benchmarks.md, sixteenth session): graphs of a chain of short kernels, alone and with
// one NCCL all-reduce (on the chain's stream or on a forked stream), or with a kernel of large
// dynamic shared memory instead; each graph's structure is written as a DOT file, and each is
// replayed 300 times, to be timed by kernel_trace.c (front_gap.py prints the gap).
//
//   nvcc -O2 -std=c++17 -arch=sm_90 nccl_front.cu -lnccl -lpthread -o nccl_front
//   CUDA_INJECTION64_PATH=libkernel_trace.so KERNEL_TRACE_DIR=dir ./nccl_front DOTDIR
#include "nccl_check.cuh"
#include <pthread.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

__global__ void spin(float* x, int iters) {
  float v = x[threadIdx.x];
  for (int i = 0; i < iters; ++i) v = v * 0.999f + 0.001f;
  x[threadIdx.x] = v;
}

__global__ void big_smem(float* x) {
  extern __shared__ float s[];
  s[threadIdx.x] = x[threadIdx.x];
  __syncthreads();
  x[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}

struct Shared {
  ncclUniqueId id;
  pthread_barrier_t barrier;
  const char* dots;
};
struct Arg {
  Shared* sh;
  int rank;
};

static void* rank_main(void* v) {
  Arg* a = (Arg*)v;
  int r = a->rank;
  CK(cudaSetDevice(r));
  ncclComm_t comm;
  NK(ncclCommInitRank(&comm, 2, a->sh->id, r));
  cudaStream_t s, side;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  cudaEvent_t fork, join;
  CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  float *x, *buf;
  CK(cudaMalloc(&x, 4096));
  CK(cudaMemset(x, 0, 4096));
  CK(cudaMalloc(&buf, 1 << 20));
  CK(cudaFuncSetAttribute(big_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, 160 * 1024));
  NK(ncclAllReduce(buf, buf, 1024, ncclFloat, ncclSum, comm, s));
  CK(cudaStreamSynchronize(s));
  const char* names[] = {"chain", "chain_nccl_inline", "chain_nccl_forked", "chain_big_smem"};
  for (int kind = 0; kind < 4; ++kind) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < 30; ++i) {
      spin<<<1, 128, 0, s>>>(x, 2000);
      if (i == 20 && kind == 2) {
        CK(cudaEventRecord(fork, s));
        CK(cudaStreamWaitEvent(side, fork, 0));
        NK(ncclAllReduce(buf, buf, 1024, ncclFloat, ncclSum, comm, side));
        CK(cudaEventRecord(join, side));
      }
    }
    if (kind == 1) NK(ncclAllReduce(buf, buf, 1024, ncclFloat, ncclSum, comm, s));
    if (kind == 2) CK(cudaStreamWaitEvent(s, join, 0));
    if (kind == 3) big_smem<<<24, 128, 160 * 1024, s>>>(x);
    spin<<<1, 128, 0, s>>>(x, 2000);
    CK(cudaStreamEndCapture(s, &g));
    if (r == 0) {
      std::string path = std::string(a->sh->dots) + "/" + names[kind] + ".dot";
      CK(cudaGraphDebugDotPrint(g, path.c_str(), cudaGraphDebugDotFlagsVerbose));
    }
    CK(cudaGraphInstantiate(&ge, g, 0));
    pthread_barrier_wait(&a->sh->barrier);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < 300; ++i) CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaStreamSynchronize(s));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    printf("rank %d %s: %.2f us a replay\n", r, names[kind], ms * 1e3 / 300);
    fflush(stdout);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
  }
  NK(ncclCommDestroy(comm));
  return nullptr;
}

int main(int argc, char** argv) {
  Shared sh{};
  sh.dots = argc > 1 ? argv[1] : ".";
  NK(ncclGetUniqueId(&sh.id));
  pthread_barrier_init(&sh.barrier, nullptr, 2);
  pthread_t t[2];
  Arg args[2] = {{&sh, 0}, {&sh, 1}};
  for (int r = 0; r < 2; ++r) pthread_create(&t[r], nullptr, rank_main, &args[r]);
  for (auto& x : t) pthread_join(x, nullptr);
  return 0;
}
