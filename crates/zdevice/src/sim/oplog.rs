//! The op log: one record per driver call, for tests to state what happened (for example "no
//! `cuMemAlloc_v2` was issued during capture").

use std::thread::ThreadId;
use std::time::Duration;

use crate::driver::DriverError;
use crate::types::{CaptureMode, CaptureStatus, Stream};

/// What a call did with its work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Ran (or answered) at call time.
    Immediate,
    /// Queued on a stream, to run when the stream is drained.
    Enqueued,
    /// Added to the capturing stream's graph as this many nodes.
    Captured(usize),
    /// A synchronous copy or memset during capture: ran now, succeeded, and is not in the graph
    /// (a "silent" row of capture-rules.md).
    Silent,
    /// Refused by the capture rules (an error code, or `NotModelled`).
    Refused,
    /// Failed for another reason (bad argument, fault plan, sticky error, ...).
    Failed,
}

/// The capture in progress when a call was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CaptureSnapshot {
    /// The capturing stream.
    pub stream: Stream,
    /// Its mode.
    pub mode: CaptureMode,
    /// Active or Invalidated.
    pub status: CaptureStatus,
}

/// One driver call.
#[derive(Clone, Debug)]
pub struct OpRecord {
    /// Position in the log since the driver was created (not reset by `clear_op_log`).
    pub seq: u64,
    /// The CUDA function name (see [`calls`](super::calls)).
    pub call: &'static str,
    /// The stream the call named, if any.
    pub stream: Option<Stream>,
    /// The calling thread.
    pub thread: ThreadId,
    /// The capture in progress before the call, if any.
    pub capture: Option<CaptureSnapshot>,
    /// What became of the work.
    pub effect: Effect,
    /// The answer.
    pub result: Result<(), DriverError>,
    /// Virtual time when the call returned.
    pub at: Duration,
}

impl OpRecord {
    /// The CUDA status code of the answer: 0 for success, the code for a CUDA error, the
    /// cuBLAS status for a cuBLAS error, `u32::MAX` for other errors.
    #[must_use]
    pub fn code(&self) -> u32 {
        match &self.result {
            Ok(()) => 0,
            Err(DriverError::Cuda { code, .. }) => code.0,
            Err(DriverError::Cublas { status, .. }) => *status,
            Err(_) => u32::MAX,
        }
    }
}
