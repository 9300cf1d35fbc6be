// A captured NCCL all-reduce of each bucket size of the XAsset step (and smaller), on buffers
// from cudaMalloc against buffers from ncclMemAlloc registered as a symmetric window
// (NCCL_WIN_COLL_SYMMETRIC, NCCL 2.27+), one thread and one GPU per rank as ddp_bench runs.
// Prints, per rank: buffer kind, bytes, all-reduces per graph, microseconds per replay, and
// whether the first replay's sums are the bits of a + b.
//
//   nvcc -O2 -std=c++17 -arch=sm_90 sym_allreduce.cu -I$NCCL/include -L$NCCL/lib -l:libnccl.so.2 \
//        -lpthread -o sym_allreduce && LD_LIBRARY_PATH=$NCCL/lib ./sym_allreduce [ranks]
#include "nccl_check.cuh"
#include <pthread.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

static const size_t kSizes[] = {4096, 65536, 200704, 265216, 790528, 1052672, 3360000};
static const size_t kMax = 3360000;

struct Shared {
  ncclUniqueId id;
  pthread_barrier_t barrier;
  int ranks;
};

__global__ void fill(float* x, size_t n, int rank) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    // Rounded as the host's `expected` rounds (no fused multiply-add).
    x[i] = __fadd_rn(__fmul_rn((float)(rank + 1), 0.37f),
                     __fmul_rn(__fmul_rn((float)(i % 97), 1.0e-3f), (float)(rank + 2)));
}

static float expected(size_t i, int ranks) {
  float sum = 0.f;
  for (int r = 0; r < ranks; ++r)
    sum += (float)(r + 1) * 0.37f + (float)(i % 97) * 1.0e-3f * (float)(r + 2);
  return sum;
}

struct Arg {
  Shared* shared;
  int rank;
};

static void* rank_main(void* p) {
  Arg* a = (Arg*)p;
  Shared* sh = a->shared;
  int r = a->rank;
  CK(cudaSetDevice(r));
  ncclComm_t comm;
  NK(ncclCommInitRank(&comm, sh->ranks, sh->id, r));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int sym = 0; sym < 2; ++sym) {
    float* buf = nullptr;
    ncclWindow_t win = nullptr;
    if (sym) {
      NK(ncclMemAlloc((void**)&buf, kMax));
      NK(ncclCommWindowRegister(comm, buf, kMax, &win, NCCL_WIN_COLL_SYMMETRIC));
    } else {
      CK(cudaMalloc(&buf, kMax));
    }
    // Eagerly first: NCCL connects lazily (allocating), which a capture refuses.
    for (size_t bytes : kSizes) NK(ncclAllReduce(buf, buf, bytes / 4, ncclFloat, ncclSum, comm, s));
    CK(cudaStreamSynchronize(s));
    for (size_t bytes : kSizes) {
      size_t n = bytes / 4;
      for (int k : {1, 8}) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < k; ++i) NK(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, comm, s));
        CK(cudaStreamEndCapture(s, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        // Bits: one all-reduce of known values.
        bool bits = true;
        if (k == 1) {
          fill<<<132, 256, 0, s>>>(buf, n, r);
          CK(cudaStreamSynchronize(s));
          pthread_barrier_wait(&sh->barrier);
          CK(cudaGraphLaunch(ge, s));
          CK(cudaStreamSynchronize(s));
          std::vector<float> h(n);
          CK(cudaMemcpy(h.data(), buf, bytes, cudaMemcpyDeviceToHost));
          for (size_t i = 0; i < n; ++i) {
            float want = expected(i, sh->ranks);
            if (memcmp(&h[i], &want, 4) != 0) {
              bits = false;
              break;
            }
          }
        }
        CK(cudaMemsetAsync(buf, 0, bytes, s));
        for (int i = 0; i < 50; ++i) CK(cudaGraphLaunch(ge, s));
        CK(cudaStreamSynchronize(s));
        pthread_barrier_wait(&sh->barrier);
        const int iters = 400;
        CK(cudaEventRecord(e0, s));
        for (int i = 0; i < iters; ++i) CK(cudaGraphLaunch(ge, s));
        CK(cudaEventRecord(e1, s));
        CK(cudaStreamSynchronize(s));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        printf("rank %d %s bytes %zu per_graph %d us_per_replay %.2f us_per_allreduce %.2f bits %s\n",
               r, sym ? "symmetric" : "cudaMalloc", bytes, k, ms * 1e3 / iters, ms * 1e3 / iters / k,
               k == 1 ? (bits ? "a+b" : "DIFFER") : "-");
        fflush(stdout);
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
      }
    }
    CK(cudaStreamSynchronize(s));
    pthread_barrier_wait(&sh->barrier);
    if (sym) {
      NK(ncclCommWindowDeregister(comm, win));
      NK(ncclMemFree(buf));
    } else {
      CK(cudaFree(buf));
    }
  }
  NK(ncclCommDestroy(comm));
  return nullptr;
}

int main(int argc, char** argv) {
  Shared sh;
  sh.ranks = argc > 1 ? atoi(argv[1]) : 2;
  NK(ncclGetUniqueId(&sh.id));
  pthread_barrier_init(&sh.barrier, nullptr, sh.ranks);
  std::vector<pthread_t> t(sh.ranks);
  std::vector<Arg> args(sh.ranks);
  for (int r = 0; r < sh.ranks; ++r) {
    args[r] = {&sh, r};
    pthread_create(&t[r], nullptr, rank_main, &args[r]);
  }
  for (auto& x : t) pthread_join(x, nullptr);
  return 0;
}
