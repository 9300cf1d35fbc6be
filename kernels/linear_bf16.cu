// The bf16 forms of linear.cu's small-row products and of its weight gradient (issue 42's
// bf16 policy; launched from crates/zcompute/src/cuda/linear.rs under MathMode::Bf16, each
// with a simulated twin in cuda/twins/linear.rs): every element of op(A) and op(B)
// rounded to bf16 (nearest-even, zc_round_bf16) as it is read, or read from a bf16 copy where
// `packed` says (bit 0: A, bit 1: B; kernels/convert.cu's packing, as PrecisionOps' copies
// hold it), float32 products and sums in the float32 forms' order, and the same float32
// epilogue (bias, activation, residual, beta). A file of their own, so linear.cu's float32
// entries compile to the PTX they had (beside these entries nvcc scheduled a shared-memory
// load of the float32 k-contiguous entry differently).
#include "linear_rows.cuh"

// tanh's backward g · (1 - y²) as zc_tanh_backward_bf16 (kernels/convert.cu) and
// zc_tanh_backward_f32 compute it: ptxas contracts their `1.0f - v * v` into one fused
// multiply-add, then multiplies (FFMA, FMUL in their SASS on sm_90). Written with explicit
// roundings here, so nothing is contracted further: a plain `s += g * d` in the bias's sum
// became one fused multiply-add with the sum, and 39 of 96 bias gradients differed from the
// composite's in their last bits (H200, session 33).
__device__ __forceinline__ float tanh_grad(float g, float y) {
    return __fmul_rn(g, __fmaf_rn(-y, y, 1.0f));
}

