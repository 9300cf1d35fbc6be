//! Simulated twins of the row kernels (`rows.cu`): softmax and LayerNorm rows, their
//! register-resident variants (which also check the width and alignment contract the GPU
//! relies on), and the fused backward kernels, which run the CPU backend's composite formulas
//! (`Backend`'s provided bodies) on the rows read from device memory.

use super::{bad, checked, cpu_err, rows_tensor, usize_of};
use crate::backend::Backend;
use crate::cpu::{self, CpuBackend};
use crate::cuda::kernels::Kernel;
use crate::tensor::CpuTensor;
use zdevice::sim::{KernelArgs, KernelFault, SimMemory};
use zdevice::{KernelArg, LaunchConfig};

pub(super) fn softmax_rows(
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

pub(super) fn softmax_rows_vec<const V: u32>(
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

pub(super) fn layer_norm_rows(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    layer_norm_body(Kernel::LayerNormRows, args, mem)
}

pub(super) fn layer_norm_rows_vec<const V: u32>(
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
