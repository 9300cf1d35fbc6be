//! Simulated twin of `kernels/norm_params.cu`: LayerNorm's backward with the weight's and
//! bias's gradients, added into their buffers (few rows) or left as each chunk's sums in the
//! `[2, chunks, n]` partials (a batch's rows, chunks of `LN_PARAMS_MAX_ROWS`). The input
//! gradient is the CPU backend's (`layer_norm_backward_add`); the column sums walk a chunk's
//! rows in row order, as each thread of the kernel does. It also refuses what the kernel cannot
//! take (another block size, more rows than its shared memory holds without partials, a grid
//! that does not match the chunks), which the GPU would not report.

use super::common::{bad, checked, cpu_err, rows_tensor, usize_of};
use crate::backend::LayerNormBackward;
use crate::cpu::CpuBackend;
use crate::cuda::kernels::Kernel;
use crate::cuda::norm_params::{
    LN_PARAMS_MAX_ROWS, LN_PARAMS_THREADS, LN_PARTIALS_MAX_N, LN_PARTIALS_THREADS,
};
use crate::norm::NormOps;
use zdevice::sim::{KernelArgs, KernelFault, SimMemory};
use zdevice::{DevicePtr, KernelArg, LaunchConfig};

pub(super) fn layer_norm_backward_params(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    if config.block != (LN_PARAMS_THREADS, 1, 1) {
        return Err(bad(
            0,
            &format!(
                "zc_layer_norm_backward_params_f32 needs blocks of {LN_PARAMS_THREADS} threads, got {:?}",
                config.block
            ),
        ));
    }
    let k = checked(Kernel::LayerNormBackwardParams, args)?;
    let (rows, n) = (k.u64(14)?, k.u64(15)?);
    let part = k.ptr(16)?;
    let chunks = rows.div_ceil(LN_PARAMS_MAX_ROWS as u64).max(1);
    if part == DevicePtr::NULL && rows > LN_PARAMS_MAX_ROWS as u64 {
        return Err(bad(
            14,
            &format!("takes at most {LN_PARAMS_MAX_ROWS} rows without partials, got {rows}"),
        ));
    }
    if u64::from(config.grid.1) != chunks {
        return Err(bad(
            14,
            &format!(
                "{rows} rows are {chunks} chunks of {LN_PARAMS_MAX_ROWS}; the grid has {} block rows",
                config.grid.1
            ),
        ));
    }
    let (has_weight, has_residual) = (k.u32(9)? != 0, k.u32(10)? != 0);
    let (want_gx, has_dw, has_db) = (k.u32(11)? != 0, k.u32(12)? != 0, k.u32(13)? != 0);
    let n = usize_of(n, 15)?;
    let (g_xhat, g) = cpu_backward(mem, &k, 3, (rows, n), [has_weight, has_residual, want_gx])?;
    if part != DevicePtr::NULL {
        // Chunk c's sums at part[c * n ..] (g * xhat) and part[(chunks + c) * n ..] (g).
        let chunk_len = LN_PARAMS_MAX_ROWS * n;
        let mut out = Vec::with_capacity(2 * g.len().div_ceil(chunk_len).max(1) * n);
        for src in [&g_xhat, &g] {
            for chunk in src.chunks(chunk_len) {
                out.extend(column_sums(chunk, n));
            }
        }
        return mem.write_f32(part, &out);
    }
    // dst[j] += Σ_rows src[r, j], the rows summed in row order from zero.
    let mut add_col_sums = |index: usize, src: &[f32]| -> Result<(), KernelFault> {
        let p = k.ptr(index)?;
        let mut dst = mem.read_f32(p, n as u64)?;
        for (d, sum) in dst.iter_mut().zip(column_sums(src, n)) {
            *d += sum;
        }
        mem.write_f32(p, &dst)
    };
    if has_dw {
        add_col_sums(1, &g_xhat)?;
    }
    if has_db {
        add_col_sums(2, &g)?;
    }
    Ok(())
}

