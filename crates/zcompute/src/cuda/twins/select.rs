//! Simulated twins of `select.cu`: the CPU backend's loops (`cpu/select.rs`) over simulated
//! memory, reading indices and the step when the kernel runs.

use super::common::{checked, usize_of};
use crate::cpu::indexed::row_of;
use crate::cpu::select::argmax_row;
use crate::cuda::kernels::Kernel;
use crate::random::{dropout_keeps, dropout_step};
use zdevice::sim::{KernelFault, SimMemory};
use zdevice::{KernelArg, LaunchConfig};

pub(super) fn select(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::Select, args)?;
    let (out, cond, a, b, n) = (k.ptr(0)?, k.ptr(1)?, k.ptr(2)?, k.ptr(3)?, k.u64(4)?);
    let (c, a, b) = (
        mem.read_f32(cond, n)?,
        mem.read_f32(a, n)?,
        mem.read_f32(b, n)?,
    );
    let values: Vec<f32> = c
        .iter()
        .zip(a.iter().zip(&b))
        .map(|(&c, (&a, &b))| {
            if c.is_nan() {
                f32::NAN
            } else if c != 0.0 {
                a
            } else {
                b
            }
        })
        .collect();
    mem.write_f32(out, &values)
}

pub(super) fn argmax_rows(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::ArgmaxRows, args)?;
    let (out, x, rows, n) = (k.ptr(0)?, k.ptr(1)?, k.u64(2)?, k.u64(3)?);
    let data = mem.read_f32(x, rows.saturating_mul(n))?;
    let values: Vec<f32> = data
        .chunks(usize_of(n, 3)?.max(1))
        .map(|row| argmax_row(row) as f32)
        .collect();
    mem.write_f32(out, &values)
}

pub(super) fn index_add_rows(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::IndexAddRows, args)?;
    let (dst, src, index) = (k.ptr(0)?, k.ptr(1)?, k.ptr(2)?);
    let (rows, len, n) = (k.u64(3)?, k.u64(4)?, k.u64(5)?);
    let (rows_us, len_us) = (usize_of(rows, 3)?, usize_of(len, 4)?);
    let indices = mem.read_f32(index, n)?;
    let src = mem.read_f32(src, n.saturating_mul(len))?;
    let mut out = mem.read_f32(dst, rows.saturating_mul(len))?;
    for (i, at) in indices.iter().enumerate() {
        let Some(r) = row_of(f64::from(*at), rows_us) else {
            continue;
        };
        let rows_of = |t: usize| t * len_us..(t + 1) * len_us;
        for (d, s) in out[rows_of(r)].iter_mut().zip(&src[rows_of(i)]) {
            *d += *s;
        }
    }
    mem.write_f32(dst, &out)
}

pub(super) fn dropout_mask(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::DropoutMask, args)?;
    let (out, step, n) = (k.ptr(0)?, k.ptr(1)?, k.u64(2)?);
    let seed = u64::from(k.u32(3)?) | (u64::from(k.u32(4)?) << 32);
    let (stream, threshold, scale) = (k.u32(5)?, k.u32(6)?, k.f32(7)?);
    let at = mem.read_f32(step, 1)?[0];
    let values: Vec<f32> = match dropout_step(f64::from(at)) {
        Some(s) => (0..n)
            .map(|i| {
                if dropout_keeps(seed, s, stream, i, threshold) {
                    scale
                } else {
                    0.0
                }
            })
            .collect(),
        None => vec![f32::NAN; usize_of(n, 2)?],
    };
    mem.write_f32(out, &values)
}
