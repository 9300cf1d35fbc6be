//! NCCL over the real CUDA driver: a small safe API over `cuda_sys::nccl`, the only place in the
//! workspace that calls NCCL.
//!
//! A communicator is always created non-blocking (`config.blocking = 0`): every NCCL call
//! returns at once (`ncclInProgress` while its work goes on on NCCL's threads), and the
//! communicator's asynchronous error is polled until it reads `ncclSuccess`, with the device's
//! sync deadline. At the deadline, or on any error, the communicator is aborted
//! (`ncclCommAbort`), which makes NCCL's kernels and threads give up, so no rank waits forever
//! for a peer that died or stalled; an aborted communicator refuses every later call.
//!
//! `ncclCommAbort` itself blocks, even on a non-blocking communicator (NCCL's docs exempt it
//! and `ncclCommDestroy`), and with a peer gone it can block for long: it frees device memory
//! (an implicit device synchronisation while NCCL's kernel may still spin on the stream) and
//! reclaims resources shared with the dead peer. So it runs on a helper thread: [`NcclComm::abort`]
//! returns at once, the device is marked lost (its stream held an aborted collective and may
//! never drain, so no later wait of the teardown waits for it again), and dropping the
//! communicator gives the helper at most [`ABORT_GRACE`] before leaving it to the process.
//!
//! NCCL reads raw CUDA streams and device addresses, so it runs over the real driver only
//! (`CudaDriver`, bare or under `FaultyDriver`): [`supports`] says whether a driver's handles
//! are the real ones, and [`NcclComm::init`] refuses the others with
//! [`NcclError::NotNative`].

use std::any::TypeId;
use std::ffi::{CStr, c_void};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use cuda_sys::nccl::{
    NCCL_VERSION_CODE, Nccl, cudaStream_t, ncclComm_t, ncclConfig_t, ncclFloat32, ncclInProgress,
    ncclResult_t, ncclSuccess, ncclSum, ncclUniqueId,
};

use crate::device::{Device, Pacing, SPIN_BEFORE_SLEEP};
use crate::driver::Driver;
use crate::error::DeviceError;
use crate::types::{DevicePtr, Readiness, Stream};
use crate::{CudaDriver, FaultyDriver};

mod error;
mod live;

use live::Live;

pub use error::NcclError;

/// How long dropping an aborted communicator waits for `ncclCommAbort` (on its helper thread)
/// to return before leaving it to the process: short, so that a rank whose peer died exits
/// well within the launcher's grace after reporting its error.
pub const ABORT_GRACE: Duration = Duration::from_secs(3);

/// Bytes of an NCCL unique id (`NCCL_UNIQUE_ID_BYTES`).
pub const UNIQUE_ID_BYTES: usize = 128;

/// `NCCL_CONFIG_UNDEF_INT`: "let NCCL choose" for an integer field of `ncclConfig_t`.
const CONFIG_UNDEF_INT: i32 = i32::MIN;
/// `ncclConfig_t.magic`, as `NCCL_CONFIG_INITIALIZER` sets it.
const CONFIG_MAGIC: u32 = 0xcafe_beef;

/// Whether `D`'s stream and memory handles are the real CUDA ones NCCL can use.
#[must_use]
pub fn supports<D: Driver>() -> bool {
    let d = TypeId::of::<D>();
    d == TypeId::of::<CudaDriver>() || d == TypeId::of::<FaultyDriver<CudaDriver>>()
}

/// `2.28.3` for NCCL's version code `22803` (`2.8.4` for the old scheme's `2804`).
#[must_use]
pub fn version_string(code: u32) -> String {
    if code < 10_000 {
        // NCCL_VERSION(X,Y,Z) below 2.9: X*1000 + Y*100 + Z.
        format!("{}.{}.{}", code / 1000, (code % 1000) / 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 10_000, (code % 10_000) / 100, code % 100)
    }
}

/// Refuses a library version older than the pinned header's ([`NCCL_VERSION_CODE`]).
pub fn check_version(found: u32) -> Result<(), NcclError> {
    if found < NCCL_VERSION_CODE {
        return Err(NcclError::VersionTooOld {
            found: version_string(found),
            needed: version_string(NCCL_VERSION_CODE),
        });
    }
    Ok(())
}

