//! Row-wise ops (reductions, softmax, LayerNorm), the loss and the optimiser step. Inputs are
//! brought to a dense `[rows, n]` form (a reduction permutes its axis last) and one warp
//! handles one row. Softmax and LayerNorm rows up to 1024 wide (a multiple of 4, 16-byte
//! aligned) go to register-resident kernels that read the row once with 16-byte loads; other
//! rows to the general kernels, which loop over the row.

use super::kernels::{self, Args, Kernel, ptr, reduce_code, u64a};
use super::{CudaBackend, CudaStorage, CudaTensor};
use crate::backend::{AdamWConfig, LayerNormOut, ReduceOp};
use crate::error::Result;
use crate::validate;
use zdevice::{DevicePtr, Driver, KernelArg};

/// A column reduction by name ([`CudaBackend::reduce_cols`]): the middle axis of the dense
/// `[outer, n, inner]` tensor `src` (`shape`) reduced by `op` into `out` (`[outer, inner]`),
/// a mean dividing by `count`, a sum added into `out` with `accumulate`; `name` is the op the
/// launches are logged and refused under.
#[derive(Clone, Copy, Debug)]
pub(super) struct ColumnReduction<'a> {
    pub(super) name: &'static str,
    pub(super) op: ReduceOp,
    pub(super) out: &'a CudaTensor,
    pub(super) src: &'a CudaTensor,
    pub(super) shape: (usize, usize, usize),
    pub(super) count: usize,
    pub(super) accumulate: bool,
}

impl<D: Driver> CudaBackend<D> {
    pub(crate) fn reduce_axis(
        &self,
        op: ReduceOp,
        x: &CudaTensor,
        axis: usize,
        keepdim: bool,
    ) -> Result<CudaTensor> {
        let validate::Reduced { name, shape, n } = validate::reduce(op, x, axis, keepdim)?;
        let out = self.alloc(name, &shape)?;
        let rows = out.numel();
        if rows == 0 {
            return Ok(out);
        }
        if n == 0 {
            self.fill_dense(name, &out, 0.0)?;
            return Ok(out);
        }
        let inner: usize = x.shape()[axis + 1..].iter().product();
        if inner > 1 {
            // A leading or middle axis: reduce the columns in place rather than transposing.
            let src = self.dense(name, x)?;
            self.reduce_cols(ColumnReduction {
                name,
                op,
                out: &out,
                src: &src,
                shape: (rows / inner, n, inner),
                count: n,
                accumulate: false,
            })?;
            return Ok(out);
        }
        let src = self.dense(name, x)?;
        if let Some((seg, parts)) = kernels::rows_split(rows, n) {
            // Few long rows: segments in parallel into [parts, rows] partials, then those.
            let partial = self.alloc_temp(name, &[parts as usize, rows])?;
            let code = if op == ReduceOp::Max { 2 } else { 0 };
            let args: Args = [
                ptr(self.ptr(name, &partial)?),
                ptr(self.ptr(name, &src)?),
                u64a(rows),
                u64a(n),
                KernelArg::U64(seg),
                KernelArg::U32(code),
            ]
            .into_iter()
            .collect();
            let config = kernels::rows_split_config(rows, parts);
            self.launch(name, Kernel::ReduceRowsSplit, config, &args)?;
            self.reduce_cols(ColumnReduction {
                name,
                op,
                out: &out,
                src: &partial,
                shape: (1, parts as usize, rows),
                count: n,
                accumulate: false,
            })?;
            return Ok(out);
        }
        let args: Args = [
            ptr(self.ptr(name, &out)?),
            ptr(self.ptr(name, &src)?),
            u64a(rows),
            u64a(n),
            KernelArg::U32(reduce_code(op)),
        ]
        .into_iter()
        .collect();
        self.launch(name, Kernel::ReduceRows, kernels::rows_config(rows), &args)?;
        Ok(out)
    }

