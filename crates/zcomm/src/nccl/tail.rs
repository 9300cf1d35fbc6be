//! The data-parallel step's tail over peer memory (zcompute's [`PeerExchange`]): the last
//! gradient bucket summed through the ranks' mapped device memory and the norm of the whole
//! gradient in one launch, instead of NCCL's all-reduce and then the norm.
//!
//! Setting it up is a collective of its own, outside any capture: each rank makes its side
//! (receive words and state), exports its words (CUDA IPC) and broadcasts a record of
//! `[made, host, handle]` from itself through NCCL (a broadcast copies bytes, so the handle
//! arrives bit for bit); each rank then maps every peer's words when all were made on this host;
//! and the ranks agree, with a one-element all-reduce of their failures, that every one of them
//! is connected. Only then does any rank take the path, so all of them launch the same kernels:
//! a rank that could not map a peer (another host, no peer access, the simulator) makes every
//! rank keep NCCL's all-reduce.
//!
//! A rank whose NCCL was told not to use peer-to-peer or shared memory (`NCCL_P2P_DISABLE=1`,
//! `NCCL_P2P_LEVEL=LOC`, `NCCL_SHM_DISABLE=1`: `transport::peer_memory_declined`; with both,
//! the socket transport, as between hosts) declines the path as well,
//! although CUDA IPC may still map the peers' memory: its NCCL then moves the other buckets
//! over sockets, and a kernel spinning on a peer's words next to NCCL's proxy threads is not
//! what such a job asked for (measured on 2 H200s, issue 44: the captured step hung).

use std::time::Duration;

use zcompute::cuda::{EXCHANGE_MAX_RANKS, PeerExchange};
use zcompute::{BTensor, CudaBackend, prelude::*};
use zdevice::{Driver, IPC_HANDLE_BYTES, IpcMemHandle};

use super::NcclCollective;
use crate::{Collective, CommError, RankInfo, Result};

/// u32 words of one rank's record: made (0/1), this host's digest (4 words), the handle.
const RECORD_WORDS: usize = 1 + 4 + IPC_HANDLE_BYTES / 4;

/// The exchange a collective holds once the ranks agreed on it.
#[derive(Debug)]
pub(super) struct Tail<D: Driver> {
    pub(super) exchange: PeerExchange<D>,
    pub(super) len: usize,
    /// How long the kernel waits for a peer before it gives up.
    pub(super) timeout: Duration,
}

impl<D: Driver> NcclCollective<D> {
    /// See [`Collective::prepare_last_and_norm`].
    pub(super) fn prepare_tail(
        &self,
        b: &CudaBackend<D>,
        len: usize,
        last: usize,
        step: u64,
    ) -> Result<bool> {
        const OP: &str = "prepare_last_and_norm";
        let world = self.info.world;
        if let Some(t) = lock(&self.tail).as_ref()
            && t.len == len
            && t.exchange.last() == last
        {
            return Ok(true);
        }
        if b.device().is_capturing() {
            return Err(CommError::CaptureIllegal { call: OP });
        }
        if self.last_bucket_on_nccl
            || !(2..=EXCHANGE_MAX_RANKS).contains(&world)
            || last == 0
            || last > len
        {
            *lock(&self.tail) = None;
            return Ok(false);
        }
        // Every rank goes through every collective below, whatever failed locally.
        let declined = super::transport::peer_memory_declined(|k| std::env::var(k).ok());
        let made = match &declined {
            Some(_) => Err(None),
            None => PeerExchange::new(b, self.info.rank, world, last)
                .and_then(|e| e.handle().map(|h| (e, h)))
                .map_err(Some),
        };
        let mine = record(made.as_ref().ok().map(|(_, h)| h));
        let records = self.gather_records(b, &mine, step)?;
        let host = mine[1..5].to_vec();
        let mut why = match &made {
            Err(Some(e)) => Some(format!("this rank's side: {e}")),
            Err(None) => declined,
            Ok(_) => records.iter().enumerate().find_map(|(q, r)| {
                if r[0] != 1 {
                    Some(format!("rank {q} could not make its side"))
                } else if r[1..5] != host[..] {
                    Some(format!("rank {q} is on another host"))
                } else {
                    None
                }
            }),
        };
        let mut exchange = made.ok().map(|(e, _)| e);
        if why.is_none()
            && let Some(e) = exchange.as_mut()
        {
            let handles: Vec<IpcMemHandle> = records.iter().map(handle_of).collect();
            if let Err(err) = e.connect(&handles) {
                why = Some(format!("mapping the peers' memory: {err}"));
            }
        }
        let failures = self.sum_one(b, f32::from(u8::from(why.is_some())), step)?;
        if failures != 0.0 {
            tracing::info!(
                target: "zcomm.nccl.tail",
                rank = self.info.rank,
                failures,
                why = why.as_deref().unwrap_or("another rank failed"),
                "the last bucket stays on NCCL's all-reduce"
            );
            *lock(&self.tail) = None;
            return Ok(false);
        }
        let Some(exchange) = exchange else {
            return Ok(false);
        };
        tracing::info!(target: "zcomm.nccl.tail", rank = self.info.rank, world, last, "the last bucket and the norm go over peer memory in one launch");
        *lock(&self.tail) = Some(std::sync::Arc::new(Tail {
            exchange,
            len,
            timeout: b.device().config().sync_deadline,
        }));
        Ok(true)
    }

