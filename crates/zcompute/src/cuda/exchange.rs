//! The data-parallel step's tail in one launch: the last gradient bucket summed over the ranks
//! through each other's device memory, and the norm of the whole gradient, in
//! `zc_exchange_sum_norm_f32` (`flat.cu`, whose comment gives the protocol).
//!
//! After backward the step waits for the all-reduce of the bucket backward finished last, then
//! takes the norm of the whole buffer: two launches one after the other (NCCL's all-reduce costs
//! about 6.4 us in a graph whatever its size here). Here one launch does both: every thread
//! stores its elements of the bucket into the peers' receive words, sums the squares of its
//! share of the rest of the buffer (summed long before by the overlapped all-reduces) while they
//! travel over NVLink, then adds the peers' values in rank order.
//!
//! A [`PeerExchange`] owns this rank's receive words (a device allocation of its own, so it can
//! be exported to the other processes with CUDA IPC), the kernel's per-block epochs and
//! partials, and the peers' receive words mapped into this process ([`PeerExchange::connect`]);
//! dropping it closes the mappings and frees the memory (after the work queued on them).
//!
//! A launch waiting for a peer that stopped spins on the device; so that the host can always end
//! it (issue 44), the kernel also polls a give-up flag in page-locked host memory mapped into
//! the device, which [`PeerExchange::give_up`] sets with one store from the host: no stream, so
//! a stream stuck behind the spinning launch cannot delay it, and no driver call that a lost or
//! busy device could refuse or block. A read of host memory from the device is a trip over PCIe
//! that the host answers one at a time (about 1 us on an H200), so the grid keeps at most one in
//! flight (`flat.cu` says how). Dropping an exchange gives up first, then waits (bounded)
//! for its stream, and leaves its memory to the process rather than free it under a launch
//! that did not end (freeing synchronizes the device on a GPU).

use super::flat::{FLAT_THREADS, NORM_MAX_PARTS, norm_parts};
use super::kernels::{Args, Kernel, ptr, u64a};
use super::{CudaBackend, CudaTensor, device_error};
use crate::error::{ComputeError, Result};
use std::time::Duration;
use zdevice::{Device, DevicePtr, Driver, IpcMemHandle, KernelArg, LaunchConfig, PinnedBuffer};

/// Most ranks one exchange addresses (the kernel's table of receive words has this many).
pub const EXCHANGE_MAX_RANKS: usize = 8;

/// Offsets in the kernel's state: per-block epochs (u32) and partials (f32), the ticket, the
/// failure flag, every rank's receive words' address (u64, null past the world), then the
/// grid's next time to read the give-up flag (u64 ns, so at most one read of host memory is in
/// flight: see `kernels/flat.cu`).
const PARTIALS_AT: u64 = NORM_MAX_PARTS * 4;
const TICKET_AT: u64 = NORM_MAX_PARTS * 8;
const FAILED_AT: u64 = TICKET_AT + 4;
const WORDS_AT: u64 = TICKET_AT + 8;
const NEXT_POLL_AT: u64 = WORDS_AT + 8 * EXCHANGE_MAX_RANKS as u64;
const STATE_BYTES: u64 = NEXT_POLL_AT + 8;

/// One rank's side of the exchange (see the module docs).
pub struct PeerExchange<D: Driver> {
    device: Device<D>,
    rank: usize,
    world: usize,
    last: usize,
    /// This rank's receive words: `[2 halves][world][last]` of (value bits, epoch).
    words: DevicePtr,
    /// `[epochs: NORM_MAX_PARTS u32][partials: NORM_MAX_PARTS f32][ticket u32][failed u32]`
    /// `[words' addresses: EXCHANGE_MAX_RANKS u64][next poll u64]`.
    state: DevicePtr,
    /// Every rank's receive words as this process addresses them (this rank's own at `rank`);
    /// empty until connected.
    peers: Vec<DevicePtr>,
    /// The peers' words this exchange mapped (CUDA IPC), closed on drop.
    opened: Vec<DevicePtr>,
    /// Page-locked host memory the peer table goes up through and the failure flag comes back
    /// through, on the engine stream (`STAGING_BYTES`); freed on drop.
    staging: Option<PinnedBuffer>,
    /// The give-up flag (one u32, page-locked, mapped into the device at `give_up_at`): set by
    /// [`PeerExchange::give_up`] with a plain store, polled by every wait; freed on drop.
    give_up: Option<PinnedBuffer>,
    give_up_at: DevicePtr,
}