    /// Reduces the middle axis of the dense `[outer, n, inner]` tensor `src` into `out`
    /// (`[outer, inner]`): one column-reduction pass, or, when the rows are split into chunks to
    /// fill the GPU, a pass into `[chunks, outer * inner]` partials and then the same over those
    /// (one pass when they are at most [`kernels::COLS_FINISH_MAX_ROWS`]).
    /// A mean divides by `count` (the reduced axis's length, also when `src` holds partials).
    /// With `accumulate` (a sum into a dense `out`) the last pass adds into `out` instead of
    /// overwriting it.
    pub(super) fn reduce_cols(&self, r: ColumnReduction<'_>) -> Result<()> {
        self.reduce_cols_passes(r, false)
    }

    /// Sums the `[outer, n, inner]` partials another kernel left (a chunk's sums per row of
    /// `n`) into `out` (`[outer, inner]`; added into it with `accumulate`): one pass when they
    /// are at most [`kernels::COLS_FINISH_MAX_ROWS`] rows.
    pub(super) fn sum_partials(
        &self,
        name: &'static str,
        out: &CudaTensor,
        src: &CudaTensor,
        shape: (usize, usize, usize),
        accumulate: bool,
    ) -> Result<()> {
        let r = ColumnReduction {
            name,
            op: ReduceOp::Sum,
            out,
            src,
            shape,
            count: shape.1,
            accumulate,
        };
        self.reduce_cols_passes(r, true)
    }

    fn reduce_cols_passes(&self, r: ColumnReduction<'_>, mut partials: bool) -> Result<()> {
        let ColumnReduction {
            name,
            op,
            out,
            src,
            shape: (outer, n, inner),
            count,
            accumulate,
        } = r;
        let code = if op == ReduceOp::Max { 2 } else { 0 };
        let total = count as f32;
        if !partials && self.reduce_cols_once(r)? {
            return Ok(());
        }
        let (mut src, mut outer, mut n, mut inner) = (src.clone(), outer, n, inner);
        loop {
            // Few partials finish in one pass: a third launch over a handful of rows costs more
            // (a dependent graph node each) than the 8 row lanes walking them.
            let (chunk, chunks) = if partials && n <= kernels::COLS_FINISH_MAX_ROWS {
                (n as u64, 1)
            } else {
                kernels::cols_chunking(outer, n, inner)
            };
            let last = chunks == 1;
            let dst = if last {
                out.clone()
            } else {
                self.alloc_temp(name, &[chunks as usize, outer * inner])?
            };
            let div = if last && op == ReduceOp::Mean {
                total
            } else {
                1.0
            };
            let args: Args = [
                ptr(self.ptr(name, &dst)?),
                ptr(self.ptr(name, &src)?),
                u64a(outer),
                u64a(n),
                u64a(inner),
                KernelArg::U64(chunk),
                KernelArg::U32(if last && accumulate { 3 } else { code }),
                KernelArg::F32(div),
            ]
            .into_iter()
            .collect();
            let config = kernels::cols_config(outer, inner, chunks);
            self.launch(name, Kernel::ReduceCols, config, &args)?;
            if last {
                return Ok(());
            }
            // The partials are [chunks, outer * inner]: one block of wide columns.
            (src, outer, n, inner) = (dst, 1, chunks as usize, outer * inner);
            partials = true;
        }
    }

