//! Simulated twin of `kernels/norm_params.cu`: LayerNorm's backward for few rows with the
//! weight's and bias's gradients added into their buffers. The input gradient is the CPU
//! backend's (`layer_norm_backward_add`); the column sums walk the rows in row order, as each
//! thread of the kernel does. It also refuses what the kernel cannot take (another block size,
//! more rows than its shared memory holds), which the GPU would not report.

use super::{bad, checked, cpu_err, rows_tensor, usize_of};
use crate::cpu::CpuBackend;
use crate::cuda::kernels::Kernel;
use crate::cuda::norm_params::{LN_PARAMS_MAX_ROWS, LN_PARAMS_THREADS};
use crate::norm::NormOps;
use zdevice::sim::{KernelFault, SimMemory};
use zdevice::{KernelArg, LaunchConfig};

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
    if rows > LN_PARAMS_MAX_ROWS as u64 {
        return Err(bad(
            14,
            &format!("takes at most {LN_PARAMS_MAX_ROWS} rows, got {rows}"),
        ));
    }
    let (has_weight, has_residual) = (k.u32(9)? != 0, k.u32(10)? != 0);
    let (want_gx, has_dw, has_db) = (k.u32(11)? != 0, k.u32(12)? != 0, k.u32(13)? != 0);
    let g = rows_tensor(mem, k.ptr(3)?, rows, n)?;
    let residual = match has_residual {
        false => None,
        true => Some(rows_tensor(mem, k.ptr(4)?, rows, n)?),
    };
    let x = rows_tensor(mem, k.ptr(5)?, rows, n)?;
    let mean = rows_tensor(mem, k.ptr(6)?, rows, 1)?;
    let rstd = rows_tensor(mem, k.ptr(7)?, rows, 1)?;
    let weight = match has_weight {
        false => None,
        true => Some(
            rows_tensor(mem, k.ptr(8)?, 1, n)?
                .reshape(&[usize_of(n, 15)?])
                .map_err(cpu_err)?,
        ),
    };
    let r = NormOps::<f32>::layer_norm_backward_add(
        &CpuBackend,
        &g,
        residual.as_ref(),
        &x,
        &mean,
        &rstd,
        weight.as_ref(),
        [want_gx, has_dw],
    )
    .map_err(cpu_err)?;
    if let Some(input) = r.input {
        mem.write_f32(k.ptr(0)?, &input.to_vec())?;
    }
    let n = usize_of(n, 15)?;
    // dst[j] += Σ_rows src[r, j], the rows summed in row order from zero.
    let mut add_col_sums = |index: usize, src: &[f32]| -> Result<(), KernelFault> {
        let p = k.ptr(index)?;
        let mut dst = mem.read_f32(p, n as u64)?;
        for (j, d) in dst.iter_mut().enumerate() {
            let sum = src.iter().skip(j).step_by(n).fold(0.0f32, |acc, v| acc + v);
            *d += sum;
        }
        mem.write_f32(p, &dst)
    };
    if let Some(g_xhat) = r.g_xhat.filter(|_| has_dw) {
        add_col_sums(1, &g_xhat.to_vec())?;
    }
    if has_db {
        add_col_sums(2, &g.to_vec())?;
    }
    Ok(())
}
