//! `PrecisionOps` on the device (issue 42): TF32 products as `cublasGemmStridedBatchedEx` on
//! the float32 operands in place, bf16 products on bf16 copies of the operands made by
//! `kernels/convert.cu` (`zc_f32_to_bf16`, nearest-even, one pass per operand), float32
//! accumulation and output in both (the descriptor is built in `matmul.rs`'s `gemm_to`).
//! Few rows under bf16 (one sample's) take the small-row kernels' bf16 forms instead
//! (`cuda/linear.rs`), which round as they read or read a copy in place, and a Linear
//! forward's bias epilogue with them. A bf16
//! copy lives in a temporary block of `ceil(n / 2)` floats (two bf16 elements a float), freed
//! in stream order once the product is queued; in a capture it comes from the reservation as
//! every temporary does, so the captured product allocates nothing at replay.

use super::CudaStorage;
use super::kernels::{self, Args, Kernel, ptr, u64a};
use super::linear::{BiasGrad, StridedRead, bf16_grads_refused, op_strides};
use super::matmul::Operand;
use super::{CudaBackend, CudaTensor};
use crate::backend::{Backend, MatmulOpts};
use crate::error::Result;
use crate::layout::checked_numel;
use crate::linear::{Activation, LinearOps};
use crate::precision::{Bf16Copy, LINEAR_NT, MathMode, PrecisionOps, linear_epilogue};
use crate::validate::{self, LinearShape, split_matrix};
use zdevice::Driver;

/// `op(a)` transposed: a weight's gradient `gᵀ · x`.
const TN: MatmulOpts = MatmulOpts {
    trans_a: true,
    trans_b: false,
};

impl<D: Driver> CudaBackend<D> {
    /// A temporary holding `x` (dense) as `x.numel()` bf16 elements, rounded to nearest-even.
    fn to_bf16(&self, op: &'static str, x: &CudaTensor) -> Result<CudaTensor> {
        let n = x.numel();
        let holder = self.alloc_temp(op, &[n.div_ceil(2)])?;
        if n > 0 {
            let args: Args = [ptr(self.ptr(op, &holder)?), ptr(self.ptr(op, x)?), u64a(n)]
                .into_iter()
                .collect();
            self.launch(op, Kernel::F32ToBf16, kernels::elementwise_config(n), &args)?;
        }
        Ok(holder)
    }

    /// A bf16 copy (a matrix: `shape_stand_in` checked it) as cuBLAS reads it: what
    /// `bf16_operand` would have made of the tensor it was converted from (row-major, one
    /// matrix: batch stride 0).
    fn copy_operand(&self, op: &'static str, copy: &Bf16Copy<CudaStorage>) -> Result<Operand> {
        Ok(Operand {
            ptr: self.ptr(op, copy.backing())?,
            _keep: copy.backing().clone(),
            col_major: false,
            ld: copy.shape()[1].max(1),
            batch_stride: 0,
        })
    }

    /// A Linear layer's bf16 parameter gradients `dw += round(g)ᵀ · x'`, `db += Σ_rows g`
    /// (float32, row order) in one launch of the bf16 parameter-gradient kernel, where it
    /// takes the product (`bf16_grads_refused`). `g` is the
    /// float32 gradient `[rows, outputs]` (the bias's summand); `reads` are g's and x's
    /// operands as the kernel reads them (first element, `(g_cs, g_rs)` and `(x_rs, x_cs)`),
    /// of the form `packed` says (`GRADS_BF16_FORMS`). `false`: nothing queued.
    fn param_grads_bf16_launch(
        &self,
        shape: LinearShape,
        g: &CudaTensor,
        (g_read, x_read): (StridedRead, StridedRead),
        (dw, db): (&CudaTensor, Option<&CudaTensor>),
        packed: u32,
    ) -> Result<bool> {
        const OP: &str = "linear_param_grads_into_bf16";
        if bf16_grads_refused(shape, dw).is_some() {
            return Ok(false);
        }
        let LinearShape {
            rows,
            inputs,
            outputs,
        } = shape;
        let bias = match db {
            Some(db) => Some(BiasGrad {
                db,
                db_stride: db.layout().strides()[0],
                gf: self.ptr(OP, g)?,
                gf_strides: op_strides(g, false),
            }),
            None => None,
        };
        self.grads_bf16((outputs, rows, inputs), g_read, x_read, (dw, bias), packed)
    }