    /// Both passes of a chunked column reduction in one launch (`zc_reduce_cols_last_f32`: the
    /// last block of each column tile adds the chunks' partials, in the order the second pass
    /// would, so the bits are the two launches'), when its shape allows: more than one chunk,
    /// partials that one pass finishes, a ticket for every tile. `false` (nothing launched)
    /// otherwise.
    fn reduce_cols_once(&self, r: ColumnReduction<'_>) -> Result<bool> {
        let ColumnReduction {
            name,
            op,
            out,
            src,
            shape: (outer, n, inner),
            count,
            accumulate,
        } = r;
        let (chunk, chunks) = kernels::cols_chunking(outer, n, inner);
        let tiles = outer.saturating_mul(inner.div_ceil(32));
        let Some(tickets) = self.tickets() else {
            return Ok(false);
        };
        if chunks < 2 || chunks as usize > kernels::COLS_FINISH_MAX_ROWS || tiles > kernels::TICKETS
        {
            return Ok(false);
        }
        let partials = self.alloc_temp(name, &[chunks as usize, outer * inner])?;
        let code = match op {
            _ if accumulate => 3,
            ReduceOp::Max => 2,
            _ => 0,
        };
        let div = if op == ReduceOp::Mean {
            count as f32
        } else {
            1.0
        };
        let args: Args = [
            ptr(self.ptr(name, out)?),
            ptr(self.ptr(name, &partials)?),
            ptr(tickets),
            ptr(self.ptr(name, src)?),
            u64a(outer),
            u64a(n),
            u64a(inner),
            KernelArg::U64(chunk),
            KernelArg::U32(code),
            KernelArg::F32(div),
        ]
        .into_iter()
        .collect();
        let config = kernels::cols_config(outer, inner, chunks);
        self.launch(name, Kernel::ReduceColsLast, config, &args)?;
        Ok(true)
    }

    fn fill_dense(&self, op: &'static str, t: &CudaTensor, value: f32) -> Result<()> {
        let p = self.ptr(op, t)?;
        self.inner
            .device
            .memset_d32_async(p, value.to_bits(), t.numel() as u64, self.inner.stream)
            .map_err(|e| super::device_error(op, e))
    }

    pub(crate) fn softmax_rows(&self, x: &CudaTensor) -> Result<CudaTensor> {
        const OP: &str = "softmax";
        let validate::Rows { n, .. } = validate::softmax(x)?;
        let out = self.alloc(OP, x.shape())?;
        if out.numel() == 0 {
            return Ok(out);
        }
        let src = self.dense(OP, x)?;
        let rows = out.numel() / n;
        let (out_ptr, src_ptr) = (self.ptr(OP, &out)?, self.ptr(OP, &src)?);
        let args: Args = [ptr(out_ptr), ptr(src_ptr), u64a(rows), u64a(n)]
            .into_iter()
            .collect();
        let (kernel, config) = match kernels::vec_lanes(n)
            .filter(|_| kernels::vec_aligned(out_ptr) && kernels::vec_aligned(src_ptr))
            .and_then(|lanes| Some((Kernel::softmax_vec(lanes)?, lanes)))
        {
            Some((k, lanes)) => (k, kernels::rows_vec_config(rows, lanes)),
            None => (Kernel::SoftmaxRows, kernels::rows_config(rows)),
        };
        self.launch(OP, kernel, config, &args)?;
        Ok(out)
    }

