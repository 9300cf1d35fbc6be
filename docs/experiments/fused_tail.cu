// What the two-GPU step's tail would cost if the last bucket's all-reduce and the gradient
// norm were one launch (the eighteenth session's lead 1), against today's tail (NCCL's
// all-reduce of the last bucket, then the fused norm over the whole buffer) and the one-GPU
// tail (the norm alone), in graphs replayed as the step's is. One thread and one GPU per rank,
// peer access enabled; a measurement, not a product (no abort path beyond a spin bound).
//
// The fused kernel, per block b of rank r, epoch e (kept per block on the device, so a graph
// replays it as is), receive buffer half e & 1:
//  1. store the block's chunk of the last bucket (the buffer's first `last` elements) into every
//     peer's receive buffer, then a release store of e into the peer's flag for (r, b);
//  2. sum the squares of its grid-stride share of the rest of the buffer (summed by NCCL long
//     before: the overlapped buckets), while the stores travel;
//  3. acquire every peer's flag for (q, b) >= e; sum its chunk in rank order (the same bits on
//     every rank; for two ranks NCCL's bits), write it back, add its squares;
//  4. the block's partial, and the last block to finish sums the partials (the fused norm's
//     ticket), sqrt.
// A peer one epoch ahead writes the other half; two ahead it cannot be (it waits for this
// rank's flag of the epoch between).
//
//   nvcc -O2 -std=c++17 -arch=sm_90 fused_tail.cu -lnccl -lpthread -o fused_tail && ./fused_tail
#include "nccl_check.cuh"
#include <pthread.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

typedef unsigned long long u64;
constexpr int kMaxRanks = 8;
constexpr int kThreads = 256;
static int argc_blocks = 411;

__device__ __forceinline__ u64 umin(u64 a, u64 b) { return a < b ? a : b; }

struct Peers {
  float* recv[kMaxRanks];      // rank q's receive buffer: [2 halves][ranks][last]
  unsigned* flags[kMaxRanks];  // rank q's flags: [source rank][block]
};