/// Opens NCCL (once per process) and checks its version against the bindings'.
pub fn library() -> Result<&'static Nccl, NcclError> {
    let nccl = cuda_sys::nccl()?;
    let mut code = 0i32;
    // SAFETY: the out-pointer is a live local; ncclGetVersion has no other precondition.
    let r = unsafe { nccl.ncclGetVersion(&mut code) };
    check(nccl, "ncclGetVersion", r)?;
    check_version(u32::try_from(code).unwrap_or(0))?;
    Ok(nccl)
}

/// The loaded library's version code (`22803`), after the same checks as [`library`].
pub fn version() -> Result<u32, NcclError> {
    let nccl = library()?;
    let mut code = 0i32;
    // SAFETY: as in `library`.
    let r = unsafe { nccl.ncclGetVersion(&mut code) };
    check(nccl, "ncclGetVersion", r)?;
    Ok(u32::try_from(code).unwrap_or(0))
}

/// A fresh unique id for a new communicator (rank 0 makes it and hands it to the others).
pub fn unique_id() -> Result<[u8; UNIQUE_ID_BYTES], NcclError> {
    let nccl = library()?;
    let mut id = ncclUniqueId::default();
    // SAFETY: the out-pointer is a live, zeroed ncclUniqueId; the call only writes it.
    let r = unsafe { nccl.ncclGetUniqueId(&mut id) };
    check(nccl, "ncclGetUniqueId", r)?;
    // `c_char` to byte, bit for bit.
    Ok(id.internal.map(|c| c as u8))
}

/// The raw communicator; only used in its turn under [`NcclComm`]'s [`Live`], or taken out of
/// it by an abort.
#[derive(Clone, Copy)]
struct RawComm(ncclComm_t);

// SAFETY: an ncclComm_t may be used from any thread as long as calls on it do not overlap
// (NCCL's thread-safety rule), which `Live` keeps to; the one exception is `ncclCommAbort`,
// which NCCL allows while a call on the communicator hangs (see `live.rs`).
unsafe impl Send for RawComm {}

/// One rank's NCCL communicator on one device. Dropping it finalizes and destroys it
/// (bounded: aborted at the deadline).
pub struct NcclComm<D: Driver> {
    nccl: &'static Nccl,
    device: Device<D>,
    rank: usize,
    world: usize,
    /// Taken once aborted or destroyed; an abort takes it without waiting for a call.
    comm: Live<RawComm>,
    /// The helper thread's `ncclCommAbort` result, once an abort was started.
    aborting: Mutex<Option<Receiver<ncclResult_t>>>,
}

impl<D: Driver> std::fmt::Debug for NcclComm<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclComm")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("device", &self.device.info().ordinal)
            .field("aborted", &self.is_aborted())
            .finish_non_exhaustive()
    }
}

impl<D: Driver> NcclComm<D> {
    /// Joins rank `rank` of `world` to the communicator named by `id`, on `device` (its
    /// context made current on this thread), non-blocking, and waits (bounded by the device's
    /// sync deadline) until every rank has joined. Refused while the device captures.
    pub fn init(
        device: &Device<D>,
        rank: usize,
        world: usize,
        id: &[u8; UNIQUE_ID_BYTES],
    ) -> Result<NcclComm<D>, NcclError> {
        const CALL: &str = "ncclCommInitRankConfig";
        if device.is_capturing() {
            return Err(NcclError::Device(DeviceError::CaptureIllegal {
                call: CALL,
                why: "create communicators before capture",
            }));
        }
        if !supports::<D>() {
            return Err(NcclError::NotNative {
                driver: device.driver().describe(),
            });
        }
        let (Ok(nranks), Ok(me)) = (i32::try_from(world), i32::try_from(rank)) else {
            return Err(invalid(CALL, format!("rank {rank} of {world} overflows")));
        };
        if world == 0 || rank >= world {
            return Err(invalid(
                CALL,
                format!("rank {rank} is outside a world of {world}"),
            ));
        }
        let nccl = library()?;
        device.bind_thread()?;
        let mut config = non_blocking_config();
        let mut raw_id = ncclUniqueId::default();
        for (dst, src) in raw_id.internal.iter_mut().zip(id) {
            // Byte to `c_char`, bit for bit.
            *dst = *src as std::os::raw::c_char;
        }
        let mut raw: ncclComm_t = std::ptr::null_mut();
        // SAFETY: `raw` and `config` are live locals NCCL writes/reads during the call (the
        // config is read at init only); `raw_id` is passed by value; the device's context is
        // current on this thread, so NCCL picks its device.
        let r = unsafe { nccl.ncclCommInitRankConfig(&mut raw, nranks, raw_id, me, &mut config) };
        let comm = NcclComm {
            nccl,
            device: device.clone(),
            rank,
            world,
            comm: Live::new((!raw.is_null()).then_some(RawComm(raw))),
            aborting: Mutex::new(None),
        };
        if r != ncclSuccess && r != ncclInProgress {
            let detail = last_error(nccl, raw);
            comm.abort();
            return Err(call_error(CALL, r, detail));
        }
        comm.wait_async(CALL)?;
        tracing::debug!(target: "zdevice.nccl.init", rank, world, "communicator ready");
        Ok(comm)
    }