// stage_a for a bf16 form: op(A) read through Bf16Op<COPY>, every load of a batch issued
// before any is converted. Staging moves values only, so its vector path (an aligned A) and
// scalar path stage the same. TANH (A in float32): y's element is loaded beside A's and the
// staged value is tanh_grad(a, y) rounded, as zc_tanh_backward_bf16 writes the copy.
template <int MR, bool COPY, bool TANH>
__device__ __forceinline__ void stage_a_bf16(float* s_a, const float* a, unsigned m, u64 k0,
                                             unsigned kn, u64 a_rs, u64 a_cs, const float* y,
                                             u64 y_rs, u64 y_cs) {
    static_assert(!(TANH && COPY), "tanh's backward reads a float32 gradient");
    using Op = Bf16Op<COPY>;
    const unsigned nt = blockDim.x, tid = threadIdx.x;
    const bool vec = a_cs == 1 && kn % 4 == 0 && a_rs % 4 == 0 && k0 % 4 == 0 && Op::aligned(a) &&
                     (!TANH || (y_cs == 1 && y_rs % 4 == 0 && Op::aligned(y)));
    if (vec) {
        const unsigned kn4 = kn / 4, total = MR * kn4;
        const float inv4 = 1.0f / (float)kn4;
        for (unsigned base = tid; base < total; base += nt * STAGE_BATCH) {
            typename Op::raw4 v[STAGE_BATCH];
            float4 t[TANH ? STAGE_BATCH : 1];
#pragma unroll
            for (int u = 0; u < STAGE_BATCH; ++u) {
                const unsigned idx = base + u * nt;
                const unsigned r = div_small(idx, kn4, inv4), c = idx - r * kn4;
                v[u] = Op::zero4();
                if constexpr (TANH) t[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (idx < total && r < m) {
                    v[u] = Op::load4(a, r * a_rs + k0 + 4 * c);
                    if constexpr (TANH) t[u] = Bf16Op<false>::load4(y, r * y_rs + k0 + 4 * c);
                }
            }
#pragma unroll
            for (int u = 0; u < STAGE_BATCH; ++u) {
                const unsigned idx = base + u * nt;
                if (idx >= total) continue;
                float4 staged;
                if constexpr (TANH) {
                    staged = Op::cvt4(make_float4(tanh_grad(v[u].x, t[u].x), tanh_grad(v[u].y, t[u].y),
                                                  tanh_grad(v[u].z, t[u].z), tanh_grad(v[u].w, t[u].w)));
                } else {
                    staged = Op::cvt4(v[u]);
                }
                reinterpret_cast<float4*>(s_a)[idx] = staged;
            }
        }
    } else {
        const unsigned total = MR * kn;
        const float inv = 1.0f / (float)kn;
        for (unsigned base = tid; base < total; base += nt * STAGE_BATCH) {
            typename Op::raw v[STAGE_BATCH];
            float t[TANH ? STAGE_BATCH : 1];
#pragma unroll
            for (int u = 0; u < STAGE_BATCH; ++u) {
                const unsigned idx = base + u * nt;
                const unsigned r = div_small(idx, kn, inv), c = idx - r * kn;
                const bool in = idx < total && r < m;
                v[u] = in ? Op::load(a, r * a_rs + (k0 + c) * a_cs) : (typename Op::raw)0;
                if constexpr (TANH) t[u] = in ? __ldg(y + r * y_rs + (k0 + c) * y_cs) : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < STAGE_BATCH; ++u) {
                const unsigned idx = base + u * nt;
                if (idx >= total) continue;
                if constexpr (TANH) {
                    s_a[idx] = Op::cvt(tanh_grad(v[u], t[u]));
                } else {
                    s_a[idx] = Op::cvt(v[u]);
                }
            }
        }
    }
}

// kmajor_sums for the bf16 forms: B read through Bf16Op<COPY> (a bf16 copy when set), the
// float32 loop's shape (a batch of KMAJOR_BATCH raw loads, then conversions and FFMAs). VEC:
// runs of four k a lane, read in one load when ALIGNED, else as four loads along the same
// run, so the order of the sums follows the shape only.
template <int MR, bool VEC, bool COPY, bool ALIGNED>
__device__ __forceinline__ void kmajor_sums_bf16(float (&acc)[MR], const float* s_a,
                                                 const float* __restrict__ col, unsigned kn,
                                                 unsigned lane, unsigned part) {
    using Op = Bf16Op<COPY>;
    using raw = typename Op::raw;
    constexpr unsigned W = VEC ? 4 : 1;
    // Raw loads a lane issues a batch: one load4 a run (aligned), else W scalar loads a run.
    constexpr int L = VEC && ALIGNED ? 1 : W;
    const unsigned step = KMAJOR_SPLIT * 32 * W;
    for (unsigned k0 = 0; k0 < kn; k0 += step * KMAJOR_BATCH) {
        typename Op::raw4 bq[KMAJOR_BATCH];
        raw bs[KMAJOR_BATCH][L];
#pragma unroll
        for (int u = 0; u < KMAJOR_BATCH; ++u) {
            const unsigned kk = k0 + u * step + (part * 32 + lane) * W;
            if constexpr (VEC && ALIGNED) {
                bq[u] = kk < kn ? Op::load4(col, kk) : Op::zero4();
            } else {
#pragma unroll
                for (int e = 0; e < L; ++e) bs[u][e] = kk < kn ? Op::load(col, kk + e) : (raw)0;
            }
        }
#pragma unroll
        for (int u = 0; u < KMAJOR_BATCH; ++u) {
            const unsigned kk = k0 + u * step + (part * 32 + lane) * W;
            if (kk >= kn) break;
            if constexpr (VEC) {
                float4 bf;
                if constexpr (ALIGNED) {
                    bf = Op::cvt4(bq[u]);
                } else {
                    bf = make_float4(Op::cvt(bs[u][0]), Op::cvt(bs[u][1]), Op::cvt(bs[u][2]),
                                     Op::cvt(bs[u][3]));
                }
#pragma unroll
                for (int r = 0; r < MR; ++r) {
                    const float4 av = lds4(s_a + r * kn + kk);
                    acc[r] = fmaf(av.x, bf.x, acc[r]);
                    acc[r] = fmaf(av.y, bf.y, acc[r]);
                    acc[r] = fmaf(av.z, bf.z, acc[r]);
                    acc[r] = fmaf(av.w, bf.w, acc[r]);
                }
            } else {
                const float bf = Op::cvt(bs[u][0]);
#pragma unroll
                for (int r = 0; r < MR; ++r) acc[r] = fmaf(s_a[r * kn + kk], bf, acc[r]);
            }
        }
    }
}

// kmajor_rows for the bf16 forms: A staged through stage_a_bf16<MR, COPY_A>, B summed by
// kmajor_sums_bf16<.., COPY_B, ..>, whose vector runs are taken whenever k and ldb are
// multiples of 4 (the float32 form also asks for an aligned B, which a copy and the tensor it
// was made from need not share; alignment only picks the loads), then kmajor_rows' reduction
// and epilogue.
template <int MR, bool COPY_A, bool COPY_B>
__device__ __forceinline__ void kmajor_rows_bf16(float* s_a, float* out, const float* a,
                                                 const float* b, const float* bias, unsigned m,
                                                 u64 k, u64 n, u64 a_rs, u64 a_cs, u64 ldb,
                                                 float beta, unsigned has_bias, unsigned act,
                                                 const float* residual) {
    using BOp = Bf16Op<COPY_B>;
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const unsigned c = warp % KMAJOR_COLS, part = warp / KMAJOR_COLS;
    const u64 j = (u64)blockIdx.x * KMAJOR_COLS + c;
    const bool live = j < n;
    const bool vec4 = k % 4 == 0 && ldb % 4 == 0;
    const bool aligned = BOp::aligned(b);
    const unsigned kcap = (ZC_A_SMEM / MR) & ~3u;
    const u64 col0 = (live ? j : 0) * ldb;
    float acc[MR];
#pragma unroll
    for (int r = 0; r < MR; ++r) acc[r] = 0.0f;
    for (u64 k0 = 0; k0 < k; k0 += kcap) {
        const unsigned kn = (unsigned)(k - k0 < kcap ? k - k0 : kcap);
        __syncthreads();
        stage_a_bf16<MR, COPY_A>(s_a, a, m, k0, kn, a_rs, a_cs);
        __syncthreads();
        if (!live) continue;
        const float* col = BOp::at(b, col0 + k0);
        if (vec4 && aligned) {
            kmajor_sums_bf16<MR, true, COPY_B, true>(acc, s_a, col, kn, lane, part);
        } else if (vec4) {
            kmajor_sums_bf16<MR, true, COPY_B, false>(acc, s_a, col, kn, lane, part);
        } else {
            kmajor_sums_bf16<MR, false, COPY_B, false>(acc, s_a, col, kn, lane, part);
        }
    }
    // kmajor_rows' reduction: a fixed xor-shuffle tree per warp, then the column's
    // KMAJOR_SPLIT warps in order.
    if (live) {
#pragma unroll
        for (int r = 0; r < MR; ++r) {
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
            }
        }
    }
    float* s_part = s_a;
    __syncthreads();
    if (live && lane == 0) {
#pragma unroll
        for (int r = 0; r < MR; ++r) s_part[(part * MR + r) * KMAJOR_COLS + c] = acc[r];
    }
    __syncthreads();
    const unsigned r = threadIdx.x / KMAJOR_COLS, cc = threadIdx.x % KMAJOR_COLS;
    const u64 jj = (u64)blockIdx.x * KMAJOR_COLS + cc;
    if (r >= m || jj >= n) return;
    float v = 0.0f;
#pragma unroll
    for (int p = 0; p < KMAJOR_SPLIT; ++p) v += s_part[(p * MR + r) * KMAJOR_COLS + cc];
    v = linear_epilogue(v, bias, jj, has_bias, act);
    if (residual != nullptr) v += residual[r * n + jj];
    if (beta != 0.0f) v = fmaf(beta, out[r * n + jj], v);
    out[r * n + jj] = v;
}

