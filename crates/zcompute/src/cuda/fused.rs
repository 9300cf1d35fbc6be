//! The fusion families' ops (`crate::linear`, `crate::norm`, `crate::pooled_loss`) on the
//! device, one kernel each from `kernels/fused.cu`: bias + activation after a product, tanh's
//! backward, the residual add with LayerNorm and its backward with the residual gradient added,
//! and mean-pool + head + BCE with its backward.
//! Operands are brought to dense form first (views through a dense temporary, as every row op).

use super::kernels::{self, Args, Kernel, ptr, u64a};
use super::{CudaBackend, CudaStorage, CudaTensor};
use crate::backend::{LayerNormBackward, LayerNormGrads, LayerNormOut};
use crate::error::Result;
use crate::linear::Activation;
use crate::norm::AddLayerNormOut;
use crate::pooled_loss::PooledLossOps;
use crate::pooled_loss::{PoolHeadBceGrads, PoolHeadBceOut};
use crate::validate;
use zdevice::{DevicePtr, Driver, KernelArg, LaunchConfig};

/// Threads per block of the bias epilogue.
const BIAS_ACT_THREADS: u64 = 128;

/// Whether the bias epilogue takes its float4 path: the kernel makes the same test.
fn bias_act_vec4(n: usize, ptrs: [DevicePtr; 3]) -> bool {
    n.is_multiple_of(4) && ptrs.iter().all(|p| p.0.is_multiple_of(16))
}

/// The launch of the bias epilogue over `[rows, n]`: threads are (column, row) pairs, a
/// column being a float4 on the vector path. Blocks are `BIAS_ACT_THREADS` threads, as wide as
/// the columns need (a power of two up to 128, so narrow matrices do not idle most lanes) and
/// as tall as that leaves; grid x over column tiles, grid y over row tiles (both grid-strided
/// past 65 535).
fn bias_act_config(rows: usize, n: usize, vec4: bool) -> LaunchConfig {
    let cols = if vec4 { n / 4 } else { n } as u64;
    let width = cols.next_power_of_two().clamp(1, BIAS_ACT_THREADS);
    let height = BIAS_ACT_THREADS / width;
    LaunchConfig {
        grid: (
            cols.div_ceil(width).clamp(1, 65_535) as u32,
            (rows as u64).div_ceil(height).clamp(1, 65_535) as u32,
            1,
        ),
        block: (width as u32, height as u32, 1),
        shared_mem_bytes: 0,
    }
}

/// Threads of every block of the pooled head's kernels (`POOL_THREADS` in fused.cu).
pub(crate) const POOL_THREADS: u32 = 256;

