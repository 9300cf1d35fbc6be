//! LayerNorm's backward with its weight's and bias's gradients added into their buffers
//! (`NormOps::layer_norm_backward_into`, `kernels/norm_params.cu`): for few rows, one sample's,
//! the row kernel and two column reductions (three dependent graph nodes) become one kernel
//! whose blocks split the columns; a batch's rows go in chunks of [`LN_PARAMS_MAX_ROWS`] (block
//! rows of the same kernel) whose sums one column reduction finishes: two launches where the
//! composite takes five. Strided parameter buffers or no buffer at all take the composite.

use super::attention::adjacent_span;
use super::kernels::{Args, Kernel, ptr, u64a};
use super::{CudaBackend, CudaStorage, CudaTensor};
use crate::backend::{LayerNormBackward, LayerNormGrads};
use crate::error::Result;
use crate::norm::{AddLayerNormOut, NormOps};
use crate::validate;
use zdevice::{DevicePtr, Driver, KernelArg, LaunchConfig};

/// Rows of one block row of the kernel (`LN_PARAMS_MAX_ROWS` in `kernels/norm_params.cu`: its
/// per-row sums live in shared memory): the most one launch takes alone; more go in chunks.
pub(crate) const LN_PARAMS_MAX_ROWS: usize = 32;

/// Threads per block (`LN_PARAMS_THREADS` in the kernel): one column each.
pub(crate) const LN_PARAMS_THREADS: u32 = 128;

/// Threads per block of the batch kernel (`LN_PARTIALS_THREADS` in `kernels/norm_params.cu`).
pub(crate) const LN_PARTIALS_THREADS: u32 = 256;
/// Widest row the batch kernel takes (`LN_PARTIALS_MAX_N`: its sums live in registers and
/// shared memory); wider rows take the block-row chunks.
pub(crate) const LN_PARTIALS_MAX_N: usize = 512;
/// Rows of one block of the batch kernel: two per warp, so a batch's 3072 rows are 192 blocks
/// and their partials one finishing pass (at most `COLS_FINISH_MAX_ROWS` rows).
pub(crate) const LN_PARTIALS_ROWS_PER_BLOCK: usize = 16;

/// Most blocks of a launch; the kernel grid-strides over the columns beyond.
const MAX_BLOCKS: u64 = 65_535;

