//! [`NcclCollective`]: the [`Collective`] over NCCL, one process per GPU.
//!
//! Rank 0 makes a unique id ([`NcclCollective::unique_id`]) and hands its bytes to every rank
//! (the rendezvous does it over TCP); each rank then calls [`NcclCollective::join`] with its
//! backend (on the device `LOCAL_RANK` names) and its [`RankInfo`]. Joining is non-blocking
//! underneath and bounded by the device's sync deadline, and refused while the device captures.
//!
//! Collectives are queued on the backend's engine stream, in place, on dense f32 tensors; they
//! are legal inside a capture (the graph then contains them). The overlapped all-reduce is
//! queued on the communicator's side stream (zcompute's `SideStream`, made at join), forked
//! from the engine stream before each call and joined back by `join_overlapped`. After each one the
//! communicator's asynchronous error is polled until NCCL has accepted it; [`Collective::synchronize`]
//! waits for the stream while polling the same error. Every wait ends at the device's sync
//! deadline: the communicator is aborted (so no peer hangs on this rank either) and the error
//! names the rank, the operation and the step (`Timeout`, `PeerFailed`, `Nccl`).
//!
//! One order for all of a communicator's work: every collective is queued on the engine
//! stream, or on the side stream forked from it and joined back to it, so the engine stream
//! orders a captured step's collectives after the eager ones before it and before the eager
//! ones after it. NCCL's own ordering of captured collectives (`NCCL_GRAPH_MIXING_SUPPORT`,
//! an event-wait and an event-record node in the graph for each) is then not needed, and
//! zcomm's launcher turns it off for its ranks (`launch::nccl_graph_mixing_setting`); a
//! process that launches its ranks itself and replays captured steps gains the same by
//! setting `NCCL_GRAPH_MIXING_SUPPORT=0`.
//!
//! NCCL needs the real CUDA driver: over the simulator `join` fails with
//! [`CommError::NotCuda`] (after the capture and argument checks, which hold on every driver).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use zcompute::cuda::SideStream;
use zcompute::{BTensor, CudaBackend};
use zdevice::cuda::nccl::{self, NcclComm, NcclError};
use zdevice::{CudaDriver, DeviceError, Driver, StreamPriority};

use crate::{Collective, CommError, RankInfo, Result};

mod errors;
mod tail;
pub mod transport;

/// Bytes of a unique id: what the rendezvous carries from rank 0 to the others.
pub const UNIQUE_ID_BYTES: usize = nccl::UNIQUE_ID_BYTES;

/// One rank's NCCL communicator over a CUDA backend's device. Dropping it finalizes and
/// destroys the communicator (bounded; aborted at the deadline).
#[derive(Debug)]
pub struct NcclCollective<D: Driver = CudaDriver> {
    /// The overlapped collectives' own communicator ([`JoinOptions::overlap_ctas`]), split
    /// from `comm`; `None`: they use `comm`. Dropped first.
    overlap: Option<NcclComm<D>>,
    comm: NcclComm<D>,
    info: RankInfo,
    /// The step of the latest operation, named by `synchronize`'s errors.
    step: AtomicU64,
    /// Where overlapped all-reduces run.
    side: SideStream<D>,
    /// The last bucket and the norm over peer memory, once the ranks agreed on it
    /// ([`Collective::prepare_last_and_norm`]).
    /// Shared (`Arc`) so that a launch holds no lock while it runs: a launch can block
    /// behind a full queue, and an abort from another thread (the watchdog) takes the lock to
    /// give the tail up (issue 44).
    tail: Mutex<Option<std::sync::Arc<tail::Tail<D>>>>,
    /// [`JoinOptions::last_bucket_on_nccl`].
    last_bucket_on_nccl: bool,
}

/// How a rank joins ([`NcclCollective::join_with`]); the default is [`NcclCollective::join`]'s.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JoinOptions {
    /// The overlapped collectives' stream priority against the engine stream's
    /// (`zdevice::DeviceConfig::engine_priority`): which of backward's kernels and the bucket
    /// all-reduces the device starts first when both wait for SMs.
    pub side_priority: StreamPriority,
    /// At most this many thread blocks (each on an SM) for an overlapped collective: they run
    /// on a second communicator split from the first with NCCL's `maxCTAs`, so a bucket's
    /// all-reduce takes fewer SMs from backward. `None`: the one communicator, NCCL's choice.
    pub overlap_ctas: Option<u32>,
    /// Keep the last bucket on NCCL's all-reduce and the norm on its own launch, instead of
    /// both in one launch over peer memory where every rank can map every other's
    /// ([`Collective::prepare_last_and_norm`]). Every rank must pass the same.
    pub last_bucket_on_nccl: bool,
}

