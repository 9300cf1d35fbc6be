//! `Backend<f32>` for `CudaBackend`: transfers, fills and copies, elementwise ops. Row-wise
//! ops are in `rows.rs`, matrix products in `matmul.rs`. Dense operands take the vectorised
//! kernels; views take the strided kernels (strides passed per operand, broadcast as stride 0).

use super::kernels::{self, Args, Kernel, binary_code, ptr, u64a, unary_code};
use super::{CudaBackend, CudaStorage, CudaTensor, device_error, lock};
use crate::backend::{
    AdamWConfig, AllocClass, Backend, BinaryOp, LayerNormGrads, LayerNormOut, MatmulOpts, ReduceOp,
    ScalarSide, UnaryOp,
};
use crate::error::{ComputeError, Result};
use crate::validate::{self, binary_name};
use zdevice::{Driver, KernelArg};

impl<D: Driver> CudaBackend<D> {
    /// Writes the view `src` into the view `dst` (same shape, not overlapping).
    pub(crate) fn copy_view(
        &self,
        op: &'static str,
        src: &CudaTensor,
        dst: &CudaTensor,
    ) -> Result<()> {
        let n = src.numel();
        if n == 0 {
            return Ok(());
        }
        let (sp, dp) = (self.ptr(op, src)?, self.ptr(op, dst)?);
        if src.is_contiguous() && dst.is_contiguous() {
            return self
                .inner
                .device
                .copy_dtod_async(dp, sp, n as u64 * 4, self.inner.stream)
                .map_err(|e| device_error(op, e));
        }
        let mut args: Args = [ptr(dp), ptr(sp), u64a(n)].into_iter().collect();
        let strides = [src.layout().strides(), dst.layout().strides()];
        kernels::push_strided(op, &mut args, src.shape(), &strides)?;
        match kernels::row_tiles(src.shape(), &strides) {
            Some(config) => self.launch(op, Kernel::CopyRowsStrided, config, &args),
            None => self.launch(
                op,
                Kernel::CopyStrided,
                kernels::elementwise_config(n),
                &args,
            ),
        }
    }

    /// `x` itself if dense, else a dense temporary copy (for read-only operands).
    pub(crate) fn dense(&self, op: &'static str, x: &CudaTensor) -> Result<CudaTensor> {
        if x.is_contiguous() {
            return Ok(x.clone());
        }
        let t = self.alloc_temp(op, x.shape())?;
        self.copy_view(op, x, &t)?;
        Ok(t)
    }

    /// `out = a op b` (shapes checked by the caller; `out` dense, shaped as the broadcast; in
    /// other memory than `a` and `b`, or, dense and of `out`'s shape, `out` itself: each thread
    /// reads `a[i]` and `b[i]` before it writes `out[i]`): the dense kernel when both operands
    /// are dense and of `out`'s shape, else the strided kernels. `name` is the op errors name.
    pub(crate) fn binary_to(
        &self,
        name: &'static str,
        op: BinaryOp,
        a: &CudaTensor,
        b: &CudaTensor,
        out: &CudaTensor,
    ) -> Result<()> {
        let shape = out.shape();
        let n = out.numel();
        if n == 0 {
            return Ok(());
        }
        let mut args: Args = [
            ptr(self.ptr(name, out)?),
            ptr(self.ptr(name, a)?),
            ptr(self.ptr(name, b)?),
            KernelArg::U32(binary_code(op)),
            u64a(n),
        ]
        .into_iter()
        .collect();
        let dense =
            a.shape() == shape && b.shape() == shape && a.is_contiguous() && b.is_contiguous();
        let (kernel, config) = if dense {
            (Kernel::Binary, kernels::elementwise_config(n))
        } else {
            let la = a.layout().broadcast_to(shape)?;
            let lb = b.layout().broadcast_to(shape)?;
            let strides = [la.strides(), lb.strides()];
            kernels::push_strided(name, &mut args, shape, &strides)?;
            match kernels::row_tiles(shape, &strides) {
                Some(config) => (Kernel::BinaryRowsStrided, config),
                None => (Kernel::BinaryStrided, kernels::elementwise_config(n)),
            }
        };
        self.launch(name, kernel, config, &args)
    }

    fn memset(&self, op: &'static str, dst: &CudaTensor, value: f32) -> Result<()> {
        let p = self.ptr(op, dst)?;
        self.inner
            .device
            .memset_d32_async(p, value.to_bits(), dst.numel() as u64, self.inner.stream)
            .map_err(|e| device_error(op, e))
    }
}

impl<D: Driver> Backend<f32> for CudaBackend<D> {
    type Storage = CudaStorage;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn upload(&self, data: &[f32], shape: &[usize]) -> Result<CudaTensor> {
        const OP: &str = "upload";
        let n = validate::upload::<f32>(data.len(), shape)?;
        self.refuse_in_capture(OP, "upload persistent tensors before the capture")?;
        let out = self.alloc(OP, shape)?;
        if n > 0 {
            self.stage_upload(OP, data, self.ptr(OP, &out)?)?;
        }
        Ok(out)
    }

