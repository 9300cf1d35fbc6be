// Kernels over a model's flat parameter and gradient buffers: the global gradient norm in two
// deterministic passes (a fixed grid of per-block partials, then one block sums them in a
// fixed order; one launch where the last block does the second pass), clipping by that norm
// with the coefficient computed on the device, the finiteness gate of a captured AdamW step,
// and the data-parallel step's last bucket summed over the ranks' peer memory with the norm in
// the same launch.
#include "common.cuh"

#define FLAT_THREADS 256

// Sums a block's FLAT_THREADS values in shared memory in a fixed tree order; thread 0 gets it.
__device__ __forceinline__ float block_sum(float v, float* shared) {
    shared[threadIdx.x] = v;
    __syncthreads();
    for (unsigned half = FLAT_THREADS / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
        __syncthreads();
    }
    return shared[0];
}

// First pass: partial[block] = sum of x[i]^2 over the elements i with
// (i / FLAT_THREADS) % gridDim.x == block (a grid-stride walk over FLAT_THREADS-wide tiles).
extern "C" __global__ void zc_sum_squares_partial_f32(float* partial, const float* x, u64 n) {
    __shared__ float shared[FLAT_THREADS];
    float acc = 0.0f;
    GRID_STRIDE_LOOP(i, 0, n) {
        float v = x[i];
        acc += v * v;
    }
    float total = block_sum(acc, shared);
    if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

// Second pass, one block: out[0] = sqrt(sum of partial[0..parts]).
extern "C" __global__ void zc_norm_finish_f32(float* out, const float* partial, u64 parts) {
    __shared__ float shared[FLAT_THREADS];
    float acc = 0.0f;
    for (u64 i = threadIdx.x; i < parts; i += FLAT_THREADS) acc += partial[i];
    float total = block_sum(acc, shared);
    if (threadIdx.x == 0) out[0] = sqrtf(total);
}

// The end of a one-launch norm, in every block: writes the block's partial (`total`, its
// thread 0's block_sum), takes the ticket tickets[0] after a fence, and in the last block to
// finish sums the partials in zc_norm_finish_f32's order into out[0] = sqrt(sum), leaving the
// ticket at 0 for the next launch on the stream.
__device__ __forceinline__ void norm_finish_last(float* out, float* partial, unsigned* tickets,
                                                 float total, float* shared) {
    __shared__ bool last;
    if (threadIdx.x == 0) partial[blockIdx.x] = total;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(tickets, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    float acc = 0.0f;
    // What other blocks just wrote: from L2, past this SM's L1.
    for (u64 i = threadIdx.x; i < gridDim.x; i += FLAT_THREADS) acc += __ldcg(partial + i);
    const float sum = block_sum(acc, shared);
    if (threadIdx.x == 0) {
        out[0] = sqrtf(sum);
        tickets[0] = 0u;
    }
}

// Both norm passes in one launch (a graph node fewer): every block writes its partial as
// zc_sum_squares_partial_f32 does, and the last block to finish (ticket tickets[0], taken
// with an atomic after a fence) sums the partials as zc_norm_finish_f32 does, so the bits
// are the two launches'. It leaves the ticket at 0 for the next launch on the stream.
extern "C" __global__ void zc_sum_squares_norm_f32(float* out, float* partial,
                                                   unsigned* tickets, const float* x, u64 n) {
    __shared__ float shared[FLAT_THREADS];
    float acc = 0.0f;
    GRID_STRIDE_LOOP(i, 0, n) {
        float v = x[i];
        acc += v * v;
    }
    norm_finish_last(out, partial, tickets, block_sum(acc, shared), shared);
}

// x[i] *= min(1, max_norm / (norm[0] + 1e-6)) (PyTorch's clip_grad_norm_ coefficient). A NaN
// norm gives a NaN coefficient, as the composed ops do (the step's gate then skips it).
extern "C" __global__ void zc_clip_scale_f32(float* x, const float* norm, float max_norm, u64 n) {
    float coef = max_norm / (norm[0] + 1e-6f);
    coef = coef > 1.0f ? 1.0f : coef;
    GRID_STRIDE_LOOP(i, 0, n) { x[i] *= coef; }
}

// dst[0] = 0 * a[0] + 0 * b[0]: 0 when both are finite, NaN otherwise (AdamW's gate).
extern "C" __global__ void zc_finite_gate_f32(float* dst, const float* a, const float* b) {
    if (blockIdx.x == 0 && threadIdx.x == 0) dst[0] = 0.0f * a[0] + 0.0f * b[0];
}

__device__ __forceinline__ void exchange_store(u64* p, u64 v) {
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ u64 exchange_load(const u64* p) {
    u64 v;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

// A flag in page-locked host memory mapped into the device (the host stores it with one
// atomic store, never through a stream): read at system scope, so each read sees the host's
// latest store.
__device__ __forceinline__ unsigned host_flag(const unsigned* p) {
    unsigned v;
    asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ u64 global_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// The data-parallel step's tail in one launch, over NVLink peer memory (one process per GPU,
// each rank's receive words mapped into every other's): x[0..last) (the last bucket of the
// flat gradient buffer, which backward finished last) summed over the ranks, and out[0] the
// Euclidean norm of all of x[0..n) (the rest summed before, by the overlapped all-reduces).
//
// Each element travels with the launch's epoch in one 8-byte word (value bits, epoch), as
// NCCL's LL protocol does, so the exchange needs no fence and no flag round trip: every thread
// stores its elements of x[0..last) into every peer's words, sums the squares of its share of
// x[last..n) while they travel, then polls its elements' words from every peer until the epoch
// is there and sums them in rank order (the same bits on every rank; for two ranks, NCCL's).
// words[q] (device memory, one pointer a rank) are rank q's [2 halves][ranks][last], half =
// epoch & 1: a peer one launch ahead
// writes the other half, and none can be two ahead (it would need this rank's words of the
// launch between). Epochs are kept per block on the device, so a captured graph replays the
// launch as is; every rank must launch it the same number of times with the same grid.
//
// The norm's partials, ticket and finish are zc_sum_squares_norm_f32's (norm_finish_last: its
// summation order over the partials), each block's partial its share of x[last..n) then its
// elements of x[0..last). A wait longer than timeout_ns for a peer sets failed[0] and uses NaN
// for the missing value (the norm is then NaN: the step's gate skips the update).
//
// give_up[0] lives in page-locked host memory mapped into the device: the host sets it with a
// plain store (aborting the communicator, tearing down), never through a stream, so a stream
// stuck behind a launch spinning on a stopped peer cannot delay it (issue 44). A read of it is
// a trip over PCIe that the host answers one at a time, about 1 us each on an H200: one read a
// block (410 blocks for XAsset) made every launch 8.8 -> 422 us and the two-GPU step 0.68 ->
// 1.09 ms (docs/benchmarks.md, twenty-eighth session). So it is read by one thread of block 0
// at the start (hidden behind its stores), and in a wait by at most one thread of the grid
// every HOST_POLL_NS: the thread whose poll comes due takes the turn with an atomic on
// next_poll[0] (device memory, 0 at first).
//
// Once failed[0] is set every launch uses NaN for every peer's value without waiting, whether
// or not the peer's words are there. A launch that finds give_up[0] set at its start gives its
// norm up (block 0's peer values NaN, so the norm is NaN and the step's gate skips the update);
// other blocks whose peers' words are there may sum them, which no one reads. A wait that finds
// give_up[0] set (or times out) sets failed[0], so every other wait ends at its next poll.
// failed[0] names the first peer found missing: 1 + q when rank q's words were not there at a
// wait that timed out or was given up (the host knows when it gave up; it reads give_up[0]
// itself).

#define HOST_POLL_NS 20000ull

// Whether the host gave up, read by at most one thread of the grid every HOST_POLL_NS.
__device__ __forceinline__ bool host_gave_up(const unsigned* give_up, u64* next_poll) {
    const u64 now = global_ns();
    const u64 due = *(volatile u64*)next_poll;
    if (now < due) return false;
    if (atomicCAS((unsigned long long*)next_poll, due, now + HOST_POLL_NS) != due) return false;
    return host_flag(give_up) != 0u;
}

extern "C" __global__ void zc_exchange_sum_norm_f32(
    float* out, float* partial, unsigned* tickets, unsigned* epochs, unsigned* failed,
    float* x, u64 n, u64 last, unsigned rank, unsigned ranks, u64 timeout_ns,
    u64* const* words, const unsigned* give_up, u64* next_poll) {
    __shared__ float shared[FLAT_THREADS];
    __shared__ unsigned block_given_up;
    const bool reads_host = blockIdx.x == 0u && threadIdx.x == 0u;
    const unsigned host_said = reads_host ? host_flag(give_up) : 0u;
    const unsigned epoch = epochs[blockIdx.x] + 1u;
    const u64 half = epoch & 1u;
    const u64 stride = (u64)blockDim.x * gridDim.x;
    const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    for (u64 i = first; i < last; i += stride) {
        const u64 word = (u64)__float_as_uint(x[i]) | ((u64)epoch << 32);
        for (unsigned q = 0; q < ranks; ++q) {
            if (q != rank) exchange_store(words[q] + (half * ranks + rank) * last + i, word);
        }
    }
    float acc = 0.0f;
    for (u64 i = last + first; i < n; i += stride) {
        float v = x[i];
        acc += v * v;
    }
    if (threadIdx.x == 0u) block_given_up = host_said;
    __syncthreads();
    const bool given_up = *(volatile unsigned*)failed != 0u || block_given_up != 0u;
    const u64* mine = words[rank] + half * ranks * last;
    const u64 start = global_ns();
    for (u64 i = first; i < last; i += stride) {
        float s = 0.0f;
        for (unsigned q = 0; q < ranks; ++q) {
            float v;
            if (q == rank) {
                v = x[i];
            } else if (given_up) {
                if ((exchange_load(mine + q * last + i) >> 32) != epoch) {
                    atomicCAS(failed, 0u, 1u + q);  // names a peer not heard
                }
                v = __uint_as_float(0x7fc00000u);  // NaN
            } else {
                u64 w;
                unsigned spins = 0;
                while (((w = exchange_load(mine + q * last + i)) >> 32) != epoch) {
                    if ((++spins & 1023u) == 0u &&
                        (*(volatile unsigned*)failed != 0u || global_ns() - start > timeout_ns ||
                         host_gave_up(give_up, next_poll))) {
                        atomicCAS(failed, 0u, 1u + q);  // names a peer not heard
                        w = 0x7fc00000ull;  // NaN
                        break;
                    }
                }
                v = __uint_as_float((unsigned)w);
            }
            s = q == 0 ? v : s + v;
        }
        x[i] = s;
        acc += s * s;
    }
    if (reads_host && host_said != 0u) acc = __uint_as_float(0x7fc00000u);  // no bucket: still NaN
    const float sum = block_sum(acc, shared);
    if (threadIdx.x == 0) epochs[blockIdx.x] = epoch;
    norm_finish_last(out, partial, tickets, sum, shared);
}
