// What a one-shot all-reduce over NVLink peer memory would cost at the step's bucket sizes,
// against NCCL's captured all-reduce in the same process: the measurement behind the
// "custom all-reduce" lead in docs/benchmarks.md (sixteenth session). One thread and one GPU
// per rank, peer access enabled; not a product: no abort path beyond a spin bound.
//
// The kernel, per block b of rank r: (1) tell every peer's block b that this rank's gradients
// are ready (a release store into the peer's flag), wait for theirs; (2) load the block's
// elements from every rank, in rank order, and sum them in registers (the same bits on every
// rank); (3) tell every peer this block has read its buffer, wait for theirs; (4) store the sums
// in place. Flags carry an epoch kept per block on the device, so a graph replays it as is.
//
//   nvcc -O2 -std=c++17 -arch=sm_90 p2p_allreduce.cu -lnccl -lpthread -o p2p && ./p2p [ranks]
#include "nccl_check.cuh"
#include <pthread.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

constexpr int kMaxRanks = 8;
constexpr int kThreads = 256;
constexpr int kPerThread = 8;
constexpr int kPerBlock = kThreads * kPerThread;
constexpr int kMaxBlocks = 160;

struct Peers {
  float* buf[kMaxRanks];
  unsigned* flags[kMaxRanks];  // rank q's flags: [phase 2][source rank][block]
};

__device__ __forceinline__ void store_release(unsigned* p, unsigned v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Every rank's block b meets every other rank's block b at `phase`.
__device__ void meet(const Peers& p, int rank, int ranks, int phase, unsigned epoch, int* failed) {
  __syncthreads();
  int q = threadIdx.x;
  if (q < ranks && q != rank) {
    store_release(p.flags[q] + (phase * kMaxRanks + rank) * kMaxBlocks + blockIdx.x, epoch);
    const unsigned* mine = p.flags[rank] + (phase * kMaxRanks + q) * kMaxBlocks + blockIdx.x;
    long long spins = 0;
    while (load_acquire(mine) != epoch) {
      if (++spins > (1ll << 24)) {
        atomicExch(failed, 1);
        break;
      }
    }
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads) one_shot_sum(Peers p, int rank, int ranks, int n,
                                                          unsigned* epochs, int* failed) {
  unsigned epoch = epochs[blockIdx.x] + 1;
  meet(p, rank, ranks, 0, epoch, failed);
  float acc[kPerThread];
  int base = blockIdx.x * kPerBlock + threadIdx.x;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) acc[j] = 0.f;
  for (int q = 0; q < ranks; ++q) {
    const float* src = p.buf[q];
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      int i = base + j * kThreads;
      if (i < n) acc[j] += src[i];
    }
  }
  meet(p, rank, ranks, 1, epoch, failed);
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    int i = base + j * kThreads;
    if (i < n) p.buf[rank][i] = acc[j];
  }
  if (threadIdx.x == 0) epochs[blockIdx.x] = epoch;
}

__global__ void fill(float* x, int n, int rank) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    x[i] = __fadd_rn(__fmul_rn((float)(rank + 1), 0.37f), __fmul_rn((float)(i % 97), 1.0e-3f));
}

static float expected(int i, int ranks) {
  float sum = 0.f;  // rank order, as the kernel and a two-rank ring sum
  for (int r = 0; r < ranks; ++r) sum += (float)(r + 1) * 0.37f + (float)(i % 97) * 1.0e-3f;
  return sum;
}

static const int kSizes[] = {4096, 65536, 200704, 265216, 790528, 1052672};
static const int kMaxBytes = 1052672;

struct Shared {
  ncclUniqueId id;
  pthread_barrier_t barrier;
  int ranks;
  Peers peers;
};

struct Arg {
  Shared* shared;
  int rank;
};

static void* rank_main(void* v) {
  Arg* a = (Arg*)v;
  Shared* sh = a->shared;
  int r = a->rank, ranks = sh->ranks;
  CK(cudaSetDevice(r));
  for (int q = 0; q < ranks; ++q)
    if (q != r) CK(cudaDeviceEnablePeerAccess(q, 0));
  float* buf;
  unsigned *flags, *epochs;
  int* failed;
  size_t flag_bytes = 2 * kMaxRanks * kMaxBlocks * sizeof(unsigned);
  CK(cudaMalloc(&buf, kMaxBytes));
  CK(cudaMalloc(&flags, flag_bytes));
  CK(cudaMemset(flags, 0, flag_bytes));
  CK(cudaMalloc(&epochs, kMaxBlocks * sizeof(unsigned)));
  CK(cudaMemset(epochs, 0, kMaxBlocks * sizeof(unsigned)));
  CK(cudaMalloc(&failed, sizeof(int)));
  CK(cudaMemset(failed, 0, sizeof(int)));
  sh->peers.buf[r] = buf;
  sh->peers.flags[r] = flags;
  ncclComm_t comm;
  NK(ncclCommInitRank(&comm, ranks, sh->id, r));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  NK(ncclAllReduce(buf, buf, kMaxBytes / 4, ncclFloat, ncclSum, comm, s));  // connect eagerly
  CK(cudaStreamSynchronize(s));
  pthread_barrier_wait(&sh->barrier);  // every rank's pointers are in sh->peers
  Peers peers = sh->peers;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int way = 0; way < 2; ++way) {
    for (int bytes : kSizes) {
      int n = bytes / 4;
      int blocks = (n + kPerBlock - 1) / kPerBlock;
      for (int k : {1, 8}) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < k; ++i) {
          if (way == 0)
            NK(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, comm, s));
          else
            one_shot_sum<<<blocks, kThreads, 0, s>>>(peers, r, ranks, n, epochs, failed);
        }
        CK(cudaStreamEndCapture(s, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        bool bits = true;
        if (k == 1) {
          fill<<<132, 256, 0, s>>>(buf, n, r);
          CK(cudaStreamSynchronize(s));
          pthread_barrier_wait(&sh->barrier);
          CK(cudaGraphLaunch(ge, s));
          CK(cudaStreamSynchronize(s));
          pthread_barrier_wait(&sh->barrier);
          std::vector<float> h(n);
          CK(cudaMemcpy(h.data(), buf, bytes, cudaMemcpyDeviceToHost));
          for (int i = 0; i < n && bits; ++i) {
            float want = expected(i, ranks);
            bits = memcmp(&h[i], &want, 4) == 0;
          }
        }
        CK(cudaMemsetAsync(buf, 0, bytes, s));
        CK(cudaStreamSynchronize(s));
        pthread_barrier_wait(&sh->barrier);
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
        int f = 0;
        CK(cudaMemcpy(&f, failed, sizeof(int), cudaMemcpyDeviceToHost));
        printf("rank %d %s bytes %d blocks %d per_graph %d us_per_allreduce %.2f bits %s%s\n", r,
               way == 0 ? "nccl" : "one_shot", bytes, way == 0 ? 0 : blocks, k,
               ms * 1e3 / iters / k, k == 1 ? (bits ? "sum" : "DIFFER") : "-",
               f ? " SPIN-BOUND-HIT" : "");
        fflush(stdout);
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
        pthread_barrier_wait(&sh->barrier);
      }
    }
  }
  NK(ncclCommDestroy(comm));
  return nullptr;
}

int main(int argc, char** argv) {
  Shared sh{};
  sh.ranks = argc > 1 ? atoi(argv[1]) : 2;
  if (sh.ranks < 2 || sh.ranks > kMaxRanks) return 2;
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
