// The selection family (crates/zcompute/src/select.rs) and the counter-based dropout mask
// (crates/zcompute/src/random.rs). Every operand is dense (the host makes it so) and every
// output element is computed by one thread in a fixed order, so the bits do not depend on the
// launch shape. The CPU backend (crates/zcompute/src/cpu/select.rs) and the simulated twins
// (crates/zcompute/src/cuda/twins/select.rs) compute the same formulas.
#include "common.cuh"

// out[i] = NaN if cond[i] is NaN, a[i] if cond[i] != 0, else b[i].
extern "C" __global__ void zc_select_f32(float* out, const float* cond, const float* a,
                                         const float* b, u64 n) {
    GRID_STRIDE_LOOP(i, 0, n) {
        float c = cond[i];
        // 0x7fc00000: the CPU's and the twin's NaN (f32::NAN), so the bits agree (an H200 showed
        // 0x7fffffff against 0x7fc00000 before).
        out[i] = isnan(c) ? __int_as_float(0x7fc00000) : (c != 0.0f ? a[i] : b[i]);
    }
}

// out[r] = the index of the first maximum of row r of x (dense [rows, n], n >= 1), as a float;
// a NaN counts as the maximum (the first NaN's index), as torch.argmax.
extern "C" __global__ void zc_argmax_rows_f32(float* out, const float* x, u64 rows, u64 n) {
    GRID_STRIDE_LOOP(r, 0, rows) {
        const float* row = x + r * n;
        u64 best = 0;
        float bv = row[0];
        for (u64 j = 1; j < n && !isnan(bv); ++j) {
            float v = row[j];
            if (isnan(v) || v > bv) {
                best = j;
                bv = v;
            }
        }
        out[r] = (float)best;
    }
}

// The index rule of indexed.cu: a whole number in [0, rows).
__device__ __forceinline__ bool zc_select_row_of(float f, u64 rows, u64* row) {
    double d = (double)f;
    if (!isfinite(d) || d < 0.0 || d != floor(d) || d >= (double)rows) return false;
    *row = (u64)d;
    return true;
}

// dst[index[i]] += src[i] for i = 0, 1, .., n - 1 in that order (dst dense [rows, row_len], src
// dense [n, row_len]): each thread owns one element of dst and adds every source row that names
// its row, in index order, so the sum is the same bits on every run (no atomics). An index that
// names no row adds nothing (its forward gather wrote a row of NaN).
extern "C" __global__ void zc_index_add_rows_f32(float* dst, const float* src, const float* index,
                                                 u64 rows, u64 row_len, u64 n) {
    GRID_STRIDE_LOOP(k, 0, rows * row_len) {
        u64 r = k / row_len;
        u64 j = k - r * row_len;
        float acc = dst[k];
        for (u64 i = 0; i < n; ++i) {
            u64 at = 0;
            if (zc_select_row_of(index[i], rows, &at) && at == r) acc += src[i * row_len + j];
        }
        dst[k] = acc;
    }
}

// Philox4x32-10 (Salmon et al., SC'11; the Random123 constants).
__device__ __forceinline__ uint4 zc_philox(uint4 c, uint2 k) {
    for (int round = 0; round < 10; ++round) {
        unsigned lo0 = 0xD2511F53u * c.x;
        unsigned hi0 = __umulhi(0xD2511F53u, c.x);
        unsigned lo1 = 0xCD9E8D57u * c.z;
        unsigned hi1 = __umulhi(0xCD9E8D57u, c.z);
        c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
        k.x += 0x9E3779B9u;
        k.y += 0xBB67AE85u;
    }
    return c;
}

// out[i] = scale if element i is kept, else 0: kept when the top 24 bits of the first word of
// Philox(counter = (i lo, i hi, step, stream), key = (seed lo, seed hi)) are >= threshold. The
// step is read from device memory when the kernel runs (a captured graph's on every replay); a
// step that is not a whole number in [0, 2^24] makes every element NaN.
extern "C" __global__ void zc_dropout_mask_f32(float* out, const float* step, u64 n,
                                               unsigned seed_lo, unsigned seed_hi, unsigned stream,
                                               unsigned threshold, float scale) {
    double s = (double)step[0];
    bool ok = isfinite(s) && s >= 0.0 && s == floor(s) && s <= 16777216.0;
    unsigned st = ok ? (unsigned)s : 0u;
    GRID_STRIDE_LOOP(i, 0, n) {
        if (!ok) {
            // 0x7fc00000, the CPU's NaN (f32::NAN): the same bits on every backend.
            out[i] = __int_as_float(0x7fc00000);
            continue;
        }
        uint4 r = zc_philox(make_uint4((unsigned)i, (unsigned)(i >> 32), st, stream),
                            make_uint2(seed_lo, seed_hi));
        out[i] = (r.x >> 8) >= threshold ? scale : 0.0f;
    }
}