/// A one-dimensional launch of `blocks` blocks of [`POOL_THREADS`].
fn pool_config(blocks: usize) -> LaunchConfig {
    LaunchConfig {
        grid: ((blocks as u64).clamp(1, 65_535) as u32, 1, 1),
        block: (POOL_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Batches up to this size run the pooled head in one launch each way (one block for the
/// forward, one block row for the backward): a graph node fewer each, and still a few us.
pub(crate) const POOL_SMALL_BATCH: usize = 8;

/// Rows of h (sample, scale) each thread of the pooled head's backward takes, about.
const POOL_BACKWARD_ROWS_PER_THREAD: u64 = 4;

/// The launch of the pooled head's backward over the `rows = B * S` rows of h: blocks of
/// 32 x 8 threads, x over 32-column tiles, y over tiles of `8 * POOL_BACKWARD_ROWS_PER_THREAD`
/// rows. Its grid's y is the number of partial rows of the head's weight gradient. A function
/// of the shape only, so the reduction order is too.
/// Small batches ([`POOL_SMALL_BATCH`]) take one block row.
pub(crate) fn pool_backward_config(batch: usize, scales: usize, width: usize) -> LaunchConfig {
    let rows = (batch as u64).saturating_mul(scales as u64);
    let parts = if batch <= POOL_SMALL_BATCH {
        1
    } else {
        rows.div_ceil(8 * POOL_BACKWARD_ROWS_PER_THREAD)
    };
    LaunchConfig {
        grid: (
            (width as u64).div_ceil(32).clamp(1, 65_535) as u32,
            parts.clamp(1, 65_535) as u32,
            1,
        ),
        block: (32, 8, 1),
        shared_mem_bytes: 0,
    }
}

fn act_code(act: Activation) -> u32 {
    match act {
        Activation::Identity => 0,
        Activation::Tanh => 1,
    }
}

impl<D: Driver> CudaBackend<D> {
    fn opt_ptr(&self, op: &'static str, t: Option<&CudaTensor>) -> Result<DevicePtr> {
        t.map_or(Ok(DevicePtr::NULL), |t| self.ptr(op, t))
    }

    pub(crate) fn bias_act_fused(
        &self,
        x: &CudaTensor,
        bias: &CudaTensor,
        act: Activation,
    ) -> Result<CudaTensor> {
        const OP: &str = "bias_act";
        let validate::Rows { rows, n } = validate::bias_act(x, bias)?;
        let out = self.alloc(OP, x.shape())?;
        if out.numel() == 0 {
            return Ok(out);
        }
        let (xc, bc) = (self.dense(OP, x)?, self.dense(OP, bias)?);
        let ptrs = [self.ptr(OP, &out)?, self.ptr(OP, &xc)?, self.ptr(OP, &bc)?];
        let config = bias_act_config(rows, n, bias_act_vec4(n, ptrs));
        let args: Args = ptrs
            .into_iter()
            .map(ptr)
            .chain([u64a(rows), u64a(n), KernelArg::U32(act_code(act))])
            .collect();
        self.launch(OP, Kernel::BiasAct, config, &args)?;
        Ok(out)
    }

    /// `act(x + bias) + residual` in one launch (`zc_bias_act_add_f32`; `[rows, n]` operands,
    /// checked by the caller's validation: a Linear layer's output and its residual stream).
    pub(crate) fn bias_act_add_fused(
        &self,
        x: &CudaTensor,
        bias: &CudaTensor,
        act: Activation,
        residual: &CudaTensor,
    ) -> Result<CudaTensor> {
        const OP: &str = "linear_add";
        let validate::Rows { rows, n } = validate::bias_act(x, bias)?;
        let out = self.alloc(OP, x.shape())?;
        if out.numel() == 0 {
            return Ok(out);
        }
        let (xc, bc, rc) = (
            self.dense(OP, x)?,
            self.dense(OP, bias)?,
            self.dense(OP, residual)?,
        );
        let ptrs = [
            self.ptr(OP, &out)?,
            self.ptr(OP, &xc)?,
            self.ptr(OP, &bc)?,
            self.ptr(OP, &rc)?,
        ];
        let vec4 = bias_act_vec4(n, [ptrs[0], ptrs[1], ptrs[2]]) && ptrs[3].0.is_multiple_of(16);
        let config = bias_act_config(rows, n, vec4);
        let args: Args = ptrs
            .into_iter()
            .map(ptr)
            .chain([u64a(rows), u64a(n), KernelArg::U32(act_code(act))])
            .collect();
        self.launch(OP, Kernel::BiasActAdd, config, &args)?;
        Ok(out)
    }

    pub(crate) fn tanh_backward_fused(&self, g: &CudaTensor, y: &CudaTensor) -> Result<CudaTensor> {
        const OP: &str = "tanh_backward";
        let n = validate::tanh_backward(g, y)?;
        let out = self.alloc(OP, y.shape())?;
        if n == 0 {
            return Ok(out);
        }
        let (gc, yc) = (self.dense(OP, g)?, self.dense(OP, y)?);
        let args: Args = [
            ptr(self.ptr(OP, &out)?),
            ptr(self.ptr(OP, &gc)?),
            ptr(self.ptr(OP, &yc)?),
            u64a(n),
        ]
        .into_iter()
        .collect();
        let config = kernels::elementwise_config(n);
        self.launch(OP, Kernel::TanhBackward, config, &args)?;
        Ok(out)
    }

    pub(crate) fn add_layer_norm_fused(
        &self,
        a: &CudaTensor,
        b: &CudaTensor,
        weight: Option<&CudaTensor>,
        bias: Option<&CudaTensor>,
        eps: f32,
    ) -> Result<AddLayerNormOut<CudaStorage>> {
        const OP: &str = "add_layer_norm";
        let validate::Rows { rows, n } = validate::add_layer_norm(a, b, weight, bias, eps)?;
        let w = weight.map(|t| self.dense(OP, t)).transpose()?;
        let bb = bias.map(|t| self.dense(OP, t)).transpose()?;
        let stat_shape = validate::stat_shape(a);
        let sum = self.alloc(OP, a.shape())?;
        let out = self.alloc(OP, a.shape())?;
        let mean = self.alloc(OP, &stat_shape)?;
        let rstd = self.alloc(OP, &stat_shape)?;
        if rows > 0 {
            let (ac, bc) = (self.dense(OP, a)?, self.dense(OP, b)?);
            let args: Args = [
                ptr(self.ptr(OP, &sum)?),
                ptr(self.ptr(OP, &out)?),
                ptr(self.ptr(OP, &mean)?),
                ptr(self.ptr(OP, &rstd)?),
                ptr(self.ptr(OP, &ac)?),
                ptr(self.ptr(OP, &bc)?),
                ptr(self.opt_ptr(OP, w.as_ref())?),
                ptr(self.opt_ptr(OP, bb.as_ref())?),
                KernelArg::U32(u32::from(w.is_some())),
                KernelArg::U32(u32::from(bb.is_some())),
                u64a(rows),
                u64a(n),
                KernelArg::F32(eps),
            ]
            .into_iter()
            .collect();
            let config = kernels::rows_config(rows);
            self.launch(OP, Kernel::AddLayerNormRows, config, &args)?;
        }
        Ok(AddLayerNormOut {
            sum,
            norm: LayerNormOut { out, mean, rstd },
        })
    }

    pub(crate) fn layer_norm_backward_add_fused(
        &self,
        ln: &LayerNormBackward<'_, CudaStorage>,
        want: [bool; 2],
    ) -> Result<LayerNormGrads<CudaStorage>> {
        const OP: &str = "layer_norm_backward_add";
        let LayerNormBackward {
            g,
            residual,
            x,
            mean,
            rstd,
            weight,
        } = *ln;
        let validate::Rows { rows, n } =
            validate::layer_norm_backward_add(g, residual, x, mean, rstd, weight)?;
        let fresh = |on: bool| on.then(|| self.alloc(OP, x.shape())).transpose();
        let (input, g_xhat) = (fresh(want[0])?, fresh(want[1])?);
        if x.numel() == 0 || !(want[0] || want[1]) {
            return Ok(LayerNormGrads { input, g_xhat });
        }
        let dense = [g, x, mean, rstd]
            .into_iter()
            .map(|t| self.dense(OP, t))
            .collect::<Result<Vec<_>>>()?;
        let res = residual.map(|t| self.dense(OP, t)).transpose()?;
        let w = weight.map(|t| self.dense(OP, t)).transpose()?;
        let args: Args = [
            ptr(self.opt_ptr(OP, input.as_ref())?),
            ptr(self.opt_ptr(OP, g_xhat.as_ref())?),
            ptr(self.ptr(OP, &dense[0])?),
            ptr(self.opt_ptr(OP, res.as_ref())?),
            ptr(self.ptr(OP, &dense[1])?),
            ptr(self.ptr(OP, &dense[2])?),
            ptr(self.ptr(OP, &dense[3])?),
            ptr(self.opt_ptr(OP, w.as_ref())?),
            KernelArg::U32(u32::from(w.is_some())),
            KernelArg::U32(u32::from(res.is_some())),
            KernelArg::U32(u32::from(want[0])),
            KernelArg::U32(u32::from(want[1])),
            u64a(rows),
            u64a(n),
        ]
        .into_iter()
        .collect();
        let config = kernels::rows_config(rows);
        self.launch(OP, Kernel::LayerNormBackwardAddRows, config, &args)?;
        Ok(LayerNormGrads { input, g_xhat })
    }

    pub(crate) fn pool_head_bce_fused(
        &self,
        h: &CudaTensor,
        weight: &CudaTensor,
        bias: &CudaTensor,
        targets: &CudaTensor,
    ) -> Result<PoolHeadBceOut<CudaStorage>> {
        const OP: &str = "pool_head_bce";
        let validate::PoolDims {
            batch,
            scales,
            width,
        } = validate::pool_head_bce(h, weight, bias, targets)?;
        let operands = [h, weight, bias, targets]
            .into_iter()
            .map(|t| self.dense(OP, t))
            .collect::<Result<Vec<_>>>()?;
        let loss = self.alloc(OP, &[])?;
        let logits = self.alloc(OP, &[batch])?;
        // Each sample's BCE term, summed in a fixed order by the second launch.
        let terms = self.alloc_temp(OP, &[batch])?;
        let (loss_ptr, terms_ptr) = (self.ptr(OP, &loss)?, self.ptr(OP, &terms)?);
        let mut args: Args = [loss_ptr, terms_ptr, self.ptr(OP, &logits)?]
            .into_iter()
            .map(ptr)
            .collect();
        for t in &operands {
            args.push(ptr(self.ptr(OP, t)?));
        }
        args.extend([u64a(batch), u64a(scales), u64a(width)]);
        // A small batch runs in one block, which then takes the mean itself.
        let one_block = batch <= POOL_SMALL_BATCH;
        let blocks = if one_block { 1 } else { batch };
        if let Some(tickets) = self.tickets().filter(|_| !one_block) {
            // One launch: the last block to finish takes the mean of the terms.
            args.insert(3, ptr(tickets));
            self.launch(OP, Kernel::PoolHeadBceLast, pool_config(blocks), &args)?;
            return Ok(PoolHeadBceOut { loss, logits });
        }
        self.launch(OP, Kernel::PoolHeadBce, pool_config(blocks), &args)?;
        if !one_block {
            let args: Args = [ptr(loss_ptr), ptr(terms_ptr), u64a(batch)]
                .into_iter()
                .collect();
            self.launch(OP, Kernel::PoolHeadBceFinish, pool_config(1), &args)?;
        }
        Ok(PoolHeadBceOut { loss, logits })
    }

    pub(crate) fn pool_head_bce_backward_fused(
        &self,
        g: &CudaTensor,
        h: &CudaTensor,
        weight: &CudaTensor,
        logits: &CudaTensor,
        targets: &CudaTensor,
    ) -> Result<PoolHeadBceGrads<CudaStorage>> {
        const OP: &str = "pool_head_bce_backward";
        let validate::PoolDims { width, .. } =
            validate::pool_head_bce_backward(g, h, weight, logits, targets)?;
        // The weight's and bias's gradients as adjacent views of one buffer: a caller adding
        // them into adjacent buffers (zgrad's flat gradients) does so with one add.
        let g_params = self.alloc(OP, &[width + 1])?;
        let gw = g_params.narrow(0, 0, width)?.reshape(&[1, width])?;
        let gb = g_params.narrow(0, width, 1)?;
        let operands = [g, h, weight, logits, targets];
        let gh = self.pool_head_backward_kernels(OP, operands, [&gw, &gb], false)?;
        Ok(PoolHeadBceGrads {
            h: gh,
            weight: gw,
            bias: gb,
        })
    }

    /// The backward adding the weight's and bias's gradients into `dw` and `db` from the
    /// kernels themselves (dense buffers; strided ones take the provided composite).
    pub(crate) fn pool_head_bce_backward_into_fused(
        &self,
        g: &CudaTensor,
        h: &CudaTensor,
        weight: &CudaTensor,
        logits: &CudaTensor,
        targets: &CudaTensor,
        [dw, db]: [&CudaTensor; 2],
    ) -> Result<CudaTensor> {
        const OP: &str = "pool_head_bce_backward_into";
        validate::pool_head_bce_backward_into(g, h, weight, logits, targets, [dw, db])?;
        if !(dw.is_contiguous() && db.is_contiguous()) {
            return crate::pooled_loss::pool_head_bce_backward_into(
                self,
                g,
                h,
                weight,
                logits,
                targets,
                [dw, db],
            );
        }
        let operands = [g, h, weight, logits, targets];
        self.pool_head_backward_kernels(OP, operands, [dw, db], true)
    }

    /// The backward's launches (checked operands `[g, h, weight, logits, targets]`): `h`'s
    /// gradient returned, the weight's and bias's written into `gw` and `gb` (dense), or
    /// added into them with `accumulate`.
    fn pool_head_backward_kernels(
        &self,
        op: &'static str,
        operands: [&CudaTensor; 5],
        [gw, gb]: [&CudaTensor; 2],
        accumulate: bool,
    ) -> Result<CudaTensor> {
        let operands = operands
            .into_iter()
            .map(|t| self.dense(op, t))
            .collect::<Result<Vec<_>>>()?;
        let &[batch, scales, width] = operands[1].shape() else {
            return Err(crate::ComputeError::RankTooLow {
                op,
                min: 3,
                shape: operands[1].shape().into(),
            });
        };
        let gh = self.alloc(op, &[batch, scales, width])?;
        let config = pool_backward_config(batch, scales, width);
        // One row of weight-gradient partials per block row of the first launch; with one
        // block row, that row is gw and the kernel writes (or adds into) gb too (no second
        // launch).
        let parts = config.grid.1 as usize;
        let partials = if parts == 1 {
            gw.clone()
        } else {
            self.alloc_temp(op, &[parts, width])?
        };
        let p = |t: &CudaTensor| self.ptr(op, t).map(ptr);
        let [og, oh, ow, ologits, oy] = [0, 1, 2, 3, 4].map(|i| &operands[i]);
        let flag = |on: bool| Ok(KernelArg::U32(u32::from(on)));
        if let Some(tickets) = self.tickets().filter(|_| parts > 1) {
            // One launch: the last block to finish adds the partials into gw and sums gb.
            let args: Args = [&gh, &partials, gw, gb]
                .into_iter()
                .map(p)
                .chain([Ok(ptr(tickets))])
                .chain([og, oh, ow, ologits, oy].into_iter().map(p))
                .chain([Ok(u64a(batch)), Ok(u64a(scales)), Ok(u64a(width))])
                .chain([flag(accumulate)])
                .collect::<Result<Args>>()?;
            self.launch(op, Kernel::PoolHeadBceBackwardLast, config, &args)?;
            return Ok(gh);
        }
        let args: Args = [&gh, &partials, gb, og, oh, ow, ologits, oy]
            .into_iter()
            .map(p)
            .chain([Ok(u64a(batch)), Ok(u64a(scales)), Ok(u64a(width))])
            .chain([flag(accumulate && parts == 1)])
            .collect::<Result<Args>>()?;
        self.launch(op, Kernel::PoolHeadBceBackward, config, &args)?;
        if parts == 1 {
            return Ok(gh);
        }
        let args: Args = [gw, gb, &partials, og, ologits, oy]
            .into_iter()
            .map(p)
            .chain([Ok(u64a(batch)), Ok(u64a(parts)), Ok(u64a(width))])
            .chain([flag(accumulate)])
            .collect::<Result<Args>>()?;
        let blocks = width.div_ceil(POOL_THREADS as usize);
        self.launch(
            op,
            Kernel::PoolHeadBceBackwardFinish,
            pool_config(blocks),
            &args,
        )?;
        Ok(gh)
    }
}

/// The pooled-loss family on the device: `fused.cu`'s pooled head, forward and backward.
impl<D: Driver> PooledLossOps<f32> for CudaBackend<D> {
    fn pool_head_bce(
        &self,
        h: &CudaTensor,
        weight: &CudaTensor,
        bias: &CudaTensor,
        targets: &CudaTensor,
    ) -> Result<PoolHeadBceOut<CudaStorage>> {
        self.pool_head_bce_fused(h, weight, bias, targets)
    }

    fn pool_head_bce_backward(
        &self,
        g: &CudaTensor,
        h: &CudaTensor,
        weight: &CudaTensor,
        logits: &CudaTensor,
        targets: &CudaTensor,
    ) -> Result<PoolHeadBceGrads<CudaStorage>> {
        self.pool_head_bce_backward_fused(g, h, weight, logits, targets)
    }

    fn pool_head_bce_backward_into(
        &self,
        g: &CudaTensor,
        h: &CudaTensor,
        weight: &CudaTensor,
        logits: &CudaTensor,
        targets: &CudaTensor,
        param_grads: [&CudaTensor; 2],
    ) -> Result<CudaTensor> {
        self.pool_head_bce_backward_into_fused(g, h, weight, logits, targets, param_grads)
    }
}