template <int MR, bool COPY_A, bool COPY_B>
__device__ __forceinline__ void nmajor_rows_bf16(float* s_a, float* out, const float* a,
                                                 const float* b, const float* bias, unsigned m,
                                                 u64 k, u64 n, u64 a_rs, u64 a_cs, u64 ldb,
                                                 float beta, unsigned has_bias, unsigned act,
                                                 const float* residual) {
    nmajor_rows<MR, false, true, COPY_A, COPY_B>(s_a, out, a, b, bias, m, k, n, a_rs, a_cs, ldb,
                                                 beta, has_bias, act, residual);
}

// ZC_ROW_CLASSES for a body with the operands' forms as template parameters after MR.
#define ZC_ROW_CLASSES_FORM(BODY, COPY_A, COPY_B, ...)                                 \
    if (m <= 1) BODY<1, COPY_A, COPY_B>(__VA_ARGS__);                                   \
    else if (m <= 2) BODY<2, COPY_A, COPY_B>(__VA_ARGS__);                              \
    else if (m <= 4) BODY<4, COPY_A, COPY_B>(__VA_ARGS__);                              \
    else if (m <= 8) BODY<8, COPY_A, COPY_B>(__VA_ARGS__);                              \
    else if (m <= 12) BODY<12, COPY_A, COPY_B>(__VA_ARGS__);                            \
    else if (m <= 16) BODY<16, COPY_A, COPY_B>(__VA_ARGS__);                            \
    else if (m <= 24) BODY<24, COPY_A, COPY_B>(__VA_ARGS__);                            \
    else BODY<ZC_LINEAR_ROWS, COPY_A, COPY_B>(__VA_ARGS__)

