//! The optimiser family on the device: SGD with momentum in one launch of `zc_sgd_f32`
//! (`kernels/train.cu`) over dense operands (views go through dense temporaries copied back,
//! as AdamW's).

use super::kernels::{self, Args, Kernel, ptr, u64a};
use super::{CudaBackend, CudaTensor};
use crate::error::Result;
use crate::optim::{OptimOps, SgdConfig};
use crate::validate;
use zdevice::{Driver, KernelArg};

impl<D: Driver> OptimOps<f32> for CudaBackend<D> {
    fn sgd_step(
        &self,
        p: &CudaTensor,
        buf: Option<&CudaTensor>,
        g: &CudaTensor,
        slot: &CudaTensor,
        cfg: &SgdConfig<f32>,
    ) -> Result<()> {
        const OP: &str = "sgd";
        validate::sgd(p, buf, g, slot, cfg)?;
        let n = p.numel();
        if n == 0 {
            return Ok(());
        }
        tracing::trace!(target: "zcompute.cuda.sgd", numel = n, "sgd");
        // Without momentum the kernel reads no buffer: `p` stands in for its pointer.
        let buf = buf.filter(|_| cfg.momentum != 0.0);
        let state: Vec<(CudaTensor, &CudaTensor)> = std::iter::once(p)
            .chain(buf)
            .map(|t| Ok((self.dense(OP, t)?, t)))
            .collect::<Result<_>>()?;
        let (gc, sc) = (self.dense(OP, g)?, self.dense(OP, slot)?);
        let buf_ptr = self.ptr(OP, &state.last().unwrap_or(&state[0]).0)?;
        let args: Args = [
            ptr(self.ptr(OP, &state[0].0)?),
            ptr(buf_ptr),
            ptr(self.ptr(OP, &gc)?),
            ptr(self.ptr(OP, &sc)?),
            u64a(n),
            KernelArg::F32(cfg.momentum),
            KernelArg::F32(cfg.dampening),
            KernelArg::F32(cfg.weight_decay),
            KernelArg::U32(u32::from(cfg.nesterov)),
            u64a(slot.numel()),
        ]
        .into_iter()
        .collect();
        self.launch(OP, Kernel::Sgd, kernels::elementwise_config(n), &args)?;
        for (dense, orig) in &state {
            if !orig.is_contiguous() {
                self.copy_view(OP, dense, orig)?;
            }
        }
        Ok(())
    }
}
