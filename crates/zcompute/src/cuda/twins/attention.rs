//! Simulated twins of `kernels/attention.cu`: the CPU backend's per-(batch, head) attention
//! (`cpu::attention`, the same algorithm the kernels run) over device memory, after checking
//! the launch contract the GPU relies on: one block per (batch, head) (of `WARPS` warps for
//! attention.cu's kernels, of 1 to 32 for attention_short.cu's), the shapes the kernels take
//! and enough dynamic shared memory for them. The short kernels sum the scores' and dP's
//! products in another order than the CPU; the twins give the CPU's bits. The bf16 kernels'
//! twins run the CPU's bf16 emulation (`Params::bf16`), so the simulated device and the CPU
//! backend agree bit for bit under bf16 as under float32.

use super::common::{bad, checked};
use crate::cpu::attention::{Params, backward_slices, forward_slices};
use crate::cuda::attention::{FUSED_MAX_DH, FUSED_MAX_SEQ, SHORT_MAX_SEQ, WARPS};
use crate::cuda::kernels::Kernel;
use crate::validate::Attention;
use zdevice::sim::{KernelArgs, KernelFault, SimMemory};
use zdevice::{KernelArg, LaunchConfig};

/// What a family of attention kernels takes: the shapes, and the warps of its one block per
/// (batch, head).
struct Contract {
    max_seq: usize,
    /// The only head width it takes, or `None` for any in `1..=FUSED_MAX_DH`.
    dh: Option<usize>,
    warps: std::ops::RangeInclusive<u32>,
    range: &'static str,
    launch: &'static str,
}

/// attention.cu's kernels.
const GENERAL: Contract = Contract {
    max_seq: FUSED_MAX_SEQ,
    dh: None,
    warps: WARPS as u32..=WARPS as u32,
    range: "sequence or head width outside the fused kernels' range",
    launch: "launch is not one block of WARPS warps per (batch, head)",
};

/// attention_short.cu's kernels for heads of `dh`.
const fn short(dh: usize) -> Contract {
    Contract {
        max_seq: SHORT_MAX_SEQ,
        dh: Some(dh),
        warps: 1..=32,
        range: "sequence or head width outside the short kernel's range",
        launch: "launch is not one block of 1 to 32 whole warps per (batch, head)",
    }
}