/// The staging buffer's size: the peer table, the larger of what passes through it.
const STAGING_BYTES: u64 = 8 * EXCHANGE_MAX_RANKS as u64;

impl<D: Driver> std::fmt::Debug for PeerExchange<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerExchange")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("last", &self.last)
            .field("connected", &!self.peers.is_empty())
            .finish_non_exhaustive()
    }
}

impl<D: Driver> PeerExchange<D> {
    /// Rank `rank` of `world`'s side of an exchange of a last bucket of `last` elements: its
    /// receive words and the kernel's state, zeroed, on `b`'s device. Not connected yet.
    ///
    /// # Errors
    /// `Unsupported` for a world of 0 or above [`EXCHANGE_MAX_RANKS`], a rank outside it or an
    /// empty bucket; `Device` (`CaptureIllegal` while capturing, out of memory) from the
    /// allocations.
    pub fn new(b: &CudaBackend<D>, rank: usize, world: usize, last: usize) -> Result<Self> {
        const OP: &str = "peer_exchange";
        if world == 0 || world > EXCHANGE_MAX_RANKS || rank >= world || last == 0 {
            return Err(ComputeError::Unsupported {
                op: OP,
                reason: format!(
                    "an exchange takes 1 to {EXCHANGE_MAX_RANKS} ranks and a bucket of at least one element (rank {rank} of {world}, {last} elements)"
                ),
            });
        }
        let device = b.device().clone();
        let words_bytes = (2 * world * last) as u64 * 8;
        let words = device.alloc(words_bytes).map_err(|e| device_error(OP, e))?;
        let state = match device.alloc(STATE_BYTES) {
            Ok(p) => p,
            Err(e) => {
                let _ = device.free(words);
                return Err(device_error(OP, e));
            }
        };
        let staging = match device.alloc_pinned(STAGING_BYTES) {
            Ok(buf) => buf,
            Err(e) => {
                let _ = device.free(state);
                let _ = device.free(words);
                return Err(device_error(OP, e));
            }
        };
        let flag = device.alloc_pinned(4).and_then(|buf| {
            let mapped = device
                .store_pinned_u32(&buf, 0, 0)
                .and_then(|()| device.pinned_device_ptr(&buf));
            match mapped {
                Ok(at) => Ok((buf, at)),
                Err(e) => {
                    let _ = device.free_pinned(buf);
                    Err(e)
                }
            }
        });
        let (give_up, give_up_at) = match flag {
            Ok(f) => f,
            Err(e) => {
                let _ = device.free_pinned(staging);
                let _ = device.free(state);
                let _ = device.free(words);
                return Err(device_error(OP, e));
            }
        };
        let exchange = PeerExchange {
            device,
            rank,
            world,
            last,
            words,
            state,
            peers: Vec::new(),
            opened: Vec::new(),
            staging: Some(staging),
            give_up: Some(give_up),
            give_up_at,
        };
        // Zeroed on the engine stream, never with the synchronous memset: work on the legacy
        // default stream here made every node of ztrain's two-GPU step start about 0.3 us
        // later (measured, docs/benchmarks.md, twentieth session). Waited for, so the words
        // are zero before their handle can reach a peer.
        let stream = b.device().stream();
        exchange
            .device
            .memset_d8_async(words, 0, words_bytes, stream)
            .and_then(|()| {
                exchange
                    .device
                    .memset_d8_async(state, 0, STATE_BYTES, stream)
            })
            .and_then(|()| exchange.device.synchronize(stream))
            .map_err(|e| device_error(OP, e))?;
        tracing::debug!(target: "zcompute.cuda.exchange", rank, world, last, "peer exchange made");
        Ok(exchange)
    }

