//! Simulated twins of the flat-buffer kernels (`flat.cu`): the two passes of the global norm,
//! clipping by a norm read from device memory, and AdamW's finiteness gate. The first pass
//! gives each block the elements the kernel's grid-stride walk gives it, so the partials mean
//! what the kernel's do.

use super::common::{bad, checked, usize_of};
use crate::cuda::kernels::Kernel;
use zdevice::sim::{KernelFault, SimMemory};
use zdevice::{DevicePtr, KernelArg, LaunchConfig};

/// Threads per block of the flat kernels (`FLAT_THREADS` in flat.cu).
const THREADS: usize = 256;

pub(super) fn sum_squares_partial(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::SumSquaresPartial, args)?;
    let (partial, x, n) = (k.ptr(0)?, k.ptr(1)?, k.u64(2)?);
    let sums = block_sums(config, mem, x, n)?;
    mem.write_f32(partial, &sums)
}

/// Both norm passes in one launch: the partials written, their sum's root into `out`; the
/// ticket must be 0 before (the kernel's last block leaves it so).
pub(super) fn sum_squares_norm(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::SumSquaresNorm, args)?;
    let (out, partial, ticket, x, n) = (k.ptr(0)?, k.ptr(1)?, k.ptr(2)?, k.ptr(3)?, k.u64(4)?);
    if mem.read_f32(ticket, 1)?[0].to_bits() != 0 {
        return Err(bad(2, "the ticket was not left at 0"));
    }
    let sums = block_sums(config, mem, x, n)?;
    mem.write_f32(partial, &sums)?;
    let total: f32 = sums.iter().sum();
    mem.write_f32(out, &[total.sqrt()])
}

/// Each block's sum of squares over the 256-wide tiles its grid-stride walk visits.
fn block_sums(
    config: &LaunchConfig,
    mem: &mut SimMemory<'_>,
    x: zdevice::DevicePtr,
    n: u64,
) -> Result<Vec<f32>, KernelFault> {
    if config.block.0 as usize != THREADS {
        return Err(bad(0, "the norm's first pass runs 256 threads per block"));
    }
    let blocks = config.grid.0 as usize;
    let data = mem.read_f32(x, n)?;
    let mut sums = vec![0.0f32; blocks];
    for (tile, chunk) in data.chunks(THREADS).enumerate() {
        let block = tile % blocks.max(1);
        sums[block] += chunk.iter().map(|v| v * v).sum::<f32>();
    }
    Ok(sums)
}

pub(super) fn norm_finish(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::NormFinish, args)?;
    let (out, partial, parts) = (k.ptr(0)?, k.ptr(1)?, k.u64(2)?);
    usize_of(parts, 2)?;
    let total: f32 = mem.read_f32(partial, parts)?.iter().sum();
    mem.write_f32(out, &[total.sqrt()])
}

pub(super) fn clip_scale(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::ClipScale, args)?;
    let (x, norm, max_norm, n) = (k.ptr(0)?, k.ptr(1)?, k.f32(2)?, k.u64(3)?);
    let norm = mem.read_f32(norm, 1)?[0];
    let coef = max_norm / (norm + 1e-6);
    // NaN stays NaN, as the kernel's `coef > 1 ? 1 : coef`.
    let coef = if coef > 1.0 { 1.0 } else { coef };
    let scaled: Vec<f32> = mem.read_f32(x, n)?.iter().map(|v| v * coef).collect();
    mem.write_f32(x, &scaled)
}

pub(super) fn finite_gate(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::FiniteGate, args)?;
    let (dst, a, b) = (k.ptr(0)?, k.ptr(1)?, k.ptr(2)?);
    let (a, b) = (mem.read_f32(a, 1)?[0], mem.read_f32(b, 1)?[0]);
    mem.write_f32(dst, &[0.0 * a + 0.0 * b])
}