    /// A second communicator over the same ranks (`ncclCommSplit`, every rank one color,
    /// keyed by its rank, so its ranks are this one's), whose collectives take at most
    /// `max_ctas` thread blocks (`ncclConfig_t.maxCTAs`; `None`: NCCL's choice): a collective
    /// that runs beside other kernels takes fewer SMs from them. Every rank must call it, in
    /// the same order as the other collectives; it waits (bounded by the device's sync
    /// deadline) until every rank has joined. Refused while the device captures.
    pub fn split(&self, max_ctas: Option<u32>) -> Result<NcclComm<D>, NcclError> {
        const CALL: &str = "ncclCommSplit";
        if self.device.is_capturing() {
            return Err(NcclError::Device(DeviceError::CaptureIllegal {
                call: CALL,
                why: "create communicators before capture",
            }));
        }
        let mut config = non_blocking_config();
        if let Some(n) = max_ctas {
            let Ok(n) = i32::try_from(n) else {
                return Err(invalid(CALL, format!("{n} thread blocks overflow")));
            };
            if n == 0 {
                return Err(invalid(
                    CALL,
                    "a collective needs at least one thread block".into(),
                ));
            }
            config.maxCTAs = n;
            config.minCTAs = 1;
        }
        let key = i32::try_from(self.rank).unwrap_or(i32::MAX);
        self.device.bind_thread()?;
        // NCCL writes the child's handle through this pointer when the split completes, on
        // its own thread after the call returns (non-blocking): it lives on the heap until the
        // parent reports the split done, and is leaked if it never does.
        let slot: *mut ncclComm_t = Box::into_raw(Box::new(std::ptr::null_mut()));
        let called = self.comm.call(|RawComm(parent)| {
            // SAFETY: `parent` is live in its turn; `slot` stays valid until NCCL has written
            // it (see above); `config` is a live local NCCL reads during the call.
            let r = unsafe { self.nccl.ncclCommSplit(parent, 0, key, slot, &mut config) };
            let failed = r != ncclSuccess && r != ncclInProgress;
            (r, failed.then(|| last_error(self.nccl, parent)))
        });
        let Some((r, detail)) = called else {
            // SAFETY: `slot` came from `Box::into_raw` above and NCCL never saw it.
            drop(unsafe { Box::from_raw(slot) });
            return Err(NcclError::Aborted { call: CALL });
        };
        if let Some(detail) = detail {
            // The job was never launched (NCCL's failure path writes the slot before returning).
            // SAFETY: as above; NCCL is done with `slot`.
            drop(unsafe { Box::from_raw(slot) });
            return Err(call_error(CALL, r, detail));
        }
        // Non-blocking: the parent reports the split's progress; an error or the deadline
        // aborts it (and NCCL may still write the slot, which is then left to the process).
        self.wait_async(CALL)?;
        // SAFETY: the split completed, so NCCL has written the slot and holds it no more.
        let raw = *unsafe { Box::from_raw(slot) };
        let child = NcclComm {
            nccl: self.nccl,
            device: self.device.clone(),
            rank: self.rank,
            world: self.world,
            comm: Live::new((!raw.is_null()).then_some(RawComm(raw))),
            aborting: Mutex::new(None),
        };
        child.wait_async(CALL)?;
        tracing::debug!(target: "zdevice.nccl.split", rank = self.rank, world = self.world, ?max_ctas, "communicator split");
        Ok(child)
    }

    /// This communicator's rank.
    #[must_use]
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    #[must_use]
    pub fn world(&self) -> usize {
        self.world
    }

    /// The device it runs on.
    #[must_use]
    pub fn device(&self) -> &Device<D> {
        &self.device
    }

