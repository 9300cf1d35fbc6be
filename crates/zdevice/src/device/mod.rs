//! `Device`: the one guarded boundary the engine talks to, over any [`Driver`].
//!
//! # Send and Sync
//! `Device<D>` is a cheap handle (`Clone` shares it) and is `Send + Sync`: every method takes
//! `&self` and may be called from any thread. The driver is thread-safe; the device keeps its
//! own bookkeeping behind locks. Ordering between work on one stream is the caller's to keep
//! (issue a stream's work from one thread, or order it with events). While a stream captures,
//! threads that want to poll or wait on the device hold off until the capture ends (bounded by
//! the sync deadline), because a query during a global-mode capture would invalidate it; the
//! capturing thread itself gets `CaptureIllegal` instead of waiting on itself. A
//! [`StreamCapture`] is the exception to `Send`: it stays on the thread that began it, because
//! the driver ends a global-mode capture only from there. What is capturing, and where a
//! capture's allocations go, is the capture session's (`session.rs`), the one owner of capture
//! state that the layers above read.

mod capture;
mod compute;
mod deferred;
mod guard;
pub(crate) use guard::{Pacing, SPIN_BEFORE_SLEEP};
mod memory;
mod session;
mod watchdog;

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::driver::Driver;
use crate::error::{DeviceError, DeviceResult};
use crate::types::*;

pub use capture::{CaptureEndError, CapturedGraph, GraphInstance, StreamCapture};
pub use compute::LoadedModule;
pub use deferred::Release;
pub use memory::{DevicePool, PinnedBuffer};
pub use session::{CaptureMemory, CapturePhase, CaptureSession, CaptureWatch, RoutedMemory};

/// Deadlines and sizes for [`Device::open`].
#[derive(Clone, Debug)]
pub struct DeviceConfig {
    /// Device ordinal.
    pub ordinal: u32,
    /// Longest wait for a stream, an event, or a capture to end before `Timeout`.
    pub sync_deadline: Duration,
    /// Longest a blocking driver call (allocation, pool growth) may take before `Timeout` and
    /// `DeviceLost`.
    pub alloc_deadline: Duration,
    /// Longest a module load (PTX JIT) or graph instantiation may take.
    pub build_deadline: Duration,
    /// Bytes of cuBLAS workspace reserved at open, so cuBLAS never allocates inside a capture.
    pub blas_workspace_bytes: u64,
    /// The engine stream's priority against the device's other streams (a data-parallel
    /// step's collectives run on a second stream; see [`StreamPriority`]).
    pub engine_priority: StreamPriority,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            ordinal: 0,
            sync_deadline: Duration::from_secs(60),
            alloc_deadline: Duration::from_secs(20),
            build_deadline: Duration::from_secs(120),
            blas_workspace_bytes: 32 << 20,
            engine_priority: StreamPriority::Normal,
        }
    }
}

/// What the device reports about itself at open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Device ordinal.
    pub ordinal: u32,
    /// Total device memory in bytes.
    pub total_memory: u64,
    /// Driver API version, e.g. 13000.
    pub driver_version: u32,
    /// Compute capability.
    pub compute_capability: (u32, u32),
    /// The driver implementation (`CudaDriver …`, `SimDriver …`).
    pub driver: String,
}

pub(crate) struct Inner<D: Driver> {
    pub(crate) driver: Arc<D>,
    pub(crate) config: DeviceConfig,
    pub(crate) info: DeviceInfo,
    pub(crate) context: Context,
    pub(crate) stream: Stream,
    pub(crate) blas: BlasHandle,
    pub(crate) blas_stream: Mutex<Stream>,
    pub(crate) blas_workspace: DevicePtr,
    pub(crate) streams: Mutex<Vec<Stream>>,
    pub(crate) gate: guard::CaptureGate,
    pub(crate) lost: Mutex<Option<String>>,
    pub(crate) guard_enabled: AtomicBool,
    pub(crate) watchdog: watchdog::Watchdog,
    /// Releases waiting for their stream to drain (see [`Device::release_after_drain`]).
    pub(crate) deferred: deferred::Deferred,
}

