//! Simulated twins of the reduction kernels (`rows.cu`): one-warp-per-row reductions, the
//! first pass of a split long-row reduction, and chunked column reductions. Each returns the
//! partials the GPU kernel would, so the host's second passes run unchanged.

use super::{bad, checked, cpu_err, rows_tensor, usize_of};
use crate::backend::ReduceOp;
use crate::cpu::{self, math};
use crate::cuda::kernels::Kernel;
use zdevice::sim::{KernelFault, SimMemory};
use zdevice::{KernelArg, LaunchConfig};

pub(super) fn reduce_rows(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::ReduceRows, args)?;
    let (out, x, rows, n) = (k.ptr(0)?, k.ptr(1)?, k.u64(2)?, k.u64(3)?);
    let op = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max]
        .get(k.u32(4)? as usize)
        .copied()
        .ok_or_else(|| bad(4, "unknown reduction"))?;
    let t = rows_tensor(mem, x, rows, n)?;
    let r = cpu::reduce::reduce(op, &t, 1, false).map_err(cpu_err)?;
    mem.write_f32(out, &r.to_vec())
}

/// `[outer, n, inner]` reduced over `n` chunk by chunk: chunk `c` (rows `c * chunk ..`) to
/// `out[c, outer, inner]`; sums divided by `div`; op 3 adds the sums into `out` (one chunk).
pub(super) fn reduce_cols(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::ReduceCols, args)?;
    let (out, x) = (k.ptr(0)?, k.ptr(1)?);
    let (outer, n, inner) = (
        usize_of(k.u64(2)?, 2)?,
        usize_of(k.u64(3)?, 3)?,
        usize_of(k.u64(4)?, 4)?,
    );
    let chunk = usize_of(k.u64(5)?, 5)?.max(1);
    let code = k.u32(6)?;
    let (is_max, accumulate) = (code == 2, code == 3);
    let div = k.f32(7)?;
    let total = outer
        .checked_mul(n)
        .and_then(|v| v.checked_mul(inner))
        .ok_or_else(|| bad(3, "size overflows"))?;
    let data = mem.read_f32(x, total as u64)?;
    let mut result = Vec::with_capacity(n.div_ceil(chunk) * outer * inner);
    let mut column = Vec::with_capacity(chunk);
    for r0 in (0..n).step_by(chunk) {
        for o in 0..outer {
            for i in 0..inner {
                column.clear();
                column.extend((r0..(r0 + chunk).min(n)).map(|r| data[(o * n + r) * inner + i]));
                result.push(if is_max {
                    math::row_max(&column)
                } else {
                    math::pairwise_sum(&column) / div
                });
            }
        }
    }
    if accumulate {
        if n > chunk {
            return Err(bad(5, "an accumulating pass must be a single chunk"));
        }
        let old = mem.read_f32(out, result.len() as u64)?;
        for (r, o) in result.iter_mut().zip(old) {
            *r += o;
        }
    }
    mem.write_f32(out, &result)
}

/// Segment `p` (`seg` elements) of row `r` of dense `[rows, n]` reduced to
/// `out[p * rows + r]` (sum, or max for op 2).
pub(super) fn reduce_rows_split(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::ReduceRowsSplit, args)?;
    let (out, x) = (k.ptr(0)?, k.ptr(1)?);
    let (rows, n) = (usize_of(k.u64(2)?, 2)?, usize_of(k.u64(3)?, 3)?);
    let seg = usize_of(k.u64(4)?, 4)?.max(1);
    let is_max = k.u32(5)? == 2;
    let total = rows
        .checked_mul(n)
        .ok_or_else(|| bad(3, "size overflows"))?;
    let data = mem.read_f32(x, total as u64)?;
    let parts = n.div_ceil(seg);
    let mut result = vec![0.0f32; parts * rows];
    for r in 0..rows {
        for p in 0..parts {
            let piece = &data[r * n + p * seg..r * n + ((p + 1) * seg).min(n)];
            result[p * rows + r] = if is_max {
                math::row_max(piece)
            } else {
                math::pairwise_sum(piece)
            };
        }
    }
    mem.write_f32(out, &result)
}
