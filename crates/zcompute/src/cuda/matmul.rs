//! Batched matrix products through cuBLAS's strided batched gemm.
//!
//! cuBLAS is column-major; a row-major `C[m,n]` is the column-major `Cᵀ[n,m]`, so the call
//! computes `Cᵀ = op(B)ᵀ · op(A)ᵀ` with the operands swapped. Each operand is used in place
//! when its matrices are row-major or column-major with a leading dimension (a transposed view
//! is just the other order) and its batch axes collapse to one stride (0 when broadcast);
//! anything else is first copied dense.

use super::kernels::coalesce;
use super::{CudaBackend, CudaTensor};
use crate::backend::MatmulOpts;
use crate::error::{ComputeError, Result};
use crate::layout::{Dims, checked_numel};
use crate::precision::MathMode;
use crate::validate::{self, split_matrix as split};
use zdevice::{DevicePtr, Driver, GemmEx, GemmF32, Transpose};

const OP: &str = "matmul";

/// How cuBLAS reads one operand's matrices.
#[derive(Debug)]
pub(super) struct Operand {
    /// Keeps a dense copy alive until the gemm is queued (stream order covers the rest).
    pub(super) _keep: CudaTensor,
    pub(super) ptr: DevicePtr,
    /// Stored column-major (a transposed view of a row-major matrix).
    pub(super) col_major: bool,
    pub(super) ld: usize,
    pub(super) batch_stride: usize,
}

/// The operands of a bf16 product converted beforehand (`cuda/precision.rs`: a bf16 copy),
/// left then right, each as cuBLAS reads it; `None` has `gemm_to` convert that operand.
pub(super) type Bf16Given = (Option<Operand>, Option<Operand>);

fn to_i32(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| ComputeError::Unsupported {
        op: OP,
        reason: format!("{what} = {v} exceeds cuBLAS's 32-bit sizes"),
    })
}

/// Leading dimension and order of a `[r, c]` matrix with strides `(sr, sc)`, if cuBLAS can
/// read it in place.
fn matrix_order(r: usize, c: usize, sr: usize, sc: usize) -> Option<(bool, usize)> {
    if (sc == 1 || c == 1) && (r == 1 || sr >= c.max(1)) {
        return Some((false, if r == 1 { c.max(1) } else { sr }));
    }
    if (sr == 1 || r == 1) && (c == 1 || sc >= r.max(1)) {
        return Some((true, if c == 1 { r.max(1) } else { sc }));
    }
    None
}

impl<D: Driver> CudaBackend<D> {
    fn operand(&self, x: &CudaTensor, batch: &[usize]) -> Result<Operand> {
        let (_, r, c) = split(x)?;
        let mut full: Dims = batch.into();
        full.extend([r, c]);
        let view = x.broadcast_to(&full)?;
        let strides = view.layout().strides();
        let (bs, ms) = strides.split_at(batch.len());
        let (bshape, bstrides) = coalesce(batch, &[bs]);
        let batch_stride = (bshape.len() == 1).then(|| bstrides[0][0]);
        if let (Some(batch_stride), Some((col_major, ld))) =
            (batch_stride, matrix_order(r, c, ms[0], ms[1]))
        {
            return Ok(Operand {
                ptr: self.ptr(OP, &view)?,
                _keep: view,
                col_major,
                ld,
                batch_stride,
            });
        }
        let dense = self.alloc_temp(OP, &full)?;
        self.copy_view(OP, &view, &dense)?;
        Ok(Operand {
            ptr: self.ptr(OP, &dense)?,
            _keep: dense,
            col_major: false,
            ld: c.max(1),
            batch_stride: r * c,
        })
    }

    pub(crate) fn matmul_gemm(
        &self,
        a: &CudaTensor,
        b: &CudaTensor,
        opts: MatmulOpts,
    ) -> Result<CudaTensor> {
        self.matmul_gemm_mode(a, b, opts, MathMode::F32)
    }

    /// `op(a) · op(b)` under `mode` (`MathMode::F32`: the float32 path, small-row kernel
    /// included; bf16: the small-row kernel's bf16 form for few rows, else
    /// `cublasGemmStridedBatchedEx`, as TF32; see `gemm_to`).
    pub(crate) fn matmul_gemm_mode(
        &self,
        a: &CudaTensor,
        b: &CudaTensor,
        opts: MatmulOpts,
        mode: MathMode,
    ) -> Result<CudaTensor> {
        self.gemm_product(a, b, opts, mode, || Ok((None, None)))
    }

    /// `op(a) · op(b)` under `mode` into a new tensor, the operands' shapes read from `a` and
    /// `b` (stand-ins for bf16 copies); `given` makes the converted operands only when a
    /// product is computed (an empty output is returned as is, an empty `k` gives zeros).
    pub(super) fn gemm_product(
        &self,
        a: &CudaTensor,
        b: &CudaTensor,
        opts: MatmulOpts,
        mode: MathMode,
        given: impl FnOnce() -> Result<Bf16Given>,
    ) -> Result<CudaTensor> {
        let shape = validate::matmul(a, b, opts)?;
        let out = self.alloc(OP, &shape.out)?;
        if out.numel() == 0 {
            return Ok(out);
        }
        if shape.k == 0 {
            self.fill_zero(&out)?;
            return Ok(out);
        }
        self.gemm_to(a, b, opts, &shape, &out, 0.0, mode, given()?)?;
        Ok(out)
    }