impl NcclCollective<CudaDriver> {
    /// A fresh unique id (rank 0 calls this and hands the bytes to every rank). Loads NCCL and
    /// checks its version first.
    ///
    /// # Errors
    /// [`CommError::Library`], [`CommError::VersionTooOld`], or [`CommError::Nccl`] from
    /// `ncclGetUniqueId`.
    pub fn unique_id() -> Result<[u8; UNIQUE_ID_BYTES]> {
        nccl::unique_id().map_err(|e| errors::convert(e, RankInfo::SINGLE, "unique_id", 0))
    }

    /// The loaded NCCL's version (`2.28.3`), after the same checks as [`Self::unique_id`].
    ///
    /// # Errors
    /// As [`Self::unique_id`].
    pub fn library_version() -> Result<String> {
        nccl::version()
            .map(nccl::version_string)
            .map_err(|e| errors::convert(e, RankInfo::SINGLE, "version", 0))
    }
}

impl<D: Driver> NcclCollective<D> {
    /// Joins rank `info.rank` of `info.world` to the communicator named by `id` (the bytes of
    /// rank 0's [`NcclCollective::unique_id`]), on `backend`'s device. Waits, bounded by the
    /// device's sync deadline, until every rank has joined.
    ///
    /// # Errors
    /// [`CommError::BadRank`] for a rank outside the world, [`CommError::InvalidArgument`] for
    /// an id that is not [`UNIQUE_ID_BYTES`] long, [`CommError::CaptureIllegal`] while the
    /// device captures, [`CommError::NotCuda`] over a driver NCCL cannot use, and the library's,
    /// version's, timeout's or NCCL's errors (op `"init"`, step 0).
    pub fn join(backend: &CudaBackend<D>, info: RankInfo, id: &[u8]) -> Result<NcclCollective<D>> {
        Self::join_with(backend, info, id, JoinOptions::default())
    }

    /// As [`NcclCollective::join`], with `options` (see [`JoinOptions`]). Every rank must
    /// pass the same `overlap_ctas` (a second communicator is made by all of them).
    ///
    /// # Errors
    /// As [`NcclCollective::join`]; [`CommError::InvalidArgument`] for `overlap_ctas` 0.
    pub fn join_with(
        backend: &CudaBackend<D>,
        info: RankInfo,
        id: &[u8],
        options: JoinOptions,
    ) -> Result<NcclCollective<D>> {
        const OP: &str = "init";
        if info.world == 0 || info.rank >= info.world {
            return Err(CommError::BadRank {
                rank: info.rank,
                world: info.world,
                op: OP,
                step: 0,
            });
        }
        let device = backend.device();
        if device.is_capturing() {
            return Err(CommError::CaptureIllegal {
                call: "NcclCollective::join",
            });
        }
        let id: &[u8; UNIQUE_ID_BYTES] =
            id.try_into().map_err(|_| CommError::InvalidArgument {
                op: OP,
                reason: format!(
                    "a unique id is {UNIQUE_ID_BYTES} bytes, got {} (pass rank 0's NcclCollective::unique_id)",
                    id.len()
                ),
            })?;
        if options.overlap_ctas == Some(0) {
            return Err(CommError::InvalidArgument {
                op: OP,
                reason: "an overlapped collective needs at least one thread block".into(),
            });
        }
        let side = SideStream::with_priority(backend, options.side_priority)
            .map_err(|source| CommError::Compute { op: OP, source })?;
        let comm = NcclComm::init(device, info.rank, info.world, id)
            .map_err(|e| errors::convert(e, info, OP, 0))?;
        let overlap = match options.overlap_ctas {
            None => None,
            Some(n) => Some(
                comm.split(Some(n))
                    .map_err(|e| errors::convert(e, info, OP, 0))?,
            ),
        };
        tracing::info!(
            target: "zcomm.nccl.join",
            rank = info.rank, world = info.world, local_rank = info.local_rank,
            device = %device.info().name,
            "joined the NCCL communicator"
        );
        Ok(NcclCollective {
            overlap,
            comm,
            info,
            step: AtomicU64::new(0),
            side,
            tail: Mutex::new(None),
            last_bucket_on_nccl: options.last_bucket_on_nccl,
        })
    }