/// The sizes at `first` (batch, seq, heads, dh), checked against `contract` and the launch.
fn launch_shape(
    contract: &Contract,
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
    let dh_ok = match contract.dh {
        Some(dh) => a.dh == dh,
        None => (1..=FUSED_MAX_DH).contains(&a.dh),
    };
    if a.seq == 0 || a.seq > contract.max_seq || !dh_ok {
        return Err(bad(first + 1, contract.range));
    }
    let whole_warps = config.block.0.is_multiple_of(32);
    if config.grid.0 as usize != a.batch * a.heads
        || !whole_warps
        || !contract.warps.contains(&(config.block.0 / 32))
    {
        return Err(bad(0, contract.launch));
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
    bf16: bool,
) -> Result<Params<f32>, KernelFault> {
    let read = |i: usize| mem.read_f32(k.ptr(i)?, a.dh as u64);
    Ok(Params {
        q_weight: read(first)?,
        q_bias: read(first + 1)?,
        k_weight: read(first + 2)?,
        k_bias: read(first + 3)?,
        eps,
        bf16,
    })
}

fn qkv_len(a: Attention) -> u64 {
    (a.batch * a.seq * 3 * a.heads * a.dh) as u64
}

/// A forward kernel of `contract` (`out, qkv, qw, qb, kw, kb, batch, seq, heads, dh, eps`):
/// the CPU's forward over device memory.
fn run_forward(
    kernel: Kernel,
    contract: &Contract,
    shared: fn(Attention) -> usize,
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(kernel, args)?;
    let a = launch_shape(contract, config, &k, 6, shared)?;
    let p = params(&k, mem, 2, a, k.f32(10)?, is_bf16(kernel))?;
    let qkv = mem.read_f32(k.ptr(1)?, qkv_len(a))?;
    mem.write_f32(k.ptr(0)?, &forward_slices(&qkv, a, &p))
}

/// A backward kernel of `contract` (`g_qkv, partials, g, qkv, qw, qb, kw, kb, batch, seq,
/// heads, dh, eps`): the CPU's backward over device memory.
fn run_backward(
    kernel: Kernel,
    contract: &Contract,
    shared: fn(Attention) -> usize,
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(kernel, args)?;
    let a = launch_shape(contract, config, &k, 8, shared)?;
    let p = params(&k, mem, 4, a, k.f32(12)?, is_bf16(kernel))?;
    let g = mem.read_f32(k.ptr(2)?, (a.batch * a.seq * a.heads * a.dh) as u64)?;
    let qkv = mem.read_f32(k.ptr(3)?, qkv_len(a))?;
    let (g_qkv, partials) = backward_slices(&g, &qkv, a, &p);
    mem.write_f32(k.ptr(0)?, &g_qkv)?;
    mem.write_f32(k.ptr(1)?, &partials)
}

/// Whether `kernel` is one of the bf16 forms (its products' operands rounded to bf16).
fn is_bf16(kernel: Kernel) -> bool {
    matches!(
        kernel,
        Kernel::QkNormAttentionBf16
            | Kernel::QkNormAttentionBackwardBf16
            | Kernel::QkNormAttentionDh32Bf16
            | Kernel::QkNormAttentionDh64Bf16
            | Kernel::QkNormAttentionBackwardDh32Bf16
            | Kernel::QkNormAttentionBackwardDh64Bf16
    )
}

/// attention.cu's forward (`BF16`: its bf16 form).
pub(super) fn forward<const BF16: bool>(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let kernel = if BF16 {
        Kernel::QkNormAttentionBf16
    } else {
        Kernel::QkNormAttention
    };
    let shared = crate::cuda::attention::forward_shared_bytes;
    run_forward(kernel, &GENERAL, shared, config, args, mem)
}

/// attention.cu's backward (`BF16`: its bf16 form).
pub(super) fn backward<const BF16: bool>(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let kernel = if BF16 {
        Kernel::QkNormAttentionBackwardBf16
    } else {
        Kernel::QkNormAttentionBackward
    };
    let shared = crate::cuda::attention::backward_shared_bytes;
    run_backward(kernel, &GENERAL, shared, config, args, mem)
}

/// attention_short.cu's forward for heads of `DH` (`BF16`: its bf16 form).
pub(super) fn short_forward<const DH: usize, const BF16: bool>(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let kernel = match (DH == 32, BF16) {
        (true, false) => Kernel::QkNormAttentionDh32,
        (false, false) => Kernel::QkNormAttentionDh64,
        (true, true) => Kernel::QkNormAttentionDh32Bf16,
        (false, true) => Kernel::QkNormAttentionDh64Bf16,
    };
    let shared = crate::cuda::attention::short_forward_shared_bytes;
    run_forward(kernel, &short(DH), shared, config, args, mem)
}

/// attention_short.cu's backward for heads of `DH` (`BF16`: its bf16 form).
pub(super) fn short_backward<const DH: usize, const BF16: bool>(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let kernel = match (DH == 32, BF16) {
        (true, false) => Kernel::QkNormAttentionBackwardDh32,
        (false, false) => Kernel::QkNormAttentionBackwardDh64,
        (true, true) => Kernel::QkNormAttentionBackwardDh32Bf16,
        (false, true) => Kernel::QkNormAttentionBackwardDh64Bf16,
    };
    let shared = crate::cuda::attention::short_backward_shared_bytes;
    run_backward(kernel, &short(DH), shared, config, args, mem)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::attention::short_forward_shared_bytes;
    use zdevice::DevicePtr;

    fn forward_args(batch: u32, seq: u32, heads: u32, dh: u32) -> Vec<KernelArg> {
        let mut args = vec![KernelArg::Ptr(DevicePtr(256)); 6];
        args.extend([batch, seq, heads, dh].map(KernelArg::U32));
        args.push(KernelArg::F32(1e-5));
        args
    }

    fn launch(blocks: u32, warps: u32, shared: usize) -> LaunchConfig {
        LaunchConfig {
            grid: (blocks, 1, 1),
            block: (warps * 32, 1, 1),
            shared_mem_bytes: shared as u32,
        }
    }

    /// The short forward's twin takes the launches the kernel is built for and refuses the
    /// others by a fault, as a GPU would misbehave on them.
    #[rstest::rstest]
    #[case::one_warp(1, 6, None)]
    #[case::four_warps(4, 6, None)]
    #[case::thirty_two_warps(32, 6, None)]
    #[case::no_warps(0, 6, Some("whole warps"))]
    #[case::too_many_warps(33, 6, Some("whole warps"))]
    #[case::grid_not_one_block_per_head(4, 5, Some("whole warps"))]
    fn short_launch_contract(
        #[case] warps: u32,
        #[case] blocks: u32,
        #[case] refused: Option<&str>,
    ) {
        let args = forward_args(3, 12, 2, 64);
        let a = Attention {
            batch: 3,
            seq: 12,
            heads: 2,
            dh: 64,
        };
        let config = launch(blocks, warps, short_forward_shared_bytes(a));
        let got = launch_shape(
            &short(64),
            &config,
            &KernelArgs(&args),
            6,
            short_forward_shared_bytes,
        );
        match refused {
            None => assert_eq!(got.expect("accepted"), a),
            Some(why) => assert!(format!("{:?}", got.expect_err("refused")).contains(why)),
        }
    }

    #[test]
    fn short_twin_refuses_other_heads_longer_sequences_and_too_little_shared_memory() {
        let a = Attention {
            batch: 1,
            seq: 12,
            heads: 1,
            dh: 64,
        };
        let shared = short_forward_shared_bytes(a);
        let check = |args: &[KernelArg], shared: usize| {
            launch_shape(
                &short(64),
                &launch(1, 4, shared),
                &KernelArgs(args),
                6,
                short_forward_shared_bytes,
            )
            .map_err(|e| format!("{e:?}"))
        };
        assert!(
            check(&forward_args(1, 12, 1, 32), shared)
                .unwrap_err()
                .contains("range")
        );
        assert!(
            check(&forward_args(1, 17, 1, 64), 4 * 2 * 17 * 64)
                .unwrap_err()
                .contains("range")
        );
        assert!(
            check(&forward_args(1, 12, 1, 64), shared - 4)
                .unwrap_err()
                .contains("shared")
        );
        assert_eq!(check(&forward_args(1, 12, 1, 64), shared), Ok(a));
    }
}