    /// `dst += op(a) · op(b)`: one gemm with `beta = 1` writing into `dst` when `dst` is dense
    /// (a per-tensor view of a flat gradient buffer is); otherwise the product and one
    /// `add_into`. An empty `k` adds nothing.
    pub(crate) fn matmul_into_gemm(
        &self,
        a: &CudaTensor,
        b: &CudaTensor,
        opts: MatmulOpts,
        dst: &CudaTensor,
    ) -> Result<()> {
        self.matmul_into_gemm_mode(a, b, opts, dst, MathMode::F32)
    }

    /// `dst += op(a) · op(b)` under `mode`, as `matmul_into_gemm`.
    pub(crate) fn matmul_into_gemm_mode(
        &self,
        a: &CudaTensor,
        b: &CudaTensor,
        opts: MatmulOpts,
        dst: &CudaTensor,
        mode: MathMode,
    ) -> Result<()> {
        let shape = validate::matmul_into(a, b, opts, dst)?;
        if dst.numel() == 0 || shape.k == 0 {
            return Ok(());
        }
        if dst.is_contiguous() {
            return self.gemm_to(a, b, opts, &shape, dst, 1.0, mode, (None, None));
        }
        let product = self.matmul_gemm_mode(a, b, opts, mode)?;
        self.add_into_fused(&product, dst)
    }

    /// `out = op(a) · op(b) + beta * out` for a dense `out` of the product's shape, under
    /// `mode`: float32 through the small-row kernel or `cublasSgemmStridedBatched`; TF32
    /// through `cublasGemmStridedBatchedEx` on the operands in place; bf16 through the
    /// small-row kernel's bf16 form for few rows (each operand rounded as it is read, or read
    /// from its copy: one launch, no conversion), else `cublasGemmStridedBatchedEx` on bf16
    /// copies of the operands (`cuda/precision.rs`). TF32 has no small-row form (the kernels
    /// would have to guess how the tensor cores read an operand), so it always takes cuBLAS.
    /// `given`, under bf16 only: the operands converted beforehand (`matmul_bf16_rhs`,
    /// `matmul_bf16`, `matmul_into_bf16`); an operand given is then read for its shape only.
    /// A product on copies takes the path, and so the order of sums, the product on the
    /// float32 operands takes (the choice reads shapes and orders, which a copy keeps).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gemm_to(
        &self,
        a: &CudaTensor,
        b: &CudaTensor,
        opts: MatmulOpts,
        shape: &validate::MatmulShape,
        out: &CudaTensor,
        beta: f32,
        mode: MathMode,
        given: Bf16Given,
    ) -> Result<()> {
        let validate::MatmulShape { batch, m, k, n, .. } = shape;
        let (m, k, n) = (*m, *k, *n);
        let count = checked_numel(OP, batch)?;
        // Few rows (one sample's): one small-row kernel over many CTAs (cuda/linear.rs).
        let trans = (opts.trans_a, opts.trans_b);
        let copies = (given.0.as_ref(), given.1.as_ref());
        if self.small_rows_gemm((a, b), trans, (m, k, n), count, out, beta, mode, copies)? {
            return Ok(());
        }
        tracing::trace!(target: "zcompute.cuda.matmul", ?batch, m, k, n, ?opts, beta, mode = mode.name(), "gemm");
        let (oa, ob) = if mode == MathMode::Bf16 {
            let (lhs, rhs) = given;
            let oa = match lhs {
                Some(oa) => oa,
                None => self.bf16_operand(a, batch)?,
            };
            let ob = match rhs {
                Some(ob) => ob,
                None => self.bf16_operand(b, batch)?,
            };
            (oa, ob)
        } else {
            (self.operand(a, batch)?, self.operand(b, batch)?)
        };
        let t = |yes: bool| if yes { Transpose::Yes } else { Transpose::No };
        let gemm = GemmF32 {
            transa: t(opts.trans_b != ob.col_major),
            transb: t(opts.trans_a != oa.col_major),
            m: to_i32("n", n)?,
            n: to_i32("m", m)?,
            k: to_i32("k", k)?,
            alpha: 1.0,
            a: ob.ptr,
            lda: to_i32("ld of b", ob.ld)?,
            stride_a: ob.batch_stride as i64,
            b: oa.ptr,
            ldb: to_i32("ld of a", oa.ld)?,
            stride_b: oa.batch_stride as i64,
            beta,
            c: self.ptr(OP, out)?,
            ldc: to_i32("n", n)?,
            stride_c: (m * n) as i64,
            batch: to_i32("batch", count)?,
        };
        match mode {
            MathMode::F32 => self.gemm(OP, &gemm),
            MathMode::Tf32 | MathMode::Bf16 => self.gemm_ex(
                OP,
                &GemmEx {
                    math: mode.gemm_math(),
                    gemm,
                },
            ),
        }
    }

    pub(super) fn fill_zero(&self, t: &CudaTensor) -> Result<()> {
        let p = self.ptr(OP, t)?;
        self.inner
            .device
            .memset_d32_async(p, 0, t.numel() as u64, self.inner.stream)
            .map_err(|e| super::device_error(OP, e))
    }
}

#[cfg(test)]
mod tests {
    use super::matrix_order;

    #[test]
    fn orders_of_views() {
        assert_eq!(matrix_order(3, 4, 4, 1), Some((false, 4)));
        assert_eq!(matrix_order(4, 3, 1, 4), Some((true, 4)));
        assert_eq!(matrix_order(3, 4, 8, 1), Some((false, 8)));
        assert_eq!(matrix_order(1, 4, 0, 1), Some((false, 4)));
        assert_eq!(matrix_order(3, 4, 8, 2), None);
        assert_eq!(matrix_order(3, 4, 0, 1), None);
    }
}
