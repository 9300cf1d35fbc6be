//! Simulated twins of the flat-buffer kernels (`flat.cu`): the two passes of the global norm,
//! clipping by a norm read from device memory, and AdamW's finiteness gate. The first pass
//! gives each block the elements the kernel's grid-stride walk gives it, so the partials mean
//! what the kernel's do.

use super::{bad, checked, usize_of};
use crate::cuda::kernels::Kernel;
use zdevice::sim::{KernelFault, SimMemory};
use zdevice::{DevicePtr, KernelArg, LaunchConfig};

/// Threads per block of the flat kernels (`FLAT_THREADS` in flat.cu).
const THREADS: usize = 256;

pub(super) fn sum_squares_partial(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::SumSquaresPartial, args)?;
    let (partial, x, n) = (k.ptr(0)?, k.ptr(1)?, k.u64(2)?);
    let sums = block_sums(config, mem, x, n)?;
    mem.write_f32(partial, &sums)
}

/// Both norm passes in one launch: the partials written, their sum's root into `out`; the
/// ticket must be 0 before (the kernel's last block leaves it so).
pub(super) fn sum_squares_norm(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::SumSquaresNorm, args)?;
    let (out, partial, ticket, x, n) = (k.ptr(0)?, k.ptr(1)?, k.ptr(2)?, k.ptr(3)?, k.u64(4)?);
    if mem.read_f32(ticket, 1)?[0].to_bits() != 0 {
        return Err(bad(2, "the ticket was not left at 0"));
    }
    let sums = block_sums(config, mem, x, n)?;
    mem.write_f32(partial, &sums)?;
    let total: f32 = sums.iter().sum();
    mem.write_f32(out, &[total.sqrt()])
}

/// Each block's sum of squares over the 256-wide tiles its grid-stride walk visits.
fn block_sums(
    config: &LaunchConfig,
    mem: &mut SimMemory<'_>,
    x: zdevice::DevicePtr,
    n: u64,
) -> Result<Vec<f32>, KernelFault> {
    if config.block.0 as usize != THREADS {
        return Err(bad(0, "the norm's first pass runs 256 threads per block"));
    }
    let blocks = config.grid.0 as usize;
    let data = mem.read_f32(x, n)?;
    let mut sums = vec![0.0f32; blocks];
    for (tile, chunk) in data.chunks(THREADS).enumerate() {
        let block = tile % blocks.max(1);
        sums[block] += chunk.iter().map(|v| v * v).sum::<f32>();
    }
    Ok(sums)
}

pub(super) fn norm_finish(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::NormFinish, args)?;
    let (out, partial, parts) = (k.ptr(0)?, k.ptr(1)?, k.u64(2)?);
    usize_of(parts, 2)?;
    let total: f32 = mem.read_f32(partial, parts)?.iter().sum();
    mem.write_f32(out, &[total.sqrt()])
}

pub(super) fn clip_scale(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::ClipScale, args)?;
    let (x, norm, max_norm, n) = (k.ptr(0)?, k.ptr(1)?, k.f32(2)?, k.u64(3)?);
    let norm = mem.read_f32(norm, 1)?[0];
    let coef = max_norm / (norm + 1e-6);
    // NaN stays NaN, as the kernel's `coef > 1 ? 1 : coef`.
    let coef = if coef > 1.0 { 1.0 } else { coef };
    let scaled: Vec<f32> = mem.read_f32(x, n)?.iter().map(|v| v * coef).collect();
    mem.write_f32(x, &scaled)
}

pub(super) fn finite_gate(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::FiniteGate, args)?;
    let (dst, a, b) = (k.ptr(0)?, k.ptr(1)?, k.ptr(2)?);
    let (a, b) = (mem.read_f32(a, 1)?[0], mem.read_f32(b, 1)?[0]);
    mem.write_f32(dst, &[0.0 * a + 0.0 * b])
}

/// A training step's tail: `stats = [loss, norm]`, the gate `0 * loss + 0 * norm`, folded into
/// the sticky one when given (`gate += sticky; sticky = gate`), the stats to row `cursor` of the
/// history when given (when the cursor names a row) and the cursor advanced.
pub(super) fn step_tail(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::StepTail, args)?;
    let (stats, gate, sticky, history, cursor) =
        (k.ptr(0)?, k.ptr(1)?, k.ptr(2)?, k.ptr(3)?, k.ptr(4)?);
    let (l, n) = (
        mem.read_f32(k.ptr(5)?, 1)?[0],
        mem.read_f32(k.ptr(6)?, 1)?[0],
    );
    let rows = k.u64(7)?;
    mem.write_f32(stats, &[l, n])?;
    let mut g = 0.0 * l + 0.0 * n;
    if sticky != DevicePtr::NULL {
        g += mem.read_f32(sticky, 1)?[0];
        mem.write_f32(sticky, &[g])?;
    }
    mem.write_f32(gate, &[g])?;
    if history != DevicePtr::NULL {
        let f = mem.read_f32(cursor, 1)?[0];
        let d = f64::from(f);
        if d.is_finite() && d >= 0.0 && d == d.floor() && d < rows as f64 {
            mem.write_f32(history.offset(d as u64 * 8), &[l, n])?;
        }
        mem.write_f32(cursor, &[f + 1.0])?;
    }
    Ok(())
}
