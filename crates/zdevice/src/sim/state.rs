//! The simulator's state behind its mutex, and what every call does before and after its own
//! work: the missing-driver and initialisation checks, sticky errors, the fault plan, the clock
//! and the op log.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::ThreadId;
use std::time::Duration;

use super::blas::BlasState;
use super::calls;
use super::capture::Capture;
use super::config::SimConfig;
use super::graphs::Graphs;
use super::kernels::Kernels;
use super::memory::Memory;
use super::oplog::{CaptureSnapshot, Effect, OpLog, OpRecord};
use super::streams::{EventState, StreamState};
use crate::driver::{CuCode, DriverError, DriverResult};
use crate::faults::{FaultAction, FaultPlan};
use crate::types::{CaptureStatus, Stream, StreamKind};

/// Numbers the simulators of this process (what an IPC handle names besides the address).
static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(1);

/// The legacy default stream (`CU_STREAM_LEGACY`, handle 0): blocking, never destroyed.
pub(crate) const LEGACY: Stream = Stream(0);

/// Per-call context: who is calling, what the fault plan said, what became of the work.
#[derive(Debug)]
pub(crate) struct Cx {
    pub call: &'static str,
    pub stream: Option<Stream>,
    pub thread: ThreadId,
    pub stall: Duration,
    pub effect: Effect,
    /// An error the fault plan gave this call to leave for the next synchronising call (set
    /// after the call, so that a synchronising call itself succeeds).
    pub fail_next_sync: Option<CuCode>,
    /// The fault plan's [`FaultAction::Hang`] for this call.
    pub hang: bool,
}

impl Cx {
    pub(crate) fn new(call: &'static str, stream: Option<Stream>) -> Self {
        Cx {
            call,
            stream,
            thread: std::thread::current().id(),
            stall: Duration::ZERO,
            effect: Effect::Immediate,
            fail_next_sync: None,
            hang: false,
        }
    }

    /// A CUDA error from this call.
    pub(crate) fn cuda(&self, code: CuCode) -> DriverError {
        DriverError::Cuda {
            call: self.call,
            code,
        }
    }

    /// A cuBLAS error from this call.
    pub(crate) fn blas(&self, status: u32) -> DriverError {
        DriverError::Cublas {
            call: self.call,
            status,
            name: blas_status_name(status),
        }
    }

    /// The stall the fault plan gave this call, for an asynchronous call to charge to its
    /// stream instead of the clock.
    pub(crate) fn take_stall(&mut self) -> Duration {
        std::mem::take(&mut self.stall)
    }
}

/// The name of a `cublasStatus_t`.
pub(crate) fn blas_status_name(status: u32) -> &'static str {
    match status {
        0 => "CUBLAS_STATUS_SUCCESS",
        1 => "CUBLAS_STATUS_NOT_INITIALIZED",
        3 => "CUBLAS_STATUS_ALLOC_FAILED",
        7 => "CUBLAS_STATUS_INVALID_VALUE",
        8 => "CUBLAS_STATUS_ARCH_MISMATCH",
        11 => "CUBLAS_STATUS_MAPPING_ERROR",
        13 => "CUBLAS_STATUS_EXECUTION_FAILED",
        14 => "CUBLAS_STATUS_INTERNAL_ERROR",
        15 => "CUBLAS_STATUS_NOT_SUPPORTED",
        16 => "CUBLAS_STATUS_LICENSE_ERROR",
        _ => "CUBLAS_STATUS_<unknown>",
    }
}

#[derive(Debug)]
pub(crate) struct State {
    pub cfg: SimConfig,
    /// This simulator's number, unique in the process: addresses repeat across simulators, so
    /// an IPC handle names the simulator as well as the allocation.
    pub instance: u64,
    pub now: Duration,
    pub initialized: bool,
    /// Once set, every call fails with it (a sticky error such as 700).
    pub sticky: Option<CuCode>,
    /// An error from earlier asynchronous work, surfacing at the next synchronising call.
    pub pending: Option<CuCode>,
    pub faults: FaultPlan,
    pub log: OpLog,
    pub log_seq: u64,
    pub mem: Memory,
    pub streams: HashMap<u64, StreamState>,
    pub events: HashMap<u64, EventState>,
    pub capture: Option<Capture>,
    pub graphs: Graphs,
    pub kernels: Kernels,
    pub blas: HashMap<u64, BlasState>,
    next_handle: u64,
    /// Number of the next queued operation, across all streams (orders cross-stream waits).
    pub next_seq: u64,
}

