//! The selection and random families on the device (`kernels/select.cu`): one launch each over
//! dense operands (a broadcast or strided operand is made dense first); the row gather is
//! `indexed.rs`'s one launch (`kernels/indexed.cu`). `concat` and `embedding` keep their
//! provided composites (strided copies; the one-launch row gather).

use super::kernels::{self, Args, Kernel, ptr, u64a};
use super::{CudaBackend, CudaTensor};
use crate::error::Result;
use crate::random::{RandomOps, dropout_threshold};
use crate::select::SelectOps;
use crate::validate;
use zdevice::{Driver, KernelArg};

impl<D: Driver> SelectOps<f32> for CudaBackend<D> {
    fn gather_rows(&self, src: &CudaTensor, index: &CudaTensor, dst: &CudaTensor) -> Result<()> {
        self.gather_rows_at(src, index, dst)
    }

    fn select(&self, cond: &CudaTensor, a: &CudaTensor, b: &CudaTensor) -> Result<CudaTensor> {
        const OP: &str = "select";
        let shape = validate::select(cond, a, b)?;
        let out = self.alloc(OP, &shape)?;
        let n = out.numel();
        if n == 0 {
            return Ok(out);
        }
        let dense = |t: &CudaTensor| self.dense(OP, &t.broadcast_to(&shape)?);
        let (c, a, b) = (dense(cond)?, dense(a)?, dense(b)?);
        let args: Args = [
            ptr(self.ptr(OP, &out)?),
            ptr(self.ptr(OP, &c)?),
            ptr(self.ptr(OP, &a)?),
            ptr(self.ptr(OP, &b)?),
            u64a(n),
        ]
        .into_iter()
        .collect();
        self.launch(OP, Kernel::Select, kernels::elementwise_config(n), &args)?;
        Ok(out)
    }

    fn argmax(&self, x: &CudaTensor) -> Result<CudaTensor> {
        const OP: &str = "argmax";
        let (rows, shape) = validate::argmax(x)?;
        let out = self.alloc(OP, &shape)?;
        if rows.rows == 0 {
            return Ok(out);
        }
        let x = self.dense(OP, x)?;
        let args: Args = [
            ptr(self.ptr(OP, &out)?),
            ptr(self.ptr(OP, &x)?),
            u64a(rows.rows),
            u64a(rows.n),
        ]
        .into_iter()
        .collect();
        self.launch(
            OP,
            Kernel::ArgmaxRows,
            kernels::elementwise_config(rows.rows),
            &args,
        )?;
        Ok(out)
    }

    fn index_add_rows(&self, src: &CudaTensor, index: &CudaTensor, dst: &CudaTensor) -> Result<()> {
        const OP: &str = "index_add_rows";
        let (table, n) = validate::index_add_rows(src, index, dst)?;
        let total = table.rows.saturating_mul(table.row_len);
        if total == 0 || n == 0 {
            return Ok(());
        }
        let args: Args = [
            ptr(self.ptr(OP, dst)?),
            ptr(self.ptr(OP, src)?),
            ptr(self.ptr(OP, index)?),
            u64a(table.rows),
            u64a(table.row_len),
            u64a(n),
        ]
        .into_iter()
        .collect();
        self.launch(
            OP,
            Kernel::IndexAddRows,
            kernels::elementwise_config(total),
            &args,
        )
    }
}

impl<D: Driver> RandomOps<f32> for CudaBackend<D> {
    fn dropout_mask(
        &self,
        shape: &[usize],
        p: f64,
        seed: u64,
        stream: u32,
        step: &CudaTensor,
    ) -> Result<CudaTensor> {
        const OP: &str = "dropout_mask";
        let n = validate::dropout_mask(shape, p, step)?;
        let out = self.alloc(OP, shape)?;
        if n == 0 {
            return Ok(out);
        }
        let args: Args = [
            ptr(self.ptr(OP, &out)?),
            ptr(self.ptr(OP, step)?),
            u64a(n),
            KernelArg::U32(seed as u32),
            KernelArg::U32((seed >> 32) as u32),
            KernelArg::U32(stream),
            KernelArg::U32(dropout_threshold(p)),
            KernelArg::F32((1.0 / (1.0 - p)) as f32),
        ]
        .into_iter()
        .collect();
        self.launch(
            OP,
            Kernel::DropoutMask,
            kernels::elementwise_config(n),
            &args,
        )?;
        Ok(out)
    }
}