// The forms the host issues (`packed`: bit 0, A is a bf16 copy; bit 1, B is): 0 (a product
// on float32 operands, a Linear forward without a weight copy), 2 (the weight's copy only) and
// 3 (both copies: the training step's products). Each is its own code, chosen once at entry,
// so no load batch holds a runtime test of the form. 1 is not instantiated: the host never
// issues it (cuda/linear.rs takes cuBLAS) and the simulated twin refuses it.
#define ZC_BF16_FORMS(BODY, ...)                                                        \
    if (packed == 3) {                                                                  \
        ZC_ROW_CLASSES_FORM(BODY, true, true, __VA_ARGS__);                             \
    } else if (packed == 2) {                                                           \
        ZC_ROW_CLASSES_FORM(BODY, false, true, __VA_ARGS__);                            \
    } else if (packed == 0) {                                                           \
        ZC_ROW_CLASSES_FORM(BODY, false, false, __VA_ARGS__);                           \
    }

// zc_linear_rows_kmajor_f32's bf16 form: its parameters and launch shape, then `packed`.
extern "C" __global__ void __launch_bounds__(KMAJOR_COLS * KMAJOR_SPLIT * 32)
    zc_linear_rows_kmajor_bf16(float* out, const float* a, const float* b, const float* bias,
                               unsigned m, u64 k, u64 n, u64 a_rs, u64 a_cs, u64 ldb,
                               float beta, unsigned has_bias, unsigned act,
                               const float* residual, unsigned packed) {
    __shared__ __align__(16) float s_a[ZC_A_SMEM];
    ZC_BF16_FORMS(kmajor_rows_bf16, s_a, out, a, b, bias, m, k, n, a_rs, a_cs, ldb, beta,
                  has_bias, act, residual);
}

// zc_linear_rows_nmajor_f32's bf16 form: its parameters and launch shape, then `packed`.
extern "C" __global__ void __launch_bounds__(NMAJOR_COLS * NMAJOR_SLICES)
    zc_linear_rows_nmajor_bf16(float* out, const float* a, const float* b, const float* bias,
                               unsigned m, u64 k, u64 n, u64 a_rs, u64 a_cs, u64 ldb,
                               float beta, unsigned has_bias, unsigned act,
                               const float* residual, unsigned packed) {
    __shared__ __align__(16) float s_a[ZC_A_SMEM];
    ZC_BF16_FORMS(nmajor_rows_bf16, s_a, out, a, b, bias, m, k, n, a_rs, a_cs, ldb, beta,
                  has_bias, act, residual);
}