    fn upload_into(&self, data: &[f32], dst: &CudaTensor) -> Result<()> {
        const OP: &str = "upload_into";
        validate::upload_into(data.len(), dst)?;
        self.refuse_in_capture(
            OP,
            "refill the graph's inputs between replays, not inside the capture",
        )?;
        if data.is_empty() {
            return Ok(());
        }
        if dst.is_contiguous() {
            return self.stage_upload(OP, data, self.ptr(OP, dst)?);
        }
        let tmp = self.alloc_temp(OP, dst.shape())?;
        self.stage_upload(OP, data, self.ptr(OP, &tmp)?)?;
        self.copy_view(OP, &tmp, dst)
    }

    fn download(&self, x: &CudaTensor) -> Result<Vec<f32>> {
        const OP: &str = "download";
        self.refuse_in_capture(OP, "download after the capture or after a replay")?;
        if x.numel() == 0 {
            return Ok(Vec::new());
        }
        let xc = self.dense(OP, x)?;
        self.stage_download(OP, self.ptr(OP, &xc)?, xc.numel())
    }

    fn full(&self, shape: &[usize], value: f32) -> Result<CudaTensor> {
        validate::full::<f32>(shape)?;
        let out = self.alloc("full", shape)?;
        if out.numel() > 0 {
            self.memset("full", &out, value)?;
        }
        Ok(out)
    }

    fn fill(&self, dst: &CudaTensor, value: f32) -> Result<()> {
        const OP: &str = "fill";
        validate::fill(dst)?;
        let n = dst.numel();
        if n == 0 {
            return Ok(());
        }
        if dst.is_contiguous() {
            return self.memset(OP, dst, value);
        }
        let mut args: Args = [ptr(self.ptr(OP, dst)?), KernelArg::F32(value), u64a(n)]
            .into_iter()
            .collect();
        kernels::push_strided(OP, &mut args, dst.shape(), &[dst.layout().strides()])?;
        self.launch(
            OP,
            Kernel::FillStrided,
            kernels::elementwise_config(n),
            &args,
        )
    }

    fn contiguous(&self, x: &CudaTensor) -> Result<CudaTensor> {
        let out = self.alloc("contiguous", x.shape())?;
        self.copy_view("contiguous", x, &out)?;
        Ok(out)
    }

    fn copy_into(&self, src: &CudaTensor, dst: &CudaTensor) -> Result<()> {
        const OP: &str = "copy_into";
        validate::copy_into(src, dst)?;
        if src.shares_storage(dst) {
            // Parallel threads would race on overlapping ranges: go through a temporary.
            let tmp = self.alloc_temp(OP, src.shape())?;
            self.copy_view(OP, src, &tmp)?;
            return self.copy_view(OP, &tmp, dst);
        }
        self.copy_view(OP, src, dst)
    }

    fn unary(&self, op: UnaryOp, x: &CudaTensor) -> Result<CudaTensor> {
        const OP: &str = "unary";
        let out = self.alloc(OP, x.shape())?;
        let n = x.numel();
        if n == 0 {
            return Ok(out);
        }
        let mut args: Args = [
            ptr(self.ptr(OP, &out)?),
            ptr(self.ptr(OP, x)?),
            KernelArg::U32(unary_code(op)),
            u64a(n),
        ]
        .into_iter()
        .collect();
        let kernel = if x.is_contiguous() {
            Kernel::Unary
        } else {
            kernels::push_strided(OP, &mut args, x.shape(), &[x.layout().strides()])?;
            Kernel::UnaryStrided
        };
        self.launch(OP, kernel, kernels::elementwise_config(n), &args)?;
        Ok(out)
    }

    fn binary(&self, op: BinaryOp, a: &CudaTensor, b: &CudaTensor) -> Result<CudaTensor> {
        let shape = validate::binary(op, a, b)?;
        let name = binary_name(op);
        let out = self.alloc(name, &shape)?;
        self.binary_to(name, op, a, b, &out)?;
        Ok(out)
    }

    fn binary_scalar(
        &self,
        op: BinaryOp,
        x: &CudaTensor,
        s: f32,
        side: ScalarSide,
    ) -> Result<CudaTensor> {
        let name = binary_name(op);
        let xc = self.dense(name, x)?;
        let out = self.alloc(name, x.shape())?;
        let n = x.numel();
        if n == 0 {
            return Ok(out);
        }
        let args: Args = [
            ptr(self.ptr(name, &out)?),
            ptr(self.ptr(name, &xc)?),
            KernelArg::F32(s),
            KernelArg::U32(binary_code(op)),
            KernelArg::U32(u32::from(side == ScalarSide::Lhs)),
            u64a(n),
        ]
        .into_iter()
        .collect();
        self.launch(
            name,
            Kernel::BinaryScalar,
            kernels::elementwise_config(n),
            &args,
        )?;
        Ok(out)
    }

