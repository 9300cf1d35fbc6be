//! Column sums added into a parameter's gradient buffer in place (`sum_rows_into`): the
//! column-reduction kernel's last pass adds its result into the buffer, so a bias or LayerNorm
//! parameter's gradient takes no separate `add_into` launch; tanh's backward can add its
//! result's column sums into a Linear layer's bias gradient in the same launch. Same summation order as the
//! reduction (no atomics): the same bits on every run.

use super::kernels::{self, Args, Kernel, ptr, u64a};
use super::rows::ColumnReduction;
use super::{CudaBackend, CudaTensor};
use crate::backend::ReduceOp;
use crate::error::Result;
use crate::validate;
use zdevice::{Driver, KernelArg};

const OP: &str = "sum_rows_into";

impl<D: Driver> CudaBackend<D> {
    /// `dst[n] += x[..., n]` summed over the rows: one column reduction into a dense `dst`
    /// (the sum and `add_into` into a strided one).
    pub(crate) fn sum_rows_into_cols(&self, x: &CudaTensor, dst: &CudaTensor) -> Result<()> {
        let validate::Rows { rows, n } = validate::sum_rows_into(x, dst)?;
        if n == 0 || rows == 0 {
            return Ok(());
        }
        let src = self.dense(OP, x)?;
        if dst.is_contiguous() {
            return self.reduce_cols(ColumnReduction {
                name: OP,
                op: ReduceOp::Sum,
                out: dst,
                src: &src,
                shape: (1, rows, n),
                count: rows,
                accumulate: true,
            });
        }
        let sum = self.alloc(OP, &[n])?;
        self.reduce_cols(ColumnReduction {
            name: OP,
            op: ReduceOp::Sum,
            out: &sum,
            src: &src,
            shape: (1, rows, n),
            count: rows,
            accumulate: false,
        })?;
        self.add_into_fused(&sum, dst)
    }
}

impl<D: Driver> CudaBackend<D> {
    /// Tanh's backward `g * (1 - y²)` over `[rows, n]`, returned, with its column sums added
    /// into the dense bias gradient `db` (`[n]`) in the same launch
    /// (`zc_tanh_backward_cols_f32`): the bits of `tanh_backward` then `sum_rows_into`, with one
    /// launch and one read of the result fewer. `None` (nothing run) where that kernel does not
    /// apply: other layouts, or a column sum that is not one launch of several chunks.
    pub(crate) fn tanh_backward_sum_into(
        &self,
        g: &CudaTensor,
        y: &CudaTensor,
        db: &CudaTensor,
    ) -> Result<Option<CudaTensor>> {
        const OP: &str = "tanh_backward_sum_into";
        let &[rows, n] = y.shape() else {
            return Ok(None);
        };
        let Some(tickets) = self.tickets() else {
            return Ok(None);
        };
        let (chunk, chunks) = kernels::cols_chunking(1, rows, n);
        let fits = g.shape() == y.shape()
            && db.shape() == [n]
            && db.is_contiguous()
            && (2..=kernels::COLS_FINISH_MAX_ROWS as u64).contains(&chunks)
            && n.div_ceil(32) <= kernels::TICKETS;
        if !fits {
            return Ok(None);
        }
        validate::tanh_backward(g, y)?;
        let (gc, yc) = (self.dense(OP, g)?, self.dense(OP, y)?);
        let gx = self.alloc(OP, y.shape())?;
        let partials = self.alloc_temp(OP, &[chunks as usize, n])?;
        let args: Args = [
            ptr(self.ptr(OP, &gx)?),
            ptr(self.ptr(OP, &partials)?),
            ptr(self.ptr(OP, db)?),
            ptr(tickets),
            ptr(self.ptr(OP, &gc)?),
            ptr(self.ptr(OP, &yc)?),
            u64a(rows),
            u64a(n),
            KernelArg::U64(chunk),
        ]
        .into_iter()
        .collect();
        let config = kernels::cols_config(1, n, chunks);
        self.launch(OP, Kernel::TanhBackwardCols, config, &args)?;
        Ok(Some(gx))
    }
}
