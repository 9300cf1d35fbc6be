//! Simulated twins of `convert.cu`: zdevice's `rounding` functions over simulated memory, the
//! same integer arithmetic as the kernels (bit for bit on every input).

use super::common::{checked, cpu_err, rows_tensor};
use crate::cuda::kernels::Kernel;
use zdevice::rounding::{bf16_bits, f32_from_bf16_bits};
use zdevice::sim::{KernelFault, SimMemory};
use zdevice::{KernelArg, LaunchConfig};

/// Bytes of `n` bf16 elements, or a fault when that overflows.
fn bf16_len(n: u64, ptr: zdevice::DevicePtr) -> Result<u64, KernelFault> {
    n.checked_mul(2).ok_or(KernelFault::OutOfBounds {
        ptr,
        len: u64::MAX,
        size: 0,
    })
}

pub(super) fn f32_to_bf16(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::F32ToBf16, args)?;
    let (out, input, n) = (k.ptr(0)?, k.ptr(1)?, k.u64(2)?);
    let bytes: Vec<u8> = mem
        .read_f32(input, n)?
        .into_iter()
        .flat_map(|v| bf16_bits(v).to_le_bytes())
        .collect();
    mem.check(out, bf16_len(n, out)?)?;
    mem.write_bytes(out, &bytes)
}

pub(super) fn bf16_to_f32(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::Bf16ToF32, args)?;
    let (out, input, n) = (k.ptr(0)?, k.ptr(1)?, k.u64(2)?);
    let values: Vec<f32> = mem
        .read_bytes(input, bf16_len(n, input)?)?
        .chunks_exact(2)
        .map(|c| f32_from_bf16_bits(u16::from_le_bytes([c[0], c[1]])))
        .collect();
    mem.write_f32(out, &values)
}

/// `zc_tanh_backward_bf16`: tanh's backward as its own twin computes it (the CPU's
/// `tanh_backward`), and that result's bf16 copy (`bf16_bits`).
pub(super) fn tanh_backward_bf16(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::TanhBackwardBf16, args)?;
    let (gz_ptr, out, n) = (k.ptr(0)?, k.ptr(1)?, k.u64(4)?);
    let g = rows_tensor(mem, k.ptr(2)?, 1, n)?;
    let y = rows_tensor(mem, k.ptr(3)?, 1, n)?;
    let gz = crate::cpu::fused::tanh_backward(&g, &y)
        .map_err(cpu_err)?
        .to_vec();
    let bytes: Vec<u8> = gz
        .iter()
        .flat_map(|&v| bf16_bits(v).to_le_bytes())
        .collect();
    mem.check(out, bf16_len(n, out)?)?;
    mem.write_f32(gz_ptr, &gz)?;
    mem.write_bytes(out, &bytes)
}