/// A training step's tail: `stats = [loss, norm]`, the gate `0 * loss + 0 * norm`, folded into
/// the sticky one when given (`gate += sticky; sticky = gate`), the stats to row `cursor` of the
/// history when given (when the cursor names a row) and the cursor advanced.
pub(super) fn step_tail(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::StepTail, args)?;
    let (stats, gate, sticky, history, cursor) =
        (k.ptr(0)?, k.ptr(1)?, k.ptr(2)?, k.ptr(3)?, k.ptr(4)?);
    let (l, n) = (
        mem.read_f32(k.ptr(5)?, 1)?[0],
        mem.read_f32(k.ptr(6)?, 1)?[0],
    );
    let rows = k.u64(7)?;
    mem.write_f32(stats, &[l, n])?;
    let mut g = 0.0 * l + 0.0 * n;
    if sticky != DevicePtr::NULL {
        g += mem.read_f32(sticky, 1)?[0];
        mem.write_f32(sticky, &[g])?;
    }
    mem.write_f32(gate, &[g])?;
    if history != DevicePtr::NULL {
        let f = mem.read_f32(cursor, 1)?[0];
        let d = f64::from(f);
        if d.is_finite() && d >= 0.0 && d == d.floor() && d < rows as f64 {
            mem.write_f32(history.offset(d as u64 * 8), &[l, n])?;
        }
        mem.write_f32(cursor, &[f + 1.0])?;
    }
    Ok(())
}