    /// One operand of a bf16 product, as cuBLAS reads it: a dense row-major bf16 copy of its
    /// matrices. A single matrix broadcast over the batch is converted once (batch stride 0);
    /// an operand already of the batch's size is converted as it is; any other broadcast is
    /// materialised first.
    pub(super) fn bf16_operand(&self, x: &CudaTensor, batch: &[usize]) -> Result<Operand> {
        const OP: &str = "matmul";
        let (_, r, c) = split_matrix(x)?;
        let count = checked_numel(OP, batch)?;
        let single = x.numel() == r * c;
        let dense = if single || x.numel() == count * r * c {
            // Broadcasting adds or widens axes of size 1 only: the same elements in the same
            // order as the batch's.
            self.dense(OP, x)?
        } else {
            let mut full: crate::layout::Dims = batch.into();
            full.extend([r, c]);
            self.dense(OP, &x.broadcast_to(&full)?)?
        };
        let holder = self.to_bf16(OP, &dense)?;
        Ok(Operand {
            ptr: self.ptr(OP, &holder)?,
            _keep: holder,
            col_major: false,
            ld: c.max(1),
            batch_stride: if single { 0 } else { r * c },
        })
    }
}

impl<D: Driver> PrecisionOps<f32> for CudaBackend<D> {
    fn matmul_mode(
        &self,
        a: &CudaTensor,
        b: &CudaTensor,
        opts: MatmulOpts,
        mode: MathMode,
    ) -> Result<CudaTensor> {
        match mode {
            MathMode::F32 => self.matmul(a, b, opts),
            MathMode::Tf32 | MathMode::Bf16 => self.matmul_gemm_mode(a, b, opts, mode),
        }
    }

    fn matmul_into_mode(
        &self,
        a: &CudaTensor,
        b: &CudaTensor,
        opts: MatmulOpts,
        dst: &CudaTensor,
        mode: MathMode,
    ) -> Result<()> {
        match mode {
            MathMode::F32 => self.matmul_into(a, b, opts, dst),
            MathMode::Tf32 | MathMode::Bf16 => self.matmul_into_gemm_mode(a, b, opts, dst, mode),
        }
    }

    /// Under bf16, one small-row launch with the bias epilogue inside for few rows
    /// (`linear_fused`: the kernel's bf16 form, the same bits as the product then
    /// `bias_act`), else the provided steps: the product under the mode, then `bias_act`.
    fn linear_mode(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        bias: &CudaTensor,
        act: Activation,
        mode: MathMode,
    ) -> Result<CudaTensor> {
        if mode == MathMode::Bf16 {
            return self.linear_fused(x, w, bias, act, None, mode);
        }
        validate::linear(x, w, bias)?;
        self.bias_act(&self.matmul_mode(x, w, LINEAR_NT, mode)?, bias, act)
    }

    /// One small-row launch on the copies with the bias epilogue (and a dense residual)
    /// inside for few rows (`linear_rows_bf16`), else the provided steps.
    fn linear_bf16(
        &self,
        x: &Bf16Copy<CudaStorage>,
        w: &Bf16Copy<CudaStorage>,
        bias: &CudaTensor,
        act: Activation,
        residual: Option<&CudaTensor>,
    ) -> Result<CudaTensor> {
        const OP: &str = "linear";
        let (sx, sw) = (
            x.shape_stand_in("linear_bf16")?,
            w.shape_stand_in("linear_bf16")?,
        );
        let given = (
            Some(self.copy_operand(OP, x)?),
            Some(self.copy_operand(OP, w)?),
        );
        let given = (given.0.as_ref(), given.1.as_ref());
        match self.linear_rows_bf16((&sx, &sw), bias, act, residual, given)? {
            Some(out) => Ok(out),
            None => {
                let z = self.matmul_bf16(x, w, LINEAR_NT)?;
                linear_epilogue(self, &z, bias, act, residual)
            }
        }
    }

    /// As `linear_bf16`, the input in float32 (rounded as the kernel reads it).
    fn linear_bf16_rhs(
        &self,
        x: &CudaTensor,
        w: &Bf16Copy<CudaStorage>,
        bias: &CudaTensor,
        act: Activation,
        residual: Option<&CudaTensor>,
    ) -> Result<CudaTensor> {
        const OP: &str = "linear";
        let sw = w.shape_stand_in("linear_bf16_rhs")?;
        let given = Some(self.copy_operand(OP, w)?);
        match self.linear_rows_bf16((x, &sw), bias, act, residual, (None, given.as_ref()))? {
            Some(out) => Ok(out),
            None => {
                let z = self.matmul_bf16_rhs(x, w, LINEAR_NT)?;
                linear_epilogue(self, &z, bias, act, residual)
            }
        }
    }

