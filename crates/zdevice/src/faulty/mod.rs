//! `FaultyDriver<D>`: the fault plan over any driver, the CUDA one included.
//!
//! The simulated driver injects faults from inside; this wrapper injects the same
//! [`FaultAction`]s around any [`Driver`], so the engine's answer to a failing call can be
//! tested on the real GPU as on the simulator:
//!
//! - **fails now**: the Nth call of a name fails with a code and never reaches the driver
//!   (`DriverError::Cublas` for a cuBLAS call, as the simulator answers);
//! - **fails at the next sync**: the call reaches the driver and succeeds; the next stream or
//!   event query or synchronize, or context synchronize, answers the code, as an error of
//!   earlier asynchronous work does;
//! - **stalls**: a synchronous call returns `d` late ([`Driver::pause`] after the real call:
//!   a sleep on a real driver, virtual time on the simulator); an asynchronous call (one that
//!   names a stream) keeps its stream busy `d` longer, in one of two ways ([`AsyncStall`]):
//!   emulated (queries of the stream, and of events recorded on it afterwards, answer
//!   `NotReady` and synchronizes wait until then, judged on [`Driver::now`]; any driver), or
//!   with a real kernel that spins on the GPU's clock for `d` (`kernels/spin.cu`), queued
//!   on the stream right after the call, so that the driver itself answers `NotReady`;
//! - **sticky**: the call fails and so does every later one, without reaching the driver;
//! - **missing driver**: every call fails as if `libcuda` could not be loaded.
//!
//! The wrapper also keeps a ledger of what the engine holds through it (device and pinned
//! allocations, streams, events, modules, graphs, pools, cuBLAS handles, IPC mappings), so a
//! test can state that nothing leaked on any driver, and lists the calls made in first-call
//! order (a recording run of a workload gives the calls a fault matrix must cover). Everything
//! is reached through a [`FaultController`], which outlives the driver (the device owns the
//! driver; the test keeps the controller).

mod driver_impl;
mod spin;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::driver::{CuCode, Driver, DriverError, DriverResult};
use crate::faults::{FaultAction, FaultPlan};
use crate::sim::calls;
use crate::types::BlasHandle;

/// A driver whose calls go through a fault plan first. See the module docs.
#[derive(Debug)]
pub struct FaultyDriver<D: Driver> {
    inner: D,
    ctl: FaultController,
    /// The spinning kernel, once loaded in the current context (for [`AsyncStall::SpinKernel`]).
    spin: Mutex<Option<(crate::types::Module, crate::types::Function)>>,
}

/// How a stalled asynchronous call keeps its stream busy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AsyncStall {
    /// The wrapper answers `NotReady` for the stream and for events recorded behind the stall
    /// until it has passed (works over any driver; the default).
    #[default]
    Emulated,
    /// A kernel spinning for the stall's length is queued on the stream (a real GPU: the
    /// driver's own queries then see it). The kernel is loaded when a context is made current;
    /// where it cannot be (the simulator has no twin for it), stalls fall back to `Emulated`.
    SpinKernel,
}

impl<D: Driver> FaultyDriver<D> {
    /// `inner` behind an empty fault plan (every call passes through until faults are added).
    pub fn new(inner: D) -> Self {
        FaultyDriver {
            inner,
            ctl: FaultController::default(),
            spin: Mutex::new(None),
        }
    }

    /// The driver underneath.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// The handle that schedules faults and reads the ledger; it stays valid after the
    /// driver is dropped.
    pub fn controller(&self) -> FaultController {
        self.ctl.clone()
    }
}

