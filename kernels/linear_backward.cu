// A Linear layer's backward in one launch for few rows (one sample's scales: m = 12), with
// y = act(x · wᵀ + b) for x [rows, ins], w [outs, ins]: gz = gy, or gy · (1 - y²) for tanh
// (from its saved output y), and
//   gx = gz · w              (when wanted)
//   dw += gzᵀ · x, db += Σ_rows gz   (added into their buffers).
// The two halves read the same inputs and write disjoint outputs, so they run side by side as
// one grid: blocks [0, dx_blocks) compute gx exactly as zc_linear_rows_nmajor_f32 does (gz
// staged in shared memory, tanh's derivative applied while staging), blocks [dx_blocks,
// dx_blocks + grads_blocks) compute the parameter gradients exactly as
// zc_linear_param_grads_f32 does (gz computed from gy and y as it is read). Every sum runs in
// the order of those kernels, so the result equals the three-launch composite bitwise and
// reruns are bitwise equal (no atomics). Launch shapes: crates/zcompute/src/cuda/linear_backward.rs.
#include "linear_rows.cuh"

// The parameter-gradient blocks' threads, as a 2-D block: x along the inputs, the rest of the
// launch's NMAJOR_COLS * NMAJOR_SLICES threads along the outputs.
#define BACKWARD_GRADS_X 64

template <int MR>
__device__ __forceinline__ void nmajor_tanh_rows(float* s_a, float* out, const float* gy,
                                                 const float* y, const float* w, unsigned m,
                                                 u64 k, u64 n, u64 gy_rs, u64 gy_cs, u64 y_rs,
                                                 u64 y_cs, u64 ldb) {
    nmajor_rows<MR, true>(s_a, out, gy, w, nullptr, m, k, n, gy_rs, gy_cs, ldb, 0.0f, 0, 0,
                          nullptr, y, y_rs, y_cs);
}

template <int MR>
__device__ __forceinline__ void nmajor_plain_rows(float* s_a, float* out, const float* gy,
                                                  const float* w, unsigned m, u64 k, u64 n,
                                                  u64 gy_rs, u64 gy_cs, u64 ldb) {
    nmajor_rows<MR>(s_a, out, gy, w, nullptr, m, k, n, gy_rs, gy_cs, ldb, 0.0f, 0, 0,
                    nullptr);
}

// gx [rows, ins] dense (written only when dx_blocks > 0); gy [rows, outs] and y (read when
// tanh != 0) through their strides; w [outs, ins] with rows ldb apart and a dense last axis;
// x through its strides; dw rows ldw apart with a dense last axis; db every db_stride (when
// has_db). Blocks of NMAJOR_COLS * NMAJOR_SLICES threads; grid.x = dx_blocks + grads_blocks,
// dx_blocks = ceil(ins / NMAJOR_COLS) or 0, grads_blocks = grads_cols * ceil(outs /
// (blockDim.x / BACKWARD_GRADS_X)) with grads_cols = ceil(cols / BACKWARD_GRADS_X) (cols:
// ins / 4 on the float4 path, else ins; linear_grads_vec4 on the host).
extern "C" __global__ void __launch_bounds__(NMAJOR_COLS * NMAJOR_SLICES)
    zc_linear_backward_f32(float* gx, float* dw, float* db, const float* gy, const float* y,
                           const float* w, const float* x, unsigned rows, u64 outs, u64 ins,
                           u64 gy_rs, u64 gy_cs, u64 y_rs, u64 y_cs, u64 ldb, u64 x_rs,
                           u64 x_cs, u64 ldw, u64 db_stride, unsigned has_db, unsigned tanh,
                           unsigned dx_blocks, unsigned grads_cols) {
    __shared__ __align__(16) float s_a[ZC_A_SMEM];
    const unsigned m = rows;
    if (blockIdx.x < dx_blocks) {
        if (tanh) {
            ZC_ROW_CLASSES(nmajor_tanh_rows, s_a, gx, gy, y, w, m, outs, ins, gy_rs, gy_cs, y_rs,
                           y_cs, ldb);
        } else {
            ZC_ROW_CLASSES(nmajor_plain_rows, s_a, gx, gy, w, m, outs, ins, gy_rs, gy_cs, ldb);
        }
        return;
    }
    const unsigned p = blockIdx.x - dx_blocks;
    const dim3 blk(p % grads_cols, p / grads_cols);
    const dim3 bdim(BACKWARD_GRADS_X, blockDim.x / BACKWARD_GRADS_X);
    const dim3 tid(threadIdx.x % BACKWARD_GRADS_X, threadIdx.x / BACKWARD_GRADS_X);
    if (tanh) {
        param_grads_block<true>(dw, db, gy, x, rows, outs, ins, gy_rs, gy_cs, x_rs, x_cs, ldw,
                                db_stride, has_db, blk, tid, bdim, y, y_rs, y_cs);
    } else {
        param_grads_block(dw, db, gy, x, rows, outs, ins, gy_rs, gy_cs, x_rs, x_cs, ldw,
                          db_stride, has_db, blk, tid, bdim);
    }
}
