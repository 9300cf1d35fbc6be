//! Simulated twins of the fused kernels (`fused.cu`): each reads its operands from device
//! memory, runs the CPU backend's fused op (`cpu/fused.rs`, or LayerNorm's provided backward
//! plus the residual) and writes what the kernel writes. They also check the launch shape the
//! kernels rely on (32 x 8 blocks, enough column tiles), which the GPU would not report.

use super::{bad, checked, cpu_err, rows_tensor, usize_of};
use crate::backend::Backend;
use crate::cpu::{CpuBackend, fused};
use crate::cuda::kernels::Kernel;
use crate::fused::Activation;
use crate::tensor::CpuTensor;
use zdevice::sim::{KernelFault, SimMemory};
use zdevice::{KernelArg, LaunchConfig};

/// The kernels that index threads as 32 columns x 8 rows need exactly that block.
fn check_block_32x8(k: Kernel, config: &LaunchConfig) -> Result<(), KernelFault> {
    if config.block == (32, 8, 1) {
        Ok(())
    } else {
        Err(bad(
            0,
            &format!(
                "{} needs blocks of 32 x 8 threads, got {:?}",
                k.spec().name,
                config.block
            ),
        ))
    }
}

fn tensor(
    mem: &SimMemory<'_>,
    p: zdevice::DevicePtr,
    shape: &[usize],
) -> Result<CpuTensor<f32>, KernelFault> {
    let n: usize = shape.iter().product();
    let data = mem.read_f32(p, n as u64)?;
    CpuTensor::from_vec(data, shape).map_err(cpu_err)
}

pub(super) fn bias_act(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    check_block_32x8(Kernel::BiasAct, config)?;
    let k = checked(Kernel::BiasAct, args)?;
    let (rows, n) = (k.u64(3)?, k.u64(4)?);
    let act = match k.u32(5)? {
        0 => Activation::Identity,
        1 => Activation::Tanh,
        _ => return Err(bad(5, "activation code is not 0 (identity) or 1 (tanh)")),
    };
    let x = rows_tensor(mem, k.ptr(1)?, rows, n)?;
    let b = tensor(mem, k.ptr(2)?, &[usize_of(n, 4)?])?;
    let r = fused::bias_act(&x, &b, act).map_err(cpu_err)?;
    mem.write_f32(k.ptr(0)?, &r.to_vec())
}

pub(super) fn tanh_backward(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::TanhBackward, args)?;
    let n = k.u64(3)?;
    let g = rows_tensor(mem, k.ptr(1)?, 1, n)?;
    let y = rows_tensor(mem, k.ptr(2)?, 1, n)?;
    let r = fused::tanh_backward(&g, &y).map_err(cpu_err)?;
    mem.write_f32(k.ptr(0)?, &r.to_vec())
}

pub(super) fn add_layer_norm(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::AddLayerNormRows, args)?;
    let (rows, n, eps) = (k.u64(10)?, k.u64(11)?, k.f32(12)?);
    let a = rows_tensor(mem, k.ptr(4)?, rows, n)?;
    let b = rows_tensor(mem, k.ptr(5)?, rows, n)?;
    let width = [usize_of(n, 11)?];
    let param = |i: usize, flag: usize| -> Result<Option<CpuTensor<f32>>, KernelFault> {
        match k.u32(flag)? {
            0 => Ok(None),
            _ => tensor(mem, k.ptr(i)?, &width).map(Some),
        }
    };
    let (w, bias) = (param(6, 8)?, param(7, 9)?);
    let r = fused::add_layer_norm(&a, &b, w.as_ref(), bias.as_ref(), eps).map_err(cpu_err)?;
    mem.write_f32(k.ptr(0)?, &r.sum.to_vec())?;
    mem.write_f32(k.ptr(1)?, &r.norm.out.to_vec())?;
    mem.write_f32(k.ptr(2)?, &r.norm.mean.to_vec())?;
    mem.write_f32(k.ptr(3)?, &r.norm.rstd.to_vec())
}