    /// Elements of the bucket it sums.
    #[must_use]
    pub fn last(&self) -> usize {
        self.last
    }

    /// This rank's receive words, for the other ranks to map ([`PeerExchange::connect`]).
    ///
    /// # Errors
    /// `Device` from `cuIpcGetMemHandle` (`CaptureIllegal` while capturing).
    pub fn handle(&self) -> Result<IpcMemHandle> {
        self.device
            .ipc_export(self.words)
            .map_err(|e| device_error("peer_exchange", e))
    }

    /// Maps every other rank's receive words from its `handles[q]` (one per rank, in rank
    /// order; this rank's own is not opened). On an error the ones already mapped are closed
    /// and the exchange stays unconnected.
    ///
    /// # Errors
    /// `Unsupported` for a count other than the world's or an exchange already connected;
    /// `Device` from `cuIpcOpenMemHandle` (peers on another host or without peer access to
    /// this device, the simulator).
    pub fn connect(&mut self, handles: &[IpcMemHandle]) -> Result<()> {
        const OP: &str = "peer_exchange";
        self.check_unconnected(OP, handles.len())?;
        let mut peers = Vec::with_capacity(self.world);
        for (q, h) in handles.iter().enumerate() {
            if q == self.rank {
                peers.push(self.words);
                continue;
            }
            match self.device.ipc_open(h) {
                Ok(p) => {
                    self.opened.push(p);
                    peers.push(p);
                }
                Err(e) => {
                    self.close_opened();
                    return Err(device_error(OP, e));
                }
            }
        }
        if let Err(e) = self.publish(&peers) {
            self.close_opened();
            return Err(e);
        }
        self.peers = peers;
        Ok(())
    }

    /// Writes the ranks' receive words' addresses where the kernel reads them.
    fn publish(&self, peers: &[DevicePtr]) -> Result<()> {
        let mut bytes = [0u8; 8 * EXCHANGE_MAX_RANKS];
        for (chunk, p) in bytes.chunks_exact_mut(8).zip(peers) {
            chunk.copy_from_slice(&p.0.to_le_bytes());
        }
        // Through pinned memory on the engine stream, not the synchronous copy (see `new`).
        let d = &self.device;
        let staging = self.staging()?;
        d.write_pinned(staging, &bytes)
            .and_then(|()| {
                d.upload_async(
                    self.state.offset(WORDS_AT),
                    staging,
                    bytes.len() as u64,
                    d.stream(),
                )
            })
            .and_then(|()| d.synchronize(d.stream()))
            .map_err(|e| device_error("peer_exchange", e))
    }

    fn staging(&self) -> Result<&PinnedBuffer> {
        // Taken only by drop.
        self.staging
            .as_ref()
            .ok_or_else(|| ComputeError::Unsupported {
                op: "peer_exchange",
                reason: "the exchange's staging memory is gone".into(),
            })
    }

    /// Connects to peers whose receive words this process already addresses (`words[q]`, from
    /// [`PeerExchange::receive_words`] of exchanges on the same device, or on devices with peer
    /// access enabled): ranks sharing one process.
    ///
    /// # Errors
    /// `Unsupported` for a count other than the world's, an exchange already connected, or
    /// this rank's entry not its own words.
    pub fn connect_addressable(&mut self, words: &[DevicePtr]) -> Result<()> {
        const OP: &str = "peer_exchange";
        self.check_unconnected(OP, words.len())?;
        if words[self.rank] != self.words {
            return Err(ComputeError::Unsupported {
                op: OP,
                reason: format!("entry {} must be this rank's own receive words", self.rank),
            });
        }
        self.publish(words)?;
        self.peers = words.to_vec();
        Ok(())
    }

