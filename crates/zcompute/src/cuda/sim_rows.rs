//! Simulated twins of the column reduction and the fused row backward kernels (`rows.cu`),
//! split from `sim.rs` to keep files short. The backward twins run the CPU backend's
//! composite formulas (`Backend`'s provided bodies) on the rows read from device memory.

use super::kernels::Kernel;
use super::sim::{bad, checked, cpu_err, rows_tensor, usize_of};
use crate::backend::Backend;
use crate::cpu::{CpuBackend, math};
use crate::tensor::CpuTensor;
use zdevice::sim::{KernelFault, SimMemory};
use zdevice::{KernelArg, LaunchConfig};

/// `[outer, n, inner]` reduced over `n` chunk by chunk: chunk `c` (rows `c * chunk ..`) to
/// `out[c, outer, inner]`; sums divided by `div`.
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
    let is_max = k.u32(6)? == 2;
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

/// `gx = y * (g - sum(g * y))` over dense `[rows, n]`.
pub(super) fn softmax_backward(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::SoftmaxBackwardRows, args)?;
    let (out, rows, n) = (k.ptr(0)?, k.u64(3)?, k.u64(4)?);
    let g = rows_tensor(mem, k.ptr(1)?, rows, n)?;
    let y = rows_tensor(mem, k.ptr(2)?, rows, n)?;
    let r = Backend::<f32>::softmax_backward(&CpuBackend, &g, &y).map_err(cpu_err)?;
    mem.write_f32(out, &r.to_vec())
}

/// LayerNorm's backward over dense `[rows, n]`: the input gradient and `g * xhat`, each
/// written only where its flag asks.
pub(super) fn layer_norm_backward(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::LayerNormBackwardRows, args)?;
    let (rows, n) = (k.u64(10)?, k.u64(11)?);
    let g = rows_tensor(mem, k.ptr(2)?, rows, n)?;
    let x = rows_tensor(mem, k.ptr(3)?, rows, n)?;
    let mean = rows_tensor(mem, k.ptr(4)?, rows, 1)?;
    let rstd = rows_tensor(mem, k.ptr(5)?, rows, 1)?;
    let weight = if k.u32(7)? == 0 {
        None
    } else {
        let data = mem.read_f32(k.ptr(6)?, n)?;
        Some(CpuTensor::from_vec(data, &[usize_of(n, 11)?]).map_err(cpu_err)?)
    };
    let want = [k.u32(8)? != 0, k.u32(9)? != 0];
    let r = Backend::<f32>::layer_norm_backward(
        &CpuBackend,
        &g,
        &x,
        &mean,
        &rstd,
        weight.as_ref(),
        want,
    )
    .map_err(cpu_err)?;
    for (i, t) in [(0, r.input), (1, r.g_xhat)] {
        if let Some(t) = t {
            mem.write_f32(k.ptr(i)?, &t.to_vec())?;
        }
    }
    Ok(())
}