/// Kinds of resource the ledger counts (its keys in [`FaultController::live_resources`]).
pub mod resource {
    /// Device memory (`cuMemAlloc`, managed, async and pool allocations).
    pub const DEVICE_MEMORY: &str = "device allocation";
    /// Page-locked host memory.
    pub const HOST_MEMORY: &str = "pinned host allocation";
    /// Streams.
    pub const STREAM: &str = "stream";
    /// Events.
    pub const EVENT: &str = "event";
    /// Loaded modules.
    pub const MODULE: &str = "module";
    /// Captured graphs.
    pub const GRAPH: &str = "graph";
    /// Instantiated graphs.
    pub const GRAPH_EXEC: &str = "graph instance";
    /// Memory pools.
    pub const POOL: &str = "memory pool";
    /// cuBLAS handles.
    pub const BLAS: &str = "cuBLAS handle";
    /// Retained primary contexts.
    pub const CONTEXT: &str = "primary context";
    /// Peer memory opened through IPC (`cuIpcOpenMemHandle`), until its last open is closed.
    pub const IPC_MAPPING: &str = "IPC mapping";
}

#[derive(Debug, Default)]
struct FaultState {
    plan: FaultPlan,
    /// Once set, every call fails with it without reaching the driver.
    sticky: Option<CuCode>,
    /// Surfaces at the next synchronising call.
    pending: Option<CuCode>,
    missing_driver: bool,
    /// Streams kept busy by a stall, until this [`Driver::now`].
    busy_streams: HashMap<u64, Duration>,
    /// Events recorded behind a stall, ready at this [`Driver::now`].
    busy_events: HashMap<u64, Duration>,
    /// The stream each cuBLAS handle queues on (a stalled gemm delays it).
    blas_streams: HashMap<u64, u64>,
    /// Distinct call names in first-call order, with their counts.
    seen: Vec<(&'static str, u64)>,
    /// Live resources by kind.
    live: HashMap<&'static str, HashSet<u64>>,
    /// Opens of each IPC-mapped address not closed yet: CUDA counts a second open of a handle
    /// in one context and returns the same address, so the mapping is live until the count
    /// is back to zero.
    ipc_opens: HashMap<u64, u64>,
    async_stall: AsyncStall,
    /// Streams held by [`FaultAction::Hang`], and events recorded behind them, until the
    /// hangs are released.
    hung_streams: HashSet<u64>,
    hung_events: HashSet<u64>,
    /// How many times the hangs were released (a synchronous call held by one waits for it to
    /// move).
    releases: u64,
}

/// Schedules faults on a [`FaultyDriver`] and reads what it recorded. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct FaultController {
    state: Arc<Mutex<FaultState>>,
    released: Arc<Condvar>,
}

impl FaultController {
    fn lock(&self) -> MutexGuard<'_, FaultState> {
        // The state is plain data, consistent after any panic elsewhere.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Schedules `action` for the `n`th next call of `call` (1 = the next one); names are
    /// those of [`calls`](crate::sim::calls).
    pub fn fault(&self, call: &'static str, n: u64, action: FaultAction) {
        self.lock().plan.add(call, n, action);
    }

    /// The `n`th next call of `call` fails with `code` and never reaches the driver.
    pub fn fail_nth(&self, call: &'static str, n: u64, code: CuCode) {
        self.fault(call, n, FaultAction::Fail(code));
    }

    /// The `n`th next call of `call` takes `d` longer (see the module docs).
    pub fn stall(&self, call: &'static str, n: u64, d: Duration) {
        self.fault(call, n, FaultAction::Stall(d));
    }

    /// The `n`th next call of `call` fails with `code`, and so does every call after it.
    pub fn sticky(&self, call: &'static str, n: u64, code: CuCode) {
        self.fault(call, n, FaultAction::Sticky(code));
    }

    /// The next synchronising call fails with `code` (a sticky code then stays).
    pub fn fail_at_next_sync(&self, code: CuCode) {
        self.lock().pending = Some(code);
    }

    /// From now on every call fails as if the driver library could not be loaded (or, with
    /// `false`, calls pass again).
    pub fn set_missing_driver(&self, missing: bool) {
        self.lock().missing_driver = missing;
    }

    /// Chooses how stalled asynchronous calls keep their stream busy (set it before the
    /// device opens: the spinning kernel is loaded when the context is made current).
    pub fn set_async_stall(&self, how: AsyncStall) {
        self.lock().async_stall = how;
    }

