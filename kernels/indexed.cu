// Device-side indexing of a leading axis by an index held in device memory. The per-sample
// schedule's captured graph reads sample i of a device-resident batch and writes sample i's
// loss to losses[i], advancing i itself, so a replay needs no host upload.
//
// The index is a float (the tensors' element type) read when the kernel runs. It names a row
// only if it is a whole number in [0, rows); any other value (NaN, negative, fractional, too
// large) names none: a gather then writes NaN (visible downstream), a scatter writes nothing.
// The same rule is crates/zcompute/src/cpu/indexed.rs's `row_of`.
#include "common.cuh"

__device__ __forceinline__ bool zc_row_of(float f, u64 rows, u64* row) {
    double d = (double)f;
    if (!isfinite(d) || d < 0.0 || d != floor(d) || d >= (double)rows) return false;
    *row = (u64)d;
    return true;
}

// dst[j] = src[row * row_len + j] for j < row_len, row = index[0]; NaN if the index names no
// row. src is dense [rows, row_len], dst dense [row_len]. Every "no row" NaN of this file is
// 0x7fc00000, Rust's f32::NAN, so the device's bits are the CPU's (the GPU's canonical
// 0x7fffffff was written before).
extern "C" __global__ void zc_gather_row_f32(float* dst, const float* src, const float* index,
                                             u64 rows, u64 row_len) {
    u64 row = 0;
    bool ok = zc_row_of(index[0], rows, &row);
    GRID_STRIDE_LOOP(j, 0, row_len) {
        dst[j] = ok ? src[row * row_len + j] : __int_as_float(0x7fc00000);
    }
}

// dst[row * row_len + j] = src[j] for j < row_len, row = index[0] (nothing if the index names no
// row); then, if advance != 0, index[0] += 1. One block: every thread has read the index and
// written its share before thread 0 moves the index.
extern "C" __global__ void zc_scatter_row_f32(float* dst, const float* src, float* index, u64 rows,
                                              u64 row_len, unsigned advance) {
    float f = index[0];
    u64 row = 0;
    if (zc_row_of(f, rows, &row)) {
        for (u64 j = threadIdx.x; j < row_len; j += blockDim.x) dst[row * row_len + j] = src[j];
    }
    __syncthreads();
    // A NaN index stays the bits it was (the CPU's NaN + 1 keeps its payload; the GPU's add
    // would write its canonical 0x7fffffff, an H200 showed).
    if (advance != 0 && threadIdx.x == 0) index[0] = f != f ? f : f + 1.0f;
}

// dst[i * row_len + j] = src[row_i * row_len + j] for i < n, j < row_len, row_i = index[i]; a row
// of NaN where index[i] names no row. src is dense [rows, row_len], dst dense [n, row_len], index
// dense [n]: the trainer's gather of a step's shuffled samples from the device-resident data set,
// reading the indices when it runs (a captured step's on every replay). Each output element is one
// copy, so the result is the same whatever the launch shape.
extern "C" __global__ void zc_gather_rows_f32(float* dst, const float* src, const float* index,
                                              u64 rows, u64 row_len, u64 n) {
    GRID_STRIDE_LOOP(k, 0, n * row_len) {
        u64 i = k / row_len;
        u64 j = k - i * row_len;
        u64 row = 0;
        bool ok = zc_row_of(index[i], rows, &row);
        dst[k] = ok ? src[row * row_len + j] : __int_as_float(0x7fc00000);
    }
}

// Rows of src named by row s = cursor[0] of the step table `steps` (dense [steps_rows, width]):
// dst[i * row_len + j] = src[r_i * row_len + j] for i < n, r_i = steps[s * width + i]; and, with
// `tail`, tail[t] = steps[s * width + width - tail_len + t] for t < tail_len. A cursor or an
// index naming no row (zc_row_of) gives NaN. The queued training step's gather: its graph's
// cursor picks the step's row of indices (and its [lr, t]) on each replay, with no upload.
// Every output element is one copy: the result does not depend on the launch shape.
extern "C" __global__ void zc_gather_rows_at_f32(float* dst, const float* src, const float* steps,
                                                 const float* cursor, float* tail, u64 rows,
                                                 u64 row_len, u64 n, u64 steps_rows, u64 width,
                                                 u64 tail_len) {
    u64 s = 0;
    const bool at = zc_row_of(cursor[0], steps_rows, &s);
    const float* row = steps + s * width;
    GRID_STRIDE_LOOP(k, 0, n * row_len) {
        u64 i = k / row_len;
        u64 j = k - i * row_len;
        u64 r = 0;
        bool ok = at && zc_row_of(row[i], rows, &r);
        dst[k] = ok ? src[r * row_len + j] : __int_as_float(0x7fc00000);
    }
    if (tail && blockIdx.x == 0) {
        for (u64 t = threadIdx.x; t < tail_len; t += blockDim.x) {
            tail[t] = at ? row[width - tail_len + t] : __int_as_float(0x7fc00000);
        }
    }
}

// A training step's tail in one launch (one thread): stats = [loss, norm]; the gate
// 0 * loss + 0 * norm (zc_finite_gate_f32's expression); with `sticky`, gate += sticky and
// sticky = gate (add_into then copy_into); with `history` (rows of two), the stats written to
// row cursor[0] (when it names a row, as zc_scatter_row_f32) and the cursor advanced. Null
// pointers for what the caller has not.
extern "C" __global__ void zc_step_tail_f32(float* stats, float* gate, float* sticky,
                                            float* history, float* cursor, const float* loss,
                                            const float* norm, u64 rows) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const float l = loss[0];
    const float n = norm[0];
    stats[0] = l;
    stats[1] = n;
    float g = 0.0f * l + 0.0f * n;
    if (sticky) {
        g = g + sticky[0];
        sticky[0] = g;
    }
    gate[0] = g;
    if (history) {
        const float f = cursor[0];
        u64 row = 0;
        if (zc_row_of(f, rows, &row)) {
            history[row * 2] = l;
            history[row * 2 + 1] = n;
        }
        cursor[0] = f != f ? f : f + 1.0f;  // NaN keeps its bits, as zc_scatter_row_f32's
    }
}
