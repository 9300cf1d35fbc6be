//! Simulated twins of the reduction kernels (`rows.cu`): one-warp-per-row reductions, the
//! first pass of a split long-row reduction, and chunked column reductions. Each returns the
//! partials the GPU kernel would, so the host's second passes run unchanged.

use super::common::{bad, checked, cpu_err, rows_tensor, usize_of};
use crate::backend::ReduceOp;
use crate::cpu::{self, math};
use crate::cuda::kernels::Kernel;
use zdevice::sim::{KernelArgs, KernelFault, SimMemory};
use zdevice::{DevicePtr, KernelArg, LaunchConfig};

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
    let shape = cols_shape(&k, 2)?;
    let chunk = usize_of(k.u64(5)?, 5)?.max(1);
    let code = k.u32(6)?;
    let div = k.f32(7)?;
    let data = mem.read_f32(x, shape.len(3)? as u64)?;
    let mut result = chunk_sums(&data, shape, chunk, code == 2, div);
    if code == 3 {
        if shape.n > chunk {
            return Err(bad(5, "an accumulating pass must be a single chunk"));
        }
        add_old(mem, out, &mut result)?;
    }
    mem.write_f32(out, &result)
}

/// Both passes of `reduce_cols` in one launch: chunk `c` of `[outer, n, inner]` into
/// `partials[c, outer * inner]`, then those added over the chunks into `out` (divided by
/// `div`; op 3 adds into `out`). The grid is one block per column tile by one per chunk, and
/// every tile's ticket must be 0 before (the kernel's last block leaves it so).
pub(super) fn reduce_cols_last(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::ReduceColsLast, args)?;
    let (out, partials, tickets, x) = (k.ptr(0)?, k.ptr(1)?, k.ptr(2)?, k.ptr(3)?);
    let shape = cols_shape(&k, 4)?;
    let chunk = usize_of(k.u64(7)?, 7)?.max(1);
    let code = k.u32(8)?;
    let div = k.f32(9)?;
    let data = mem.read_f32(x, shape.len(3)? as u64)?;
    let last = LastBlock {
        partials,
        tickets,
        args: (7, 2),
    };
    let mut result = last.sums(config, mem, &data, shape, chunk, (code == 2, div))?;
    if code == 3 {
        add_old(mem, out, &mut result)?;
    }
    mem.write_f32(out, &result)
}

/// Tanh's backward `gx = g * (1 - y * y)` over `[rows, n]`, and `db += ` its column sums as
/// `reduce_cols_last` adds a `[1, rows, n]` reduction into a buffer (chunks of `chunk` rows,
/// their partials, then the sum of those). The grid is one block per 32-column tile by one per
/// chunk, and every tile's ticket must be 0 before.
pub(super) fn tanh_backward_cols(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::TanhBackwardCols, args)?;
    let (gx, partials, db, tickets, g, y) = (
        k.ptr(0)?,
        k.ptr(1)?,
        k.ptr(2)?,
        k.ptr(3)?,
        k.ptr(4)?,
        k.ptr(5)?,
    );
    let shape = ColsShape {
        outer: 1,
        n: usize_of(k.u64(6)?, 6)?,
        inner: usize_of(k.u64(7)?, 7)?,
    };
    let chunk = usize_of(k.u64(8)?, 8)?.max(1);
    let len = shape.len(6)? as u64;
    let (gv, yv) = (mem.read_f32(g, len)?, mem.read_f32(y, len)?);
    let gz: Vec<f32> = gv.iter().zip(&yv).map(|(g, y)| g * (1.0 - y * y)).collect();
    mem.write_f32(gx, &gz)?;
    let last = LastBlock {
        partials,
        tickets,
        args: (8, 3),
    };
    let mut result = last.sums(config, mem, &gz, shape, chunk, (false, 1.0))?;
    add_old(mem, db, &mut result)?;
    mem.write_f32(db, &result)
}

/// The one-launch column reductions' second pass, as their last block does it: where the
/// partials go, the tickets, and the argument indices of `chunk` and of the tickets (for the
/// faults).
struct LastBlock {
    partials: DevicePtr,
    tickets: DevicePtr,
    args: (usize, usize),
}

impl LastBlock {
    /// Checks the grid (one block per column tile by one per chunk) and that every tile's
    /// ticket is 0, writes each chunk's sums (or maxima) of `data` into the partials, and
    /// returns those reduced over the chunks, sums divided by `div`.
    fn sums(
        &self,
        config: &LaunchConfig,
        mem: &mut SimMemory<'_>,
        data: &[f32],
        shape: ColsShape,
        chunk: usize,
        (is_max, div): (bool, f32),
    ) -> Result<Vec<f32>, KernelFault> {
        let chunks = shape.n.div_ceil(chunk);
        let tiles = shape.outer * shape.inner.div_ceil(32);
        if config.grid.0 as usize != tiles || config.grid.1 as usize != chunks.max(1) {
            let why = "the grid must be one block per column tile by one per chunk";
            return Err(bad(self.args.0, why));
        }
        let tickets = mem.read_f32(self.tickets, tiles as u64)?;
        if tickets.iter().any(|t| t.to_bits() != 0) {
            return Err(bad(self.args.1, "a tile's ticket was not left at 0"));
        }
        let parts = chunk_sums(data, shape, chunk, is_max, 1.0);
        mem.write_f32(self.partials, &parts)?;
        let whole = ColsShape {
            outer: 1,
            n: chunks,
            inner: shape.outer * shape.inner,
        };
        Ok(chunk_sums(&parts, whole, chunks.max(1), is_max, div))
    }
}

/// A column reduction's `[outer, n, inner]`.
#[derive(Clone, Copy)]
struct ColsShape {
    outer: usize,
    n: usize,
    inner: usize,
}

impl ColsShape {
    fn len(self, arg: usize) -> Result<usize, KernelFault> {
        self.outer
            .checked_mul(self.n)
            .and_then(|v| v.checked_mul(self.inner))
            .ok_or_else(|| bad(arg, "size overflows"))
    }
}

fn cols_shape(k: &KernelArgs<'_>, first: usize) -> Result<ColsShape, KernelFault> {
    Ok(ColsShape {
        outer: usize_of(k.u64(first)?, first)?,
        n: usize_of(k.u64(first + 1)?, first + 1)?,
        inner: usize_of(k.u64(first + 2)?, first + 2)?,
    })
}

/// Each chunk of `chunk` rows of `data` (`[outer, n, inner]`) reduced per column (sum divided
/// by `div`, or max): `[chunks, outer, inner]`.
fn chunk_sums(data: &[f32], shape: ColsShape, chunk: usize, is_max: bool, div: f32) -> Vec<f32> {
    let ColsShape { outer, n, inner } = shape;
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
    result
}

/// `result += out` (an accumulating pass adds into what `out` held).
fn add_old(mem: &mut SimMemory<'_>, out: DevicePtr, result: &mut [f32]) -> Result<(), KernelFault> {
    let old = mem.read_f32(out, result.len() as u64)?;
    for (r, o) in result.iter_mut().zip(old) {
        *r += o;
    }
    Ok(())
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
