//! Simulated twins of the row kernels (`rows.cu`): softmax and LayerNorm rows, their
//! register-resident variants (which also check the width and alignment contract the GPU
//! relies on), and the fused backward kernels, which run the CPU backend's composite formulas
//! (`Backend`'s provided bodies) on the rows read from device memory.

use super::common::{bad, checked, cpu_err, rows_tensor, usize_of};
use crate::backend::Backend;
use crate::cpu::{self, CpuBackend};
use crate::cuda::kernels::Kernel;
use crate::tensor::CpuTensor;
use zdevice::sim::{KernelArgs, KernelFault, SimMemory};
use zdevice::{KernelArg, LaunchConfig};

/// `zc_softmax_rows_f32` as its 32 lanes compute it (`softmax_row_lanes`), not the CPU's
/// softmax: the per-lane online max and sum are where the kernel can go wrong (a lane that sees
/// only -inf once added `expf(-inf - -inf)` = NaN), so the twin runs the same arithmetic.
pub(super) fn softmax_rows(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::SoftmaxRows, args)?;
    let (out, x, rows, n) = (k.ptr(0)?, k.ptr(1)?, k.u64(2)?, k.u64(3)?);
    let x = mem.read_f32(x, rows.saturating_mul(n))?;
    let mut y = vec![0.0f32; x.len()];
    let n = usize_of(n, 3)?;
    if n > 0 {
        for (xr, yr) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
            softmax_row_lanes(xr, yr);
        }
    }
    mem.write_f32(out, &y)
}

/// The warp's lanes of `zc_softmax_rows_f32`.
const LANES: usize = 32;

/// `zc_maximum` (common.cuh): NaN wins, else the larger.
fn maximum(a: f32, b: f32) -> f32 {
    if a.is_nan() || a >= b { a } else { b }
}

/// `warp_sum` / `warp_max` (common.cuh): the xor butterfly, every lane combining with lane
/// `l ^ o` at once for o = 16, 8, 4, 2, 1.
fn butterfly(mut v: [f32; LANES], op: fn(f32, f32) -> f32) -> [f32; LANES] {
    for o in [16, 8, 4, 2, 1] {
        let prev = v;
        for (l, x) in v.iter_mut().enumerate() {
            *x = op(prev[l], prev[l ^ o]);
        }
    }
    v
}

/// One row of `zc_softmax_rows_f32`, lane by lane: each lane's online max and rescaled sum over
/// the columns `lane, lane + 32, ...` (a -inf adds nothing; a NaN goes in), the warp's max and
/// the sum of the lanes' sums rescaled to it (a lane that saw nothing adds 0), then
/// `exp(x - max) / sum` (NaN everywhere when the max is NaN).
pub(crate) fn softmax_row_lanes(x: &[f32], y: &mut [f32]) {
    let (mut m, mut s) = ([f32::NEG_INFINITY; LANES], [0.0f32; LANES]);
    for (j, &v) in x.iter().enumerate() {
        let lane = j % LANES;
        if v > m[lane] {
            s[lane] = s[lane] * (m[lane] - v).exp() + 1.0;
            m[lane] = v;
        } else if v != f32::NEG_INFINITY {
            s[lane] += (v - m[lane]).exp();
        }
    }
    let row_max = butterfly(m, maximum);
    let mut scaled = [0.0f32; LANES];
    for l in 0..LANES {
        scaled[l] = if s[l] == 0.0 {
            0.0
        } else {
            s[l] * (m[l] - row_max[l]).exp()
        };
    }
    let sum = butterfly(scaled, |a, b| a + b);
    for (j, (yj, &v)) in y.iter_mut().zip(x).enumerate() {
        let lane = j % LANES;
        let inv = if row_max[lane].is_nan() {
            row_max[lane]
        } else {
            1.0 / sum[lane]
        };
        *yj = (v - row_max[lane]).exp() * inv;
    }
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

#[cfg(test)]
mod tests {
    use super::softmax_row_lanes;
    use crate::backend::Backend;
    use crate::cpu::CpuBackend;

    /// Columns 0 and 32 (both of lane 0) masked to -inf in a row of 64, and a row of 37 whose
    /// lanes 5 and 6 see only -inf: each lane that saw only -inf adds nothing (the kernel's
    /// arithmetic before the fix added expf(-inf - -inf) = NaN there, and the whole row was
    /// NaN); the masked columns are 0, the rest the CPU's softmax within rounding.
    #[rstest::rstest]
    #[case::lane_zero_all_masked(64, &[0, 32])]
    #[case::short_row(37, &[5, 6])]
    fn a_lane_that_sees_only_minus_infinity_adds_nothing(
        #[case] n: usize,
        #[case] masked: &[usize],
    ) {
        let x: Vec<f32> = (0..n)
            .map(|j| {
                if masked.contains(&j) {
                    f32::NEG_INFINITY
                } else {
                    ((j * 7 % 11) as f32 - 5.0) / 3.0
                }
            })
            .collect();
        let mut y = vec![0.0f32; n];
        softmax_row_lanes(&x, &mut y);
        assert!(y.iter().all(|v| v.is_finite()), "{y:?}");
        let t = crate::tensor::CpuTensor::from_vec(x.clone(), &[1, n]).unwrap();
        let want = CpuBackend.softmax_last(&t).unwrap().to_vec();
        for (j, (a, b)) in y.iter().zip(&want).enumerate() {
            if masked.contains(&j) {
                assert_eq!(*a, 0.0, "column {j}");
            }
            assert!(
                (a - b).abs() <= 1e-6 * b.abs().max(1e-3),
                "column {j}: {a} vs {b}"
            );
        }
    }

    /// A NaN in the row makes the whole row NaN, as in the kernel (and the CPU).
    #[test]
    fn a_nan_propagates_to_the_row() {
        let mut x = vec![0.5f32; 40];
        x[3] = f32::NAN;
        let mut y = vec![0.0f32; 40];
        softmax_row_lanes(&x, &mut y);
        assert!(y.iter().all(|v| v.is_nan()));
    }
}