    /// Every rank's record, rank `q`'s broadcast from rank `q`.
    fn gather_records(
        &self,
        b: &CudaBackend<D>,
        mine: &[u32; RECORD_WORDS],
        step: u64,
    ) -> Result<Vec<[u32; RECORD_WORDS]>> {
        const OP: &str = "prepare_last_and_norm";
        let compute = |source| CommError::Compute { op: OP, source };
        let world = self.info.world;
        let mut host = vec![0.0f32; world * RECORD_WORDS];
        let at = self.info.rank * RECORD_WORDS;
        for (h, &w) in host[at..at + RECORD_WORDS].iter_mut().zip(mine) {
            *h = f32::from_bits(w);
        }
        let all = b.upload(&host, &[host.len()]).map_err(compute)?;
        for q in 0..world {
            let slot = all
                .narrow(0, q * RECORD_WORDS, RECORD_WORDS)
                .map_err(compute)?;
            self.broadcast(b, &slot, q, step)?;
        }
        self.synchronize(b)?;
        let back = b.download(&all).map_err(compute)?;
        Ok(back
            .chunks_exact(RECORD_WORDS)
            .map(|c| {
                let mut r = [0u32; RECORD_WORDS];
                for (w, v) in r.iter_mut().zip(c) {
                    *w = v.to_bits();
                }
                r
            })
            .collect())
    }

    /// The sum over the ranks of one small count (exact in f32).
    fn sum_one(&self, b: &CudaBackend<D>, value: f32, step: u64) -> Result<f32> {
        const OP: &str = "prepare_last_and_norm";
        let compute = |source| CommError::Compute { op: OP, source };
        let t: BTensor<CudaBackend<D>, f32> = b.upload(&[value], &[1]).map_err(compute)?;
        self.all_reduce_sum(b, &t, step)?;
        self.synchronize(b)?;
        Ok(b.download(&t).map_err(compute)?[0])
    }

    /// `Timeout` when a launch of the exchange gave up waiting for a peer (the communicator is
    /// aborted first).
    pub(super) fn check_tail(&self, step: u64) -> Result<()> {
        let failed = match lock(&self.tail).as_ref() {
            None => None,
            Some(t) => failure(t, self.info, step)?,
        };
        if let Some(e) = failed {
            self.abort();
            return Err(e);
        }
        Ok(())
    }
}

/// The error of a tail whose exchange failed, if it did: `Timeout` naming the peer a launch found
/// missing ([`PeerExchange::silent_peer`]; of two ranks, the other one anyway).
pub(super) fn failure<D: Driver>(
    t: &Tail<D>,
    info: RankInfo,
    step: u64,
) -> Result<Option<CommError>> {
    const OP: &str = "all_reduce_last_and_norm";
    let compute = |source| CommError::Compute { op: OP, source };
    if !t.exchange.failed().map_err(compute)? {
        return Ok(None);
    }
    let named = t.exchange.silent_peer().map_err(compute)?;
    Ok(Some(CommError::Timeout {
        rank: info.rank,
        op: OP,
        step,
        waited_for: t.timeout,
        silent: crate::Silent::of(
            info,
            named,
            "the peer-memory exchange found no peer's flag missing",
        ),
    }))
}

/// The tail, a poisoned lock taken as it is (it holds no invariant a panic could break).
pub(super) fn lock<D: Driver>(
    m: &std::sync::Mutex<Option<std::sync::Arc<Tail<D>>>>,
) -> std::sync::MutexGuard<'_, Option<std::sync::Arc<Tail<D>>>> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// This rank's record: made or not, this host, the handle of its receive words.
fn record(handle: Option<&IpcMemHandle>) -> [u32; RECORD_WORDS] {
    let mut r = [0u32; RECORD_WORDS];
    r[1..5].copy_from_slice(&host_digest());
    if let Some(h) = handle {
        r[0] = 1;
        for (w, c) in r[5..].iter_mut().zip(h.0.chunks_exact(4)) {
            *w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
    }
    r
}

fn handle_of(r: &[u32; RECORD_WORDS]) -> IpcMemHandle {
    let mut h = [0u8; IPC_HANDLE_BYTES];
    for (c, w) in h.chunks_exact_mut(4).zip(&r[5..]) {
        c.copy_from_slice(&w.to_le_bytes());
    }
    IpcMemHandle(h)
}

/// 16 bytes naming this host for this boot: the kernel's boot id and host name, hashed. Ranks
/// on one host agree; ranks on two hosts differ (their boots do).
fn host_digest() -> [u32; 4] {
    use std::hash::{Hash, Hasher};
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let id = (
        read("/proc/sys/kernel/random/boot_id"),
        read("/proc/sys/kernel/hostname"),
    );
    let mut out = [0u32; 4];
    for (salt, pair) in out.chunks_exact_mut(2).enumerate() {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (salt, &id).hash(&mut h);
        let v = h.finish();
        pair[0] = v as u32;
        pair[1] = (v >> 32) as u32;
    }
    out
}
