//! Simulated twins of `kernels/attention.cu`: the CPU backend's per-(batch, head) attention
//! (`cpu::attention`, the same algorithm the kernels run) over device memory, after checking
//! the launch contract the GPU relies on: one block of 8 warps per (batch, head), the shapes
//! the kernels take and enough dynamic shared memory for them.

use super::{bad, checked};
use crate::cpu::attention::{Params, backward_slices, forward_slices};
use crate::cuda::attention::{FUSED_MAX_DH, FUSED_MAX_SEQ, WARPS};
use crate::cuda::kernels::Kernel;
use crate::validate::Attention;
use zdevice::sim::{KernelArgs, KernelFault, SimMemory};
use zdevice::{KernelArg, LaunchConfig};

/// The sizes at `first` (batch, seq, heads, dh), checked against the launch.
fn launch_shape(
    config: &LaunchConfig,
    k: &KernelArgs<'_>,
    first: usize,
    shared: fn(Attention) -> usize,
) -> Result<Attention, KernelFault> {
    let size = |i: usize| k.u32(i).map(|v| v as usize);
    let a = Attention {
        batch: size(first)?,
        seq: size(first + 1)?,
        heads: size(first + 2)?,
        dh: size(first + 3)?,
    };
    if a.seq == 0 || a.seq > FUSED_MAX_SEQ || a.dh == 0 || a.dh > FUSED_MAX_DH {
        return Err(bad(
            first + 1,
            "sequence or head width outside the fused kernels' range",
        ));
    }
    if config.grid.0 as usize != a.batch * a.heads || config.block.0 as usize != WARPS * 32 {
        return Err(bad(0, "launch is not one 8-warp block per (batch, head)"));
    }
    if (config.shared_mem_bytes as usize) < shared(a) {
        return Err(bad(0, "too little dynamic shared memory for this shape"));
    }
    Ok(a)
}

fn params(
    k: &KernelArgs<'_>,
    mem: &SimMemory<'_>,
    first: usize,
    a: Attention,
    eps: f32,
) -> Result<Params<f32>, KernelFault> {
    let read = |i: usize| mem.read_f32(k.ptr(i)?, a.dh as u64);
    Ok(Params {
        q_weight: read(first)?,
        q_bias: read(first + 1)?,
        k_weight: read(first + 2)?,
        k_bias: read(first + 3)?,
        eps,
    })
}

fn qkv_len(a: Attention) -> u64 {
    (a.batch * a.seq * 3 * a.heads * a.dh) as u64
}

/// `out, qkv, qw, qb, kw, kb, batch, seq, heads, dh, eps`.
pub(super) fn forward(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::QkNormAttention, args)?;
    let a = launch_shape(config, &k, 6, crate::cuda::attention::forward_shared_bytes)?;
    let p = params(&k, mem, 2, a, k.f32(10)?)?;
    let qkv = mem.read_f32(k.ptr(1)?, qkv_len(a))?;
    mem.write_f32(k.ptr(0)?, &forward_slices(&qkv, a, &p))
}

/// `g_qkv, partials, g, qkv, qw, qb, kw, kb, batch, seq, heads, dh, eps`.
pub(super) fn backward(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::QkNormAttentionBackward, args)?;
    let a = launch_shape(config, &k, 8, crate::cuda::attention::backward_shared_bytes)?;
    let p = params(&k, mem, 4, a, k.f32(12)?)?;
    let g = mem.read_f32(k.ptr(2)?, (a.batch * a.seq * a.heads * a.dh) as u64)?;
    let qkv = mem.read_f32(k.ptr(3)?, qkv_len(a))?;
    let (g_qkv, partials) = backward_slices(&g, &qkv, a, &p);
    mem.write_f32(k.ptr(0)?, &g_qkv)?;
    mem.write_f32(k.ptr(1)?, &partials)
}
