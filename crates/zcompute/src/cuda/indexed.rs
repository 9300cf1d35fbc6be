//! Row ops indexed from device memory (`Backend::gather_row`, `SelectOps::gather_rows`,
//! `StepOps::gather_rows_at_cursor`, `Backend::scatter_row`): one kernel each (`kernels/indexed.cu`) that reads the index when it runs, so a captured graph
//! walks a device-resident table on its replays with no host work. The operands are dense
//! (checked by `validate::indexed_row`), so the kernels take plain pointers.

use super::kernels::{self, Args, Kernel, ptr, u64a};
use super::{CudaBackend, CudaTensor};
use crate::error::Result;
use crate::validate;
use zdevice::{DevicePtr, Driver, KernelArg};

impl<D: Driver> CudaBackend<D> {
    pub(crate) fn gather_row_at(
        &self,
        src: &CudaTensor,
        index: &CudaTensor,
        dst: &CudaTensor,
    ) -> Result<()> {
        const OP: &str = "gather_row";
        let table = validate::indexed_row(OP, src, dst, index)?;
        if table.row_len == 0 {
            return Ok(());
        }
        let args: Args = [
            ptr(self.ptr(OP, dst)?),
            ptr(self.ptr(OP, src)?),
            ptr(self.ptr(OP, index)?),
            u64a(table.rows),
            u64a(table.row_len),
        ]
        .into_iter()
        .collect();
        let config = kernels::elementwise_config(table.row_len);
        self.launch(OP, Kernel::GatherRow, config, &args)
    }

    pub(crate) fn gather_rows_at(
        &self,
        src: &CudaTensor,
        index: &CudaTensor,
        dst: &CudaTensor,
    ) -> Result<()> {
        const OP: &str = "gather_rows";
        let (table, n) = validate::indexed_rows(OP, src, dst, index)?;
        let total = n.saturating_mul(table.row_len);
        if total == 0 {
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
        let config = kernels::elementwise_config(total);
        self.launch(OP, Kernel::GatherRows, config, &args)
    }

    pub(crate) fn gather_rows_at_cursor_fused(
        &self,
        src: &CudaTensor,
        steps: &CudaTensor,
        cursor: &CudaTensor,
        dst: &CudaTensor,
        tail: Option<&CudaTensor>,
    ) -> Result<()> {
        const OP: &str = "gather_rows_at_cursor";
        let at = validate::indexed_rows_at_cursor(src, steps, cursor, dst, tail)?;
        let total = at.n.saturating_mul(at.src.row_len);
        if total == 0 && at.tail == 0 {
            return Ok(());
        }
        let tail_ptr = match tail {
            Some(t) => self.ptr(OP, t)?,
            None => DevicePtr::NULL,
        };
        let args: Args = [
            ptr(self.ptr(OP, dst)?),
            ptr(self.ptr(OP, src)?),
            ptr(self.ptr(OP, steps)?),
            ptr(self.ptr(OP, cursor)?),
            ptr(tail_ptr),
            u64a(at.src.rows),
            u64a(at.src.row_len),
            u64a(at.n),
            u64a(at.steps.rows),
            u64a(at.steps.row_len),
            u64a(at.tail),
        ]
        .into_iter()
        .collect();
        // At least one block: the tail is written by the first.
        let config = kernels::elementwise_config(total.max(at.tail).max(1));
        self.launch(OP, Kernel::GatherRowsAt, config, &args)
    }

    pub(crate) fn scatter_row_at(
        &self,
        src: &CudaTensor,
        index: &CudaTensor,
        dst: &CudaTensor,
        advance: bool,
    ) -> Result<()> {
        const OP: &str = "scatter_row";
        let table = validate::indexed_row(OP, dst, src, index)?;
        if table.row_len == 0 && !advance {
            return Ok(());
        }
        let args: Args = [
            ptr(self.ptr(OP, dst)?),
            ptr(self.ptr(OP, src)?),
            ptr(self.ptr(OP, index)?),
            u64a(table.rows),
            u64a(table.row_len),
            KernelArg::U32(u32::from(advance)),
        ]
        .into_iter()
        .collect();
        // One block: the kernel moves the index only after every thread has written.
        self.launch(OP, Kernel::ScatterRow, kernels::single_block(), &args)
    }
}