/// The exchange of the data-parallel step's last bucket and the norm (`zc_exchange_sum_norm_f32`):
/// this rank's elements of `x[..last]` stored into every peer's receive words with the epoch,
/// then each peer's words of this epoch read from its own and added in rank order. The simulator
/// runs one kernel at a time, so a peer's words are there only if its launch ran before.
///
/// A peer whose words are missing is waited for as on the GPU (issue 44): the launch does not
/// complete (`KernelFault::Waiting`: it stays at the front of its stream, which cannot drain,
/// and runs again at the next query or wait) until the words come or the exchange is given up
/// (the failure flag, or the give-up flag the host stores into mapped host memory); then it does
/// what the kernel does (NaN for the missing values, the failure flag set). The kernel's own
/// timeout is not modelled (the twin has no clock): the host's deadline, as long, ends first.
/// Its stores into the peers' words are the same bits each time it runs again.
pub(super) fn exchange_sum_norm(
    config: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::ExchangeSumNorm, args)?;
    let (out, partial, ticket, epochs, failed) =
        (k.ptr(0)?, k.ptr(1)?, k.ptr(2)?, k.ptr(3)?, k.ptr(4)?);
    let (x, n, last) = (k.ptr(5)?, k.u64(6)?, k.u64(7)?);
    let (rank, ranks) = (k.u32(8)? as usize, k.u32(9)? as usize);
    let words: Vec<DevicePtr> = mem
        .read_bytes(k.ptr(11)?, 64)?
        .chunks_exact(8)
        .map(|c| DevicePtr(u64::from_le_bytes(c.try_into().unwrap_or_default())))
        .collect();
    if config.block.0 as usize != THREADS {
        return Err(bad(0, "the exchange runs 256 threads per block"));
    }
    if ranks == 0 || ranks > words.len() || rank >= ranks || last > n {
        return Err(bad(8, "rank, ranks or the bucket out of range"));
    }
    if mem.read_f32(ticket, 1)?[0].to_bits() != 0 {
        return Err(bad(2, "the ticket was not left at 0"));
    }
    let blocks = config.grid.0 as usize;
    // Every block keeps the same count; the first one's names the launch.
    let epoch = mem.read_u32(epochs, 1)?[0].wrapping_add(1);
    let half = u64::from(epoch & 1);
    let (n_last, w) = (usize_of(last, 7)?, ranks as u64);
    let mut data = mem.read_f32(x, n)?;
    let word = |v: f32| u64::from(v.to_bits()) | (u64::from(epoch) << 32);
    let mine: Vec<u8> = data[..n_last]
        .iter()
        .flat_map(|&v| word(v).to_le_bytes())
        .collect();
    for (q, &peer) in words.iter().enumerate().take(ranks) {
        if q != rank {
            mem.write_bytes(peer.offset((half * w + rank as u64) * last * 8), &mine)?;
        }
    }
    let give_up = k.ptr(12)?;
    k.ptr(13)?; // the grid's next poll of give_up: the twin reads the flag at once
    let failed_before = mem.read_u32(failed, 1)?[0];
    let host_gave_up = mem.read_u32(give_up, 1)?[0] != 0;
    // The first peer whose words of this epoch are not all there.
    let mut missing = None;
    for q in (0..ranks).filter(|&q| q != rank) {
        let bytes = mem.read_bytes(
            words[rank].offset((half * w + q as u64) * last * 8),
            last * 8,
        )?;
        if bytes
            .chunks_exact(8)
            .any(|c| (u64::from_le_bytes(c.try_into().unwrap_or_default()) >> 32) as u32 != epoch)
        {
            missing = Some(q);
            break;
        }
    }
    // Every wait ends once failed[0] is set, or once a poll finds give_up[0] set.
    let lost = failed_before != 0 || (host_gave_up && missing.is_some());
    if let (Some(q), false) = (missing, lost) {
        return Err(KernelFault::Waiting(format!(
            "rank {rank} waits for rank {q}'s words of epoch {epoch} (peer exchange)"
        )));
    }
    // Given up with every word there: block 0 (which read give_up[0] at its start) uses NaN for
    // its peer values and its partial; the other blocks sum.
    let stride = THREADS * blocks.max(1);
    let block_zero_gave_up = host_gave_up && !lost;
    let nan_at = |i: usize| lost || (block_zero_gave_up && i % stride < THREADS);
    let mut sums = data[..n_last].to_vec();
    for q in 0..ranks {
        let values: Vec<f32> = if q == rank {
            data[..n_last].to_vec()
        } else {
            let bytes = mem.read_bytes(
                words[rank].offset((half * w + q as u64) * last * 8),
                last * 8,
            )?;
            bytes
                .chunks_exact(8)
                .enumerate()
                .map(|(i, c)| {
                    let v = u64::from_le_bytes(c.try_into().unwrap_or_default());
                    // Not lost: every word is there (a missing one waits, above).
                    if nan_at(i) {
                        f32::NAN
                    } else {
                        f32::from_bits(v as u32)
                    }
                })
                .collect()
        };
        for (s, v) in sums.iter_mut().zip(values) {
            *s = if q == 0 { v } else { *s + v };
        }
    }
    data[..n_last].copy_from_slice(&sums);
    mem.write_f32(x, &data[..n_last])?;
    // Each block's partial: its share of x[last..n), then its elements of x[..last).
    let mut part = vec![0.0f32; blocks];
    for (b, p) in part.iter_mut().enumerate() {
        for t in 0..THREADS {
            let first = b * THREADS + t;
            let mut i = n_last + first;
            while i < data.len() {
                *p += data[i] * data[i];
                i += stride;
            }
        }
        let mut i = b * THREADS;
        while i < n_last {
            for v in &data[i..(i + THREADS).min(n_last)] {
                *p += v * v;
            }
            i += stride;
        }
    }
    if block_zero_gave_up && let Some(p) = part.first_mut() {
        *p = f32::NAN; // no bucket in block 0: its norm is given up all the same
    }
    mem.write_f32(partial, &part)?;
    mem.write_u32(epochs, &vec![epoch; blocks])?;
    // The kernel's failure word: 1 + the peer found missing, kept once set.
    if let (0, Some(q)) = (failed_before, missing) {
        mem.write_u32(failed, &[1 + q as u32])?;
    }
    let total: f32 = part.iter().sum();
    mem.write_f32(out, &[total.sqrt()])
}
