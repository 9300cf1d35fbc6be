//! `SimDriver`: a deterministic simulated CUDA driver, host-backed, answering every call the
//! way the real driver was measured to (`docs/capture-rules.md`).
//!
//! What it models, and where:
//! - memory (`memory`, `memcalls`): a capacity, 256-byte granularity, generation-stamped
//!   addresses, poison, stream-ordered pools and frees, page-locked host memory;
//! - interprocess memory (`ipc`): handles exported for live allocations; opening one is not
//!   supported (there is no second process);
//! - streams and events (`streams`): FIFO queues run only when observed, a virtual clock;
//! - capture and graphs (`capture`, `graphs`): the capture-rules table in one `match`, graphs
//!   that replay only what was recorded, memory nodes;
//! - kernels (`kernels`, `launch`, `access`): Rust closures over checked memory;
//! - cuBLAS (`blas`, `gemm`): a CPU strided-batched gemm;
//! - the fault plan (`crate::faults`, shared with `FaultyDriver`) and the op log (`oplog`).
//!
//! Tests drive it through the [`Driver`](crate::Driver) trait, plus the test helpers here
//! (fault plan, op log, `peek`, kernel registration).

mod access;
mod blas;
pub mod calls;
mod capture;
mod config;
mod copies;
mod driver_impl;
mod gemm;
mod gemm_ex;
mod graphs;
mod ipc;
mod kernels;
mod launch;
mod memcalls;
mod memory;
mod oplog;
mod ops;
mod state;
mod storage;
mod streams;

#[cfg(test)]
mod tests_capture;
#[cfg(test)]
mod tests_memory;
#[cfg(test)]
mod tests_replay;
#[cfg(test)]
mod tests_streams;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

pub use crate::faults::FaultAction;
pub use access::{KernelArgs, KernelFault, SimMemory};
pub use config::{DEFAULT_LAUNCH_QUEUE_DEPTH, SimConfig};
pub use kernels::{BUILTIN_PTX, KernelFn};
pub use oplog::{CaptureSnapshot, DEFAULT_OP_LOG_CAPACITY, Effect, OpRecord};

use crate::driver::{CuCode, DriverResult};
use crate::types::{DevicePtr, GraphExec, InstantiateFlags, KernelArg, LaunchConfig, Stream};
pub(crate) use state::blas_status_name;
use state::{Cx, State};

/// The simulated driver. Cheap to share: all state sits behind one mutex.
#[derive(Debug)]
pub struct SimDriver {
    state: Mutex<State>,
    /// How many times the fault plan's hangs were released; a synchronous call held by
    /// [`FaultAction::Hang`] waits, without the state's lock, until it moves.
    releases: Mutex<u64>,
    released: std::sync::Condvar,
}

impl Default for SimDriver {
    fn default() -> Self {
        SimDriver::new(SimConfig::default())
    }
}

impl SimDriver {
    /// A simulated device as configured, with the built-in kernels (`fill_f32`, `axpy_f32`)
    /// registered. Like the real driver, it needs `init` before anything else.
    #[must_use]
    pub fn new(config: SimConfig) -> Self {
        SimDriver {
            state: Mutex::new(State::new(config)),
            releases: Mutex::new(0),
            released: std::sync::Condvar::new(),
        }
    }

