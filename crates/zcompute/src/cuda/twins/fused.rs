//! Simulated twins of the fused kernels (`fused.cu`): each reads its operands from device
//! memory, runs the CPU backend's fused op (`cpu/fused.rs`, or LayerNorm's provided backward
//! plus the residual) and writes what the kernel writes. They also check the launch shape the
//! kernels rely on (32 x 8 blocks, enough column tiles), which the GPU would not report.

use super::common::{bad, checked, cpu_err, rows_tensor, usize_of};
use crate::backend::LayerNormBackward;
use crate::cpu::{CpuBackend, fused, math};
use crate::cuda::kernels::Kernel;
use crate::linear::Activation;
use crate::norm::NormOps;
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
    // The kernel grid-strides both axes, so any grid covers the matrix; its blocks are 2-D.
    if config.block.2 != 1 {
        return Err(bad(0, "zc_bias_act_f32 takes two-dimensional blocks"));
    }
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

/// `act(x + bias) + residual`: the bias epilogue's twin, then the add.
pub(super) fn bias_act_add(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::BiasActAdd, args)?;
    let (out, residual, rows, n) = (k.ptr(0)?, k.ptr(3)?, k.u64(4)?, k.u64(5)?);
    // out, x, bias, rows, n, act: the epilogue's arguments.
    let epilogue = [args[0], args[1], args[2], args[4], args[5], args[6]];
    bias_act(config, &epilogue, mem)?;
    let len = rows
        .checked_mul(n)
        .ok_or_else(|| bad(5, "size overflows"))?;
    let (y, h) = (mem.read_f32(out, len)?, mem.read_f32(residual, len)?);
    let sum: Vec<f32> = y.iter().zip(&h).map(|(a, b)| a + b).collect();
    mem.write_f32(out, &sum)
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
    let r = NormOps::<f32>::layer_norm_backward_add(
        &CpuBackend,
        &LayerNormBackward {
            g: &g,
            residual: residual.as_ref(),
            x: &x,
            mean: &mean,
            rstd: &rstd,
            weight: weight.as_ref(),
        },
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

/// The pooled head's kernels index their threads by [`POOL_THREADS`] (fixed-order sums over
/// its warps), so they need exactly that block.
fn check_pool_block(k: Kernel, config: &LaunchConfig) -> Result<(), KernelFault> {
    let threads = crate::cuda::fused::POOL_THREADS;
    if config.block == (threads, 1, 1) {
        Ok(())
    } else {
        Err(bad(
            0,
            &format!("{} needs blocks of {threads} threads", k.spec().name),
        ))
    }
}

/// Writes `terms[b] = bce(logits[b], y[b])` and the logits, one block per sample, and with a
/// grid of one block the loss too.
pub(super) fn pool_head_bce(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    check_pool_block(Kernel::PoolHeadBce, config)?;
    let k = checked(Kernel::PoolHeadBce, args)?;
    let [b, s, d] = pool_shape(&k, 7)?;
    let h = tensor(mem, k.ptr(3)?, &[b, s, d])?;
    let w = tensor(mem, k.ptr(4)?, &[1, d])?;
    let bias = tensor(mem, k.ptr(5)?, &[1])?;
    let y = tensor(mem, k.ptr(6)?, &[b])?;
    let r = fused::pool_head_bce(&h, &w, &bias, &y).map_err(cpu_err)?;
    let logits = r.logits.to_vec();
    let terms: Vec<f32> = logits
        .iter()
        .zip(y.to_vec())
        .map(|(&x, t)| math::bce_with_logits(x, t))
        .collect();
    mem.write_f32(k.ptr(1)?, &terms)?;
    mem.write_f32(k.ptr(2)?, &logits)?;
    // A grid of one block takes the mean itself.
    if config.grid == (1, 1, 1) {
        mem.write_f32(k.ptr(0)?, &r.loss.to_vec())?;
    }
    Ok(())
}

/// `loss[0]` = the mean of the per-sample terms.
pub(super) fn pool_head_bce_finish(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    check_pool_block(Kernel::PoolHeadBceFinish, config)?;
    let k = checked(Kernel::PoolHeadBceFinish, args)?;
    let batch = k.u64(2)?;
    let terms = mem.read_f32(k.ptr(1)?, batch)?;
    let loss = math::pairwise_sum(&terms) / batch as f32;
    mem.write_f32(k.ptr(0)?, &[loss])
}

/// Writes every element of gh and one row of weight-gradient partials per block row of the
/// grid, each over the rows of h the kernel gives that block row (`p * 8 + ty`, stepping
/// `grid.y * 8`), so the finishing twin sees what the kernel leaves; with one block row, gb.
/// With `accumulate` (one block row only: the kernel's contract) it adds into the partials
/// (gw) and gb instead.
pub(super) fn pool_head_bce_backward(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let kernel = Kernel::PoolHeadBceBackward;
    check_block_32x8(kernel, config)?;
    let k = checked(kernel, args)?;
    let [b, s, d] = pool_shape(&k, 8)?;
    let g = tensor(mem, k.ptr(3)?, &[])?;
    let h = tensor(mem, k.ptr(4)?, &[b, s, d])?;
    let w = tensor(mem, k.ptr(5)?, &[1, d])?;
    let logits = tensor(mem, k.ptr(6)?, &[b])?;
    let y = tensor(mem, k.ptr(7)?, &[b])?;
    let accumulate = accumulate_flag(&k, 11)?;
    if accumulate && config.grid.1 != 1 {
        return Err(bad(
            11,
            "accumulate needs one block row (the finish kernel adds otherwise)",
        ));
    }
    let r = fused::pool_head_bce_backward(&g, &h, &w, &logits, &y).map_err(cpu_err)?;
    mem.write_f32(k.ptr(0)?, &r.h.to_vec())?;
    let scale = g.to_vec()[0] / b as f32;
    let inv_s = 1.0 / s as f32;
    let db: Vec<f32> = logits
        .to_vec()
        .into_iter()
        .zip(y.to_vec())
        .map(|(l, t)| (math::sigmoid(l) - t) * scale)
        .collect();
    let (hv, parts, step) = (
        h.to_vec(),
        config.grid.1 as usize,
        config.grid.1 as usize * 8,
    );
    let mut partials = vec![0.0f32; parts * d];
    for (p, row) in partials.chunks_mut(d.max(1)).enumerate() {
        for (j, out) in row.iter_mut().enumerate() {
            let mut total = 0.0f32;
            for ty in 0..8 {
                let mut acc = 0.0f32;
                for r in (p * 8 + ty..b * s).step_by(step) {
                    acc += db[r / s] * hv[r * d + j];
                }
                total += acc;
            }
            *out = total * inv_s;
        }
    }
    // One block row: its partials are gw, and it writes gb.
    if accumulate {
        add_into_mem(mem, k.ptr(1)?, &partials)?;
        add_into_mem(mem, k.ptr(2)?, &r.bias.to_vec())?;
        return Ok(());
    }
    mem.write_f32(k.ptr(1)?, &partials)?;
    if parts == 1 {
        mem.write_f32(k.ptr(2)?, &r.bias.to_vec())?;
    }
    Ok(())
}

/// The `accumulate` flag at `index`: 0 writes, 1 adds into the outputs.
fn accumulate_flag(k: &zdevice::sim::KernelArgs<'_>, index: usize) -> Result<bool, KernelFault> {
    match k.u32(index)? {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(bad(index, "accumulate flag is not 0 or 1")),
    }
}

/// `dst[i] += values[i]` in device memory (what an accumulating kernel does, one writer per
/// element).
fn add_into_mem(
    mem: &mut SimMemory<'_>,
    dst: zdevice::DevicePtr,
    values: &[f32],
) -> Result<(), KernelFault> {
    let old = mem.read_f32(dst, values.len() as u64)?;
    let sum: Vec<f32> = old.iter().zip(values).map(|(a, b)| a + b).collect();
    mem.write_f32(dst, &sum)
}

/// `gw[j]` = the sum of the partials' column j, `gb[0]` = the sum of `d_b`.
pub(super) fn pool_head_bce_backward_finish(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let kernel = Kernel::PoolHeadBceBackwardFinish;
    check_pool_block(kernel, config)?;
    let k = checked(kernel, args)?;
    let (b, parts, d) = (k.u64(6)?, k.u64(7)?, k.u64(8)?);
    let d_us = usize_of(d, 8)?;
    let partials = mem.read_f32(k.ptr(2)?, parts.saturating_mul(d))?;
    let mut gw = vec![0.0f32; d_us];
    for row in partials.chunks(d_us.max(1)) {
        for (acc, v) in gw.iter_mut().zip(row) {
            *acc += v;
        }
    }
    let scale = mem.read_f32(k.ptr(3)?, 1)?[0] / b as f32;
    let logits = mem.read_f32(k.ptr(4)?, b)?;
    let y = mem.read_f32(k.ptr(5)?, b)?;
    let db: Vec<f32> = logits
        .into_iter()
        .zip(y)
        .map(|(l, t)| (math::sigmoid(l) - t) * scale)
        .collect();
    let gb = [math::pairwise_sum(&db)];
    if accumulate_flag(&k, 9)? {
        add_into_mem(mem, k.ptr(0)?, &gw)?;
        return add_into_mem(mem, k.ptr(1)?, &gb);
    }
    mem.write_f32(k.ptr(0)?, &gw)?;
    mem.write_f32(k.ptr(1)?, &gb)
}

/// `args` without the entry at `index` (a ticketed kernel's tickets), for the twins of the two
/// launches it fuses.
fn without(args: &[KernelArg], index: usize) -> Vec<KernelArg> {
    let mut rest = args.to_vec();
    rest.remove(index);
    rest
}

/// The ticket at `args[index]` must be 0 before the launch (the kernel's last block leaves it
/// so).
fn ticket_clear(
    args: &[KernelArg],
    index: usize,
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let KernelArg::Ptr(ticket) = args[index] else {
        return Err(bad(index, "the ticket is not a pointer"));
    };
    if mem.read_f32(ticket, 1)?[0].to_bits() == 0 {
        Ok(())
    } else {
        Err(bad(index, "the ticket was not left at 0"))
    }
}

/// The pooled head's forward and its finish in one launch: the terms and logits as the first
/// launch writes them, the loss as the finish does.
pub(super) fn pool_head_bce_last(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    check_pool_block(Kernel::PoolHeadBceLast, config)?;
    checked(Kernel::PoolHeadBceLast, args)?;
    ticket_clear(args, 3, mem)?;
    let first = without(args, 3);
    pool_head_bce(config, &first, mem)?;
    // The finish: loss, terms, batch.
    let finish = [first[0], first[1], first[7]];
    let one = LaunchConfig {
        grid: (1, 1, 1),
        ..*config
    };
    pool_head_bce_finish(&one, &finish, mem)
}

/// The pooled head's backward and its finish in one launch: gh and the partials as the first
/// launch writes them (several block rows, so not accumulated), gw and gb as the finish does.
pub(super) fn pool_head_bce_backward_last(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    checked(Kernel::PoolHeadBceBackwardLast, args)?;
    if config.grid.1 < 2 {
        return Err(bad(1, "the one-launch backward needs several block rows"));
    }
    ticket_clear(args, 4, mem)?;
    // gh, partials, gb, g, h, w, logits, y, batch, s, d, accumulate (0: several block rows).
    let mut first = without(&without(args, 4), 2);
    first[11] = KernelArg::U32(0);
    pool_head_bce_backward(config, &first, mem)?;
    // gw, gb, partials, g, logits, y, batch, parts, d, accumulate.
    let parts = KernelArg::U64(u64::from(config.grid.1));
    let finish = [
        args[2], args[3], args[1], args[5], args[8], args[9], args[10], parts, args[12], args[13],
    ];
    let pool = LaunchConfig {
        grid: (1, 1, 1),
        block: (crate::cuda::fused::POOL_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    pool_head_bce_backward_finish(&pool, &finish, mem)
}