    /// Aborts the communicator now (a rank giving up aborts it so its peers fail fast):
    /// every later operation fails with [`CommError::PeerFailed`].
    ///
    /// The order holds on the GPU (issue 44): the peer-memory tail's kernel, which waits on
    /// peers outside NCCL, is told to give up first (one store from the host into the flag it
    /// polls: no stream, no driver call, nothing that can block) before `ncclCommAbort` (which
    /// waits for the device) starts on its helper thread; then the communicators are aborted,
    /// which marks the device lost. Nothing here blocks the calling thread.
    pub fn abort(&self) {
        if let Some(t) = tail::lock(&self.tail).as_ref()
            && let Err(e) = t.exchange.give_up()
        {
            tracing::warn!(target: "zcomm.nccl.abort", rank = self.info.rank, error = %e, "telling the peer-memory tail to give up failed");
        }
        if let Some(o) = &self.overlap {
            o.abort();
        }
        self.comm.abort();
    }

    /// One read of the communicators' asynchronous errors, from any thread (the watchdog's,
    /// [`crate::Watched::polling`]), never waiting for a call in progress: an error (NCCL's
    /// threads saw a peer's connection go, a remote failure) aborts everything as
    /// [`Self::abort`] does and is returned, naming the step of the latest operation.
    pub fn poll_async_error(&self) -> Option<CommError> {
        let polled = self
            .overlap
            .iter()
            .chain([&self.comm])
            .try_for_each(NcclComm::poll_async_error);
        let e = polled.err()?;
        self.abort();
        Some(errors::convert(
            e,
            self.info,
            "watchdog",
            self.step.load(Ordering::Relaxed),
        ))
    }

    /// Whether the communicator was aborted (by a failure or by [`Self::abort`]).
    #[must_use]
    pub fn is_aborted(&self) -> bool {
        self.comm.is_aborted() || self.overlap.as_ref().is_some_and(NcclComm::is_aborted)
    }

    /// The communicator of the overlapped collectives.
    fn side_comm(&self) -> &NcclComm<D> {
        self.overlap.as_ref().unwrap_or(&self.comm)
    }

    /// `e` as the caller's error. A communicator that failed aborted itself; with two, the
    /// other is aborted too, so no peer waits on it for its deadline.
    fn failed(&self, e: NcclError, op: &'static str, step: u64) -> CommError {
        if self.is_aborted() {
            self.abort();
        }
        errors::convert(e, self.info, op, step)
    }

    /// The device pointer and element count of `x`, after checking it is dense and lives on
    /// this communicator's device.
    fn operand(
        &self,
        b: &CudaBackend<D>,
        x: &BTensor<CudaBackend<D>, f32>,
        op: &'static str,
        step: u64,
    ) -> Result<(zdevice::DevicePtr, usize)> {
        self.step.store(step, Ordering::Relaxed);
        if b.device().context() != self.comm.device().context() {
            return Err(CommError::InvalidArgument {
                op,
                reason: format!(
                    "the tensor's backend is on device {}, the communicator on device {}",
                    b.device().info().ordinal,
                    self.comm.device().info().ordinal
                ),
            });
        }
        if !x.layout().is_contiguous() {
            return Err(CommError::InvalidArgument {
                op,
                reason: format!(
                    "collectives work on dense tensors; shape {:?} with strides {:?} is a view (make it contiguous first)",
                    x.shape(),
                    x.layout().strides()
                ),
            });
        }
        let ptr = b
            .device_ptr(op, x)
            .map_err(|source| CommError::Compute { op, source })?;
        Ok((ptr, x.numel()))
    }
}

impl<D: Driver> Collective<CudaBackend<D>, f32> for NcclCollective<D> {
    fn info(&self) -> RankInfo {
        self.info
    }

    fn all_reduce_sum(
        &self,
        b: &CudaBackend<D>,
        x: &BTensor<CudaBackend<D>, f32>,
        step: u64,
    ) -> Result<()> {
        const OP: &str = "all_reduce";
        let (ptr, count) = self.operand(b, x, OP, step)?;
        self.comm
            .all_reduce_sum_f32(ptr, count, b.device().stream())
            .map_err(|e| self.failed(e, OP, step))
    }