    /// Whether an earlier failure aborted it.
    #[must_use]
    pub fn is_aborted(&self) -> bool {
        self.comm.is_aborted()
    }

    /// Queues an in-place sum of `count` f32 at `data` over every rank on `stream` (legal
    /// while `stream` captures: the collective becomes a node of the graph), then waits,
    /// bounded, until NCCL has accepted it.
    pub fn all_reduce_sum_f32(
        &self,
        data: DevicePtr,
        count: usize,
        stream: Stream,
    ) -> Result<(), NcclError> {
        const CALL: &str = "ncclAllReduce";
        self.enqueue(CALL, |nccl, comm| {
            let p = data.0 as usize as *mut c_void;
            // SAFETY: `comm` is live (held under the mutex); `data` is a device address of at
            // least `count` f32 the caller owns (a bad one faults on the GPU and is reported
            // by the stream, never touches host memory); the stream handle is the real
            // CUstream (`supports` was checked at init); in-place send == recv is allowed.
            unsafe {
                nccl.ncclAllReduce(p, p, count, ncclFloat32, ncclSum, comm, cuda_stream(stream))
            }
        })
    }

    /// Queues an in-place broadcast of `count` f32 at `data` from rank `root` on `stream`
    /// (legal while `stream` captures), then waits, bounded, until NCCL has accepted it.
    pub fn broadcast_f32(
        &self,
        data: DevicePtr,
        count: usize,
        root: usize,
        stream: Stream,
    ) -> Result<(), NcclError> {
        const CALL: &str = "ncclBroadcast";
        if root >= self.world {
            return Err(invalid(
                CALL,
                format!("root {root} is outside a world of {}", self.world),
            ));
        }
        let root = i32::try_from(root).unwrap_or(i32::MAX);
        self.enqueue(CALL, |nccl, comm| {
            let p = data.0 as usize as *mut c_void;
            // SAFETY: as in `all_reduce_sum_f32`; in-place broadcast (send == recv) is allowed.
            unsafe { nccl.ncclBroadcast(p, p, count, ncclFloat32, root, comm, cuda_stream(stream)) }
        })
    }

    /// Waits until everything queued on `stream` has run, polling the communicator's
    /// asynchronous error between stream queries; aborts the communicator at the device's
    /// sync deadline or on an asynchronous error. Refused on the thread that captures.
    pub fn synchronize(&self, stream: Stream) -> Result<(), NcclError> {
        const CALL: &str = "cuStreamQuery";
        let deadline = self.device.config().sync_deadline;
        let started = Instant::now();
        let until = started + deadline;
        // As the device's own waits: a step queued on the stream is seen done as it ends.
        let mut pacing = Pacing::new(SPIN_BEFORE_SLEEP);
        loop {
            self.async_state("synchronize")?;
            let ticket = self.device.enter_poll(CALL, until)?;
            let ready = self.device.call(|d| d.stream_query(stream));
            drop(ticket);
            if ready? == Readiness::Ready {
                // Runs the releases that waited for this stream; returns at once.
                self.device.synchronize(stream)?;
                return Ok(());
            }
            if Instant::now() >= until {
                self.abort();
                return Err(NcclError::Timeout {
                    call: "synchronize",
                    deadline,
                });
            }
            match pacing.next(started.elapsed()) {
                None => std::thread::yield_now(),
                Some(sleep) => std::thread::sleep(sleep),
            }
        }
    }

    /// Aborts the communicator (idempotent) and returns at once: `ncclCommAbort` runs on a
    /// helper thread (it may block for long with a peer gone; see the module documentation),
    /// NCCL's kernels and threads give up, every later call is refused with
    /// [`NcclError::Aborted`], and the device is marked lost, so the teardown that follows
    /// never waits on a stream that held the aborted collectives. It does not wait for a call
    /// in progress on another thread (an enqueue blocked behind a full queue): that call is
    /// what the abort ends (see `live.rs`).
    pub fn abort(&self) {
        let Some(raw) = self.comm.take_for_abort() else {
            return;
        };
        self.device.mark_lost(format!(
            "the NCCL communicator of rank {} was aborted; its collectives on the stream may never complete",
            self.rank
        ));
        let nccl = self.nccl;
        let rank = self.rank;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let job = move || {
            // The whole `RawComm` (Send) moves in, not its raw pointer field alone.
            let raw: RawComm = raw;
            let comm = raw.0;
            // SAFETY: `comm` is live and was taken out of its `Live`, so no later call uses it;
            // it is aborted exactly once, here; a call still in NCCL on another thread is the
            // hang NCCL allows an abort to end. NCCL selects the communicator's device itself.
            let r = unsafe { nccl.ncclCommAbort(comm) };
            tracing::warn!(target: "zdevice.nccl.abort", rank, result = r, "communicator aborted");
            let _ = tx.send(r);
        };
        let spawned = std::thread::Builder::new()
            .name(format!("nccl-abort-{rank}"))
            .spawn(job);
        match spawned {
            Ok(_) => *lock(&self.aborting) = Some(rx),
            Err(e) => {
                // No thread to run it on: the raw handle went with the closure, which never
                // ran; the communicator is left to the process (it exits after an abort).
                tracing::error!(target: "zdevice.nccl.abort", rank, error = %e, "could not start the abort thread; communicator left to the process");
            }
        }
    }

