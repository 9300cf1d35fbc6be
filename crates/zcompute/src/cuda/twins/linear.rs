//! Simulated twins of the small-row product kernels (`linear.cu`, `linear_backward.cu`): each
//! reads its operands through the strides it is given, sums in f32 in row/k order and writes
//! what the kernel writes (never reading `out` when `beta` is 0, as the kernel does not). They also check the
//! launch shapes the kernels rely on (block sizes, a grid covering every column), which the
//! GPU would not report. The products' bf16 forms round every operand element as
//! `zdevice::rounding` does (the kernel's formula), or read it from a bf16 copy, and take tanh
//! from the CPU backend, as the bias epilogue's twin does, so a bf16 Linear forward in one
//! launch equals its product then `bias_act` here as on the GPU.

use super::common::{bad, checked, usize_of};
use crate::cuda::kernels::Kernel;
use crate::cuda::linear::{
    GRADS_BF16_FORMS, GRADS_BLOCK, KMAJOR_COLS, KMAJOR_SPLIT, LINEAR_ROW_LIMIT, NMAJOR_COLS,
    NMAJOR_SLICES, ROWS_BF16_FORMS, linear_grads_bf16_vec4, linear_grads_vec4,
};
use crate::cuda::linear_backward::{BACKWARD_THREADS, BackwardGrid};
use crate::element::Element;
use zdevice::rounding::{f32_from_bf16_bits, round_to_bf16};
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
        let span = Strided::span((rows, cols), (row_stride, col_stride))?;
        Ok(Strided {
            data: mem.read_f32(p, span)?,
            row_stride: usize_of(row_stride, 7)?,
            col_stride: usize_of(col_stride, 8)?,
        })
    }

    /// `read` for a bf16 form's operand: each element rounded to bf16, or (`copy`) read from
    /// a bf16 copy, two bytes an element.
    fn read_bf16(
        mem: &SimMemory<'_>,
        p: DevicePtr,
        dims: (usize, usize),
        strides: (u64, u64),
        copy: bool,
    ) -> Result<Self, KernelFault> {
        if !copy {
            let mut s = Strided::read(mem, p, dims, strides)?;
            s.data.iter_mut().for_each(|v| *v = round_to_bf16(*v));
            return Ok(s);
        }
        // The span in elements, as `read` finds it, read as bf16.
        let span = Strided::span(dims, strides)?;
        let bytes = mem.read_bytes(p, span * 2)?;
        Ok(Strided {
            data: bytes
                .chunks_exact(2)
                .map(|c| f32_from_bf16_bits(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
            row_stride: usize_of(strides.0, 7)?,
            col_stride: usize_of(strides.1, 8)?,
        })
    }

    /// Elements from the first to the last one a `[rows, cols]` view reaches, inclusive.
    fn span(
        (rows, cols): (usize, usize),
        (row_stride, col_stride): (u64, u64),
    ) -> Result<u64, KernelFault> {
        let (row_stride, col_stride) = (usize_of(row_stride, 7)?, usize_of(col_stride, 8)?);
        if rows == 0 || cols == 0 {
            return Ok(0);
        }
        (rows - 1)
            .checked_mul(row_stride)
            .and_then(|a| {
                (cols - 1)
                    .checked_mul(col_stride)
                    .and_then(|b| a.checked_add(b))
            })
            .and_then(|x| x.checked_add(1))
            .map(|x| x as u64)
            .ok_or_else(|| bad(7, "strided span overflows"))
    }

    fn at(&self, r: usize, c: usize) -> f32 {
        self.data[r * self.row_stride + c * self.col_stride]
    }
}

fn rows_product(
    (k_major, bf16): (bool, bool),
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let kernel = match (k_major, bf16) {
        (true, false) => Kernel::LinearRowsKMajor,
        (false, false) => Kernel::LinearRowsNMajor,
        (true, true) => Kernel::LinearRowsKMajorBf16,
        (false, true) => Kernel::LinearRowsNMajorBf16,
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
    let packed = if bf16 { a.u32(14)? } else { 0 };
    if bf16 && !ROWS_BF16_FORMS.contains(&packed) {
        return Err(bad(
            14,
            "packed is not a form the kernel is built for (0, 2 or 3)",
        ));
    }
    let operand = |p, dims, strides, copy| {
        if bf16 {
            Strided::read_bf16(mem, p, dims, strides, copy)
        } else {
            Strided::read(mem, p, dims, strides)
        }
    };
    let lhs = operand(a.ptr(1)?, (m, k), (a.u64(7)?, a.u64(8)?), packed & 1 != 0)?;
    let b_strides = if k_major { (1, ldb) } else { (ldb, 1) };
    let rhs = operand(a.ptr(2)?, (k, n), b_strides, packed & 2 != 0)?;
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
    let residual_ptr = a.ptr(13)?;
    let residual = if residual_ptr == DevicePtr::NULL {
        None
    } else {
        Some(mem.read_f32(residual_ptr, (m * n) as u64)?)
    };
    let mut out = vec![0.0f32; m * n];
    for r in 0..m {
        let mut row: Vec<f32> = (0..n)
            .map(|j| {
                let mut acc = 0.0f32;
                for kk in 0..k {
                    acc = lhs.at(r, kk).mul_add(rhs.at(kk, j), acc);
                }
                if has_bias { acc + bias[j] } else { acc }
            })
            .collect();
        if act == 1 && bf16 {
            f32::tanh_slice(&mut row);
        }
        for (j, &z) in row.iter().enumerate() {
            let mut v = z;
            if act == 1 && !bf16 {
                v = v.tanh();
            }
            if let Some(res) = &residual {
                v += res[r * n + j];
            }
            if beta != 0.0 {
                v = beta.mul_add(old[r * n + j], v);
            }
            out[r * n + j] = v;
        }
    }
    mem.write_f32(out_ptr, &out)
}

/// `zc_linear_rows_kmajor_f32` (BF16 = false) and its bf16 form.
pub(super) fn rows_kmajor<const BF16: bool>(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    rows_product((true, BF16), config, args, mem)
}

/// `zc_linear_rows_nmajor_f32` (BF16 = false) and its bf16 form.
pub(super) fn rows_nmajor<const BF16: bool>(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    rows_product((false, BF16), config, args, mem)
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

/// `zc_linear_param_grads_bf16`: dw += g'ᵀ · x', every element of g and x rounded to bf16 (or
/// read from a bf16 copy, as `packed` says), each element's sum in row order. Checks the
/// grid covers dw with the host's blocks (a float4 of dw a thread where
/// `linear_grads_bf16_vec4` holds, as the kernel decides), and refuses the forms the kernel
/// is not built for.
pub(super) fn param_grads_bf16(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let a = checked(Kernel::LinearParamGradsBf16, args)?;
    let rows = a.u32(3)? as usize;
    let (outs, ins) = (usize_of(a.u64(4)?, 4)?, usize_of(a.u64(5)?, 5)?);
    let (dw_ptr, g_ptr, x_ptr) = (a.ptr(0)?, a.ptr(1)?, a.ptr(2)?);
    let packed = a.u32(11)?;
    if !GRADS_BF16_FORMS.contains(&packed) {
        return Err(bad(
            11,
            "packed is not a form the kernel is built for (0 or 3)",
        ));
    }
    let (x_rs, x_cs, ldw) = (a.u64(8)?, a.u64(9)?, a.u64(10)?);
    let vec4 = linear_grads_bf16_vec4(ins, ldw, (x_rs, x_cs), (dw_ptr, x_ptr), packed & 2 != 0);
    let cols = if vec4 { ins / 4 } else { ins };
    if config.block != (GRADS_BLOCK.0, GRADS_BLOCK.1, 1)
        || (config.grid.0 as usize) * (GRADS_BLOCK.0 as usize) < cols
        || (config.grid.1 as usize) * (GRADS_BLOCK.1 as usize) < outs
    {
        return Err(bad(
            0,
            "zc_linear_param_grads_bf16's grid does not cover dw",
        ));
    }
    let g = Strided::read_bf16(
        mem,
        g_ptr,
        (rows, outs),
        (a.u64(6)?, a.u64(7)?),
        packed & 1 != 0,
    )?;
    let x = Strided::read_bf16(mem, x_ptr, (rows, ins), (x_rs, x_cs), packed & 2 != 0)?;
    let ldw = usize_of(ldw, 10)?;
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
    if a.u32(17)? != 0 {
        let gf = Strided::read(mem, a.ptr(13)?, (rows, outs), (a.u64(14)?, a.u64(15)?))?;
        let db_stride = usize_of(a.u64(16)?, 16)?;
        let db_ptr = a.ptr(12)?;
        for o in 0..outs {
            let p = db_ptr.offset((o * db_stride * 4) as u64);
            let mut sum = 0.0f32;
            for r in 0..rows {
                sum += gf.at(r, o);
            }
            let old = mem.read_f32(p, 1)?[0];
            mem.write_f32(p, &[old + sum])?;
        }
    }
    Ok(())
}

/// `zc_linear_backward_f32`: gz = g (or g · (1 - y²) for tanh), gx = gz · w when the grid has
/// product blocks, dw += gzᵀ · x and db += Σ_rows gz, each sum in row/k order. Checks that
/// the grid is exactly the product's blocks plus the parameter-gradient blocks the host sized
/// (the kernel splits the grid by `dx_blocks` and `grads_cols`).
pub(super) fn backward(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    backward_form(Kernel::LinearBackward, config, args, mem)
}

/// `zc_linear_backward_bf16`: `backward` with both products on bf16 operands, gz rounded as
/// the composite's copy holds it (`zc_tanh_backward_bf16`'s formula, then the rounding) and w
/// and x read from their bf16 copies (`packed` = 3, the only form the kernel is built for);
/// db sums the unrounded gz. The float4 test of its parameter-gradient blocks is the bf16
/// kernel's (`linear_grads_bf16_vec4` on a copy).
pub(super) fn backward_bf16(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    backward_form(Kernel::LinearBackwardBf16, config, args, mem)
}

fn backward_form(
    kernel: Kernel,
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let name = kernel.spec().name;
    let a = checked(kernel, args)?;
    let bf16 = kernel == Kernel::LinearBackwardBf16;
    if bf16 && a.u32(23)? != 3 {
        return Err(bad(23, "packed is not a form the kernel is built for (3)"));
    }
    let rows = a.u32(7)? as usize;
    let (outs, ins) = (usize_of(a.u64(8)?, 8)?, usize_of(a.u64(9)?, 9)?);
    if rows == 0 || rows > LINEAR_ROW_LIMIT {
        return Err(bad(
            7,
            &format!("{name} takes 1 to {LINEAR_ROW_LIMIT} rows"),
        ));
    }
    let (gx_ptr, dw_ptr, db_ptr, g_ptr, y_ptr, w_ptr, x_ptr) = (
        a.ptr(0)?,
        a.ptr(1)?,
        a.ptr(2)?,
        a.ptr(3)?,
        a.ptr(4)?,
        a.ptr(5)?,
        a.ptr(6)?,
    );
    let (ldb, x_rs, x_cs, ldw) = (a.u64(14)?, a.u64(15)?, a.u64(16)?, a.u64(17)?);
    let (has_db, tanh) = (a.u32(19)? != 0, a.u32(20)? != 0);
    let (dx_blocks, grads_cols) = (u64::from(a.u32(21)?), u64::from(a.u32(22)?));
    let vec4 = if bf16 {
        linear_grads_bf16_vec4(ins, ldw, (x_rs, x_cs), (dw_ptr, x_ptr), true)
    } else {
        linear_grads_vec4(ins, ldw, x_rs, x_cs, [dw_ptr, x_ptr])
    };
    let cols = if vec4 { ins / 4 } else { ins };
    check_backward_grid(
        name,
        config,
        BackwardGrid::new(dx_blocks, cols as u64, outs as u64),
        grads_cols,
    )?;
    if dx_blocks > 0 && dx_blocks * u64::from(NMAJOR_COLS) < ins as u64 {
        return Err(bad(21, &format!("{name}'s product blocks do not cover gx")));
    }
    let g = Strided::read(mem, g_ptr, (rows, outs), (a.u64(10)?, a.u64(11)?))?;
    let y = if tanh {
        Some(Strided::read(
            mem,
            y_ptr,
            (rows, outs),
            (a.u64(12)?, a.u64(13)?),
        )?)
    } else {
        None
    };
    // gz as tanh_backward writes it (the CPU formula), dense [rows, outs].
    let gz: Vec<f32> = (0..rows)
        .flat_map(|r| (0..outs).map(move |o| (r, o)))
        .map(|(r, o)| {
            let v = g.at(r, o);
            y.as_ref()
                .map_or(v, |y| v * (1.0 - y.at(r, o) * y.at(r, o)))
        })
        .collect();
    // What the products read: gz, or its bf16 copy's values.
    let gz_product: Vec<f32> = if bf16 {
        gz.iter().map(|v| round_to_bf16(*v)).collect()
    } else {
        gz.clone()
    };
    let x = if bf16 {
        Strided::read_bf16(mem, x_ptr, (rows, ins), (x_rs, x_cs), true)?
    } else {
        Strided::read(mem, x_ptr, (rows, ins), (x_rs, x_cs))?
    };
    if dx_blocks > 0 {
        let w = if bf16 {
            Strided::read_bf16(mem, w_ptr, (outs, ins), (ldb, 1), true)?
        } else {
            Strided::read(mem, w_ptr, (outs, ins), (ldb, 1))?
        };
        mem.write_f32(gx_ptr, &input_gradient(&gz_product, &w, (rows, outs, ins)))?;
    }
    add_weight_gradient(
        mem,
        dw_ptr,
        usize_of(ldw, 17)?,
        &gz_product,
        &x,
        (rows, outs, ins),
    )?;
    if has_db {
        add_bias_gradient(mem, db_ptr, usize_of(a.u64(18)?, 18)?, &gz, (rows, outs))?;
    }
    Ok(())
}

/// Refuses a backward launch whose blocks are not 512 threads or whose grid is not exactly
/// `want`'s product and parameter-gradient blocks (`grads_cols` as the host sized them).
fn check_backward_grid(
    name: &str,
    config: &LaunchConfig,
    want: BackwardGrid,
    grads_cols: u64,
) -> Result<(), KernelFault> {
    if config.block != (BACKWARD_THREADS, 1, 1) {
        return Err(bad(0, &format!("{name} needs blocks of 512 threads")));
    }
    if grads_cols != want.grads_cols
        || u64::from(config.grid.0) != want.blocks()
        || config.grid.1 != 1
        || config.grid.2 != 1
    {
        return Err(bad(
            0,
            &format!("{name}'s grid is not its product and gradient blocks"),
        ));
    }
    Ok(())
}

/// gx = gz · w, dense `[rows, ins]`, each sum in k order.
fn input_gradient(gz: &[f32], w: &Strided, (rows, outs, ins): (usize, usize, usize)) -> Vec<f32> {
    let mut gx = vec![0.0f32; rows * ins];
    for r in 0..rows {
        for j in 0..ins {
            let mut acc = 0.0f32;
            for k in 0..outs {
                acc = gz[r * outs + k].mul_add(w.at(k, j), acc);
            }
            gx[r * ins + j] = acc;
        }
    }
    gx
}

/// dw += gzᵀ · x, row `o` of dw at `o * ldw` elements from `dw_ptr`, each sum in row order.
fn add_weight_gradient(
    mem: &mut SimMemory<'_>,
    dw_ptr: DevicePtr,
    ldw: usize,
    gz: &[f32],
    x: &Strided,
    (rows, outs, ins): (usize, usize, usize),
) -> Result<(), KernelFault> {
    for o in 0..outs {
        let row_ptr = dw_ptr.offset((o * ldw * 4) as u64);
        let mut dw = mem.read_f32(row_ptr, ins as u64)?;
        for (i, d) in dw.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            for r in 0..rows {
                acc = gz[r * outs + o].mul_add(x.at(r, i), acc);
            }
            *d += acc;
        }
        mem.write_f32(row_ptr, &dw)?;
    }
    Ok(())
}

/// db += Σ_rows gz, element `o` of db at `o * db_stride` elements from `db_ptr`.
fn add_bias_gradient(
    mem: &mut SimMemory<'_>,
    db_ptr: DevicePtr,
    db_stride: usize,
    gz: &[f32],
    (rows, outs): (usize, usize),
) -> Result<(), KernelFault> {
    for o in 0..outs {
        let p = db_ptr.offset((o * db_stride * 4) as u64);
        let sum: f32 = (0..rows).map(|r| gz[r * outs + o]).sum();
        let old = mem.read_f32(p, 1)?[0];
        mem.write_f32(p, &[old + sum])?;
    }
    Ok(())
}