/// The CPU backend's LayerNorm backward over a kernel's operands, which stand at argument
/// indices `g_arg..g_arg + 6` in the order g, residual, x, mean, rstd, weight (the input
/// gradient at index 0): writes the input gradient when `want_gx`, returns g * xhat and g.
fn cpu_backward(
    mem: &mut SimMemory<'_>,
    k: &KernelArgs<'_>,
    g_arg: usize,
    (rows, n): (u64, usize),
    [has_weight, has_residual, want_gx]: [bool; 3],
) -> Result<(Vec<f32>, Vec<f32>), KernelFault> {
    let cols = n as u64;
    let g = rows_tensor(mem, k.ptr(g_arg)?, rows, cols)?;
    let residual = match has_residual {
        false => None,
        true => Some(rows_tensor(mem, k.ptr(g_arg + 1)?, rows, cols)?),
    };
    let x = rows_tensor(mem, k.ptr(g_arg + 2)?, rows, cols)?;
    let mean = rows_tensor(mem, k.ptr(g_arg + 3)?, rows, 1)?;
    let rstd = rows_tensor(mem, k.ptr(g_arg + 4)?, rows, 1)?;
    let weight = match has_weight {
        false => None,
        true => Some(
            rows_tensor(mem, k.ptr(g_arg + 5)?, 1, cols)?
                .reshape(&[n])
                .map_err(cpu_err)?,
        ),
    };
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
        [want_gx, true],
    )
    .map_err(cpu_err)?;
    if let Some(input) = r.input.filter(|_| want_gx) {
        mem.write_f32(k.ptr(0)?, &input.to_vec())?;
    }
    let g_xhat = r.g_xhat.map(|t| t.to_vec()).unwrap_or_default();
    Ok((g_xhat, g.to_vec()))
}

/// Σ_rows src[r, j] for each of the `n` columns of the dense rows `src`, in row order from zero.
fn column_sums(src: &[f32], n: usize) -> Vec<f32> {
    (0..n)
        .map(|j| src.iter().skip(j).step_by(n).fold(0.0f32, |acc, v| acc + v))
        .collect()
}

/// Twin of `zc_layer_norm_backward_partials_f32`: the input gradient (the CPU backend's), and
/// block b's sums of g * xhat and g over its `rows_per_block` rows into the `[2, blocks, n]`
/// partials, each warp's rows (w, w + 8, ...) in order and then the warps in order, as the
/// kernel adds them.
pub(super) fn layer_norm_backward_partials(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    if config.block != (LN_PARTIALS_THREADS, 1, 1) {
        return Err(bad(
            0,
            &format!(
                "zc_layer_norm_backward_partials_f32 needs blocks of {LN_PARTIALS_THREADS} threads, got {:?}",
                config.block
            ),
        ));
    }
    let k = checked(Kernel::LayerNormBackwardPartials, args)?;
    let (rows, n, per_block) = (k.u64(11)?, k.u64(12)?, k.u64(13)?);
    if n > LN_PARTIALS_MAX_N as u64 {
        return Err(bad(
            12,
            &format!("takes rows at most {LN_PARTIALS_MAX_N} wide, got {n}"),
        ));
    }
    let blocks = u64::from(config.grid.0);
    if per_block == 0 || rows.div_ceil(per_block) != blocks {
        return Err(bad(
            13,
            &format!("{rows} rows in blocks of {per_block} do not make the grid's {blocks}"),
        ));
    }
    let (has_weight, has_residual, want_gx) = (k.u32(8)? != 0, k.u32(9)? != 0, k.u32(10)? != 0);
    let n = usize_of(n, 12)?;
    let per_block = usize_of(per_block, 13)?;
    let (g_xhat, g) = cpu_backward(mem, &k, 2, (rows, n), [has_weight, has_residual, want_gx])?;
    let mut out = Vec::with_capacity(2 * blocks as usize * n);
    for src in [&g_xhat, &g] {
        for block in src.chunks(per_block * n) {
            out.extend(warp_ordered_sums(block, n));
        }
    }
    mem.write_f32(k.ptr(1)?, &out)
}

/// One block's column sums as the kernel adds them: warp w's rows w, w + 8, ... in order, then
/// the 8 warps' sums in warp order.
fn warp_ordered_sums(block: &[f32], n: usize) -> Vec<f32> {
    const WARPS: usize = (LN_PARTIALS_THREADS / 32) as usize;
    let rows = block.len() / n.max(1);
    let mut total = vec![0.0f32; n];
    for w in 0..WARPS {
        let mut warp = vec![0.0f32; n];
        for row in (w..rows).step_by(WARPS) {
            for (acc, v) in warp.iter_mut().zip(&block[row * n..(row + 1) * n]) {
                *acc += v;
            }
        }
        for (t, v) in total.iter_mut().zip(&warp) {
            *t += v;
        }
    }
    total
}
