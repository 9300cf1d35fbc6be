//! Column sums added into a parameter's gradient buffer in place (`sum_rows_into`): the
//! column-reduction kernel's last pass adds its result into the buffer, so a bias or LayerNorm
//! parameter's gradient takes no separate `add_into` launch. Same summation order as the
//! reduction (no atomics): the same bits on every run.

use super::{CudaBackend, CudaTensor};
use crate::backend::ReduceOp;
use crate::error::Result;
use crate::validate;
use zdevice::Driver;

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
            return self.reduce_cols(OP, ReduceOp::Sum, dst, &src, (1, rows, n), rows, true);
        }
        let sum = self.alloc(OP, &[n])?;
        self.reduce_cols(OP, ReduceOp::Sum, &sum, &src, (1, rows, n), rows, false)?;
        self.add_into_fused(&sum, dst)
    }
}
