//! The simulated twins of `kernels/*.cu`: one Rust closure per kernel-id entry, registered on a
//! `SimDriver` under the PTX entry name, so `CudaBackend<SimDriver>` runs the whole op suite in
//! CI. Each twin implements its kernel's contract (arguments in, memory out) with the CPU
//! backend's formulas; the host code around it (layouts, strides, launches, gemm descriptors,
//! allocation, capture) is the same code that drives the GPU.

use super::kernels::{Kernel, read_strided};
use super::sim_rows;
use crate::backend::{ADAMW_SLOT_LR, ADAMW_SLOT_STEP, AdamWConfig, BinaryOp, ReduceOp, UnaryOp};
use crate::cpu::{self, math};
use crate::tensor::CpuTensor;
use zdevice::sim::{KernelArgs, KernelFault, SimMemory};
use zdevice::{DevicePtr, KernelArg, LaunchConfig, SimDriver};

type Twin = fn(&LaunchConfig, &[KernelArg], &mut SimMemory<'_>) -> Result<(), KernelFault>;

/// Registers every twin on `sim` (idempotent).
pub fn register(sim: &SimDriver) {
    for k in Kernel::ALL {
        sim.register_kernel(k.spec().name, twin(k));
    }
}

fn twin(k: Kernel) -> Twin {
    match k {
        Kernel::Unary => unary,
        Kernel::UnaryStrided => unary_strided,
        Kernel::Binary => binary,
        Kernel::BinaryStrided => binary_strided,
        Kernel::BinaryRowsStrided => binary_rows_strided,
        Kernel::BinaryScalar => binary_scalar,
        Kernel::CopyStrided => copy_strided,
        Kernel::CopyRowsStrided => copy_rows_strided,
        Kernel::FillStrided => fill_strided,
        Kernel::ReduceRows => reduce_rows,
        Kernel::ReduceCols => sim_rows::reduce_cols,
        Kernel::ReduceRowsSplit => sim_rows::reduce_rows_split,
        Kernel::SoftmaxRows => softmax_rows,
        Kernel::LayerNormRows => layer_norm_rows,
        Kernel::SoftmaxBackwardRows => sim_rows::softmax_backward,
        Kernel::LayerNormBackwardRows => sim_rows::layer_norm_backward,
        Kernel::BceMean => bce_mean,
        Kernel::AdamW => adamw,
        Kernel::SoftmaxRowsV1 => softmax_rows_vec::<1>,
        Kernel::SoftmaxRowsV2 => softmax_rows_vec::<2>,
        Kernel::SoftmaxRowsV4 => softmax_rows_vec::<4>,
        Kernel::SoftmaxRowsV8 => softmax_rows_vec::<8>,
        Kernel::LayerNormRowsV1 => layer_norm_rows_vec::<1>,
        Kernel::LayerNormRowsV2 => layer_norm_rows_vec::<2>,
        Kernel::LayerNormRowsV4 => layer_norm_rows_vec::<4>,
        Kernel::LayerNormRowsV8 => layer_norm_rows_vec::<8>,
    }
}

pub(super) fn bad(index: usize, reason: &str) -> KernelFault {
    KernelFault::BadArgument {
        index,
        reason: reason.to_string(),
    }
}

pub(super) fn checked(k: Kernel, args: &[KernelArg]) -> Result<KernelArgs<'_>, KernelFault> {
    if k.accepts(args) {
        Ok(KernelArgs(args))
    } else {
        Err(bad(0, &format!("arguments do not match {}", k.spec().name)))
    }
}

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

