//! The argument helpers every twin shares (argument checks, sizes, reading a matrix, error
//! conversion): the ground of `twins/`, which imports nothing from its siblings or from
//! `twins.rs`, so the twins depend on it and the table in `twins.rs` depends on the twins,
//! without a circle.

use crate::cuda::kernels::Kernel;
use crate::tensor::CpuTensor;
use zdevice::sim::{KernelArgs, KernelFault, SimMemory};
use zdevice::{DevicePtr, KernelArg};

pub(super) fn bad(index: usize, reason: &str) -> KernelFault {
    KernelFault::BadArgument {
        index,
        reason: reason.to_string(),
    }
}

pub(super) fn checked(k: Kernel, args: &[KernelArg]) -> Result<KernelArgs<'_>, KernelFault> {
    if k.accepts(args) {
        Ok(KernelArgs(args))
    } else {
        Err(bad(0, &format!("arguments do not match {}", k.spec().name)))
    }
}

pub(super) fn usize_of(v: u64, index: usize) -> Result<usize, KernelFault> {
    usize::try_from(v).map_err(|_| bad(index, "size does not fit usize"))
}

/// Reads a dense `[rows, n]` matrix as a CPU tensor.
pub(super) fn rows_tensor(
    mem: &SimMemory<'_>,
    p: DevicePtr,
    rows: u64,
    n: u64,
) -> Result<CpuTensor<f32>, KernelFault> {
    let data = mem.read_f32(p, rows.saturating_mul(n))?;
    let shape = [usize_of(rows, 2)?, usize_of(n, 3)?];
    CpuTensor::from_vec(data, &shape).map_err(|e| bad(2, &e.to_string()))
}

pub(super) fn cpu_err(e: crate::error::ComputeError) -> KernelFault {
    bad(0, &e.to_string())
}