    /// Waits at most `grace` for an abort started by [`Self::abort`] to return; `true` when it
    /// did (or none was started).
    pub fn wait_aborted(&self, grace: Duration) -> bool {
        let Some(rx) = lock(&self.aborting).take() else {
            return true;
        };
        match rx.recv_timeout(grace) {
            Ok(_) | Err(RecvTimeoutError::Disconnected) => true,
            Err(RecvTimeoutError::Timeout) => {
                tracing::warn!(
                    target: "zdevice.nccl.abort",
                    rank = self.rank, ?grace,
                    "ncclCommAbort has not returned; leaving it to the process"
                );
                false
            }
        }
    }

    /// Runs one enqueueing call on the live communicator, then waits for NCCL to accept it.
    fn enqueue(
        &self,
        call: &'static str,
        f: impl FnOnce(&Nccl, ncclComm_t) -> ncclResult_t,
    ) -> Result<(), NcclError> {
        // Aborted first: an abort also marks the device lost, and the caller is to hear that
        // the communicator is gone, not that the device is.
        if self.is_aborted() {
            return Err(NcclError::Aborted { call });
        }
        self.device.bind_thread()?;
        let called = self.comm.call(|RawComm(comm)| {
            let r = f(self.nccl, comm);
            let detail =
                (r != ncclSuccess && r != ncclInProgress).then(|| last_error(self.nccl, comm));
            (r, detail)
        });
        let Some((r, detail)) = called else {
            return Err(NcclError::Aborted { call });
        };
        if let Some(detail) = detail {
            self.abort();
            return Err(call_error(call, r, detail));
        }
        self.wait_async(call)
    }

    /// One read of the asynchronous error from any thread (a watchdog's), skipped while a call
    /// holds the communicator's turn (it may be blocked: this never waits for it) or once
    /// aborted. An error (a peer's connection lost, a remote failure NCCL saw on its own
    /// threads) aborts the communicator, as every failure does, and is returned, so a watcher
    /// can end a training thread blocked in a launch before any deadline (issue 44).
    pub fn poll_async_error(&self) -> Result<(), NcclError> {
        match self.comm.try_call(|RawComm(comm)| self.read_async(comm)) {
            None | Some((_, None)) => Ok(()),
            Some((state, Some(detail))) => {
                self.abort();
                Err(NcclError::Async {
                    call: "ncclCommGetAsyncError",
                    code: state,
                    name: cuda_sys::nccl_result_name(state),
                    detail,
                })
            }
        }
    }

    /// `ncclCommGetAsyncError` on `comm` (in its turn): the state, and NCCL's last error
    /// text when it is a failure.
    fn read_async(&self, comm: ncclComm_t) -> (ncclResult_t, Option<String>) {
        let mut state: ncclResult_t = ncclInProgress;
        // SAFETY: `comm` is live in its turn (the caller's); the out-pointer is a live local.
        let r = unsafe { self.nccl.ncclCommGetAsyncError(comm, &mut state) };
        if r != ncclSuccess {
            state = r;
        }
        let failed = state != ncclSuccess && state != ncclInProgress;
        (state, failed.then(|| last_error(self.nccl, comm)))
    }

    /// One read of the asynchronous error: `Ok(true)` once it is `ncclSuccess`, `Ok(false)`
    /// while `ncclInProgress`; an error aborts.
    fn async_state(&self, call: &'static str) -> Result<bool, NcclError> {
        let read = self.comm.call(|RawComm(comm)| self.read_async(comm));
        let Some((state, detail)) = read else {
            return Err(NcclError::Aborted { call });
        };
        match detail {
            None => Ok(state == ncclSuccess),
            Some(detail) => {
                self.abort();
                Err(NcclError::Async {
                    call,
                    code: state,
                    name: cuda_sys::nccl_result_name(state),
                    detail,
                })
            }
        }
    }