// The bf16 weight gradient on param_grads_block's structure (linear_rows.cuh), for block `blk`
// of a 2-D grid of `bdim` blocks (x along i, y along o), thread `tid`: a float4 of `i` a thread
// where the float4 test below holds (the host's: linear_grads_bf16_vec4 in cuda/linear.rs), x
// read as four bf16 in one load (a copy: a uint2) or a float4 rounded after the loads, g's
// column read through Bf16Op<COPY_G>, GRADS_GROUP rows of loads issued before any is
// converted, sums in row order; else one element a thread, the same group shape with scalar
// loads of x. TANH (g in float32): y's column is loaded beside g's and the product reads
// tanh_grad(g, y) rounded, the bias gradient sums tanh_grad(gf, y) unrounded (gf is g then),
// so the values are those of the composite's zc_tanh_backward_bf16 and its copy.
template <bool COPY_G, bool COPY_X, bool TANH = false>
__device__ __forceinline__ void param_grads_bf16(float* dw, const float* g, const float* x,
                                                 unsigned rows, u64 outs, u64 ins, u64 g_rs,
                                                 u64 g_cs, u64 x_rs, u64 x_cs, u64 ldw,
                                                 float* db, const float* gf, u64 gf_rs,
                                                 u64 gf_cs, u64 db_stride, unsigned has_db,
                                                 dim3 blk, dim3 tid, dim3 bdim,
                                                 const float* y = nullptr, u64 y_rs = 0,
                                                 u64 y_cs = 0) {
    static_assert(!(TANH && COPY_G), "tanh's backward reads a float32 gradient");
    using GOp = Bf16Op<COPY_G>;
    using XOp = Bf16Op<COPY_X>;
    const u64 o = (u64)blk.y * bdim.y + tid.y;
    if (o >= outs) return;
    const float* ycol = TANH ? y + o * y_cs : nullptr;
    // The bias gradient, float32 and unrounded: param_grads_block's sum (row order, one
    // fixed writer a column).
    if (has_db && blk.x == 0 && tid.x == 0) {
        float s = 0.0f;
        for (unsigned r = 0; r < rows; ++r) {
            const float v = gf[r * gf_rs + o * gf_cs];
            s += TANH ? tanh_grad(v, ycol[r * y_rs]) : v;
        }
        db[o * db_stride] += s;
    }
    const float* gcol = GOp::at(g, o * g_cs);
    // Row r's raw load of g, y's beside it under TANH, and the rounded gradient they give.
    float yv[GRADS_GROUP];
    auto g_of = [](typename GOp::raw v, float t) {
        if constexpr (TANH) {
            return zc_round_bf16(tanh_grad(v, t));
        } else {
            return GOp::cvt(v);
        }
    };
    const bool vec4 = ins % 4 == 0 && ldw % 4 == 0 && x_cs == 1 && x_rs % 4 == 0 &&
                      (((u64)dw & 15) == 0) && XOp::aligned(x);
    const u64 i = (u64)blk.x * bdim.x + tid.x;
    if (vec4) {
        if (i >= ins / 4) return;
        float4* dst = reinterpret_cast<float4*>(dw + o * ldw) + i;
        float4 d = *dst;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (unsigned r0 = 0; r0 < rows; r0 += GRADS_GROUP) {
            typename GOp::raw gv[GRADS_GROUP];
            typename XOp::raw4 xv[GRADS_GROUP];
#pragma unroll
            for (int u = 0; u < GRADS_GROUP; ++u) {
                const unsigned r = r0 + u;
                gv[u] = r < rows ? GOp::load(gcol, r * g_rs) : (typename GOp::raw)0;
                yv[u] = TANH && r < rows ? __ldg(ycol + r * y_rs) : 0.0f;
                xv[u] = r < rows ? XOp::load4(x, r * x_rs + 4 * i) : XOp::zero4();
            }
#pragma unroll
            for (int u = 0; u < GRADS_GROUP; ++u) {
                if (r0 + u >= rows) break;
                const float gr = g_of(gv[u], yv[u]);
                const float4 xf = XOp::cvt4(xv[u]);
                acc.x = fmaf(gr, xf.x, acc.x);
                acc.y = fmaf(gr, xf.y, acc.y);
                acc.z = fmaf(gr, xf.z, acc.z);
                acc.w = fmaf(gr, xf.w, acc.w);
            }
        }
        d.x += acc.x;
        d.y += acc.y;
        d.z += acc.z;
        d.w += acc.w;
        *dst = d;
    } else {
        if (i >= ins) return;
        const float d = dw[o * ldw + i];
        float acc = 0.0f;
        for (unsigned r0 = 0; r0 < rows; r0 += GRADS_GROUP) {
            typename GOp::raw gv[GRADS_GROUP];
            typename XOp::raw xv[GRADS_GROUP];
#pragma unroll
            for (int u = 0; u < GRADS_GROUP; ++u) {
                const unsigned r = r0 + u;
                gv[u] = r < rows ? GOp::load(gcol, r * g_rs) : (typename GOp::raw)0;
                yv[u] = TANH && r < rows ? __ldg(ycol + r * y_rs) : 0.0f;
                xv[u] = r < rows ? XOp::load(x, r * x_rs + i * x_cs) : (typename XOp::raw)0;
            }
#pragma unroll
            for (int u = 0; u < GRADS_GROUP; ++u) {
                if (r0 + u >= rows) break;
                acc = fmaf(g_of(gv[u], yv[u]), XOp::cvt(xv[u]), acc);
            }
        }
        dw[o * ldw + i] = d + acc;
    }
}

