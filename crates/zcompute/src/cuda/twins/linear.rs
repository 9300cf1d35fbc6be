//! Simulated twins of the small-row product kernels (`linear.cu`): each reads its operands
//! through the strides it is given, sums in f32 in row/k order and writes what the kernel
//! writes (never reading `out` when `beta` is 0, as the kernel does not). They also check the
//! launch shapes the kernels rely on (block sizes, a grid covering every column), which the
//! GPU would not report.

use super::{bad, checked, usize_of};
use crate::cuda::kernels::Kernel;
use crate::cuda::linear::{
    KMAJOR_COLS, KMAJOR_SPLIT, LINEAR_ROW_LIMIT, NMAJOR_COLS, NMAJOR_SLICES, linear_grads_vec4,
};
use zdevice::sim::{KernelFault, SimMemory};
use zdevice::{DevicePtr, KernelArg, LaunchConfig};

/// A matrix `[rows, cols]` read through its strides: the span it reaches, from its base.
struct Strided {
    data: Vec<f32>,
    row_stride: usize,
    col_stride: usize,
}

impl Strided {
    fn read(
        mem: &SimMemory<'_>,
        p: DevicePtr,
        (rows, cols): (usize, usize),
        (row_stride, col_stride): (u64, u64),
    ) -> Result<Self, KernelFault> {
        let (row_stride, col_stride) = (usize_of(row_stride, 7)?, usize_of(col_stride, 8)?);
        let span = if rows == 0 || cols == 0 {
            0
        } else {
            (rows - 1)
                .checked_mul(row_stride)
                .and_then(|a| {
                    (cols - 1)
                        .checked_mul(col_stride)
                        .and_then(|b| a.checked_add(b))
                })
                .and_then(|x| x.checked_add(1))
                .ok_or_else(|| bad(7, "strided span overflows"))?
        };
        Ok(Strided {
            data: mem.read_f32(p, span as u64)?,
            row_stride,
            col_stride,
        })
    }

    fn at(&self, r: usize, c: usize) -> f32 {
        self.data[r * self.row_stride + c * self.col_stride]
    }
}

fn rows_product(
    k_major: bool,
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let kernel = if k_major {
        Kernel::LinearRowsKMajor
    } else {
        Kernel::LinearRowsNMajor
    };
    let name = kernel.spec().name;
    let a = checked(kernel, args)?;
    let m = a.u32(4)? as usize;
    let (k, n) = (usize_of(a.u64(5)?, 5)?, usize_of(a.u64(6)?, 6)?);
    let (block, per_block) = if k_major {
        (KMAJOR_COLS * KMAJOR_SPLIT * 32, KMAJOR_COLS)
    } else {
        (NMAJOR_COLS * NMAJOR_SLICES, NMAJOR_COLS)
    };
    if config.block != (block, 1, 1) {
        return Err(bad(0, &format!("{name} needs blocks of {block} threads")));
    }
    if (config.grid.0 as usize) * (per_block as usize) < n || config.grid.1 != 1 {
        return Err(bad(
            0,
            &format!("{name}'s grid does not cover its {n} columns"),
        ));
    }
    if m == 0 || m > LINEAR_ROW_LIMIT {
        return Err(bad(
            4,
            &format!("{name} takes 1 to {LINEAR_ROW_LIMIT} rows"),
        ));
    }
    let ldb = a.u64(9)?;
    let lhs = Strided::read(mem, a.ptr(1)?, (m, k), (a.u64(7)?, a.u64(8)?))?;
    let rhs = if k_major {
        Strided::read(mem, a.ptr(2)?, (k, n), (1, ldb))?
    } else {
        Strided::read(mem, a.ptr(2)?, (k, n), (ldb, 1))?
    };
    let (beta, has_bias, act) = (a.f32(10)?, a.u32(11)? != 0, a.u32(12)?);
    if act > 1 {
        return Err(bad(12, "activation code is not 0 (identity) or 1 (tanh)"));
    }
    let bias = if has_bias {
        mem.read_f32(a.ptr(3)?, n as u64)?
    } else {
        Vec::new()
    };
    let out_ptr = a.ptr(0)?;
    let old = if beta != 0.0 {
        mem.read_f32(out_ptr, (m * n) as u64)?
    } else {
        Vec::new()
    };
    let mut out = vec![0.0f32; m * n];
    for r in 0..m {
        for j in 0..n {
            let mut acc = 0.0f32;
            for kk in 0..k {
                acc = lhs.at(r, kk).mul_add(rhs.at(kk, j), acc);
            }
            let mut v = if has_bias { acc + bias[j] } else { acc };
            if act == 1 {
                v = v.tanh();
            }
            if beta != 0.0 {
                v = beta.mul_add(old[r * n + j], v);
            }
            out[r * n + j] = v;
        }
    }
    mem.write_f32(out_ptr, &out)
}

pub(super) fn rows_kmajor(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    rows_product(true, config, args, mem)
}

pub(super) fn rows_nmajor(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    rows_product(false, config, args, mem)
}

pub(super) fn param_grads(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let a = checked(Kernel::LinearParamGrads, args)?;
    let rows = a.u32(4)? as usize;
    let (outs, ins) = (usize_of(a.u64(5)?, 5)?, usize_of(a.u64(6)?, 6)?);
    let (dw_ptr, db_ptr, g_ptr, x_ptr) = (a.ptr(0)?, a.ptr(1)?, a.ptr(2)?, a.ptr(3)?);
    let (x_rs, x_cs, ldw) = (a.u64(9)?, a.u64(10)?, a.u64(11)?);
    let vec4 = linear_grads_vec4(ins, ldw, x_rs, x_cs, [dw_ptr, x_ptr]);
    let cols = if vec4 { ins / 4 } else { ins };
    let (gx, gy) = (config.grid.0 as usize, config.grid.1 as usize);
    let (bx, by) = (config.block.0 as usize, config.block.1 as usize);
    if config.block.2 != 1 || gx * bx < cols || gy * by < outs {
        return Err(bad(0, "zc_linear_param_grads_f32's grid does not cover dw"));
    }
    let g = Strided::read(mem, g_ptr, (rows, outs), (a.u64(7)?, a.u64(8)?))?;
    let x = Strided::read(mem, x_ptr, (rows, ins), (x_rs, x_cs))?;
    let ldw = usize_of(ldw, 11)?;
    for o in 0..outs {
        let row_ptr = dw_ptr.offset((o * ldw * 4) as u64);
        let mut dw = mem.read_f32(row_ptr, ins as u64)?;
        for (i, d) in dw.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            for r in 0..rows {
                acc = g.at(r, o).mul_add(x.at(r, i), acc);
            }
            *d += acc;
        }
        mem.write_f32(row_ptr, &dw)?;
    }
    if a.u32(13)? != 0 {
        let db_stride = usize_of(a.u64(12)?, 12)?;
        for o in 0..outs {
            let p = db_ptr.offset((o * db_stride * 4) as u64);
            let sum: f32 = (0..rows).map(|r| g.at(r, o)).sum();
            let old = mem.read_f32(p, 1)?[0];
            mem.write_f32(p, &[old + sum])?;
        }
    }
    Ok(())
}