__device__ __forceinline__ void store_release(unsigned* p, unsigned v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ float block_sum(float v, float* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (unsigned half = kThreads / 2; half > 0; half >>= 1) {
    if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  return shared[0];
}

// The fused norm of flat.cu (zc_sum_squares_norm_f32), as the step runs it today.
__global__ void __launch_bounds__(kThreads)
    norm(float* out, float* partial, unsigned* tickets, const float* x, u64 n) {
  __shared__ float shared[kThreads];
  __shared__ bool last;
  float acc = 0.0f;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)blockDim.x * gridDim.x) {
    float v = x[i];
    acc += v * v;
  }
  float sum = block_sum(acc, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(tickets, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  acc = 0.0f;
  for (u64 i = threadIdx.x; i < gridDim.x; i += kThreads) acc += __ldcg(partial + i);
  sum = block_sum(acc, shared);
  if (threadIdx.x == 0) {
    out[0] = sqrtf(sum);
    tickets[0] = 0u;
  }
}

__global__ void __launch_bounds__(kThreads)
    fused_tail(Peers p, int rank, int ranks, float* grad, u64 last_n, u64 n, float* out,
               float* partial, unsigned* tickets, unsigned* epochs, int* failed) {
  __shared__ float shared[kThreads];
  __shared__ bool last;
  const unsigned epoch = epochs[blockIdx.x] + 1;
  const u64 half = epoch & 1u;
  const u64 chunk = (last_n + gridDim.x - 1) / gridDim.x;
  const u64 c0 = umin((u64)blockIdx.x * chunk, last_n);
  const u64 c1 = umin(c0 + chunk, last_n);
  for (int q = 0; q < ranks; ++q) {
    if (q == rank) continue;
    float* dst = p.recv[q] + (half * ranks + rank) * last_n;
    for (u64 i = c0 + threadIdx.x; i < c1; i += kThreads) dst[i] = grad[i];
  }
  __syncthreads();
  int q = threadIdx.x;
  if (q < ranks && q != rank) {
    __threadfence_system();
    store_release(p.flags[q] + rank * gridDim.x + blockIdx.x, epoch);
  }
  float acc = 0.0f;
  for (u64 i = last_n + (u64)blockIdx.x * kThreads + threadIdx.x; i < n;
       i += (u64)kThreads * gridDim.x) {
    float v = grad[i];
    acc += v * v;
  }
  if (q < ranks && q != rank) {
    const unsigned* mine = p.flags[rank] + q * gridDim.x + blockIdx.x;
    long long spins = 0;
    while ((int)(load_acquire(mine) - epoch) < 0) {
      if (++spins > (1ll << 26)) {
        atomicExch(failed, 1);
        break;
      }
    }
  }
  __syncthreads();
  const float* in = p.recv[rank] + half * ranks * last_n;
  for (u64 i = c0 + threadIdx.x; i < c1; i += kThreads) {
    float s = 0.0f;
    for (int r = 0; r < ranks; ++r) {
      float v = r == rank ? grad[i] : __ldcg(in + r * last_n + i);
      s = r == 0 ? v : s + v;
    }
    grad[i] = s;
    acc += s * s;
  }
  float sum = block_sum(acc, shared);
  if (threadIdx.x == 0) {
    partial[blockIdx.x] = sum;
    epochs[blockIdx.x] = epoch;
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(tickets, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  acc = 0.0f;
  for (u64 i = threadIdx.x; i < gridDim.x; i += kThreads) acc += __ldcg(partial + i);
  sum = block_sum(acc, shared);
  if (threadIdx.x == 0) {
    out[0] = sqrtf(sum);
    tickets[0] = 0u;
  }
}

// As fused_tail, the exchange as NCCL's LL protocol does it: each element travels with the
// epoch in one 8-byte store (value bits, epoch), so no fence and no flag round trip; the reader
// polls each of its elements' words until the epoch is there.
__device__ __forceinline__ void store_word(u64* p, u64 v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ u64 load_word(const u64* p) {
  u64 v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

struct PeersLl {
  u64* recv[kMaxRanks];  // rank q's receive words: [2 halves][ranks][last]
};

__global__ void __launch_bounds__(kThreads)
    fused_tail_ll(PeersLl p, int rank, int ranks, float* grad, u64 last_n, u64 n, float* out,
                  float* partial, unsigned* tickets, unsigned* epochs, int* failed) {
  __shared__ float shared[kThreads];
  __shared__ bool last;
  const unsigned epoch = epochs[blockIdx.x] + 1;
  const u64 half = epoch & 1u;
  const u64 stride = (u64)kThreads * gridDim.x;
  const u64 first = (u64)blockIdx.x * kThreads + threadIdx.x;
  for (u64 i = first; i < last_n; i += stride) {
    const u64 word = (u64)__float_as_uint(grad[i]) | ((u64)epoch << 32);
    for (int q = 0; q < ranks; ++q)
      if (q != rank) store_word(p.recv[q] + (half * ranks + rank) * last_n + i, word);
  }
  float acc = 0.0f;
  for (u64 i = last_n + first; i < n; i += stride) {
    float v = grad[i];
    acc += v * v;
  }
  const u64* in = p.recv[rank] + half * ranks * last_n;
  for (u64 i = first; i < last_n; i += stride) {
    float s = 0.0f;
    for (int r = 0; r < ranks; ++r) {
      float v;
      if (r == rank) {
        v = grad[i];
      } else {
        u64 w;
        long long spins = 0;
        while (((w = load_word(in + r * last_n + i)) >> 32) != epoch) {
          if (++spins > (1ll << 26)) {
            atomicExch(failed, 1);
            break;
          }
        }
        v = __uint_as_float((unsigned)w);
      }
      s = r == 0 ? v : s + v;
    }
    grad[i] = s;
    acc += s * s;
  }
  float sum = block_sum(acc, shared);
  if (threadIdx.x == 0) {
    partial[blockIdx.x] = sum;
    epochs[blockIdx.x] = epoch;
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(tickets, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  acc = 0.0f;
  for (u64 i = threadIdx.x; i < gridDim.x; i += kThreads) acc += __ldcg(partial + i);
  sum = block_sum(acc, shared);
  if (threadIdx.x == 0) {
    out[0] = sqrtf(sum);
    tickets[0] = 0u;
  }
}

// Backward's stand-in: writes the gradient (rank-dependent values) with the whole grid.
__global__ void produce(float* x, u64 n, int rank) {
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
    x[i] = __fadd_rn(__fmul_rn((float)(rank + 1), 1.7e-3f), __fmul_rn((float)(i % 89), -3.1e-5f));
}

// XAsset L = 1: 3.36 MB of gradient; the last bucket (ln1, emb) 50,176 elements.
constexpr u64 kN = 840192;
constexpr u64 kLast = 50176;

struct Shared {
  ncclUniqueId id;
  pthread_barrier_t barrier;
  int ranks;
  Peers peers;
  PeersLl peers_ll;
};

struct Arg {
  Shared* shared;
  int rank;
};

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

static void* rank_main(void* v) {
  Arg* a = (Arg*)v;
  Shared* sh = a->shared;
  const int r = a->rank, ranks = sh->ranks;
  CK(cudaSetDevice(r));
  for (int q = 0; q < ranks; ++q)
    if (q != r) CK(cudaDeviceEnablePeerAccess(q, 0));
  const int norm_blocks = (int)std::min<u64>((kN + 2047) / 2048, 1024);
  int fused_blocks = argc_blocks;
  float *grad, *recv, *out, *partial;
  u64* words;
  unsigned* epochs_ll;
  unsigned *flags, *tickets, *epochs;
  int* failed;
  CK(cudaMalloc(&grad, kN * 4));
  CK(cudaMalloc(&recv, 2 * ranks * kLast * 4));
  CK(cudaMalloc(&words, 2 * ranks * kLast * 8));
  CK(cudaMemset(words, 0, 2 * ranks * kLast * 8));
  CK(cudaMalloc(&epochs_ll, 1024 * 4));
  CK(cudaMemset(epochs_ll, 0, 1024 * 4));
  CK(cudaMalloc(&out, 4));
  CK(cudaMalloc(&partial, 1024 * 4));
  CK(cudaMalloc(&flags, kMaxRanks * 1024 * 4));
  CK(cudaMemset(flags, 0, kMaxRanks * 1024 * 4));
  CK(cudaMalloc(&tickets, 4));
  CK(cudaMemset(tickets, 0, 4));
  CK(cudaMalloc(&epochs, 1024 * 4));
  CK(cudaMemset(epochs, 0, 1024 * 4));
  CK(cudaMalloc(&failed, 4));
  CK(cudaMemset(failed, 0, 4));
  sh->peers.recv[r] = recv;
  sh->peers.flags[r] = flags;
  sh->peers_ll.recv[r] = words;
  ncclComm_t comm;
  NK(ncclCommInitRank(&comm, ranks, sh->id, r));
  cudaStream_t s;
  int lo, hi;
  CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  CK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, hi));
  NK(ncclAllReduce(grad, grad, kN, ncclFloat, ncclSum, comm, s));  // connect eagerly
  CK(cudaStreamSynchronize(s));
  pthread_barrier_wait(&sh->barrier);
  Peers peers = sh->peers;
  PeersLl peers_ll = sh->peers_ll;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const char* names[] = {"one_gpu_norm", "nccl_then_norm", "fused", "fused_ll"};
  std::vector<float> reference_grad(kLast);
  float reference_norm = 0.f;
  for (int round = 0; round < 2; ++round) {
    for (int way = 0; way < 4; ++way) {
      cudaGraph_t g;
      cudaGraphExec_t ge;
      CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      produce<<<132, 256, 0, s>>>(grad, kN, r);
      if (way == 1) NK(ncclAllReduce(grad, grad, kLast, ncclFloat, ncclSum, comm, s));
      if (way < 2)
        norm<<<norm_blocks, kThreads, 0, s>>>(out, partial, tickets, grad, kN);
      else if (way == 2)
        fused_tail<<<fused_blocks, kThreads, 0, s>>>(peers, r, ranks, grad, kLast, kN, out,
                                                      partial, tickets, epochs, failed);
      else
        fused_tail_ll<<<fused_blocks, kThreads, 0, s>>>(peers_ll, r, ranks, grad, kLast, kN, out,
                                                         partial, tickets, epochs_ll, failed);
      CK(cudaStreamEndCapture(s, &g));
      CK(cudaGraphInstantiate(&ge, g, 0));
      // Bits: the last bucket after one replay, and the norm.
      pthread_barrier_wait(&sh->barrier);
      CK(cudaGraphLaunch(ge, s));
      CK(cudaStreamSynchronize(s));
      std::vector<float> h(kLast);
      float nrm;
      CK(cudaMemcpy(h.data(), grad, kLast * 4, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(&nrm, out, 4, cudaMemcpyDeviceToHost));
      const char* bits = "-";
      if (way == 1) {
        reference_grad = h;
        reference_norm = nrm;
      } else if (way >= 2) {
        bits = memcmp(h.data(), reference_grad.data(), kLast * 4) == 0 ? "equal" : "DIFFER";
      }
      // Back to back: 400 replays between two events.
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
      // One at a time, as ddp_bench's rounds: events around each replay, median.
      std::vector<double> single;
      for (int i = 0; i < 200; ++i) {
        pthread_barrier_wait(&sh->barrier);
        CK(cudaEventRecord(e0, s));
        CK(cudaGraphLaunch(ge, s));
        CK(cudaEventRecord(e1, s));
        CK(cudaStreamSynchronize(s));
        float one;
        CK(cudaEventElapsedTime(&one, e0, e1));
        single.push_back(one * 1e3);
      }
      int f = 0;
      CK(cudaMemcpy(&f, failed, 4, cudaMemcpyDeviceToHost));
      printf("round %d rank %d %-15s back_to_back_us %.2f single_us_median %.2f norm %.9g "
             "(nccl path %.9g) last_bucket_bits %s blocks %d%s\n",
             round, r, names[way], ms * 1e3 / iters, median(single), nrm, reference_norm, bits,
             way >= 2 ? fused_blocks : norm_blocks, f ? " SPIN-BOUND-HIT" : "");
      fflush(stdout);
      CK(cudaGraphExecDestroy(ge));
      CK(cudaGraphDestroy(g));
    }
  }
  NK(ncclCommDestroy(comm));
  return nullptr;
}

int main(int argc, char** argv) {
  Shared sh{};
  sh.ranks = 2;
  argc_blocks = argc > 1 ? atoi(argv[1]) : 411;
  if (argc_blocks < 1 || argc_blocks > 1024) return 2;
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