    /// Drops every scheduled fault and a pending error (a sticky error already raised stays).
    /// Releases every [`FaultAction::Hang`]: the streams and events it held complete (as
    /// the driver underneath says), and the synchronous calls it held return.
    pub fn release_hangs(&self) {
        let mut st = self.lock();
        st.hung_streams.clear();
        st.hung_events.clear();
        st.releases += 1;
        self.released.notify_all();
    }

    /// Blocks the calling thread until the hangs are released (a synchronous call held by
    /// [`FaultAction::Hang`]).
    fn hold(&self) {
        let mut st = self.lock();
        let at = st.releases;
        while st.releases == at {
            st = self
                .released
                .wait(st)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    pub fn clear_faults(&self) {
        let mut st = self.lock();
        st.plan.clear();
        st.pending = None;
    }

    /// The sticky error raised, if any.
    #[must_use]
    pub fn sticky_error(&self) -> Option<CuCode> {
        self.lock().sticky
    }

    /// How many times `call` reached the fault plan.
    #[must_use]
    pub fn call_count(&self, call: &str) -> u64 {
        self.lock().plan.count(call)
    }

    /// Every call name that reached the fault plan, in first-call order, with its count.
    #[must_use]
    pub fn calls_seen(&self) -> Vec<(&'static str, u64)> {
        self.lock().seen.clone()
    }

    /// Resources acquired through the driver and not released, by kind (kinds with none are
    /// left out; see [`resource`]).
    #[must_use]
    pub fn live_resources(&self) -> Vec<(&'static str, usize)> {
        let st = self.lock();
        let mut out: Vec<_> = st
            .live
            .iter()
            .filter(|(_, set)| !set.is_empty())
            .map(|(k, set)| (*k, set.len()))
            .collect();
        out.sort_unstable();
        out
    }
}

/// What the plan decided for one call that may proceed.
#[derive(Clone, Copy, Debug, Default)]
struct Go {
    stall: Option<Duration>,
    hang: bool,
}

/// The error every call returns while the driver is "missing".
fn missing_driver() -> DriverError {
    DriverError::Load(cuda_sys::LoadError::LibraryNotFound {
        library: "libcuda",
        tried: vec!["libcuda.so.1 (FaultyDriver: driver marked missing)".to_string()],
    })
}

fn error_of(call: &'static str, code: CuCode) -> DriverError {
    if calls::is_blas(call) {
        DriverError::Cublas {
            call,
            status: code.0,
            name: crate::sim::blas_status_name(code.0),
        }
    } else {
        DriverError::Cuda { call, code }
    }
}

impl<D: Driver> FaultyDriver<D> {
    /// The stream a cuBLAS handle queues on (the legacy stream until one is set), where its
    /// products' faults are delivered.
    fn blas_stream(&self, handle: BlasHandle) -> u64 {
        let ctl = self.ctl.lock();
        ctl.blas_streams.get(&handle.0).copied().unwrap_or(0)
    }

    /// The prologue of every call: missing driver, sticky error, then the fault plan.
    fn enter(&self, call: &'static str) -> DriverResult<Go> {
        let mut st = self.ctl.lock();
        if st.missing_driver {
            return Err(missing_driver());
        }
        if let Some(code) = st.sticky {
            return Err(DriverError::Cuda { call, code });
        }
        match st.seen.iter_mut().find(|(name, _)| *name == call) {
            Some((_, n)) => *n += 1,
            None => st.seen.push((call, 1)),
        }
        match st.plan.on_call(call) {
            None => Ok(Go::default()),
            Some(FaultAction::Fail(code)) => Err(error_of(call, code)),
            Some(FaultAction::Sticky(code)) => {
                st.sticky = Some(code);
                Err(DriverError::Cuda { call, code })
            }
            Some(FaultAction::FailAtNextSync(code)) => {
                st.pending = Some(code);
                Ok(Go::default())
            }
            Some(FaultAction::Stall(d)) => Ok(Go {
                stall: Some(d),
                hang: false,
            }),
            Some(FaultAction::Hang) => Ok(Go {
                stall: None,
                hang: true,
            }),
        }
    }

    /// A synchronous call: the real call, then its stall.
    fn sync_call<T>(
        &self,
        call: &'static str,
        f: impl FnOnce(&D) -> DriverResult<T>,
    ) -> DriverResult<T> {
        let go = self.enter(call)?;
        let out = f(&self.inner);
        if let Some(d) = go.stall {
            self.inner.pause(d);
        }
        if go.hang {
            self.ctl.hold();
        }
        out
    }

    /// An asynchronous call on `stream`: the real call, then its stall charged to the stream.
    fn async_call<T>(
        &self,
        call: &'static str,
        stream: u64,
        f: impl FnOnce(&D) -> DriverResult<T>,
    ) -> DriverResult<T> {
        let go = self.enter(call)?;
        let out = f(&self.inner);
        if go.hang && out.is_ok() {
            self.ctl.lock().hung_streams.insert(stream);
        }
        if let (Some(d), true) = (go.stall, out.is_ok())
            && !self.spin_on(stream, d)
        {
            let until = self.inner.now().saturating_add(d);
            let mut st = self.ctl.lock();
            let busy = st.busy_streams.entry(stream).or_default();
            *busy = (*busy).max(until);
        }
        out
    }

    /// After a synchronising call's real answer: a pending error surfaces now (sticky codes
    /// latch).
    fn surface<T>(&self, call: &'static str, out: DriverResult<T>) -> DriverResult<T> {
        let value = out?;
        let mut st = self.ctl.lock();
        match st.pending.take() {
            Some(code) => {
                if code.is_sticky() {
                    st.sticky = Some(code);
                }
                Err(DriverError::Cuda { call, code })
            }
            None => Ok(value),
        }
    }

    /// Whether `stream` is held by a hang.
    fn stream_hung(&self, stream: u64) -> bool {
        self.ctl.lock().hung_streams.contains(&stream)
    }

    fn event_hung(&self, event: u64) -> bool {
        self.ctl.lock().hung_events.contains(&event)
    }

    /// A synchronize's answer for work held by a hang: on a GPU the call never returns; the
    /// wrapper answers `CUDA_ERROR_NOT_READY` (the device's own waits poll with deadlines and
    /// never synchronize such a stream).
    fn refuse_hung(call: &'static str, hung: bool) -> DriverResult<()> {
        if hung {
            return Err(DriverError::Cuda {
                call,
                code: CuCode::NOT_READY,
            });
        }
        Ok(())
    }

    /// How long `stream` stays busy from now (zero when it is not).
    fn stream_busy_for(&self, stream: u64) -> Duration {
        let until = self.ctl.lock().busy_streams.get(&stream).copied();
        until.map_or(Duration::ZERO, |u| u.saturating_sub(self.inner.now()))
    }

    fn event_busy_for(&self, event: u64) -> Duration {
        let until = self.ctl.lock().busy_events.get(&event).copied();
        until.map_or(Duration::ZERO, |u| u.saturating_sub(self.inner.now()))
    }

    /// Counts one more open (`true`) or one close of an IPC-mapped address; the ledger holds
    /// the mapping while any open is not closed.
    fn track_ipc(&self, ptr: u64, open: bool) {
        let mut st = self.ctl.lock();
        let count = st.ipc_opens.entry(ptr).or_default();
        if open {
            *count += 1;
        } else {
            *count = count.saturating_sub(1);
        }
        let live = *count > 0;
        if !live {
            st.ipc_opens.remove(&ptr);
        }
        let set = st.live.entry(resource::IPC_MAPPING).or_default();
        if live {
            set.insert(ptr);
        } else {
            set.remove(&ptr);
        }
    }

    /// Adds (`true`) or removes a resource of `kind` in the ledger.
    fn track(&self, kind: &'static str, id: u64, live: bool) {
        let mut st = self.ctl.lock();
        let set = st.live.entry(kind).or_default();
        if live {
            set.insert(id);
        } else {
            set.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests;
