//! Simulated twins of the flat-buffer kernels (`flat.cu`): the two passes of the global norm,
//! clipping by a norm read from device memory, and AdamW's finiteness gate. The first pass
//! gives each block the elements the kernel's grid-stride walk gives it, so the partials mean
//! what the kernel's do.

use super::{bad, checked, usize_of};
use crate::cuda::kernels::Kernel;
use zdevice::sim::{KernelFault, SimMemory};
use zdevice::{KernelArg, LaunchConfig};

/// Threads per block of the flat kernels (`FLAT_THREADS` in flat.cu).
const THREADS: usize = 256;

pub(super) fn sum_squares_partial(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::SumSquaresPartial, args)?;
    let (partial, x, n) = (k.ptr(0)?, k.ptr(1)?, k.u64(2)?);
    if config.block.0 as usize != THREADS {
        return Err(bad(0, "sum_squares_partial runs 256 threads per block"));
    }
    let blocks = config.grid.0 as usize;
    let data = mem.read_f32(x, n)?;
    let mut sums = vec![0.0f32; blocks];
    for (tile, chunk) in data.chunks(THREADS).enumerate() {
        let block = tile % blocks.max(1);
        sums[block] += chunk.iter().map(|v| v * v).sum::<f32>();
    }
    mem.write_f32(partial, &sums)
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