// The bf16 form of zc_linear_param_grads_f32's weight gradient, for a product `dw += op(A) ·
// op(B)` of few rows (k <= ZC_LINEAR_ROWS) and many columns of op(A) (m, a Linear layer's
// outputs, past the row kernels' limit): dw[o, i] += Σ_r g'[r, o] · x'[r, i], r in row order,
// g[r, o] = op(A)[o, r] and x = op(B) through their strides, each element rounded to bf16 as
// it is read or read from a bf16 copy where `packed` says (bit 0: g, bit 1: x; the host issues
// 0 and 3 only, the others do nothing and the twin refuses them). Grid (ceil(cols /
// blockDim.x), ceil(outs / blockDim.y)), cols = ins / 4 on the float4 path, else ins; dw's
// rows ldw apart, last axis dense. When has_db, the bias gradient too, db[o] += Σ_r gf[r, o]
// (r in row order) from `gf`, the float32 gradient g was rounded from (strides gf_rs, gf_cs),
// as zc_linear_param_grads_f32 sums it (PrecisionOps::linear_param_grads_into_bf16).
extern "C" __global__ void zc_linear_param_grads_bf16(float* dw, const float* g, const float* x,
                                                      unsigned rows, u64 outs, u64 ins,
                                                      u64 g_rs, u64 g_cs, u64 x_rs, u64 x_cs,
                                                      u64 ldw, unsigned packed, float* db,
                                                      const float* gf, u64 gf_rs, u64 gf_cs,
                                                      u64 db_stride, unsigned has_db) {
    const dim3 blk(blockIdx.x, blockIdx.y), tid(threadIdx.x, threadIdx.y);
    const dim3 bdim(blockDim.x, blockDim.y);
    if (packed == 3) {
        param_grads_bf16<true, true>(dw, g, x, rows, outs, ins, g_rs, g_cs, x_rs, x_cs, ldw, db,
                                     gf, gf_rs, gf_cs, db_stride, has_db, blk, tid, bdim);
    } else if (packed == 0) {
        param_grads_bf16<false, false>(dw, g, x, rows, outs, ins, g_rs, g_cs, x_rs, x_cs, ldw,
                                       db, gf, gf_rs, gf_cs, db_stride, has_db, blk, tid, bdim);
    }
}

// The parameter-gradient blocks' threads along the inputs in the fused backward below
// (linear_backward.cu's BACKWARD_GRADS_X; the rest of the block lies along the outputs).
#define BACKWARD_BF16_GRADS_X 64

// The input's gradient of the fused backward: gx = round(gz) · w' on the n-contiguous product
// (zc_linear_rows_nmajor_bf16's sums), gz staged from gy (and y under TANH) as the composite's
// copy holds it, w' read through Bf16Op<COPY_W>.
template <int MR, bool TANH, bool COPY_W>
__device__ __forceinline__ void backward_gx_bf16(float* s_a, float* gx, const float* gy,
                                                 const float* y, const float* w, unsigned m,
                                                 u64 outs, u64 ins, u64 gy_rs, u64 gy_cs,
                                                 u64 y_rs, u64 y_cs, u64 ldb) {
    nmajor_rows<MR, TANH, true, false, COPY_W>(s_a, gx, gy, w, nullptr, m, outs, ins, gy_rs,
                                                gy_cs, ldb, 0.0f, 0, 0, nullptr, y, y_rs, y_cs);
}