impl State {
    pub(crate) fn new(cfg: SimConfig) -> Self {
        let mut streams = HashMap::new();
        streams.insert(LEGACY.0, StreamState::new(StreamKind::Blocking));
        State {
            instance: NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed),
            mem: Memory::new(cfg.capacity, cfg.poison_on_free),
            log: OpLog::new(cfg.op_log_capacity),
            cfg,
            now: Duration::ZERO,
            initialized: false,
            sticky: None,
            pending: None,
            faults: FaultPlan::default(),
            log_seq: 0,
            streams,
            events: HashMap::new(),
            capture: None,
            graphs: Graphs::default(),
            kernels: Kernels::with_builtins(),
            blas: HashMap::new(),
            next_handle: 0x100,
            next_seq: 1,
        }
    }

    /// A fresh handle value, distinct across every handle type (easier to read in logs).
    pub(crate) fn handle(&mut self) -> u64 {
        self.next_handle += 1;
        self.next_handle
    }

    /// What happens before a call does its own work. Time moves by `call_time` for every call
    /// that reaches the driver, so polling loops see the clock advance.
    pub(crate) fn prologue(&mut self, cx: &mut Cx) -> DriverResult<()> {
        if self.cfg.missing_driver {
            return Err(missing_driver());
        }
        // cuDriverGetVersion is the one call the real driver answers before cuInit.
        if !self.initialized && cx.call != calls::INIT && cx.call != calls::DRIVER_GET_VERSION {
            return Err(cx.cuda(CuCode::NOT_INITIALIZED));
        }
        if let Some(code) = self.sticky {
            return Err(cx.cuda(code));
        }
        self.now = self.now.saturating_add(self.cfg.call_time);
        match self.faults.on_call(cx.call) {
            Some(FaultAction::Fail(code)) if calls::is_blas(cx.call) => Err(cx.blas(code.0)),
            Some(FaultAction::Fail(code)) => Err(cx.cuda(code)),
            Some(FaultAction::Sticky(code)) => {
                self.sticky = Some(code);
                Err(cx.cuda(code))
            }
            Some(FaultAction::Stall(d)) => {
                cx.stall = d;
                Ok(())
            }
            Some(FaultAction::FailAtNextSync(code)) => {
                cx.fail_next_sync = Some(code);
                Ok(())
            }
            Some(FaultAction::Hang) => {
                cx.hang = true;
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Charges a stall the call did not hand to a stream, and logs the call.
    pub(crate) fn epilogue(
        &mut self,
        cx: &mut Cx,
        capture: Option<CaptureSnapshot>,
        result: Result<(), DriverError>,
    ) {
        if let Some(code) = cx.fail_next_sync.take() {
            self.pending = Some(code);
        }
        let stall = cx.take_stall();
        self.now = self.now.saturating_add(stall);
        if self.cfg.real_time_stalls && !stall.is_zero() {
            std::thread::sleep(stall);
        }
        if result.is_err() && cx.effect != super::oplog::Effect::Refused {
            cx.effect = Effect::Failed;
        }
        self.log_seq += 1;
        self.log.push(OpRecord {
            seq: self.log_seq,
            call: cx.call,
            stream: cx.stream,
            thread: cx.thread,
            capture,
            effect: cx.effect,
            result,
            at: self.now,
        });
    }

    /// The capture in progress, for the op log.
    pub(crate) fn capture_snapshot(&self) -> Option<CaptureSnapshot> {
        self.capture.as_ref().map(|c| CaptureSnapshot {
            stream: c.stream,
            mode: c.mode,
            status: if c.invalidated {
                CaptureStatus::Invalidated
            } else {
                CaptureStatus::Active
            },
        })
    }

    /// Returns the pending asynchronous error, if any, as this call's error. A sticky code stays
    /// for every later call.
    pub(crate) fn surface(&mut self, cx: &Cx) -> DriverResult<()> {
        match self.pending.take() {
            Some(code) => {
                if code.is_sticky() {
                    self.sticky = Some(code);
                }
                Err(cx.cuda(code))
            }
            None => Ok(()),
        }
    }

    /// Whether a sticky fault has happened (then queued work no longer runs, as on a GPU whose
    /// context is lost).
    pub(crate) fn faulted(&self) -> bool {
        self.sticky.is_some() || self.pending.is_some_and(CuCode::is_sticky)
    }
}

/// The error every call returns when the simulated machine has no driver.
pub(crate) fn missing_driver() -> DriverError {
    DriverError::Load(cuda_sys::LoadError::LibraryNotFound {
        library: "libcuda",
        tried: vec!["libcuda.so.1 (simulated: no driver)".to_string()],
    })
}

impl State {
    /// The simulator has one device, ordinal 0.
    pub(crate) fn check_ordinal(&self, cx: &Cx, ordinal: u32) -> DriverResult<()> {
        if ordinal == 0 {
            Ok(())
        } else {
            Err(cx.cuda(CuCode::INVALID_DEVICE))
        }
    }
}