    /// Both gradients in one launch of the bf16 weight-gradient kernel where it takes the
    /// product (`param_grads_bf16_launch`), else the provided steps.
    fn linear_param_grads_into_bf16(
        &self,
        g: &CudaTensor,
        g_copy: &Bf16Copy<CudaStorage>,
        x: &Bf16Copy<CudaStorage>,
        dw: &CudaTensor,
        db: Option<&CudaTensor>,
    ) -> Result<()> {
        const OP: &str = "linear_param_grads_into_bf16";
        let sx = x.shape_stand_in(OP)?;
        let shape = validate::linear_param_grads_into_bf16(g, g_copy.shape(), &sx, dw, db)?;
        let (gp, xp) = (self.copy_operand(OP, g_copy)?, self.copy_operand(OP, x)?);
        let reads = ((gp.ptr, (1, gp.ld)), (xp.ptr, (xp.ld, 1)));
        if self.param_grads_bf16_launch(shape, g, reads, (dw, db), 3)? {
            return Ok(());
        }
        self.matmul_into_bf16(g_copy, x, TN, dw)?;
        match db {
            Some(db) => self.sum_rows_into(g, db),
            None => Ok(()),
        }
    }

    /// One launch of `zc_linear_backward_bf16` where it takes the backward
    /// (`linear_backward_bf16_fused`, which validates), else the provided steps (which the
    /// fused kernel equals bit for bit).
    fn linear_backward_into_bf16(
        &self,
        gy: &CudaTensor,
        x: &Bf16Copy<CudaStorage>,
        w: Option<&Bf16Copy<CudaStorage>>,
        (act, y): (Activation, Option<&CudaTensor>),
        (dw, db): (&CudaTensor, Option<&CudaTensor>),
    ) -> Result<Option<CudaTensor>> {
        match self.linear_backward_bf16_fused(gy, x, w, (act, y), (dw, db))? {
            Some(gx) => Ok(gx),
            None => crate::precision::linear_backward_bf16_steps(self, gy, x, w, y, (dw, db)),
        }
    }

    /// Under bf16, the provided steps with the parameter gradients as
    /// `linear_param_grads_into_bf16` runs them on the copies (one launch of the bf16
    /// parameter-gradient kernel, the bias summed in row order, where that kernel takes the
    /// product), so converting per call gives the bits of the trainer's copies
    /// (`linear_backward_into_bf16`); other modes the provided steps.
    fn linear_backward_into_mode(
        &self,
        gy: &CudaTensor,
        x: &CudaTensor,
        w: Option<&CudaTensor>,
        (act, y): (Activation, Option<&CudaTensor>),
        (dw, db): (&CudaTensor, Option<&CudaTensor>),
        mode: MathMode,
    ) -> Result<Option<CudaTensor>> {
        const OP: &str = "linear_backward_into_mode";
        if mode != MathMode::Bf16 {
            return crate::precision::linear_backward_into_mode(
                self,
                gy,
                x,
                w,
                (act, y),
                (dw, db),
                mode,
            );
        }
        let shape = validate::linear_backward_into(gy, x, w, (act, y), dw, db)?;
        let (gz, gx) = crate::precision::gz_and_gx_mode(self, gy, w, y, mode)?;
        let (g_rs, g_cs) = op_strides(&gz, false);
        let reads = (
            (self.ptr(OP, &gz)?, (g_cs, g_rs)),
            (self.ptr(OP, x)?, op_strides(x, false)),
        );
        if !self.param_grads_bf16_launch(shape, &gz, reads, (dw, db), 0)? {
            self.matmul_into_mode(&gz, x, TN, dw, mode)?;
            if let Some(db) = db {
                self.sum_rows_into(&gz, db)?;
            }
        }
        Ok(gx)
    }

    /// One launch (`zc_tanh_backward_bf16`): tanh's backward and its bf16 copy.
    fn tanh_backward_bf16(
        &self,
        g: &CudaTensor,
        y: &CudaTensor,
    ) -> Result<(CudaTensor, Bf16Copy<CudaStorage>)> {
        const OP: &str = "tanh_backward_bf16";
        let n = validate::tanh_backward(g, y)?;
        let gz = self.alloc(OP, y.shape())?;
        let copy = self.bf16_copy_alloc(y.shape())?;
        if n == 0 {
            return Ok((gz, copy));
        }
        let (gc, yc) = (self.dense(OP, g)?, self.dense(OP, y)?);
        let args: Args = [
            ptr(self.ptr(OP, &gz)?),
            ptr(self.ptr(OP, copy.backing())?),
            ptr(self.ptr(OP, &gc)?),
            ptr(self.ptr(OP, &yc)?),
            u64a(n),
        ]
        .into_iter()
        .collect();
        self.launch(
            OP,
            Kernel::TanhBackwardBf16,
            kernels::elementwise_config(n),
            &args,
        )?;
        Ok((gz, copy))
    }