/// The guarded device. See the module docs for the threading contract.
pub struct Device<D: Driver> {
    pub(crate) inner: Arc<Inner<D>>,
}

impl<D: Driver> Clone for Device<D> {
    fn clone(&self) -> Self {
        Device {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<D: Driver> std::fmt::Debug for Device<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("info", &self.inner.info)
            .finish_non_exhaustive()
    }
}

fn open_err(ordinal: u32) -> impl Fn(crate::driver::DriverError) -> DeviceError {
    move |e| match e {
        crate::driver::DriverError::Load(l) => DeviceError::Unavailable(l),
        crate::driver::DriverError::Cuda { call, code } => DeviceError::NoDevice {
            ordinal,
            reason: format!("{call} returned {code}"),
        },
        other => other.into(),
    }
}

type Undo<D> = Box<dyn FnOnce(&D) -> crate::driver::DriverResult<()>>;

/// The engine's stream, the cuBLAS handle bound to it, and the cuBLAS workspace. On failure,
/// returns the steps that release what was acquired so far.
#[allow(clippy::type_complexity)]
fn acquire<D: Driver>(
    driver: &D,
    context: Context,
    config: &DeviceConfig,
) -> Result<(Stream, BlasHandle, DevicePtr), (crate::driver::DriverError, Vec<Undo<D>>)> {
    let mut undo: Vec<Undo<D>> = Vec::new();
    macro_rules! step {
        ($e:expr) => {
            match $e {
                Ok(v) => v,
                Err(e) => return Err((e, undo)),
            }
        };
    }
    step!(driver.ctx_set_current(context));
    let stream = step!(match config.engine_priority {
        // CUDA's default priority is the least: the plain call makes the same stream.
        StreamPriority::Normal => driver.stream_create(StreamKind::NonBlocking),
        p => driver.stream_priority_range().and_then(|range| {
            driver.stream_create_with_priority(StreamKind::NonBlocking, range.value(p))
        }),
    });
    undo.push(Box::new(move |d: &D| d.stream_destroy(stream)));
    let blas = step!(driver.blas_create());
    undo.push(Box::new(move |d: &D| d.blas_destroy(blas)));
    step!(driver.blas_set_stream(blas, stream));
    let mut workspace = DevicePtr::NULL;
    if config.blas_workspace_bytes > 0 {
        workspace = step!(driver.mem_alloc(config.blas_workspace_bytes));
        undo.push(Box::new(move |d: &D| d.mem_free(workspace)));
        step!(driver.blas_set_workspace(blas, workspace, config.blas_workspace_bytes));
    }
    step!(driver.blas_set_tf32(blas, false));
    Ok((stream, blas, workspace))
}

impl<D: Driver> Device<D> {
    /// Opens the device: initialises the driver, retains the primary context (the one cuBLAS
    /// uses), creates the engine's non-blocking stream, creates the cuBLAS handle and reserves
    /// its workspace before any capture can begin.
    pub fn open(driver: D, config: DeviceConfig) -> DeviceResult<Device<D>> {
        let span = tracing::info_span!("zdevice.device.open", ordinal = config.ordinal);
        let _enter = span.enter();
        let ordinal = config.ordinal;
        let err = open_err(ordinal);
        driver.init().map_err(&err)?;
        let count = driver.device_count().map_err(&err)?;
        if ordinal >= count {
            return Err(DeviceError::NoDevice {
                ordinal,
                reason: format!("the driver reports {count} device(s)"),
            });
        }
        let info = DeviceInfo {
            name: driver.device_name(ordinal).map_err(&err)?,
            ordinal,
            total_memory: driver.device_total_mem(ordinal).map_err(&err)?,
            driver_version: driver.driver_version().map_err(&err)?,
            compute_capability: driver.compute_capability(ordinal).map_err(&err)?,
            driver: driver.describe(),
        };
        let context = driver.primary_ctx_retain(ordinal)?;
        let (stream, blas, blas_workspace) = match acquire(&driver, context, &config) {
            Ok(parts) => parts,
            Err((e, undo)) => {
                // Give back what was acquired before the failure, newest first; the original
                // error is what the caller needs to see.
                for step in undo.into_iter().rev() {
                    let _ = step(&driver);
                }
                let _ = driver.primary_ctx_release(ordinal);
                return Err(e.into());
            }
        };
        tracing::info!(
            target: "zdevice.device.open",
            name = %info.name, total = info.total_memory, driver_version = info.driver_version,
            "device open"
        );
        Ok(Device {
            inner: Arc::new(Inner {
                driver: Arc::new(driver),
                config,
                info,
                context,
                stream,
                blas,
                blas_stream: Mutex::new(stream),
                blas_workspace,
                streams: Mutex::new(Vec::new()),
                gate: guard::CaptureGate::default(),
                lost: Mutex::new(None),
                guard_enabled: AtomicBool::new(true),
                watchdog: watchdog::Watchdog::default(),
                deferred: deferred::Deferred::default(),
            }),
        })
    }

