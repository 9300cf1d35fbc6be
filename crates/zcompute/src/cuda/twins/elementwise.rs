//! Simulated twins of the elementwise kernels (`elementwise.cu`): unary, binary and
//! scalar-binary maps, strided copies and fills. Strided operands are decoded from the same
//! tail the host encodes and walked element by element in logical order.

use super::common::{bad, checked};
use crate::backend::{BinaryOp, UnaryOp};
use crate::cpu::math;
use crate::cuda::kernels::{Kernel, read_strided};
use zdevice::sim::{KernelFault, SimMemory};
use zdevice::{DevicePtr, KernelArg, LaunchConfig};

fn unary_op(code: u32) -> Result<UnaryOp, KernelFault> {
    UnaryOp::ALL
        .get(code as usize)
        .copied()
        .ok_or_else(|| bad(2, "unknown unary op"))
}

fn binary_op(code: u32, index: usize) -> Result<BinaryOp, KernelFault> {
    BinaryOp::ALL
        .get(code as usize)
        .copied()
        .ok_or_else(|| bad(index, "unknown binary op"))
}

/// Element offsets of a view in logical (row-major) order.
fn offsets(shape: &[u64], strides: &[u64], n: u64) -> Vec<u64> {
    let mut out = Vec::with_capacity(n as usize);
    let mut index = vec![0u64; shape.len()];
    for _ in 0..n {
        out.push(index.iter().zip(strides).map(|(i, s)| i * s).sum());
        for ax in (0..shape.len()).rev() {
            index[ax] += 1;
            if index[ax] < shape[ax] {
                break;
            }
            index[ax] = 0;
        }
    }
    out
}

fn gather(mem: &SimMemory<'_>, base: DevicePtr, offs: &[u64]) -> Result<Vec<f32>, KernelFault> {
    let span = offs.iter().max().map_or(0, |m| m + 1);
    let data = mem.read_f32(base, span)?;
    Ok(offs.iter().map(|&o| data[o as usize]).collect())
}

fn scatter(
    mem: &mut SimMemory<'_>,
    base: DevicePtr,
    offs: &[u64],
    values: &[f32],
) -> Result<(), KernelFault> {
    let span = offs.iter().max().map_or(0, |m| m + 1);
    let mut data = mem.read_f32(base, span)?;
    for (&o, &v) in offs.iter().zip(values) {
        data[o as usize] = v;
    }
    mem.write_f32(base, &data)
}

fn strided_tail(
    args: &[KernelArg],
    from: usize,
    operands: usize,
    n: u64,
) -> Result<Vec<Vec<u64>>, KernelFault> {
    let (shape, strides) =
        read_strided(&args[from..], operands).ok_or_else(|| bad(from, "bad strided tail"))?;
    Ok(strides.iter().map(|s| offsets(&shape, s, n)).collect())
}

pub(super) fn unary(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let a = checked(Kernel::Unary, args)?;
    let (out, x, op, n) = (a.ptr(0)?, a.ptr(1)?, unary_op(a.u32(2)?)?, a.u64(3)?);
    let v: Vec<f32> = mem
        .read_f32(x, n)?
        .into_iter()
        .map(|v| math::unary(op, v))
        .collect();
    mem.write_f32(out, &v)
}

pub(super) fn unary_strided(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let a = checked(Kernel::UnaryStrided, args)?;
    let (out, x, op, n) = (a.ptr(0)?, a.ptr(1)?, unary_op(a.u32(2)?)?, a.u64(3)?);
    let offs = strided_tail(args, 4, 1, n)?;
    let v: Vec<f32> = gather(mem, x, &offs[0])?
        .into_iter()
        .map(|v| math::unary(op, v))
        .collect();
    mem.write_f32(out, &v)
}

pub(super) fn binary(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::Binary, args)?;
    let (out, a, b, n) = (k.ptr(0)?, k.ptr(1)?, k.ptr(2)?, k.u64(4)?);
    let op = binary_op(k.u32(3)?, 3)?;
    let (va, vb) = (mem.read_f32(a, n)?, mem.read_f32(b, n)?);
    let v: Vec<f32> = va
        .iter()
        .zip(&vb)
        .map(|(&x, &y)| math::binary(op, x, y))
        .collect();
    mem.write_f32(out, &v)
}

pub(super) fn binary_strided(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    binary_strided_body(Kernel::BinaryStrided, args, mem)
}

/// The row-tiled kernel has the per-element kernel's contract.
pub(super) fn binary_rows_strided(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    binary_strided_body(Kernel::BinaryRowsStrided, args, mem)
}

fn binary_strided_body(
    kernel: Kernel,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(kernel, args)?;
    let (out, a, b, n) = (k.ptr(0)?, k.ptr(1)?, k.ptr(2)?, k.u64(4)?);
    let op = binary_op(k.u32(3)?, 3)?;
    let offs = strided_tail(args, 5, 2, n)?;
    let (va, vb) = (gather(mem, a, &offs[0])?, gather(mem, b, &offs[1])?);
    let v: Vec<f32> = va
        .iter()
        .zip(&vb)
        .map(|(&x, &y)| math::binary(op, x, y))
        .collect();
    mem.write_f32(out, &v)
}

pub(super) fn binary_scalar(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::BinaryScalar, args)?;
    let (out, x, s, n) = (k.ptr(0)?, k.ptr(1)?, k.f32(2)?, k.u64(5)?);
    let op = binary_op(k.u32(3)?, 3)?;
    let lhs = k.u32(4)? != 0;
    let v: Vec<f32> = mem
        .read_f32(x, n)?
        .into_iter()
        .map(|v| {
            if lhs {
                math::binary(op, s, v)
            } else {
                math::binary(op, v, s)
            }
        })
        .collect();
    mem.write_f32(out, &v)
}

pub(super) fn copy_strided(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    copy_strided_body(Kernel::CopyStrided, args, mem)
}

/// The row-tiled kernel has the per-element kernel's contract.
pub(super) fn copy_rows_strided(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    copy_strided_body(Kernel::CopyRowsStrided, args, mem)
}

fn copy_strided_body(
    kernel: Kernel,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(kernel, args)?;
    let (dst, src, n) = (k.ptr(0)?, k.ptr(1)?, k.u64(2)?);
    let offs = strided_tail(args, 3, 2, n)?;
    let v = gather(mem, src, &offs[0])?;
    scatter(mem, dst, &offs[1], &v)
}

pub(super) fn fill_strided(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::FillStrided, args)?;
    let (dst, value, n) = (k.ptr(0)?, k.f32(1)?, k.u64(2)?);
    let offs = strided_tail(args, 3, 1, n)?;
    scatter(mem, dst, &offs[0], &vec![value; offs[0].len()])
}