    /// Two bf16 values a float, as `bf16_operand`'s temporaries hold them.
    fn bf16_copy_alloc(&self, shape: &[usize]) -> Result<Bf16Copy<CudaStorage>> {
        const OP: &str = "bf16_copy_alloc";
        let n = checked_numel(OP, shape)?;
        Bf16Copy::new(self.alloc(OP, &[n.div_ceil(2)])?, shape, 2)
    }

    /// One launch of the conversion `bf16_operand` runs, into the copy's backing instead of a
    /// temporary: the same bits.
    fn bf16_copy_into(&self, src: &CudaTensor, dst: &Bf16Copy<CudaStorage>) -> Result<()> {
        const OP: &str = "bf16_copy_into";
        let n = src.numel();
        if n != dst.numel() {
            return Err(crate::error::ComputeError::LengthMismatch {
                op: OP,
                expected: dst.numel(),
                got: n,
            });
        }
        if n == 0 {
            return Ok(());
        }
        let src = self.dense(OP, src)?;
        let args: Args = [
            ptr(self.ptr(OP, dst.backing())?),
            ptr(self.ptr(OP, &src)?),
            u64a(n),
        ]
        .into_iter()
        .collect();
        self.launch(OP, Kernel::F32ToBf16, kernels::elementwise_config(n), &args)
    }

    /// `matmul_gemm_mode` under bf16 with `w`'s converted matrix as the right operand, read as
    /// `bf16_operand` would have made it (row-major, one matrix: batch stride 0).
    fn matmul_bf16_rhs(
        &self,
        a: &CudaTensor,
        w: &Bf16Copy<CudaStorage>,
        opts: MatmulOpts,
    ) -> Result<CudaTensor> {
        const OP: &str = "matmul";
        let stand_in = w.shape_stand_in("matmul_bf16_rhs")?;
        self.gemm_product(a, &stand_in, opts, MathMode::Bf16, || {
            Ok((None, Some(self.copy_operand(OP, w)?)))
        })
    }

    /// `gemm_to` under bf16 with both operands read from their copies, as `bf16_operand` would
    /// have made them: the same cuBLAS call as `matmul_mode` on the float32 tensors.
    fn matmul_bf16(
        &self,
        a: &Bf16Copy<CudaStorage>,
        b: &Bf16Copy<CudaStorage>,
        opts: MatmulOpts,
    ) -> Result<CudaTensor> {
        const OP: &str = "matmul";
        let (sa, sb) = (
            a.shape_stand_in("matmul_bf16")?,
            b.shape_stand_in("matmul_bf16")?,
        );
        self.gemm_product(&sa, &sb, opts, MathMode::Bf16, || {
            Ok((
                Some(self.copy_operand(OP, a)?),
                Some(self.copy_operand(OP, b)?),
            ))
        })
    }

    /// `matmul_into_gemm_mode`'s steps under bf16 on the copies: one gemm with `beta = 1`
    /// into a dense `dst`, otherwise the product and one `add_into`.
    fn matmul_into_bf16(
        &self,
        a: &Bf16Copy<CudaStorage>,
        b: &Bf16Copy<CudaStorage>,
        opts: MatmulOpts,
        dst: &CudaTensor,
    ) -> Result<()> {
        const OP: &str = "matmul";
        let (sa, sb) = (
            a.shape_stand_in("matmul_into_bf16")?,
            b.shape_stand_in("matmul_into_bf16")?,
        );
        let shape = validate::matmul_into(&sa, &sb, opts, dst)?;
        if dst.numel() == 0 || shape.k == 0 {
            return Ok(());
        }
        if !dst.is_contiguous() {
            let product = self.matmul_bf16(a, b, opts)?;
            return self.add_into_fused(&product, dst);
        }
        let given = (
            Some(self.copy_operand(OP, a)?),
            Some(self.copy_operand(OP, b)?),
        );
        self.gemm_to(&sa, &sb, opts, &shape, dst, 1.0, MathMode::Bf16, given)
    }

    fn round_to_bf16(&self, x: &CudaTensor) -> Result<CudaTensor> {
        const OP: &str = "round_to_bf16";
        let out = self.alloc(OP, x.shape())?;
        let n = x.numel();
        if n == 0 {
            return Ok(out);
        }
        let holder = self.to_bf16(OP, &self.dense(OP, x)?)?;
        let args: Args = [
            ptr(self.ptr(OP, &out)?),
            ptr(self.ptr(OP, &holder)?),
            u64a(n),
        ]
        .into_iter()
        .collect();
        self.launch(OP, Kernel::Bf16ToF32, kernels::elementwise_config(n), &args)?;
        Ok(out)
    }
}
