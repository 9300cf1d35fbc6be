//! The ops over flat buffers as fused kernels (`flat.cu`): the Euclidean norm in one launch
//! (per-block partial sums of squares over a grid fixed by the size, then the last block to
//! finish summing them in a fixed order: deterministic, an atomic only for the ticket that
//! picks the last block), clipping by a norm read from memory in
//! one launch, and AdamW's finiteness gate in one launch. A model's whole gradient lives in one
//! buffer, so the global gradient norm and clipping cost one launch each whatever the
//! parameter count.

use super::kernels::{self, Args, Kernel, ptr, u64a};
use super::{CudaBackend, CudaTensor};
use crate::backend::{Backend, BinaryOp};
use crate::error::Result;
use crate::validate;
use zdevice::{DevicePtr, Driver, KernelArg, LaunchConfig};

/// Threads per block of the norm passes (`FLAT_THREADS` in flat.cu: its shared-memory tree is
/// that wide).
pub(crate) const FLAT_THREADS: u32 = 256;
/// Elements each thread of the first norm pass reads at least (so a block's partial is worth
/// the second pass reading it).
const NORM_PER_THREAD: u64 = 8;
/// Most partial sums of the first norm pass (about 8 resident 256-thread blocks on each of an
/// H100/H200's 132 SMs); the second pass's one block reads them all.
pub(crate) const NORM_MAX_PARTS: u64 = 1024;

/// One warp: the launch of the kernels whose single thread does the work (the gate, the step's
/// tail).
const ONE_WARP: LaunchConfig = LaunchConfig {
    grid: (1, 1, 1),
    block: (32, 1, 1),
    shared_mem_bytes: 0,
};

/// Blocks of the first norm pass over `n` elements: a function of `n` only, so the summation
/// order, and the result's bits, are the same every run.
pub(crate) fn norm_parts(n: u64) -> u64 {
    n.div_ceil(u64::from(FLAT_THREADS) * NORM_PER_THREAD)
        .clamp(1, NORM_MAX_PARTS)
}

impl<D: Driver> CudaBackend<D> {
    pub(crate) fn norm2_fused(&self, x: &CudaTensor) -> Result<CudaTensor> {
        const OP: &str = "norm2";
        let out = self.alloc(OP, &[])?;
        let n = x.numel() as u64;
        if n == 0 {
            self.fill(&out, 0.0)?;
            return Ok(out);
        }
        let xc = self.dense(OP, x)?;
        let parts = norm_parts(n);
        let partial = self.alloc_temp(OP, &[parts as usize])?;
        let grid = LaunchConfig {
            grid: (parts as u32, 1, 1),
            block: (FLAT_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        if let Some(tickets) = self.tickets() {
            // Both passes in one launch: the last block adds the partials.
            let args: Args = [
                ptr(self.ptr(OP, &out)?),
                ptr(self.ptr(OP, &partial)?),
                ptr(tickets),
                ptr(self.ptr(OP, &xc)?),
                u64a(n as usize),
            ]
            .into_iter()
            .collect();
            self.launch(OP, Kernel::SumSquaresNorm, grid, &args)?;
            return Ok(out);
        }
        let first: Args = [
            ptr(self.ptr(OP, &partial)?),
            ptr(self.ptr(OP, &xc)?),
            u64a(n as usize),
        ]
        .into_iter()
        .collect();
        self.launch(OP, Kernel::SumSquaresPartial, grid, &first)?;
        let second: Args = [
            ptr(self.ptr(OP, &out)?),
            ptr(self.ptr(OP, &partial)?),
            u64a(parts as usize),
        ]
        .into_iter()
        .collect();
        let one_block = LaunchConfig {
            grid: (1, 1, 1),
            block: (FLAT_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        self.launch(OP, Kernel::NormFinish, one_block, &second)?;
        Ok(out)
    }

    pub(crate) fn clip_scale_fused(
        &self,
        x: &CudaTensor,
        norm: &CudaTensor,
        max_norm: f32,
    ) -> Result<()> {
        const OP: &str = "clip_scale";
        validate::clip_scale(x, norm, max_norm)?;
        let n = x.numel();
        if n == 0 {
            return Ok(());
        }
        // The kernel scales dense memory in place; a view goes through a dense copy written back.
        let xc = self.dense(OP, x)?;
        let args: Args = [
            ptr(self.ptr(OP, &xc)?),
            ptr(self.ptr(OP, norm)?),
            KernelArg::F32(max_norm),
            u64a(n),
        ]
        .into_iter()
        .collect();
        self.launch(OP, Kernel::ClipScale, kernels::elementwise_config(n), &args)?;
        if !x.is_contiguous() {
            self.copy_view(OP, &xc, x)?;
        }
        Ok(())
    }

    /// `StepOps::step_tail` in one launch when the stats and the history are dense (a view
    /// the kernel cannot address takes the composite).
    pub(crate) fn step_tail_fused(
        &self,
        [loss, norm]: [&CudaTensor; 2],
        stats: &CudaTensor,
        gate: &CudaTensor,
        sticky: Option<&CudaTensor>,
        history: Option<(&CudaTensor, &CudaTensor)>,
    ) -> Result<()> {
        const OP: &str = "step_tail";
        validate::step_tail([loss, norm], stats, gate, sticky, history)?;
        if !stats.is_contiguous() || history.is_some_and(|(rows, _)| !rows.is_contiguous()) {
            return crate::step::step_tail(self, [loss, norm], stats, gate, sticky, history);
        }
        let opt = |t: Option<&CudaTensor>| t.map_or(Ok(DevicePtr::NULL), |t| self.ptr(OP, t));
        let args: Args = [
            ptr(self.ptr(OP, stats)?),
            ptr(self.ptr(OP, gate)?),
            ptr(opt(sticky)?),
            ptr(opt(history.map(|h| h.0))?),
            ptr(opt(history.map(|h| h.1))?),
            ptr(self.ptr(OP, loss)?),
            ptr(self.ptr(OP, norm)?),
            u64a(history.map_or(0, |(rows, _)| rows.shape()[0])),
        ]
        .into_iter()
        .collect();
        self.launch(OP, Kernel::StepTail, ONE_WARP, &args)
    }

    pub(crate) fn finite_gate_fused(
        &self,
        a: &CudaTensor,
        b: &CudaTensor,
        dst: &CudaTensor,
    ) -> Result<()> {
        const OP: &str = "finite_gate";
        validate::finite_gate(a, b, dst)?;
        let args: Args = [
            ptr(self.ptr(OP, dst)?),
            ptr(self.ptr(OP, a)?),
            ptr(self.ptr(OP, b)?),
        ]
        .into_iter()
        .collect();
        self.launch(OP, Kernel::FiniteGate, ONE_WARP, &args)
    }

    pub(crate) fn add_into_fused(&self, src: &CudaTensor, dst: &CudaTensor) -> Result<()> {
        const OP: &str = "add_into";
        validate::add_into(src, dst)?;
        let n = dst.numel();
        if n == 0 {
            return Ok(());
        }
        if !(src.is_contiguous() && dst.is_contiguous()) {
            let sum = self.add(dst, src)?;
            return self.copy_into(&sum, dst);
        }
        // The dense binary kernel with out = a = dst: an in-place add.
        self.binary_to(OP, BinaryOp::Add, dst, src, dst)
    }
}
