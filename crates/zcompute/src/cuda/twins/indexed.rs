//! Simulated twins of the row kernels indexed from device memory (`indexed.cu`): the index
//! is read from simulated memory when the kernel runs, under the CPU backend's rule
//! (`cpu::indexed::row_of`).

use super::common::{checked, usize_of};
use crate::cpu::indexed::row_of;
use crate::cuda::kernels::Kernel;
use zdevice::sim::{KernelFault, SimMemory};
use zdevice::{KernelArg, LaunchConfig};

/// The row the index at `index` names among `rows`, read now.
fn row(
    mem: &SimMemory<'_>,
    index: zdevice::DevicePtr,
    rows: u64,
) -> Result<Option<u64>, KernelFault> {
    let at = mem.read_f32(index, 1)?[0];
    Ok(row_of(f64::from(at), usize_of(rows, 3)?).map(|r| r as u64))
}

pub(super) fn gather_row(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::GatherRow, args)?;
    let (dst, src, index, rows, len) = (k.ptr(0)?, k.ptr(1)?, k.ptr(2)?, k.u64(3)?, k.u64(4)?);
    let values = match row(mem, index, rows)? {
        Some(r) => mem.read_f32(src.offset(r * len * 4), len)?,
        None => vec![f32::NAN; usize_of(len, 4)?],
    };
    mem.write_f32(dst, &values)
}

pub(super) fn scatter_row(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::ScatterRow, args)?;
    let (dst, src, index, rows, len) = (k.ptr(0)?, k.ptr(1)?, k.ptr(2)?, k.u64(3)?, k.u64(4)?);
    let advance = k.u32(5)? != 0;
    let at = mem.read_f32(index, 1)?[0];
    if let Some(r) = row(mem, index, rows)? {
        let values = mem.read_f32(src, len)?;
        mem.write_f32(dst.offset(r * len * 4), &values)?;
    }
    if advance {
        mem.write_f32(index, &[at + 1.0])?;
    }
    Ok(())
}

pub(super) fn gather_rows(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::GatherRows, args)?;
    let (dst, src, index, rows) = (k.ptr(0)?, k.ptr(1)?, k.ptr(2)?, k.u64(3)?);
    let (len, n) = (k.u64(4)?, k.u64(5)?);
    let rows = usize_of(rows, 3)?;
    // Every index is read before any row is written (the operands are distinct, so on the
    // device too no write can change an index).
    let indices = mem.read_f32(index, n)?;
    let mut values = Vec::with_capacity(usize_of(n.saturating_mul(len), 4)?);
    for at in indices {
        match row_of(f64::from(at), rows) {
            Some(r) => values.extend(mem.read_f32(src.offset(r as u64 * len * 4), len)?),
            None => values.extend(std::iter::repeat_n(f32::NAN, usize_of(len, 4)?)),
        }
    }
    mem.write_f32(dst, &values)
}

pub(super) fn gather_rows_at(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::GatherRowsAt, args)?;
    let (dst, src, steps, cursor, tail) = (k.ptr(0)?, k.ptr(1)?, k.ptr(2)?, k.ptr(3)?, k.ptr(4)?);
    let (rows, len, n) = (usize_of(k.u64(5)?, 5)?, k.u64(6)?, k.u64(7)?);
    let (steps_rows, width, tail_len) = (k.u64(8)?, k.u64(9)?, k.u64(10)?);
    // The picked row is read whole before anything is written (the operands are distinct).
    let picked = match row(mem, cursor, steps_rows)? {
        Some(s) => Some(mem.read_f32(steps.offset(s * width * 4), width)?),
        None => None,
    };
    let mut values = Vec::with_capacity(usize_of(n.saturating_mul(len), 6)?);
    for i in 0..usize_of(n, 7)? {
        let r = picked.as_ref().and_then(|p| row_of(f64::from(p[i]), rows));
        match r {
            Some(r) => values.extend(mem.read_f32(src.offset(r as u64 * len * 4), len)?),
            None => values.extend(std::iter::repeat_n(f32::NAN, usize_of(len, 6)?)),
        }
    }
    mem.write_f32(dst, &values)?;
    if tail != zdevice::DevicePtr::NULL {
        let t = usize_of(tail_len, 10)?;
        let end = match &picked {
            Some(p) => p[p.len() - t..].to_vec(),
            None => vec![f32::NAN; t],
        };
        mem.write_f32(tail, &end)?;
    }
    Ok(())
}