// The parameter gradients' blocks of the fused backward, block p of the grads grid.
template <bool TANH, bool COPY_X>
__device__ __forceinline__ void backward_grads_bf16(float* dw, float* db, const float* gy,
                                                    const float* y, const float* x,
                                                    unsigned rows, u64 outs, u64 ins,
                                                    u64 gy_rs, u64 gy_cs, u64 y_rs, u64 y_cs,
                                                    u64 x_rs, u64 x_cs, u64 ldw, u64 db_stride,
                                                    unsigned has_db, unsigned p,
                                                    unsigned grads_cols) {
    const dim3 blk(p % grads_cols, p / grads_cols);
    const dim3 bdim(BACKWARD_BF16_GRADS_X, blockDim.x / BACKWARD_BF16_GRADS_X);
    const dim3 tid(threadIdx.x % BACKWARD_BF16_GRADS_X, threadIdx.x / BACKWARD_BF16_GRADS_X);
    param_grads_bf16<false, COPY_X, TANH>(dw, gy, x, rows, outs, ins, gy_rs, gy_cs, x_rs, x_cs,
                                          ldw, db, gy, gy_rs, gy_cs, db_stride, has_db, blk,
                                          tid, bdim, y, y_rs, y_cs);
}

// zc_linear_backward_f32's bf16 form (linear_backward.cu: the same parameters, grid split and
// blocks, then `packed`) on the trainer's bf16 copies of w and x (packed = 3, the only form
// the host issues; the kernel does nothing for another and the twin refuses it): gz = gy, or
// tanh_grad(gy, y); gx = round(gz) · w' (when dx_blocks > 0), dw += round(gz)ᵀ · x', db +=
// Σ_rows gz (float32, unrounded), w' and x' the copies. Each half sums in its composite
// kernel's order (gx: zc_linear_rows_nmajor_bf16; dw and db: zc_linear_param_grads_bf16, row
// order), so it equals zc_tanh_backward_bf16 (or the copy of gy), the product and the
// parameter-gradient kernel bit for bit, in one launch where the composite ran three.
extern "C" __global__ void __launch_bounds__(NMAJOR_COLS * NMAJOR_SLICES)
    zc_linear_backward_bf16(float* gx, float* dw, float* db, const float* gy, const float* y,
                            const float* w, const float* x, unsigned rows, u64 outs, u64 ins,
                            u64 gy_rs, u64 gy_cs, u64 y_rs, u64 y_cs, u64 ldb, u64 x_rs,
                            u64 x_cs, u64 ldw, u64 db_stride, unsigned has_db, unsigned tanh,
                            unsigned dx_blocks, unsigned grads_cols, unsigned packed) {
    __shared__ __align__(16) float s_a[ZC_A_SMEM];
    const unsigned m = rows;
    if (packed != 3) return;
    if (blockIdx.x < dx_blocks) {
        if (tanh) {
            ZC_ROW_CLASSES_FORM(backward_gx_bf16, true, true, s_a, gx, gy, y, w, m, outs, ins,
                                gy_rs, gy_cs, y_rs, y_cs, ldb);
        } else {
            ZC_ROW_CLASSES_FORM(backward_gx_bf16, false, true, s_a, gx, gy, y, w, m, outs, ins,
                                gy_rs, gy_cs, y_rs, y_cs, ldb);
        }
        return;
    }
    const unsigned p = blockIdx.x - dx_blocks;
    if (tanh) {
        backward_grads_bf16<true, true>(dw, db, gy, y, x, rows, outs, ins, gy_rs, gy_cs, y_rs,
                                        y_cs, x_rs, x_cs, ldw, db_stride, has_db, p, grads_cols);
    } else {
        backward_grads_bf16<false, true>(dw, db, gy, y, x, rows, outs, ins, gy_rs, gy_cs, y_rs,
                                         y_cs, x_rs, x_cs, ldw, db_stride, has_db, p, grads_cols);
    }
}