    pub(crate) fn layer_norm_rows(
        &self,
        x: &CudaTensor,
        weight: Option<&CudaTensor>,
        bias: Option<&CudaTensor>,
        eps: f32,
    ) -> Result<LayerNormOut<CudaStorage>> {
        const OP: &str = "layer_norm";
        let validate::Rows { n, .. } = validate::layer_norm(x, weight, bias, eps)?;
        let w = weight.map(|t| self.dense(OP, t)).transpose()?;
        let b = bias.map(|t| self.dense(OP, t)).transpose()?;
        let stat_shape = validate::stat_shape(x);
        let out = self.alloc(OP, x.shape())?;
        let mean = self.alloc(OP, &stat_shape)?;
        let rstd = self.alloc(OP, &stat_shape)?;
        let rows = mean.numel();
        if rows > 0 {
            let src = self.dense(OP, x)?;
            let opt_ptr = |t: &Option<CudaTensor>| -> Result<DevicePtr> {
                t.as_ref().map_or(Ok(DevicePtr::NULL), |t| self.ptr(OP, t))
            };
            let (out_ptr, src_ptr) = (self.ptr(OP, &out)?, self.ptr(OP, &src)?);
            let (w_ptr, b_ptr) = (opt_ptr(&w)?, opt_ptr(&b)?);
            let args: Args = [
                ptr(out_ptr),
                ptr(self.ptr(OP, &mean)?),
                ptr(self.ptr(OP, &rstd)?),
                ptr(src_ptr),
                ptr(w_ptr),
                ptr(b_ptr),
                KernelArg::U32(u32::from(w.is_some())),
                KernelArg::U32(u32::from(b.is_some())),
                u64a(rows),
                u64a(n),
                KernelArg::F32(eps),
            ]
            .into_iter()
            .collect();
            // NULL (absent weight or bias) counts as aligned: the kernel does not read it.
            let aligned = [out_ptr, src_ptr, w_ptr, b_ptr]
                .into_iter()
                .all(kernels::vec_aligned);
            let (kernel, config) = match kernels::vec_lanes(n)
                .filter(|_| aligned)
                .and_then(|lanes| Some((Kernel::layer_norm_vec(lanes)?, lanes)))
            {
                Some((k, lanes)) => (k, kernels::rows_vec_config(rows, lanes)),
                None => (Kernel::LayerNormRows, kernels::rows_config(rows)),
            };
            self.launch(OP, kernel, config, &args)?;
        }
        Ok(LayerNormOut { out, mean, rstd })
    }

    pub(crate) fn bce_mean(&self, logits: &CudaTensor, targets: &CudaTensor) -> Result<CudaTensor> {
        const OP: &str = "bce_with_logits";
        let n = validate::bce(logits, targets)?;
        let (x, y) = (self.dense(OP, logits)?, self.dense(OP, targets)?);
        let out = self.alloc(OP, &[])?;
        let args: Args = [
            ptr(self.ptr(OP, &out)?),
            ptr(self.ptr(OP, &x)?),
            ptr(self.ptr(OP, &y)?),
            u64a(n),
        ]
        .into_iter()
        .collect();
        self.launch(OP, Kernel::BceMean, kernels::single_block(), &args)?;
        Ok(out)
    }

    pub(crate) fn adamw(
        &self,
        p: &CudaTensor,
        m: &CudaTensor,
        v: &CudaTensor,
        g: &CudaTensor,
        slot: &CudaTensor,
        cfg: &AdamWConfig<f32>,
    ) -> Result<()> {
        const OP: &str = "adamw";
        validate::adamw(p, m, v, g, slot, cfg)?;
        let n = p.numel();
        if n == 0 {
            return Ok(());
        }
        tracing::trace!(target: "zcompute.cuda.adamw", numel = n, "adamw");
        // The kernel updates dense p, m, v in place; views go through dense temporaries that
        // are copied back.
        let state: Vec<CudaTensor> = [p, m, v]
            .into_iter()
            .map(|t| self.dense(OP, t))
            .collect::<Result<_>>()?;
        let (gc, sc) = (self.dense(OP, g)?, self.dense(OP, slot)?);
        let args: Args = [
            ptr(self.ptr(OP, &state[0])?),
            ptr(self.ptr(OP, &state[1])?),
            ptr(self.ptr(OP, &state[2])?),
            ptr(self.ptr(OP, &gc)?),
            ptr(self.ptr(OP, &sc)?),
            u64a(n),
            KernelArg::F32(cfg.beta1),
            KernelArg::F32(cfg.beta2),
            KernelArg::F32(cfg.eps),
            KernelArg::F32(cfg.weight_decay),
            u64a(slot.numel()),
        ]
        .into_iter()
        .collect();
        self.launch(OP, Kernel::AdamW, kernels::elementwise_config(n), &args)?;
        for (t, orig) in state.iter().zip([p, m, v]) {
            if !orig.is_contiguous() {
                self.copy_view(OP, t, orig)?;
            }
        }
        Ok(())
    }
}
