//! Simulated twins of `attention.cu`'s key-padding kernels: the CPU backend's passes
//! (`cpu::key_padding`: the forward, the backward's query pass leaving each row's stats in
//! device memory, the key pass reading them back) over device memory, after checking the launch
//! contract the GPU relies on: one block of `THREADS` threads per query row (per key row for the
//! key pass), sequences of 1 to `MAX_SEQ`, enough dynamic shared memory. A null mask pointer is
//! "every key kept", as in the kernels.

use super::common::{bad, checked};
use crate::cpu::key_padding::{Operands, forward_slices, key_pass, query_pass};
use crate::cuda::kernels::Kernel;
use crate::cuda::key_padding::{MAX_SEQ, THREADS, shared_bytes};
use crate::validate::KeyPadding;
use zdevice::sim::{KernelArgs, KernelFault, SimMemory};
use zdevice::{DevicePtr, KernelArg, LaunchConfig};

/// The sizes at `first` (batch, q_len, k_len, dk, dv), checked against the launch.
fn launch_shape(
    kernel: Kernel,
    config: &LaunchConfig,
    k: &KernelArgs<'_>,
    first: usize,
) -> Result<KeyPadding, KernelFault> {
    let size = |i: usize| k.u32(first + i).map(|v| v as usize);
    let a = KeyPadding {
        batch: size(0)?,
        q_len: size(1)?,
        k_len: size(2)?,
        dk: size(3)?,
        dv: size(4)?,
    };
    let in_range = |n: usize| (1..=MAX_SEQ).contains(&n);
    if a.batch == 0 || !in_range(a.q_len) || !in_range(a.k_len) {
        return Err(bad(first, "batch or sequence outside the kernels' range"));
    }
    let rows = match kernel {
        Kernel::KeyPaddingAttentionBackwardKv => a.batch * a.k_len,
        _ => a.batch * a.q_len,
    };
    if config.grid.0 as usize != rows || config.block.0 != THREADS {
        return Err(bad(0, "launch is not one block of THREADS threads per row"));
    }
    if (config.shared_mem_bytes as usize) < shared_bytes(kernel, a) {
        return Err(bad(0, "too little dynamic shared memory for this shape"));
    }
    Ok(a)
}

/// q, k, v and the mask (`None` for a null pointer) at `first`, read from device memory.
type Read = (Vec<f32>, Vec<f32>, Vec<f32>, Option<Vec<f32>>);

fn operands(
    k: &KernelArgs<'_>,
    mem: &SimMemory<'_>,
    first: usize,
    a: KeyPadding,
) -> Result<Read, KernelFault> {
    let n = |x: usize, y: usize| (a.batch * x * y) as u64;
    let keep = match k.ptr(first + 3)? {
        DevicePtr::NULL => None,
        p => Some(mem.read_f32(p, n(a.k_len, 1))?),
    };
    Ok((
        mem.read_f32(k.ptr(first)?, n(a.q_len, a.dk))?,
        mem.read_f32(k.ptr(first + 1)?, n(a.k_len, a.dk))?,
        mem.read_f32(k.ptr(first + 2)?, n(a.k_len, a.dv))?,
        keep,
    ))
}

/// `zc_key_padding_attention_f32` (`out, q, k, v, keep, sizes, scale`).
pub(super) fn forward(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let kernel = Kernel::KeyPaddingAttention;
    let k = checked(kernel, args)?;
    let a = launch_shape(kernel, config, &k, 5)?;
    let (q, kk, v, keep) = operands(&k, mem, 1, a)?;
    let o = Operands {
        q: &q,
        k: &kk,
        v: &v,
        keep: keep.as_deref(),
        scale: k.f32(10)?,
    };
    mem.write_f32(k.ptr(0)?, &forward_slices(&o, a))
}

/// `zc_key_padding_attention_backward_q_f32` (`dq, stats, g, q, k, v, keep, sizes, scale`).
pub(super) fn backward_q(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let kernel = Kernel::KeyPaddingAttentionBackwardQ;
    let k = checked(kernel, args)?;
    let a = launch_shape(kernel, config, &k, 7)?;
    let g = mem.read_f32(k.ptr(2)?, (a.batch * a.q_len * a.dv) as u64)?;
    let (q, kk, v, keep) = operands(&k, mem, 3, a)?;
    let o = Operands {
        q: &q,
        k: &kk,
        v: &v,
        keep: keep.as_deref(),
        scale: k.f32(12)?,
    };
    let (dq, stats) = query_pass(&g, &o, a);
    mem.write_f32(k.ptr(0)?, &dq)?;
    mem.write_f32(k.ptr(1)?, &stats)
}

/// `zc_key_padding_attention_backward_kv_f32` (`dk, dv, stats, g, q, k, v, keep, sizes,
/// scale`): reads the stats the query pass left in device memory.
pub(super) fn backward_kv(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let kernel = Kernel::KeyPaddingAttentionBackwardKv;
    let k = checked(kernel, args)?;
    let a = launch_shape(kernel, config, &k, 8)?;
    let stats = mem.read_f32(k.ptr(2)?, (a.batch * a.q_len * 3) as u64)?;
    let g = mem.read_f32(k.ptr(3)?, (a.batch * a.q_len * a.dv) as u64)?;
    let (q, kk, v, keep) = operands(&k, mem, 4, a)?;
    let o = Operands {
        q: &q,
        k: &kk,
        v: &v,
        keep: keep.as_deref(),
        scale: k.f32(13)?,
    };
    let (dk, dv) = key_pass(&g, &o, a, &stats);
    mem.write_f32(k.ptr(0)?, &dk)?;
    mem.write_f32(k.ptr(1)?, &dv)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(batch: u32, q_len: u32, k_len: u32) -> Vec<KernelArg> {
        let mut args = vec![KernelArg::Ptr(DevicePtr(256)); 5];
        args.extend([batch, q_len, k_len, 8, 6].map(KernelArg::U32));
        args.push(KernelArg::F32(0.5));
        args
    }

    /// The forward's twin takes the launch the kernel is built for and refuses the others by
    /// a fault, as a GPU would misbehave on them.
    #[rstest::rstest]
    #[case::kernel_launch(12, THREADS, 4 * 7, None)]
    #[case::one_block_short(11, THREADS, 4 * 7, Some("one block"))]
    #[case::other_threads(12, 64, 4 * 7, Some("one block"))]
    #[case::too_little_shared(12, THREADS, 4 * 6, Some("shared"))]
    fn forward_launch_contract(
        #[case] blocks: u32,
        #[case] threads: u32,
        #[case] shared: u32,
        #[case] refused: Option<&str>,
    ) {
        let config = LaunchConfig {
            grid: (blocks, 1, 1),
            block: (threads, 1, 1),
            shared_mem_bytes: shared,
        };
        let args = args(3, 4, 5);
        let got = launch_shape(Kernel::KeyPaddingAttention, &config, &KernelArgs(&args), 5);
        match refused {
            None => assert_eq!(got.expect("accepted").k_len, 5),
            Some(why) => assert!(format!("{:?}", got.expect_err("refused")).contains(why)),
        }
    }
}
