//! A Linear layer's backward as one launch for few rows (`kernels/linear_backward.cu`):
//! tanh's backward, the input's gradient `gz · w` and the parameter gradients
//! `dw += gzᵀ · x`, `db += Σ_rows gz`, which the composite runs as up to three dependent
//! launches (`tanh_backward`, the n-contiguous small-row product, `zc_linear_param_grads_f32`).
//! The two halves are independent, so one grid holds both: the product's blocks first, then
//! the parameter-gradient blocks, each computing what its kernel of the composite computes in
//! the same order. Anything the fused kernel does not take (more rows than
//! [`LINEAR_ROW_LIMIT`], a weight read other than n-contiguous, a `dw` whose last axis is not
//! dense, too many blocks) runs the composite. Traced at `zcompute.cuda.linear`.

use super::kernels::{Args, Kernel, ptr, u64a};
use super::linear::{
    LINEAR_ROW_LIMIT, MAX_GRID, NMAJOR_COLS, NMAJOR_SLICES, StridedRead, bf16_grads_refused,
    linear_grads_bf16_vec4, linear_grads_vec4, op_strides, rows_plan,
};
use super::{CudaBackend, CudaStorage, CudaTensor};
use crate::error::Result;
use crate::linear::Activation;
use crate::precision::Bf16Copy;
use crate::validate::{self, LinearShape};
use zdevice::{DevicePtr, Driver, KernelArg, LaunchConfig};

/// Threads of every block of the fused launch (the n-contiguous product's block).
pub(crate) const BACKWARD_THREADS: u32 = NMAJOR_COLS * NMAJOR_SLICES;
/// The parameter-gradient blocks' threads along the inputs (`BACKWARD_GRADS_X`); the rest of
/// the block lies along the outputs.
pub(crate) const BACKWARD_GRADS_X: u32 = 64;
const _: () = assert!(BACKWARD_THREADS.is_multiple_of(BACKWARD_GRADS_X));

/// How the fused launch's grid splits: `dx_blocks` product blocks, then `grads_cols` x
/// `grads_rows` parameter-gradient blocks (column-major in the launch: block
/// `dx_blocks + p` is column `p % grads_cols`, row `p / grads_cols`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BackwardGrid {
    pub dx_blocks: u64,
    pub grads_cols: u64,
    pub grads_rows: u64,
}

impl BackwardGrid {
    /// The grid for `outputs` x `cols` parameter-gradient columns (`cols`: inputs, or inputs / 4
    /// on the float4 path) after `dx_blocks` product blocks.
    pub(crate) fn new(dx_blocks: u64, cols: u64, outputs: u64) -> Self {
        let per_block_rows = u64::from(BACKWARD_THREADS / BACKWARD_GRADS_X);
        BackwardGrid {
            dx_blocks,
            grads_cols: cols.div_ceil(u64::from(BACKWARD_GRADS_X)),
            grads_rows: outputs.div_ceil(per_block_rows),
        }
    }

    pub(crate) fn blocks(&self) -> u64 {
        self.dx_blocks + self.grads_cols * self.grads_rows
    }
}

impl<D: Driver> CudaBackend<D> {
    /// The provided composite of `linear_backward_into` (validated already), with tanh's
    /// backward and the bias gradient's column sums in one launch where that kernel applies
    /// (`tanh_backward_sum_into`: the same bits, a launch and a read of `gz` fewer).
    fn linear_backward_composite(
        &self,
        gy: &CudaTensor,
        x: &CudaTensor,
        w: Option<&CudaTensor>,
        (act, y): (Activation, Option<&CudaTensor>),
        (dw, db): (&CudaTensor, Option<&CudaTensor>),
    ) -> Result<Option<CudaTensor>> {
        let fused = match (y, db) {
            (Some(y), Some(db)) => self.tanh_backward_sum_into(gy, y, db)?,
            _ => None,
        };
        let Some(gz) = fused else {
            return crate::linear::linear_backward_into(self, gy, x, w, (act, y), (dw, db));
        };
        // The bias gradient is summed already.
        crate::linear::linear_backward_from_gz(self, &gz, x, w, dw, None)
    }