    fn all_reduce_sum_overlapped(
        &self,
        b: &CudaBackend<D>,
        x: &BTensor<CudaBackend<D>, f32>,
        step: u64,
    ) -> Result<()> {
        const OP: &str = "all_reduce";
        let (ptr, count) = self.operand(b, x, OP, step)?;
        self.side
            .fork()
            .map_err(|source| CommError::Compute { op: OP, source })?;
        self.side_comm()
            .all_reduce_sum_f32(ptr, count, self.side.stream())
            .map_err(|e| self.failed(e, OP, step))
    }

    fn join_overlapped(&self, _b: &CudaBackend<D>) -> Result<()> {
        self.side.join().map_err(|source| CommError::Compute {
            op: "join_overlapped",
            source,
        })
    }

    fn broadcast(
        &self,
        b: &CudaBackend<D>,
        x: &BTensor<CudaBackend<D>, f32>,
        root: usize,
        step: u64,
    ) -> Result<()> {
        const OP: &str = "broadcast";
        if root >= self.info.world {
            return Err(CommError::BadRank {
                rank: root,
                world: self.info.world,
                op: OP,
                step,
            });
        }
        let (ptr, count) = self.operand(b, x, OP, step)?;
        self.comm
            .broadcast_f32(ptr, count, root, b.device().stream())
            .map_err(|e| self.failed(e, OP, step))
    }

    fn synchronize(&self, b: &CudaBackend<D>) -> Result<()> {
        const OP: &str = "synchronize";
        let step = self.step.load(Ordering::Relaxed);
        if b.device().is_capturing() {
            return Err(CommError::CaptureIllegal { call: OP });
        }
        // The side stream first: an overlapped collective never joined (its step failed
        // before the join) is waited for too, with the same deadline and error polling.
        self.side_comm()
            .synchronize(self.side.stream())
            .and_then(|()| self.comm.synchronize(b.device().stream()))
            .map_err(|e| self.failed(e, OP, step))?;
        self.check_tail(step)
    }

    fn prepare_last_and_norm(
        &self,
        b: &CudaBackend<D>,
        len: usize,
        last: usize,
        step: u64,
    ) -> Result<bool> {
        self.prepare_tail(b, len, last, step)
    }

    fn all_reduce_last_and_norm(
        &self,
        b: &CudaBackend<D>,
        grads: &BTensor<CudaBackend<D>, f32>,
        last: usize,
        step: u64,
    ) -> Result<Option<BTensor<CudaBackend<D>, f32>>> {
        const OP: &str = "all_reduce_last_and_norm";
        self.step.store(step, Ordering::Relaxed);
        let tail = tail::lock(&self.tail).clone();
        let Some(t) = tail.filter(|t| t.len == grads.numel() && t.exchange.last() == last) else {
            return Ok(None);
        };
        t.exchange
            .sum_and_norm(b, grads, t.timeout)
            .map(Some)
            .map_err(|source| CommError::Compute { op: OP, source })
    }

    fn set_step(&self, step: u64) {
        self.step.store(step, Ordering::Relaxed);
    }

    /// Aborts the communicator: a peer blocked in a collective with this rank then fails
    /// (NCCL reports the abort to it) instead of waiting for its deadline.
    fn abort(&self, why: &str) {
        tracing::warn!(
            target: "zcomm.nccl.abort",
            rank = self.info.rank,
            why,
            "aborting the NCCL communicator"
        );
        NcclCollective::abort(self);
    }
}

impl<D: Driver> Drop for NcclCollective<D> {
    /// Gives up the peer-memory tail before the fields go (issue 44): the communicators are
    /// dropped first (finalized, or aborted, and `ncclCommAbort` waits for the device), and a
    /// launch of the tail still spinning on a peer that stopped would hold the engine stream,
    /// and so the abort, until its own timeout. Giving up is one store from the host; the
    /// tail's launches have all been waited for when a job ends normally, so it changes no
    /// result then.
    fn drop(&mut self) {
        if let Some(t) = tail::lock(&self.tail).as_ref()
            && let Err(e) = t.exchange.give_up()
        {
            tracing::warn!(target: "zcomm.nccl.drop", rank = self.info.rank, error = %e, "telling the peer-memory tail to give up failed");
        }
    }
}

/// Whether an error is a device refusal during capture (kept apart for the conversion).
fn is_capture_refusal(e: &NcclError) -> Option<&'static str> {
    match e {
        NcclError::Device(DeviceError::CaptureIllegal { call, .. }) => Some(call),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