    /// Polls the asynchronous error until `ncclSuccess`, aborting at the device's deadline.
    fn wait_async(&self, call: &'static str) -> Result<(), NcclError> {
        let deadline = self.device.config().sync_deadline;
        let until = Instant::now() + deadline;
        let mut pause = Duration::from_micros(1);
        while !self.async_state(call)? {
            if Instant::now() >= until {
                self.abort();
                return Err(NcclError::Timeout { call, deadline });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
        Ok(())
    }
}

impl<D: Driver> Drop for NcclComm<D> {
    fn drop(&mut self) {
        if self.is_aborted() || self.device.bind_thread().is_err() {
            self.abort();
            self.wait_aborted(ABORT_GRACE);
            return;
        }
        let finalized = self.comm.call(|RawComm(comm)| {
            // SAFETY: `comm` is live in its turn; non-blocking, so this returns at once.
            unsafe { self.nccl.ncclCommFinalize(comm) }
        });
        let finalized = matches!(finalized, Some(r) if r == ncclSuccess || r == ncclInProgress)
            && self.wait_async("ncclCommFinalize").is_ok();
        if !finalized {
            self.abort();
            self.wait_aborted(ABORT_GRACE);
            return;
        }
        if let Some(RawComm(comm)) = self.comm.take_after_calls() {
            // SAFETY: finalized, live, and taken out of its `Live`: destroyed exactly once.
            let r = unsafe { self.nccl.ncclCommDestroy(comm) };
            tracing::debug!(target: "zdevice.nccl.destroy", rank = self.rank, result = r, "communicator destroyed");
        }
    }
}

/// `NCCL_CONFIG_INITIALIZER` with `blocking = 0`.
fn non_blocking_config() -> ncclConfig_t {
    ncclConfig_t {
        size: std::mem::size_of::<ncclConfig_t>(),
        magic: CONFIG_MAGIC,
        version: NCCL_VERSION_CODE,
        blocking: 0,
        cgaClusterSize: CONFIG_UNDEF_INT,
        minCTAs: CONFIG_UNDEF_INT,
        maxCTAs: CONFIG_UNDEF_INT,
        netName: std::ptr::null(),
        splitShare: CONFIG_UNDEF_INT,
        trafficClass: CONFIG_UNDEF_INT,
        commName: std::ptr::null(),
        collnetEnable: CONFIG_UNDEF_INT,
        CTAPolicy: CONFIG_UNDEF_INT,
        shrinkShare: CONFIG_UNDEF_INT,
        nvlsCTAs: CONFIG_UNDEF_INT,
        nChannelsPerNetPeer: CONFIG_UNDEF_INT,
        nvlinkCentricSched: CONFIG_UNDEF_INT,
    }
}

/// Locks the communicator, carrying on past poisoning (the guarded value is a plain handle).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn cuda_stream(s: Stream) -> cudaStream_t {
    s.0 as usize as cudaStream_t
}

fn invalid(call: &'static str, reason: String) -> NcclError {
    NcclError::InvalidArgument { call, reason }
}

fn call_error(call: &'static str, code: ncclResult_t, detail: String) -> NcclError {
    NcclError::Call {
        call,
        code,
        name: cuda_sys::nccl_result_name(code),
        detail,
    }
}

/// A call made without a communicator: anything but `ncclSuccess` is an error.
fn check(nccl: &Nccl, call: &'static str, r: ncclResult_t) -> Result<(), NcclError> {
    if r == ncclSuccess {
        return Ok(());
    }
    Err(call_error(call, r, last_error(nccl, std::ptr::null_mut())))
}

/// `ncclGetLastError`'s text (for `comm`, or the process's last when null).
fn last_error(nccl: &Nccl, comm: ncclComm_t) -> String {
    // SAFETY: a null or live communicator is accepted; the result is a NUL-terminated string
    // NCCL owns, read at once and copied.
    let text = unsafe { nccl.ncclGetLastError(comm) };
    if text.is_null() {
        return String::new();
    }
    // SAFETY: non-null, NUL-terminated, alive until the next NCCL call on this thread.
    unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests;