    /// `LinearOps::linear_backward_into`: one launch for few rows, else the provided composite.
    pub(crate) fn linear_backward_fused(
        &self,
        gy: &CudaTensor,
        x: &CudaTensor,
        w: Option<&CudaTensor>,
        (act, y): (Activation, Option<&CudaTensor>),
        (dw, db): (&CudaTensor, Option<&CudaTensor>),
    ) -> Result<Option<CudaTensor>> {
        const OP: &str = "linear_backward_into";
        let shape = validate::linear_backward_into(gy, x, w, (act, y), dw, db)?;
        let composite = |why: &'static str| {
            tracing::trace!(target: "zcompute.cuda.linear", op = OP, ?shape, why, "composite");
            self.linear_backward_composite(gy, x, w, (act, y), (dw, db))
        };
        if let Err(why) = small_rows(shape) {
            return composite(why);
        }
        let (ldw, dw_cs) = op_strides(dw, false);
        if dw_cs != 1 && shape.inputs != 1 {
            return composite("dw's last axis is not dense");
        }
        let x_read = (self.ptr(OP, x)?, op_strides(x, false));
        let w_read = match w {
            Some(w) => Some((self.ptr(OP, w)?, op_strides(w, false))),
            None => None,
        };
        let vec4 = linear_grads_vec4(
            shape.inputs,
            ldw as u64,
            x_read.1.0 as u64,
            x_read.1.1 as u64,
            [self.ptr(OP, dw)?, x_read.0],
        );
        let launch = FusedBackward {
            op: OP,
            kernel: Kernel::LinearBackward,
            shape,
            x: x_read,
            w: w_read,
            vec4,
            packed: None,
        };
        match self.launch_backward(&launch, gy, y, (dw, db))? {
            Ok(gx) => Ok(gx),
            Err(why) => composite(why),
        }
    }

    /// `PrecisionOps::linear_backward_into_bf16`: one launch of `zc_linear_backward_bf16` on
    /// the copies where its composite's kernels are the small-row ones it fuses (few rows,
    /// more outputs than the row kernels take, so dw and db are the bf16 parameter-gradient
    /// kernel's; a dense dw; the input's gradient n-contiguous), else `None` (nothing queued,
    /// the input validated).
    pub(crate) fn linear_backward_bf16_fused(
        &self,
        gy: &CudaTensor,
        x: &Bf16Copy<CudaStorage>,
        w: Option<&Bf16Copy<CudaStorage>>,
        (act, y): (Activation, Option<&CudaTensor>),
        (dw, db): (&CudaTensor, Option<&CudaTensor>),
    ) -> Result<Option<Option<CudaTensor>>> {
        const OP: &str = "linear_backward_into_bf16";
        let sw = w.map(|w| w.shape_stand_in(OP)).transpose()?;
        let sx = x.shape_stand_in(OP)?;
        let shape = validate::linear_backward_into(gy, &sx, sw.as_ref(), (act, y), dw, db)?;
        // The composite's dw and db must be the bf16 parameter-gradient kernel's, whose sums
        // this launch repeats.
        if let Some(why) = bf16_grads_refused(shape, dw) {
            tracing::trace!(target: "zcompute.cuda.linear", op = OP, ?shape, why, "composite");
            return Ok(None);
        }
        // A copy is one dense row-major matrix (`copy_operand`).
        let x_read = (self.ptr(OP, x.backing())?, (shape.inputs.max(1), 1));
        let w_read = match w {
            Some(w) => Some((self.ptr(OP, w.backing())?, (shape.inputs.max(1), 1))),
            None => None,
        };
        let vec4 = linear_grads_bf16_vec4(
            shape.inputs,
            shape.inputs as u64,
            (x_read.1.0 as u64, 1),
            (self.ptr(OP, dw)?, x_read.0),
            true,
        );
        let launch = FusedBackward {
            op: OP,
            kernel: Kernel::LinearBackwardBf16,
            shape,
            x: x_read,
            w: w_read,
            vec4,
            packed: Some(3),
        };
        match self.launch_backward(&launch, gy, y, (dw, db))? {
            Ok(gx) => Ok(Some(gx)),
            Err(why) => {
                tracing::trace!(target: "zcompute.cuda.linear", op = OP, ?shape, why, "composite");
                Ok(None)
            }
        }
    }

    /// Queues `l`'s launch and returns the input's gradient, or (`Err`, nothing queued) why
    /// the kernel does not take it: the weight not read n-contiguous, too many blocks.
    fn launch_backward(
        &self,
        l: &FusedBackward,
        gy: &CudaTensor,
        y: Option<&CudaTensor>,
        (dw, db): (&CudaTensor, Option<&CudaTensor>),
    ) -> Result<std::result::Result<Option<CudaTensor>, &'static str>> {
        let op = l.op;
        let LinearShape {
            rows,
            inputs,
            outputs,
        } = l.shape;
        let (gy_rs, gy_cs) = op_strides(gy, false);
        // The input's gradient gz [rows, outputs] · w [outputs, inputs], read as stored.
        let dx = match l.w {
            None => None,
            Some((w, strides)) => match rows_plan(rows, outputs, inputs, (gy_rs, gy_cs), strides) {
                Some(plan) if plan.kernel == Kernel::LinearRowsNMajor => Some((w, plan)),
                _ => return Ok(Err("w is not read n-contiguous")),
            },
        };
        let cols = if l.vec4 { inputs / 4 } else { inputs } as u64;
        let dx_blocks = dx.map_or(0, |(_, plan)| u64::from(plan.config.grid.0));
        let grid = BackwardGrid::new(dx_blocks, cols, outputs as u64);
        if grid.blocks() > MAX_GRID {
            return Ok(Err("too many blocks"));
        }
        tracing::trace!(
            target: "zcompute.cuda.linear",
            op, rows, inputs, outputs, tanh = y.is_some(), dx_blocks, blocks = grid.blocks(),
            vec4 = l.vec4, kernel = l.kernel.spec().name, "one launch"
        );
        let gx = dx.map(|_| self.alloc(op, &[rows, inputs])).transpose()?;
        let opt_ptr = |t: Option<&CudaTensor>| t.map_or(Ok(DevicePtr::NULL), |t| self.ptr(op, t));
        let (y_rs, y_cs) = y.map_or((0, 0), |y| op_strides(y, false));
        let (ldw, _) = op_strides(dw, false);
        let db_stride = db.map_or(0, |t| t.layout().strides()[0]);
        let (x, (x_rs, x_cs)) = l.x;
        let mut args: Args = [
            ptr(opt_ptr(gx.as_ref())?),
            ptr(self.ptr(op, dw)?),
            ptr(opt_ptr(db)?),
            ptr(self.ptr(op, gy)?),
            ptr(opt_ptr(y)?),
            ptr(dx.map_or(DevicePtr::NULL, |(w, _)| w)),
            ptr(x),
            KernelArg::U32(rows as u32),
            u64a(outputs),
            u64a(inputs),
            u64a(gy_rs),
            u64a(gy_cs),
            u64a(y_rs),
            u64a(y_cs),
            KernelArg::U64(dx.map_or(0, |(_, plan)| plan.ldb)),
            u64a(x_rs),
            u64a(x_cs),
            u64a(ldw),
            u64a(db_stride),
            KernelArg::U32(u32::from(db.is_some())),
            KernelArg::U32(u32::from(y.is_some())),
            KernelArg::U32(grid.dx_blocks as u32),
            KernelArg::U32(grid.grads_cols as u32),
        ]
        .into_iter()
        .collect();
        if let Some(packed) = l.packed {
            args.push(KernelArg::U32(packed));
        }
        let config = LaunchConfig {
            grid: (grid.blocks() as u32, 1, 1),
            block: (BACKWARD_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        self.launch(op, l.kernel, config, &args)?;
        Ok(Ok(gx))
    }
}

/// One fused backward launch's own inputs ([`CudaBackend::launch_backward`]): x and w as the
/// kernel reads them (first element, row and column strides), whether the parameter
/// gradients take the float4 path (the kernel makes the same test), and the bf16 form's
/// `packed`.
struct FusedBackward {
    op: &'static str,
    kernel: Kernel,
    shape: LinearShape,
    x: StridedRead,
    w: Option<StridedRead>,
    vec4: bool,
    packed: Option<u32>,
}

/// Why the fused kernels do not take `shape` (more rows than they hold, an empty axis).
fn small_rows(shape: LinearShape) -> std::result::Result<(), &'static str> {
    if (1..=LINEAR_ROW_LIMIT).contains(&shape.rows) && shape.inputs > 0 && shape.outputs > 0 {
        Ok(())
    } else {
        Err("sizes outside the small-row kernel")
    }
}