pub(super) fn layer_norm_backward_add(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::LayerNormBackwardAddRows, args)?;
    let (rows, n) = (k.u64(12)?, k.u64(13)?);
    let g = rows_tensor(mem, k.ptr(2)?, rows, n)?;
    let residual = match k.u32(9)? {
        0 => None,
        _ => Some(rows_tensor(mem, k.ptr(3)?, rows, n)?),
    };
    let x = rows_tensor(mem, k.ptr(4)?, rows, n)?;
    let mean = rows_tensor(mem, k.ptr(5)?, rows, 1)?;
    let rstd = rows_tensor(mem, k.ptr(6)?, rows, 1)?;
    let weight = match k.u32(8)? {
        0 => None,
        _ => Some(tensor(mem, k.ptr(7)?, &[usize_of(n, 13)?])?),
    };
    let want = [k.u32(10)? != 0, k.u32(11)? != 0];
    let r = Backend::<f32>::layer_norm_backward_add(
        &CpuBackend,
        &g,
        residual.as_ref(),
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

/// `[B, S, D]` from the arguments at `first..first + 3`.
fn pool_shape(k: &zdevice::sim::KernelArgs<'_>, first: usize) -> Result<[usize; 3], KernelFault> {
    Ok([
        usize_of(k.u64(first)?, first)?,
        usize_of(k.u64(first + 1)?, first + 1)?,
        usize_of(k.u64(first + 2)?, first + 2)?,
    ])
}

pub(super) fn pool_head_bce(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    // One block whose warps split the samples and whose warp sums make the loss.
    let threads = crate::cuda::fused::POOL_THREADS;
    if config.grid != (1, 1, 1) || config.block != (threads, 1, 1) {
        return Err(bad(
            0,
            &format!("zc_pool_head_bce_f32 runs as one block of {threads} threads"),
        ));
    }
    let k = checked(Kernel::PoolHeadBce, args)?;
    let [b, s, d] = pool_shape(&k, 6)?;
    let h = tensor(mem, k.ptr(2)?, &[b, s, d])?;
    let w = tensor(mem, k.ptr(3)?, &[1, d])?;
    let bias = tensor(mem, k.ptr(4)?, &[1])?;
    let y = tensor(mem, k.ptr(5)?, &[b])?;
    let r = fused::pool_head_bce(&h, &w, &bias, &y).map_err(cpu_err)?;
    mem.write_f32(k.ptr(0)?, &r.loss.to_vec())?;
    mem.write_f32(k.ptr(1)?, &r.logits.to_vec())
}

pub(super) fn pool_head_bce_backward(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let kernel = Kernel::PoolHeadBceBackward;
    check_block_32x8(kernel, config)?;
    let k = checked(kernel, args)?;
    let [b, s, d] = pool_shape(&k, 8)?;
    // Only the blocks of grid row 0 reduce the weight gradient, one 32-column tile each.
    if u64::from(config.grid.0) * 32 < d as u64 {
        return Err(bad(
            10,
            "the grid's x does not cover every column of the head",
        ));
    }
    let g = tensor(mem, k.ptr(3)?, &[])?;
    let h = tensor(mem, k.ptr(4)?, &[b, s, d])?;
    let w = tensor(mem, k.ptr(5)?, &[1, d])?;
    let logits = tensor(mem, k.ptr(6)?, &[b])?;
    let y = tensor(mem, k.ptr(7)?, &[b])?;
    let r = fused::pool_head_bce_backward(&g, &h, &w, &logits, &y).map_err(cpu_err)?;
    mem.write_f32(k.ptr(0)?, &r.h.to_vec())?;
    mem.write_f32(k.ptr(1)?, &r.weight.to_vec())?;
    mem.write_f32(k.ptr(2)?, &r.bias.to_vec())
}