/// One block per `LN_PARAMS_THREADS` columns of a width-`n` LayerNorm, one block row per
/// chunk of [`LN_PARAMS_MAX_ROWS`] rows (`chunks` at most [`MAX_BLOCKS`]).
pub(crate) fn ln_params_config(n: usize, chunks: usize) -> LaunchConfig {
    let blocks = (n as u64)
        .div_ceil(u64::from(LN_PARAMS_THREADS))
        .clamp(1, MAX_BLOCKS);
    LaunchConfig {
        grid: (
            blocks as u32,
            (chunks as u64).clamp(1, MAX_BLOCKS) as u32,
            1,
        ),
        block: (LN_PARAMS_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl<D: Driver> CudaBackend<D> {
    pub(crate) fn layer_norm_backward_params_fused(
        &self,
        ln: &LayerNormBackward<'_, CudaStorage>,
        want_input: bool,
        dw: Option<&CudaTensor>,
        db: Option<&CudaTensor>,
    ) -> Result<Option<CudaTensor>> {
        const OP: &str = "layer_norm_backward_into";
        let validate::Rows { rows, n } = validate::layer_norm_backward_into(ln, dw, db)?;
        let LayerNormBackward {
            g,
            residual,
            x,
            mean,
            rstd,
            weight,
        } = *ln;
        // The kernel adds into dense `[n]` buffers; with neither given it would be the plain
        // row kernel, which the composite already is.
        let dense_dst = |t: Option<&CudaTensor>| t.is_none_or(CudaTensor::is_contiguous);
        let chunks = rows.div_ceil(LN_PARAMS_MAX_ROWS);
        let fits = rows > 0
            && chunks as u64 <= MAX_BLOCKS
            && n > 0
            && (dw.is_some() || db.is_some())
            && dense_dst(dw)
            && dense_dst(db);
        if !fits {
            tracing::trace!(target: "zcompute.cuda.norm_params", op = OP, rows, n, "layer_norm_backward + sum_rows_into");
            return crate::norm::layer_norm_backward_into(self, ln, want_input, dw, db);
        }
        let input = want_input.then(|| self.alloc(OP, x.shape())).transpose()?;
        if chunks > 1 && n <= LN_PARTIALS_MAX_N {
            let blocks = rows.div_ceil(LN_PARTIALS_ROWS_PER_BLOCK);
            let part = self.alloc_temp(OP, &[2, blocks, n])?;
            self.layer_norm_backward_partials(
                &part,
                input.as_ref(),
                [g, x, mean, rstd],
                residual,
                weight,
                (rows, n),
            )?;
            self.finish_layer_norm_params(OP, &part, (blocks, n), dw, db)?;
            return Ok(input);
        }
        // A batch's chunks leave their sums here: [2, chunks, n], g * xhat's then g's.
        let part = (chunks > 1)
            .then(|| self.alloc_temp(OP, &[2, chunks, n]))
            .transpose()?;
        let dense = [g, x, mean, rstd]
            .into_iter()
            .map(|t| self.dense(OP, t))
            .collect::<Result<Vec<_>>>()?;
        let res = residual.map(|t| self.dense(OP, t)).transpose()?;
        let w = weight.map(|t| self.dense(OP, t)).transpose()?;
        let opt_ptr = |t: Option<&CudaTensor>| -> Result<DevicePtr> {
            t.map_or(Ok(DevicePtr::NULL), |t| self.ptr(OP, t))
        };
        let flag = |on: bool| KernelArg::U32(u32::from(on));
        let args: Args = [
            ptr(opt_ptr(input.as_ref())?),
            ptr(opt_ptr(dw)?),
            ptr(opt_ptr(db)?),
            ptr(self.ptr(OP, &dense[0])?),
            ptr(opt_ptr(res.as_ref())?),
            ptr(self.ptr(OP, &dense[1])?),
            ptr(self.ptr(OP, &dense[2])?),
            ptr(self.ptr(OP, &dense[3])?),
            ptr(opt_ptr(w.as_ref())?),
            flag(w.is_some()),
            flag(res.is_some()),
            flag(want_input),
            flag(dw.is_some()),
            flag(db.is_some()),
            u64a(rows),
            u64a(n),
            ptr(opt_ptr(part.as_ref())?),
        ]
        .into_iter()
        .collect();
        self.launch(
            OP,
            Kernel::LayerNormBackwardParams,
            ln_params_config(n, chunks),
            &args,
        )?;
        if let Some(part) = part {
            self.finish_layer_norm_params(OP, &part, (chunks, n), dw, db)?;
        }
        Ok(input)
    }

    /// The batch kernel: the input gradient into `input` (when given) and each block's sums of
    /// g * xhat and g into `part` (`[2, blocks, n]`).
    fn layer_norm_backward_partials(
        &self,
        part: &CudaTensor,
        input: Option<&CudaTensor>,
        [g, x, mean, rstd]: [&CudaTensor; 4],
        residual: Option<&CudaTensor>,
        weight: Option<&CudaTensor>,
        (rows, n): (usize, usize),
    ) -> Result<()> {
        const OP: &str = "layer_norm_backward_into";
        let dense = [g, x, mean, rstd]
            .into_iter()
            .map(|t| self.dense(OP, t))
            .collect::<Result<Vec<_>>>()?;
        let res = residual.map(|t| self.dense(OP, t)).transpose()?;
        let w = weight.map(|t| self.dense(OP, t)).transpose()?;
        let opt_ptr = |t: Option<&CudaTensor>| -> Result<DevicePtr> {
            t.map_or(Ok(DevicePtr::NULL), |t| self.ptr(OP, t))
        };
        let flag = |on: bool| KernelArg::U32(u32::from(on));
        let blocks = rows.div_ceil(LN_PARTIALS_ROWS_PER_BLOCK);
        let args: Args = [
            ptr(opt_ptr(input)?),
            ptr(self.ptr(OP, part)?),
            ptr(self.ptr(OP, &dense[0])?),
            ptr(opt_ptr(res.as_ref())?),
            ptr(self.ptr(OP, &dense[1])?),
            ptr(self.ptr(OP, &dense[2])?),
            ptr(self.ptr(OP, &dense[3])?),
            ptr(opt_ptr(w.as_ref())?),
            flag(w.is_some()),
            flag(res.is_some()),
            flag(input.is_some()),
            u64a(rows),
            u64a(n),
            u64a(LN_PARTIALS_ROWS_PER_BLOCK),
        ]
        .into_iter()
        .collect();
        let config = LaunchConfig {
            grid: (blocks as u32, 1, 1),
            block: (LN_PARTIALS_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        self.launch(OP, Kernel::LayerNormBackwardPartials, config, &args)
    }

    /// Adds the chunks' sums (`part`, `[2, chunks, n]`) into dw and db: one column reduction
    /// over both when they are adjacent (as zgrad's flat gradient buffer lays out a LayerNorm's
    /// weight and bias), else one per buffer given.
    fn finish_layer_norm_params(
        &self,
        op: &'static str,
        part: &CudaTensor,
        (chunks, n): (usize, usize),
        dw: Option<&CudaTensor>,
        db: Option<&CudaTensor>,
    ) -> Result<()> {
        if let Some(span) = adjacent_span(&[dw, db], n)? {
            return self.sum_partials(op, &span, part, (2, chunks, n), true);
        }
        for (k, dst) in [dw, db].into_iter().enumerate() {
            if let Some(dst) = dst {
                let half = part.narrow(0, k, 1)?.reshape(&[chunks, n])?;
                self.sum_partials(op, dst, &half, (1, chunks, n), true)?;
            }
        }
        Ok(())
    }
}

/// The LayerNorm family on the device: `fused.cu` for the residual forms, `norm_params.cu` for
/// the parameters' gradients (dense buffers; the composite otherwise).
impl<D: Driver> NormOps<f32> for CudaBackend<D> {
    fn add_layer_norm(
        &self,
        a: &CudaTensor,
        b: &CudaTensor,
        weight: Option<&CudaTensor>,
        bias: Option<&CudaTensor>,
        eps: f32,
    ) -> Result<AddLayerNormOut<CudaStorage>> {
        self.add_layer_norm_fused(a, b, weight, bias, eps)
    }

    fn layer_norm_backward_add(
        &self,
        ln: &LayerNormBackward<'_, CudaStorage>,
        want: [bool; 2],
    ) -> Result<LayerNormGrads<CudaStorage>> {
        self.layer_norm_backward_add_fused(ln, want)
    }

    fn layer_norm_backward_into(
        &self,
        ln: &LayerNormBackward<'_, CudaStorage>,
        want_input: bool,
        dw: Option<&CudaTensor>,
        db: Option<&CudaTensor>,
    ) -> Result<Option<CudaTensor>> {
        self.layer_norm_backward_params_fused(ln, want_input, dw, db)
    }
}