    /// This rank's receive words' address in this process.
    #[must_use]
    pub fn receive_words(&self) -> DevicePtr {
        self.words
    }

    fn check_unconnected(&self, op: &'static str, count: usize) -> Result<()> {
        if !self.peers.is_empty() {
            return Err(ComputeError::Unsupported {
                op,
                reason: "the exchange is already connected".into(),
            });
        }
        if count != self.world {
            return Err(ComputeError::Unsupported {
                op,
                reason: format!("{count} peers' words for a world of {}", self.world),
            });
        }
        Ok(())
    }

    /// Queues on `b`'s engine stream: `x[..last]` replaced by its sum over the ranks (in rank
    /// order), and a new rank-0 tensor holding the Euclidean norm of all of `x` (dense, f32,
    /// at least `last` elements; the rest already summed over the ranks). Every rank must queue
    /// the same calls, with the same size of `x`. A peer that does not come within `timeout`
    /// leaves the norm NaN and marks the exchange failed ([`PeerExchange::failed`]); so does
    /// every later call. Legal inside a capture: the graph replays the launch as is.
    ///
    /// # Errors
    /// `Unsupported` before [`PeerExchange::connect`], for an `x` on another device or of fewer
    /// than `last` elements; `NotContiguous` for a view; the allocation's and the launch's
    /// errors.
    pub fn sum_and_norm(
        &self,
        b: &CudaBackend<D>,
        x: &CudaTensor,
        timeout: Duration,
    ) -> Result<CudaTensor> {
        const OP: &str = "exchange_sum_norm";
        if self.peers.is_empty() {
            return Err(ComputeError::Unsupported {
                op: OP,
                reason: "the exchange is not connected to its peers".into(),
            });
        }
        if b.device().context() != self.device.context() {
            return Err(ComputeError::Unsupported {
                op: OP,
                reason: "the tensor's backend is on another device than the exchange".into(),
            });
        }
        if !x.is_contiguous() {
            return Err(ComputeError::NotContiguous {
                op: OP,
                shape: x.shape().into(),
                strides: x.layout().strides().into(),
            });
        }
        let n = x.numel();
        if n < self.last {
            return Err(ComputeError::Unsupported {
                op: OP,
                reason: format!(
                    "{n} elements hold no bucket of {} (the exchange was made for it)",
                    self.last
                ),
            });
        }
        let out = b.alloc(OP, &[])?;
        let parts = norm_parts(n as u64);
        let state = self.state;
        let args: Args = [
            ptr(b.ptr(OP, &out)?),
            ptr(state.offset(PARTIALS_AT)),
            ptr(state.offset(TICKET_AT)),
            ptr(state),
            ptr(state.offset(FAILED_AT)),
            ptr(b.ptr(OP, x)?),
            u64a(n),
            u64a(self.last),
            KernelArg::U32(self.rank as u32),
            KernelArg::U32(self.world as u32),
            KernelArg::U64(u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX)),
            ptr(state.offset(WORDS_AT)),
            ptr(self.give_up_at),
            ptr(state.offset(NEXT_POLL_AT)),
        ]
        .into_iter()
        .collect();
        let grid = LaunchConfig {
            grid: (parts as u32, 1, 1),
            block: (FLAT_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        b.launch(OP, Kernel::ExchangeSumNorm, grid, &args)?;
        Ok(out)
    }

    /// Whether the exchange failed: a launch gave up waiting for a peer (read from the device
    /// after the work queued on the engine stream, through the staging buffer on that stream),
    /// or it was given up ([`PeerExchange::give_up`]).
    ///
    /// # Errors
    /// `Device` from the copy (`CaptureIllegal` while capturing, a device marked lost).
    pub fn failed(&self) -> Result<bool> {
        Ok(self.failure_word()? != 0 || self.given_up()?)
    }

    /// The rank a failed launch found missing (its words not there when its wait timed out or
    /// was given up), if any: the peer that did not answer.
    ///
    /// # Errors
    /// As [`PeerExchange::failed`].
    pub fn silent_peer(&self) -> Result<Option<usize>> {
        let word = self.failure_word()? as usize;
        Ok((1..=self.world).contains(&word).then(|| word - 1))
    }

    /// The kernel's failure word: 0, or 1 + the first peer a failed launch found missing.
    fn failure_word(&self) -> Result<u32> {
        let mut flag = [0u8; 4];
        let d = &self.device;
        let staging = self.staging()?;
        d.download_async(staging, self.state.offset(FAILED_AT), 4, d.stream())
            .and_then(|()| d.read_pinned(staging, &mut flag))
            .map_err(|e| device_error("peer_exchange", e))?;
        Ok(u32::from_le_bytes(flag))
    }

    fn given_up(&self) -> Result<bool> {
        let mut flag = [0u8; 4];
        self.device
            .read_pinned(self.give_up_flag()?, &mut flag)
            .map_err(|e| device_error("peer_exchange", e))?;
        Ok(u32::from_le_bytes(flag) != 0)
    }

    fn give_up_flag(&self) -> Result<&PinnedBuffer> {
        // Taken only by drop.
        self.give_up
            .as_ref()
            .ok_or_else(|| ComputeError::Unsupported {
                op: "peer_exchange",
                reason: "the exchange's give-up flag is gone".into(),
            })
    }

    /// Makes the launches running or queued give up their waits for peers now, and every later
    /// one at once: what aborting a communicator does to NCCL's kernels, so that a rank whose
    /// peer died does not wait for the timeout. Not undone: an exchange given up stays failed.
    ///
    /// One store from the host into the give-up flag the kernel polls (page-locked memory
    /// mapped into the device): it goes through no stream and no driver call, so neither a
    /// stream stuck behind the spinning launch nor a busy or lost device can delay or refuse
    /// it; legal during a capture too (issue 44: the flag went up with a synchronous copy,
    /// refused once the device was marked lost, and the launch spun on).
    ///
    /// # Errors
    /// `Device` only if the flag's memory is not the page-locked allocation it was made in.
    pub fn give_up(&self) -> Result<()> {
        self.device
            .store_pinned_u32(self.give_up_flag()?, 0, 1)
            .map_err(|e| device_error("peer_exchange", e))
    }

    fn close_opened(&mut self) {
        for p in self.opened.drain(..) {
            if let Err(e) = self.device.ipc_close(p) {
                tracing::warn!(target: "zcompute.cuda.exchange", error = %e, "closing a peer's receive words failed");
            }
        }
    }
}

impl<D: Driver> Drop for PeerExchange<D> {
    fn drop(&mut self) {
        // Given up first, so a launch still waiting for a peer that stopped ends, and the wait
        // for the stream below is not one behind it (issue 44). The results of launches still
        // queued are nobody's once the exchange goes.
        if let Err(e) = self.give_up() {
            tracing::warn!(target: "zcompute.cuda.exchange", error = %e, "giving up the exchange's launches failed");
        }
        // The kernels queued on these words must have run before they are unmapped or freed.
        // If they did not (a device marked lost, a stream stuck behind other work), the memory
        // is left to the process: on a GPU, unmapping and freeing synchronize the device, and a
        // launch still running would read freed memory.
        if let Err(e) = self.device.synchronize(self.device.stream()) {
            tracing::warn!(target: "zcompute.cuda.exchange", error = %e, "the exchange's launches did not end; its memory is left to the process");
            return;
        }
        self.close_opened();
        for p in [self.state, self.words] {
            if let Err(e) = self.device.free(p) {
                tracing::warn!(target: "zcompute.cuda.exchange", error = %e, "freeing the exchange's memory failed");
            }
        }
        for buf in [self.staging.take(), self.give_up.take()]
            .into_iter()
            .flatten()
        {
            if let Err(e) = self.device.free_pinned(buf) {
                tracing::warn!(target: "zcompute.cuda.exchange", error = %e, "freeing the exchange's page-locked memory failed");
            }
        }
    }
}