    /// A poisoned lock only means a kernel closure panicked in another thread; the state is
    /// still consistent enough to report on, so carry on rather than panic again.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// What every driver call shares: the prologue (missing driver, init, sticky error, fault
    /// plan, clock), the call's work, then the epilogue (stall, op log).
    fn call<T>(
        &self,
        call: &'static str,
        stream: Option<Stream>,
        work: impl FnOnce(&mut State, &mut Cx) -> DriverResult<T>,
    ) -> DriverResult<T> {
        let mut st = self.lock();
        let mut cx = Cx::new(call, stream);
        let snapshot = st.capture_snapshot();
        let releases = *self.releases_lock();
        let result = st.prologue(&mut cx).and_then(|()| work(&mut st, &mut cx));
        // A hang the call did not hand to a stream holds the calling thread itself.
        let hang = std::mem::take(&mut cx.hang);
        let logged = result.as_ref().map(|_| ()).map_err(Clone::clone);
        st.epilogue(&mut cx, snapshot, logged);
        drop(st);
        if hang {
            let mut n = self.releases_lock();
            while *n == releases {
                n = self
                    .released
                    .wait(n)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        }
        result
    }

    /// A launch onto `stream` ([`SimConfig::launch_queue_depth`]): waits, holding the calling
    /// thread but not the driver, while the stream's queue is full behind an operation that
    /// cannot complete, re-checking at every release of the fault plan's hangs (an abort
    /// makes one) and every 10 ms of real time; then makes the call.
    fn launching<T>(
        &self,
        call: &'static str,
        stream: Stream,
        work: impl FnOnce(&mut State, &mut Cx) -> DriverResult<T>,
    ) -> DriverResult<T> {
        let mut logged = false;
        loop {
            let releases = *self.releases_lock();
            if self.lock().launch_room(stream) {
                return self.call(call, Some(stream), work);
            }
            if !logged {
                tracing::warn!(target: "zdevice.sim.launch", call, ?stream, "launch blocked: the stream's queue is full behind work that does not complete");
                logged = true;
            }
            let n = self.releases_lock();
            if *n == releases {
                let _ = self
                    .released
                    .wait_timeout(n, Duration::from_millis(10))
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        }
    }

    fn releases_lock(&self) -> MutexGuard<'_, u64> {
        self.releases
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Releases every [`FaultAction::Hang`]: the operations it held on streams complete (at
    /// the next query or wait), and the synchronous calls it held return.
    pub fn release_hangs(&self) {
        self.lock().release_hangs();
        *self.releases_lock() += 1;
        self.released.notify_all();
    }

    /// The configuration the simulator was made with.
    #[must_use]
    pub fn config(&self) -> SimConfig {
        self.lock().cfg.clone()
    }

    /// Device memory in bytes (the `total` of `cuMemGetInfo`): a request above it can never fit.
    #[must_use]
    pub fn capacity(&self) -> u64 {
        self.lock().mem.capacity
    }

    /// Bytes counted against capacity now (allocations rounded to 256 bytes, plus pool
    /// reservations and graph memory).
    #[must_use]
    pub fn used_bytes(&self) -> u64 {
        self.lock().mem.used
    }

    /// Every live device allocation as (address, requested bytes), in address order.
    #[must_use]
    pub fn live_allocations(&self) -> Vec<(DevicePtr, u64)> {
        self.lock()
            .mem
            .live()
            .into_iter()
            .map(|(p, size, _)| (p, size))
            .collect()
    }

    /// Test help: reads device memory as it is now, without draining any queue and without a
    /// driver call (no log entry, no capture rule). Checked like a kernel access.
    pub fn peek(&self, ptr: DevicePtr, len: u64) -> Result<Vec<u8>, KernelFault> {
        self.lock().mem.read(ptr, len)
    }

    /// Test help: `peek` as float32 values.
    pub fn peek_f32(&self, ptr: DevicePtr, n: u64) -> Result<Vec<f32>, KernelFault> {
        let mut st = self.lock();
        SimMemory::new(&mut st.mem).read_f32(ptr, n)
    }

    /// Operations queued on `stream` and not yet run (0 for an unknown stream).
    #[must_use]
    pub fn pending_ops(&self, stream: Stream) -> usize {
        self.lock()
            .streams
            .get(&stream.0)
            .map_or(0, |s| s.queue.len())
    }

    /// A stream's priority (`None` for an unknown stream): the least, 0, unless it was made
    /// with one (clamped into the simulator's range, 0 to -5).
    #[must_use]
    pub fn stream_priority(&self, stream: Stream) -> Option<i32> {
        self.lock().streams.get(&stream.0).map(|s| s.priority)
    }

    /// The executable graphs not destroyed yet, oldest first.
    #[must_use]
    pub fn live_execs(&self) -> Vec<GraphExec> {
        let mut ids: Vec<u64> = self.lock().graphs.execs.keys().copied().collect();
        ids.sort_unstable();
        ids.into_iter().map(GraphExec).collect()
    }

    /// The flags an executable graph was instantiated with (`None` for an unknown one).
    #[must_use]
    pub fn exec_flags(&self, exec: GraphExec) -> Option<InstantiateFlags> {
        self.lock()
            .graphs
            .execs
            .get(&exec.0)
            .map(|e| InstantiateFlags {
                auto_free_on_launch: e.auto_free,
                use_node_priority: e.use_node_priority,
            })
    }

    // --- kernels ----------------------------------------------------------------------------

    /// Registers (or replaces) the simulated kernel behind PTX entry `name`. The closure sees
    /// only its launch configuration and arguments, and reaches memory through [`SimMemory`];
    /// a returned fault becomes a sticky `CUDA_ERROR_ILLEGAL_ADDRESS` at the next sync.
    /// Functions already resolved keep the closure they were resolved with.
    pub fn register_kernel<F>(&self, name: &str, kernel: F)
    where
        F: Fn(&LaunchConfig, &[KernelArg], &mut SimMemory<'_>) -> Result<(), KernelFault>
            + Send
            + Sync
            + 'static,
    {
        self.lock()
            .kernels
            .registry
            .insert(name.to_string(), Arc::new(kernel));
    }

    // --- fault plan ---------------------------------------------------------------------------

    /// Schedules `action` for the `n`th next call of `call` (1 = the next one).
    pub fn fault(&self, call: &'static str, n: u64, action: FaultAction) {
        self.lock().faults.add(call, n, action);
    }

    /// The `n`th next call of `call` (1 = the next one) fails with `code` and has no effect.
    /// For a cuBLAS call the error is `DriverError::Cublas` with status `code.0`.
    pub fn fail_nth(&self, call: &'static str, n: u64, code: CuCode) {
        self.lock().faults.add(call, n, FaultAction::Fail(code));
    }

    /// The `n`th next call of `call` takes `d` longer in virtual time: a synchronous call
    /// advances the clock by `d` before returning; an asynchronous one keeps its stream busy
    /// `d` longer (so a later sync or query sees it).
    pub fn stall(&self, call: &'static str, n: u64, d: Duration) {
        self.lock().faults.add(call, n, FaultAction::Stall(d));
    }

    /// The `n`th next call of `call` fails with `code`, and so does every call after it.
    pub fn sticky(&self, call: &'static str, n: u64, code: CuCode) {
        self.lock().faults.add(call, n, FaultAction::Sticky(code));
    }

    /// An error from "earlier asynchronous work": the next synchronising call (stream or event
    /// synchronize or query, context synchronize, a synchronous copy or memset, `cuMemFree`)
    /// returns `code`; a sticky code then stays for every later call.
    pub fn fail_at_next_sync(&self, code: CuCode) {
        self.lock().pending = Some(code);
    }

    /// Drops every scheduled fault (sticky errors already raised stay).
    pub fn clear_faults(&self) {
        self.lock().faults.clear();
    }

    /// How many times `call` reached the fault plan (every attempt after the missing-driver,
    /// initialisation and sticky-error checks).
    #[must_use]
    pub fn call_count(&self, call: &str) -> u64 {
        self.lock().faults.count(call)
    }

    // --- op log -------------------------------------------------------------------------------

    /// The driver calls since creation or the last `clear_op_log`, in order: the most recent
    /// [`SimConfig::op_log_capacity`] of them (see [`SimDriver::op_log_dropped`]).
    #[must_use]
    pub fn op_log(&self) -> Vec<OpRecord> {
        self.lock().log.records()
    }

    /// How many records the op log dropped (oldest first) since creation or the last
    /// `clear_op_log` because it held `op_log_capacity` already.
    #[must_use]
    pub fn op_log_dropped(&self) -> u64 {
        self.lock().log.dropped()
    }

    /// Records the op log holds now (at most `op_log_capacity`), without copying them.
    #[must_use]
    pub fn op_log_len(&self) -> usize {
        self.lock().log.len()
    }

    /// Empties the op log and resets its dropped count.
    pub fn clear_op_log(&self) {
        self.lock().log.clear();
    }
}
