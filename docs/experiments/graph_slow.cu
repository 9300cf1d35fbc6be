// Does the peer-memory exchange kernel (kernels/flat.cu) slow the other nodes of a graph it is
// in? 40 small kernels, then a tail: the norm alone | NCCL's all-reduce of the last bucket and the
// norm | the exchange over two ranks | the exchange of one rank | a plain two-rank variant
// (peer pointers as parameters, no timeout) | nothing. Two threads, one GPU each, peer access on;
// graphs replayed back to back. nvcc -O2 -std=c++17 -arch=sm_90 graph_slow.cu -lnccl -lpthread
#include "nccl_check.cuh"
#include "../../kernels/flat.cu"
#include <pthread.h>
#include <vector>
#include <algorithm>
__global__ void small(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * 0.999f + 0.001f;
}
__global__ void exch2(float* out, float* partial, unsigned* tickets, unsigned* epochs, float* x,
                      u64 n, u64 last, unsigned rank, u64* mine, u64* peer) {
  __shared__ float shared[FLAT_THREADS];
  __shared__ bool is_last;
  const unsigned epoch = epochs[blockIdx.x] + 1u;
  const u64 half = epoch & 1u;
  const u64 stride = (u64)blockDim.x * gridDim.x;
  const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  for (u64 i = first; i < last; i += stride)
    exchange_store(peer + (half * 2 + rank) * last + i, (u64)__float_as_uint(x[i]) | ((u64)epoch << 32));
  float acc = 0.0f;
  for (u64 i = last + first; i < n; i += stride) { float v = x[i]; acc += v * v; }
  for (u64 i = first; i < last; i += stride) {
    u64 w; unsigned spins = 0;
    while (((w = exchange_load(mine + (half * 2 + (1 - rank)) * last + i)) >> 32) != epoch && ++spins < (1u << 30)) {}
    float o = __uint_as_float((unsigned)w), s = rank == 0 ? x[i] + o : o + x[i];
    x[i] = s; acc += s * s;
  }
  float sum = block_sum(acc, shared);
  if (threadIdx.x == 0) { partial[blockIdx.x] = sum; epochs[blockIdx.x] = epoch; }
  __threadfence(); __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(tickets, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!is_last) return;
  acc = 0.0f;
  for (u64 i = threadIdx.x; i < gridDim.x; i += FLAT_THREADS) acc += __ldcg(partial + i);
  sum = block_sum(acc, shared);
  if (threadIdx.x == 0) { out[0] = sqrtf(sum); tickets[0] = 0u; }
}
constexpr u64 kN = 840192, kLast = 50176;
struct Shared { ncclUniqueId id; pthread_barrier_t bar; u64* words[2]; };
struct Arg { Shared* sh; int r; };
static void* rank_main(void* v) {
  Arg* a = (Arg*)v; Shared* sh = a->sh; int r = a->r;
  CK(cudaSetDevice(r)); CK(cudaDeviceEnablePeerAccess(1 - r, 0));
  float *x, *small_buf, *out, *partial; unsigned *tickets, *epochs, *epochs2, *epochs1, *failed; u64* words;
  CK(cudaMalloc(&x, kN * 4)); CK(cudaMemset(x, 0, kN * 4));
  CK(cudaMalloc(&small_buf, 65536 * 4)); CK(cudaMemset(small_buf, 0, 65536 * 4));
  CK(cudaMalloc(&out, 4)); CK(cudaMalloc(&partial, 4096 * 4));
  CK(cudaMalloc(&tickets, 4)); CK(cudaMemset(tickets, 0, 4)); CK(cudaMalloc(&failed, 4)); CK(cudaMemset(failed, 0, 4));
  for (unsigned** ep : {&epochs, &epochs2, &epochs1}) { CK(cudaMalloc(ep, 4096)); CK(cudaMemset(*ep, 0, 4096)); }
  CK(cudaMalloc(&words, 4 * kLast * 8)); CK(cudaMemset(words, 0, 4 * kLast * 8));
  sh->words[r] = words;
  ncclComm_t comm; NK(ncclCommInitRank(&comm, 2, sh->id, r));
  cudaStream_t s; int lo, hi; CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  CK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, hi));
  NK(ncclAllReduce(x, x, kN, ncclFloat, ncclSum, comm, s)); CK(cudaStreamSynchronize(s));
  pthread_barrier_wait(&sh->bar);
  u64* peer = sh->words[1 - r];
  // The kernel's table of receive words (rank order), for two ranks and for one.
  u64** table2; u64** table1;
  CK(cudaMalloc(&table2, 8 * sizeof(u64*))); CK(cudaMalloc(&table1, 8 * sizeof(u64*)));
  u64* t2[8] = {r == 0 ? words : peer, r == 0 ? peer : words};
  u64* t1[8] = {words};
  CK(cudaMemcpy(table2, t2, sizeof t2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(table1, t1, sizeof t1, cudaMemcpyHostToDevice));
  int blocks = (int)std::min<u64>((kN + 2047) / 2048, 1024);
  const char* names[] = {"norm", "nccl+norm", "exchange2", "exchange1", "exch2_plain", "nothing"};
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  for (int round = 0; round < 3; ++round) for (int way = 0; way < 6; ++way) {
    cudaGraph_t g; cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int k = 0; k < 40; ++k) small<<<256, 256, 0, s>>>(small_buf, 65536);
    if (way == 0) zc_sum_squares_norm_f32<<<blocks, 256, 0, s>>>(out, partial, tickets, x, kN);
    if (way == 1) { NK(ncclAllReduce(x, x, kLast, ncclFloat, ncclSum, comm, s)); zc_sum_squares_norm_f32<<<blocks, 256, 0, s>>>(out, partial, tickets, x, kN); }
    if (way == 2) zc_exchange_sum_norm_f32<<<blocks, 256, 0, s>>>(out, partial, tickets, epochs, failed, x, kN, kLast, r, 2, 10000000000ull, table2);
    if (way == 3) zc_exchange_sum_norm_f32<<<blocks, 256, 0, s>>>(out, partial, tickets, epochs1, failed, x, kN, kLast, 0, 1, 10000000000ull, table1);
    if (way == 4) exch2<<<blocks, 256, 0, s>>>(out, partial, tickets, epochs2, x, kN, kLast, r, words, peer);
    CK(cudaStreamEndCapture(s, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
    pthread_barrier_wait(&sh->bar);
    for (int i = 0; i < 50; ++i) CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s)); pthread_barrier_wait(&sh->bar);
    const int iters = 300;
    CK(cudaEventRecord(e0, s)); for (int i = 0; i < iters; ++i) CK(cudaGraphLaunch(ge, s)); CK(cudaEventRecord(e1, s));
    CK(cudaStreamSynchronize(s)); float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
    printf("round %d rank %d %-12s back_to_back_us %.2f\n", round, r, names[way], ms * 1e3 / iters); fflush(stdout);
    CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g));
  }
  return nullptr;
}
int main() {
  Shared sh{}; NK(ncclGetUniqueId(&sh.id)); pthread_barrier_init(&sh.bar, nullptr, 2);
  pthread_t t[2]; Arg a[2] = {{&sh, 0}, {&sh, 1}};
  for (int r = 0; r < 2; ++r) pthread_create(&t[r], nullptr, rank_main, &a[r]);
  for (auto& x : t) pthread_join(x, nullptr);
}
