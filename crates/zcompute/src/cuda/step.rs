//! The training-step family on the device: each op in one launch, the row gather at a cursor
//! (`indexed.rs`, `kernels/indexed.cu`), a binary op into a view (`ops.rs`'s dense binary
//! kernel writing the destination), the step's tail (`flat.rs`, `kernels/flat.cu`).

use super::{CudaBackend, CudaTensor};
use crate::backend::{Backend, BinaryOp};
use crate::error::Result;
use crate::step::StepOps;
use crate::validate::{self, binary_name};
use zdevice::Driver;

impl<D: Driver> StepOps<f32> for CudaBackend<D> {
    fn gather_rows_at_cursor(
        &self,
        src: &CudaTensor,
        steps: &CudaTensor,
        cursor: &CudaTensor,
        dst: &CudaTensor,
        tail: Option<&CudaTensor>,
    ) -> Result<()> {
        self.gather_rows_at_cursor_fused(src, steps, cursor, dst, tail)
    }

    fn step_tail(
        &self,
        loss_norm: [&CudaTensor; 2],
        stats: &CudaTensor,
        gate: &CudaTensor,
        sticky: Option<&CudaTensor>,
        history: Option<(&CudaTensor, &CudaTensor)>,
    ) -> Result<()> {
        self.step_tail_fused(loss_norm, stats, gate, sticky, history)
    }

    fn binary_into(
        &self,
        op: BinaryOp,
        a: &CudaTensor,
        b: &CudaTensor,
        dst: &CudaTensor,
    ) -> Result<()> {
        validate::binary_into(op, a, b, dst)?;
        if !dst.is_contiguous() {
            let out = self.binary(op, a, b)?;
            return self.copy_into(&out, dst);
        }
        self.binary_to(binary_name(op), op, a, b, dst)
    }
}