pub(super) fn usize_of(v: u64, index: usize) -> Result<usize, KernelFault> {
    usize::try_from(v).map_err(|_| bad(index, "size does not fit usize"))
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

fn unary(_: &LaunchConfig, args: &[KernelArg], mem: &mut SimMemory<'_>) -> Result<(), KernelFault> {
    let a = checked(Kernel::Unary, args)?;
    let (out, x, op, n) = (a.ptr(0)?, a.ptr(1)?, unary_op(a.u32(2)?)?, a.u64(3)?);
    let v: Vec<f32> = mem
        .read_f32(x, n)?
        .into_iter()
        .map(|v| math::unary(op, v))
        .collect();
    mem.write_f32(out, &v)
}

fn unary_strided(
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

fn binary(
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

fn binary_strided(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    binary_strided_body(Kernel::BinaryStrided, args, mem)
}

/// The row-tiled kernel has the per-element kernel's contract.
fn binary_rows_strided(
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

fn binary_scalar(
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

fn copy_strided(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    copy_strided_body(Kernel::CopyStrided, args, mem)
}

/// The row-tiled kernel has the per-element kernel's contract.
fn copy_rows_strided(
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

fn fill_strided(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::FillStrided, args)?;
    let (dst, value, n) = (k.ptr(0)?, k.f32(1)?, k.u64(2)?);
    let offs = strided_tail(args, 3, 1, n)?;
    scatter(mem, dst, &offs[0], &vec![value; offs[0].len()])
}

/// Reads a dense `[rows, n]` matrix as a CPU tensor.
pub(super) fn rows_tensor(
    mem: &SimMemory<'_>,
    p: DevicePtr,
    rows: u64,
    n: u64,
) -> Result<CpuTensor<f32>, KernelFault> {
    let data = mem.read_f32(p, rows.saturating_mul(n))?;
    let shape = [usize_of(rows, 2)?, usize_of(n, 3)?];
    CpuTensor::from_vec(data, &shape).map_err(|e| bad(2, &e.to_string()))
}

pub(super) fn cpu_err(e: crate::error::ComputeError) -> KernelFault {
    bad(0, &e.to_string())
}

fn reduce_rows(
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

fn softmax_rows(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    softmax_body(Kernel::SoftmaxRows, args, mem)
}

/// The register-resident kernels' contract on top of the general one: rows a multiple of 4
/// wide and at most 128 * V, and the pointers at `ptrs` 16-byte aligned (null counts as
/// aligned: those operands are flagged absent). A launch that breaks it would read or write
/// the wrong elements on the GPU, so the twin refuses it.
fn check_vec(k: Kernel, args: &KernelArgs<'_>, n: u64, ptrs: &[usize]) -> Result<(), KernelFault> {
    let lanes = k
        .vec_lanes()
        .ok_or_else(|| bad(0, "not a register-resident kernel"))?;
    if !n.is_multiple_of(4) || n > 128 * u64::from(lanes) {
        return Err(bad(
            0,
            &format!(
                "{} takes rows a multiple of 4 and at most {} wide, not {n}",
                k.spec().name,
                128 * lanes
            ),
        ));
    }
    for &i in ptrs {
        if !args.ptr(i)?.0.is_multiple_of(16) {
            return Err(bad(i, "pointer is not 16-byte aligned"));
        }
    }
    Ok(())
}

fn softmax_rows_vec<const V: u32>(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = Kernel::softmax_vec(V).ok_or_else(|| bad(0, "no such softmax kernel"))?;
    let a = checked(k, args)?;
    check_vec(k, &a, a.u64(3)?, &[0, 1])?;
    softmax_body(k, args, mem)
}

fn softmax_body(k: Kernel, args: &[KernelArg], mem: &mut SimMemory<'_>) -> Result<(), KernelFault> {
    let k = checked(k, args)?;
    let (out, x, rows, n) = (k.ptr(0)?, k.ptr(1)?, k.u64(2)?, k.u64(3)?);
    let t = rows_tensor(mem, x, rows, n)?;
    let r = cpu::norm::softmax_last(&t).map_err(cpu_err)?;
    mem.write_f32(out, &r.to_vec())
}

fn layer_norm_rows(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    layer_norm_body(Kernel::LayerNormRows, args, mem)
}

fn layer_norm_rows_vec<const V: u32>(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = Kernel::layer_norm_vec(V).ok_or_else(|| bad(0, "no such LayerNorm kernel"))?;
    let a = checked(k, args)?;
    check_vec(k, &a, a.u64(9)?, &[0, 3, 4, 5])?;
    layer_norm_body(k, args, mem)
}

fn layer_norm_body(
    k: Kernel,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(k, args)?;
    let (out, mean, rstd, x) = (k.ptr(0)?, k.ptr(1)?, k.ptr(2)?, k.ptr(3)?);
    let (rows, n, eps) = (k.u64(8)?, k.u64(9)?, k.f32(10)?);
    let param = |i: usize, flag: usize| -> Result<Option<CpuTensor<f32>>, KernelFault> {
        if k.u32(flag)? == 0 {
            return Ok(None);
        }
        let data = mem.read_f32(k.ptr(i)?, n)?;
        CpuTensor::from_vec(data, &[usize_of(n, 9)?])
            .map(Some)
            .map_err(cpu_err)
    };
    let (w, b) = (param(4, 6)?, param(5, 7)?);
    let t = rows_tensor(mem, x, rows, n)?;
    let r = cpu::norm::layer_norm(&t, w.as_ref(), b.as_ref(), eps).map_err(cpu_err)?;
    mem.write_f32(out, &r.out.to_vec())?;
    mem.write_f32(mean, &r.mean.to_vec())?;
    mem.write_f32(rstd, &r.rstd.to_vec())
}

fn bce_mean(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::BceMean, args)?;
    let (out, x, y, n) = (k.ptr(0)?, k.ptr(1)?, k.ptr(2)?, k.u64(3)?);
    let (tx, ty) = (rows_tensor(mem, x, 1, n)?, rows_tensor(mem, y, 1, n)?);
    let r = cpu::train::bce_with_logits_mean(&tx, &ty).map_err(cpu_err)?;
    mem.write_f32(out, &r.to_vec())
}

fn adamw(_: &LaunchConfig, args: &[KernelArg], mem: &mut SimMemory<'_>) -> Result<(), KernelFault> {
    let k = checked(Kernel::AdamW, args)?;
    let [p, m, v, g, slot] = [0, 1, 2, 3, 4].map(|i| k.ptr(i));
    let (p, m, v, g, slot) = (p?, m?, v?, g?, slot?);
    let n = k.u64(5)?;
    let cfg = AdamWConfig {
        beta1: k.f32(6)?,
        beta2: k.f32(7)?,
        eps: k.f32(8)?,
        weight_decay: k.f32(9)?,
    };
    let t = |mem: &SimMemory<'_>, ptr| rows_tensor(mem, ptr, 1, n);
    let (tp, tm, tv, tg) = (t(mem, p)?, t(mem, m)?, t(mem, v)?, t(mem, g)?);
    let s = mem.read_f32(slot, 2)?;
    let mut slot_values = [0.0f32; 2];
    slot_values[ADAMW_SLOT_LR] = s[ADAMW_SLOT_LR];
    slot_values[ADAMW_SLOT_STEP] = s[ADAMW_SLOT_STEP];
    let ts = CpuTensor::from_vec(slot_values.to_vec(), &[2]).map_err(cpu_err)?;
    cpu::train::adamw_step(&tp, &tm, &tv, &tg, &ts, &cfg).map_err(cpu_err)?;
    mem.write_f32(p, &tp.to_vec())?;
    mem.write_f32(m, &tm.to_vec())?;
    mem.write_f32(v, &tv.to_vec())
}