    fn reduce(
        &self,
        op: ReduceOp,
        x: &CudaTensor,
        axis: usize,
        keepdim: bool,
    ) -> Result<CudaTensor> {
        self.reduce_axis(op, x, axis, keepdim)
    }

    fn softmax_last(&self, x: &CudaTensor) -> Result<CudaTensor> {
        self.softmax_rows(x)
    }

    fn layer_norm(
        &self,
        x: &CudaTensor,
        weight: Option<&CudaTensor>,
        bias: Option<&CudaTensor>,
        eps: f32,
    ) -> Result<LayerNormOut<CudaStorage>> {
        self.layer_norm_rows(x, weight, bias, eps)
    }

    fn softmax_backward(&self, g: &CudaTensor, y: &CudaTensor) -> Result<CudaTensor> {
        self.softmax_backward_rows(g, y)
    }

    fn layer_norm_backward(
        &self,
        g: &CudaTensor,
        x: &CudaTensor,
        mean: &CudaTensor,
        rstd: &CudaTensor,
        weight: Option<&CudaTensor>,
        want: [bool; 2],
    ) -> Result<LayerNormGrads<CudaStorage>> {
        self.layer_norm_backward_rows(g, x, mean, rstd, weight, want)
    }

    fn norm2(&self, x: &CudaTensor) -> Result<CudaTensor> {
        self.norm2_fused(x)
    }

    fn clip_scale(&self, x: &CudaTensor, norm: &CudaTensor, max_norm: f32) -> Result<()> {
        self.clip_scale_fused(x, norm, max_norm)
    }

    fn finite_gate(&self, a: &CudaTensor, b: &CudaTensor, dst: &CudaTensor) -> Result<()> {
        self.finite_gate_fused(a, b, dst)
    }

    fn add_into(&self, src: &CudaTensor, dst: &CudaTensor) -> Result<()> {
        self.add_into_fused(src, dst)
    }

    fn matmul_into(
        &self,
        a: &CudaTensor,
        b: &CudaTensor,
        opts: MatmulOpts,
        dst: &CudaTensor,
    ) -> Result<()> {
        self.matmul_into_gemm(a, b, opts, dst)
    }

    fn sum_rows_into(&self, x: &CudaTensor, dst: &CudaTensor) -> Result<()> {
        self.sum_rows_into_cols(x, dst)
    }

    fn matmul(&self, a: &CudaTensor, b: &CudaTensor, opts: MatmulOpts) -> Result<CudaTensor> {
        self.matmul_gemm(a, b, opts)
    }

    fn bce_with_logits_mean(
        &self,
        logits: &CudaTensor,
        targets: &CudaTensor,
    ) -> Result<CudaTensor> {
        self.bce_mean(logits, targets)
    }

    fn adamw_step(
        &self,
        p: &CudaTensor,
        m: &CudaTensor,
        v: &CudaTensor,
        g: &CudaTensor,
        slot: &CudaTensor,
        cfg: &AdamWConfig<f32>,
    ) -> Result<()> {
        self.adamw(p, m, v, g, slot, cfg)
    }

    fn gather_row(&self, src: &CudaTensor, index: &CudaTensor, dst: &CudaTensor) -> Result<()> {
        self.gather_row_at(src, index, dst)
    }

    fn scatter_row(
        &self,
        src: &CudaTensor,
        index: &CudaTensor,
        dst: &CudaTensor,
        advance: bool,
    ) -> Result<()> {
        self.scatter_row_at(src, index, dst, advance)
    }

    fn set_alloc_class(&self, class: AllocClass) -> AllocClass {
        std::mem::replace(&mut *lock(&self.inner.class), class)
    }

    fn alloc_class(&self) -> AllocClass {
        *lock(&self.inner.class)
    }

    fn storage_class(&self, x: &CudaTensor) -> Option<AllocClass> {
        Some(x.storage().class())
    }

    fn begin_step(&self) -> Result<()> {
        const OP: &str = "begin_step";
        self.refuse_in_capture(OP, "steps begin and end outside the capture")?;
        let mut step = lock(&self.inner.step);
        if step.is_some() {
            return Err(ComputeError::StepState {
                op: OP,
                why: "a step is already open on this backend; end it first",
            });
        }
        *step = Some(
            self.inner
                .arena
                .step_owned()
                .map_err(|e| super::mem_error(OP, e))?,
        );
        Ok(())
    }

    fn end_step(&self) -> Result<()> {
        const OP: &str = "end_step";
        self.refuse_in_capture(OP, "steps begin and end outside the capture")?;
        let step = lock(&self.inner.step)
            .take()
            .ok_or(ComputeError::StepState {
                op: OP,
                why: "no step is open; call begin_step first",
            })?;
        let summary = step.end().map_err(|e| super::mem_error(OP, e))?;
        tracing::debug!(target: "zcompute.cuda.step", ?summary, "step ended");
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        self.refuse_in_capture("synchronize", "synchronise after the capture")?;
        self.inner
            .device
            .synchronize(self.inner.stream)
            .map_err(|e| device_error("synchronize", e))
    }
}