    /// What the device reported at open.
    #[must_use]
    pub fn info(&self) -> &DeviceInfo {
        &self.inner.info
    }

    /// The configuration the device was opened with.
    #[must_use]
    pub fn config(&self) -> &DeviceConfig {
        &self.inner.config
    }

    /// The driver underneath (tests use it to reach the simulated driver's controls).
    #[must_use]
    pub fn driver(&self) -> &D {
        &self.inner.driver
    }

    /// The engine's stream (non-blocking), made at open.
    #[must_use]
    pub fn stream(&self) -> Stream {
        self.inner.stream
    }

    /// The primary context.
    #[must_use]
    pub fn context(&self) -> Context {
        self.inner.context
    }

    /// Whether the device has been lost, and why.
    #[must_use]
    pub fn lost_reason(&self) -> Option<String> {
        self.inner
            .lost
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Marks the device lost on purpose (first reason wins): work queued on its streams may
    /// never complete (a communicator was aborted with its collectives in flight), so every
    /// later call fails with `DeviceLost` at once and the teardown leaves memory to the process
    /// instead of waiting for those streams again, up to the deadline each time.
    pub fn abandon(&self, reason: impl Into<String>) {
        self.mark_lost(reason.into());
    }

    /// Makes the device's context current on the calling thread (needed once per thread for
    /// the real driver; harmless otherwise).
    pub fn bind_thread(&self) -> DeviceResult<()> {
        self.call(|d| d.ctx_set_current(self.inner.context))
    }

    /// Creates another non-blocking stream, destroyed with the device.
    pub fn create_stream(&self) -> DeviceResult<Stream> {
        self.refuse_during_capture("cuStreamCreate", "create streams before capture")?;
        let s = self.call(|d| d.stream_create(StreamKind::NonBlocking))?;
        Ok(self.keep_stream(s))
    }

    /// Records a stream this device made, to destroy it with the device.
    fn keep_stream(&self, s: Stream) -> Stream {
        self.inner
            .streams
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(s);
        s
    }

    /// The device's stream priorities (`cuCtxGetStreamPriorityRange`). Answered during a
    /// capture too: the driver answers it there in every mode and the capture goes on (measured;
    /// zdevice's capture-rules harness, `rules.rs`).
    pub fn stream_priority_range(&self) -> DeviceResult<PriorityRange> {
        self.call(|d| d.stream_priority_range())
    }

    /// Creates another non-blocking stream of priority `priority`, destroyed with the device.
    pub fn create_stream_with_priority(&self, priority: StreamPriority) -> DeviceResult<Stream> {
        if priority == StreamPriority::Normal {
            return self.create_stream();
        }
        self.refuse_during_capture(
            "cuStreamCreateWithPriority",
            "create streams before capture",
        )?;
        let range = self.stream_priority_range()?;
        let s = self.call(|d| {
            d.stream_create_with_priority(StreamKind::NonBlocking, range.value(priority))
        })?;
        Ok(self.keep_stream(s))
    }

    /// Waits (bounded by the sync deadline) until all work queued on `stream` has run; then
    /// performs the releases that waited for it (see [`Device::release_after_drain`]).
    pub fn synchronize(&self, stream: Stream) -> DeviceResult<()> {
        self.drain(stream)?;
        self.after_drained(stream);
        Ok(())
    }

    /// Waits (bounded by the sync deadline) until all work queued on `stream` has run.
    pub(crate) fn drain(&self, stream: Stream) -> DeviceResult<()> {
        self.poll_until_ready(
            "cuStreamQuery",
            || format!("stream {stream:?} to finish its work"),
            |d| d.stream_query(stream),
        )
    }

    /// Creates an event (timing enabled when `timing`).
    pub fn create_event(&self, timing: bool) -> DeviceResult<Event> {
        self.refuse_during_capture("cuEventCreate", "create events before capture")?;
        self.call(|d| d.event_create(timing))
    }

    /// Destroys an event.
    pub fn destroy_event(&self, event: Event) -> DeviceResult<()> {
        self.call(|d| d.event_destroy(event))
    }

    /// Records `event` on `stream` (legal during capture on the capturing stream).
    pub fn record_event(&self, event: Event, stream: Stream) -> DeviceResult<()> {
        self.call(|d| d.event_record(event, stream))
    }

    /// Makes `stream` wait for `event` (device-side; does not block the host).
    pub fn stream_wait_event(&self, stream: Stream, event: Event) -> DeviceResult<()> {
        self.call(|d| d.stream_wait_event(stream, event))
    }

    /// Waits (bounded) until `event` has completed.
    pub fn wait_event(&self, event: Event) -> DeviceResult<()> {
        self.poll_until_ready(
            "cuEventQuery",
            || format!("event {event:?} to complete"),
            |d| d.event_query(event),
        )
    }

    /// Whether `event` has completed, without waiting (an event never recorded has).
    pub fn event_done(&self, event: Event) -> DeviceResult<bool> {
        self.call(|d| d.event_query(event))
            .map(|r| r == Readiness::Ready)
    }

    /// Milliseconds between two completed timing events.
    pub fn elapsed_ms(&self, start: Event, end: Event) -> DeviceResult<f32> {
        self.call(|d| d.event_elapsed_ms(start, end))
    }

    /// Test-only switch: when `false`, synchronous copies and memsets are no longer refused
    /// during capture, so the driver's silent rows get through. Exists to prove that the tests
    /// of that guard can fail; never turn it off in real code. Only with the `testing` feature
    /// (tests enable it; a release build of `ztrain` has no such switch).
    #[cfg(any(test, feature = "testing"))]
    pub fn set_capture_guard_for_tests(&self, enabled: bool) {
        self.inner
            .guard_enabled
            .store(enabled, std::sync::atomic::Ordering::Relaxed);
    }
}

impl<D: Driver> Drop for Inner<D> {
    fn drop(&mut self) {
        let lost = self.lost.get_mut().map(|l| l.is_some()).unwrap_or(true);
        // The last `Device` handle performs what waits (see `release_at_close`); only two
        // handles dropped at the same moment on two threads, each seeing the other, skip it.
        let waiting = self.deferred.len();
        if waiting > 0 {
            tracing::warn!(target: "zdevice.device.close", n = waiting, "releases still deferred at close: memory left to the process");
        }
        if lost {
            // Nothing can be released through a lost context; the process owns the rest.
            return;
        }
        let d = &self.driver;
        // Best effort: the device is going away, and errors here have nowhere to go but logs.
        let results = [
            d.blas_destroy(self.blas).err(),
            (self.blas_workspace != DevicePtr::NULL)
                .then(|| d.mem_free(self.blas_workspace).err())
                .flatten(),
            d.stream_destroy(self.stream).err(),
        ];
        let streams = self
            .streams
            .get_mut()
            .map(std::mem::take)
            .unwrap_or_default();
        let more = streams
            .into_iter()
            .filter_map(|s| d.stream_destroy(s).err());
        for e in results.into_iter().flatten().chain(more) {
            tracing::warn!(target: "zdevice.device.close", error = %e, "while closing the device");
        }
        if let Err(e) = d.primary_ctx_release(self.info.ordinal) {
            tracing::warn!(target: "zdevice.device.close", error = %e, "releasing the primary context");
        }
    }
}
