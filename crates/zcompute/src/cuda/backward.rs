//! Fused backward of the row ops: softmax's and LayerNorm's backward formulas (the composites
//! that `Backend` provides) as one row kernel each, instead of 4 and ~10 elementwise launches
//! with broadcast operands. One warp per row of the dense `[rows, n]` form, as the forward.

use super::kernels::{self, Args, Kernel, ptr, u64a};
use super::{CudaBackend, CudaStorage, CudaTensor};
use crate::backend::LayerNormGrads;
use crate::error::Result;
use crate::validate;
use zdevice::{DevicePtr, Driver, KernelArg};

impl<D: Driver> CudaBackend<D> {
    pub(crate) fn softmax_backward_rows(
        &self,
        g: &CudaTensor,
        y: &CudaTensor,
    ) -> Result<CudaTensor> {
        const OP: &str = "softmax_backward";
        let validate::Rows { rows, n } = validate::softmax_backward(g, y)?;
        let out = self.alloc(OP, y.shape())?;
        if out.numel() == 0 {
            return Ok(out);
        }
        let (gc, yc) = (self.dense(OP, g)?, self.dense(OP, y)?);
        let args: Args = [
            ptr(self.ptr(OP, &out)?),
            ptr(self.ptr(OP, &gc)?),
            ptr(self.ptr(OP, &yc)?),
            u64a(rows),
            u64a(n),
        ]
        .into_iter()
        .collect();
        self.launch(
            OP,
            Kernel::SoftmaxBackwardRows,
            kernels::rows_config(rows),
            &args,
        )?;
        Ok(out)
    }

    pub(crate) fn layer_norm_backward_rows(
        &self,
        g: &CudaTensor,
        x: &CudaTensor,
        mean: &CudaTensor,
        rstd: &CudaTensor,
        weight: Option<&CudaTensor>,
        want: [bool; 2],
    ) -> Result<LayerNormGrads<CudaStorage>> {
        const OP: &str = "layer_norm_backward";
        let validate::Rows { rows, n } = validate::layer_norm_backward(g, x, mean, rstd, weight)?;
        let fresh = |on: bool| on.then(|| self.alloc(OP, x.shape())).transpose();
        let (input, g_xhat) = (fresh(want[0])?, fresh(want[1])?);
        if x.numel() == 0 || !(want[0] || want[1]) {
            return Ok(LayerNormGrads { input, g_xhat });
        }
        let dense = [g, x, mean, rstd]
            .into_iter()
            .map(|t| self.dense(OP, t))
            .collect::<Result<Vec<_>>>()?;
        let w = weight.map(|w| self.dense(OP, w)).transpose()?;
        let opt_ptr = |t: &Option<CudaTensor>| -> Result<DevicePtr> {
            t.as_ref().map_or(Ok(DevicePtr::NULL), |t| self.ptr(OP, t))
        };
        let mut args: Args = [ptr(opt_ptr(&input)?), ptr(opt_ptr(&g_xhat)?)]
            .into_iter()
            .collect();
        for t in &dense {
            args.push(ptr(self.ptr(OP, t)?));
        }
        args.extend([
            ptr(opt_ptr(&w)?),
            KernelArg::U32(u32::from(w.is_some())),
            KernelArg::U32(u32::from(want[0])),
            KernelArg::U32(u32::from(want[1])),
            u64a(rows),
            u64a(n),
        ]);
        self.launch(
            OP,
            Kernel::LayerNormBackwardRows,
            kernels::rows_config(rows),
            &args,
        )?;
        Ok(LayerNormGrads { input, g_xhat })
    }
}
