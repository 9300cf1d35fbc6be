//! The op log: one record per driver call, for tests to state what happened (for example "no
//! `cuMemAlloc_v2` was issued during capture").
//!
//! The log is a ring, like zmem's timeline: it keeps the most recent
//! [`SimConfig::op_log_capacity`](super::SimConfig::op_log_capacity) records (default
//! [`DEFAULT_OP_LOG_CAPACITY`]) and counts the ones it dropped, so a long simulated run (a
//! per-sample training run makes about 400 calls a step) keeps bounded memory.

use std::collections::VecDeque;
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
    /// (a "silent" row of docs/capture-rules.md).
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

/// Records the op log keeps by default: 65,536 (about 6 MiB; some 160 per-sample training
/// steps of the tiny XAsset model).
pub const DEFAULT_OP_LOG_CAPACITY: usize = 1 << 16;

/// The ring behind the op log: the last `capacity` records and how many fell out of it.
#[derive(Debug)]
pub(crate) struct OpLog {
    records: VecDeque<OpRecord>,
    capacity: usize,
    dropped: u64,
}

impl OpLog {
    /// A ring of `capacity` records (0 keeps none, only counts).
    pub(crate) fn new(capacity: usize) -> Self {
        OpLog {
            // Grown on demand: most simulated devices live for a few hundred calls.
            records: VecDeque::new(),
            capacity,
            dropped: 0,
        }
    }

    /// Appends `record`, dropping the oldest one when full.
    pub(crate) fn push(&mut self, record: OpRecord) {
        if self.capacity == 0 {
            self.dropped = self.dropped.saturating_add(1);
            return;
        }
        if self.records.len() == self.capacity {
            self.records.pop_front();
            self.dropped = self.dropped.saturating_add(1);
        }
        self.records.push_back(record);
    }

    /// The kept records, oldest first.
    pub(crate) fn records(&self) -> Vec<OpRecord> {
        self.records.iter().cloned().collect()
    }

    /// Records dropped since creation or the last `clear` because the ring was full.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Empties the ring and resets the dropped count.
    pub(crate) fn clear(&mut self) {
        self.records.clear();
        self.dropped = 0;
    }

    /// Records kept now.
    pub(crate) fn len(&self) -> usize {
        self.records.len()
    }
}

#[cfg(test)]
mod tests {
    use super::DEFAULT_OP_LOG_CAPACITY;
    use crate::driver::Driver;
    use crate::sim::{SimConfig, SimDriver, calls};
    use crate::types::StreamKind;

    /// Before the ring, the log kept every record: 70,000 queries left 70,002 records.
    #[test]
    fn a_long_run_keeps_the_op_log_bounded_and_counts_what_it_dropped() {
        let d = SimDriver::default();
        d.init().unwrap();
        let s = d.stream_create(StreamKind::NonBlocking).unwrap();
        let calls_made = DEFAULT_OP_LOG_CAPACITY as u64 + 4_464;
        for _ in 2..calls_made {
            d.stream_query(s).unwrap();
        }
        assert_eq!(d.op_log_len(), DEFAULT_OP_LOG_CAPACITY);
        assert_eq!(
            d.op_log_dropped(),
            calls_made - DEFAULT_OP_LOG_CAPACITY as u64
        );
        let log = d.op_log();
        // The newest records are the ones kept, in order, numbered since creation.
        assert_eq!(log.last().map(|r| r.seq), Some(calls_made));
        assert_eq!(log[0].seq, calls_made - DEFAULT_OP_LOG_CAPACITY as u64 + 1);
        assert!(log.windows(2).all(|w| w[1].seq == w[0].seq + 1));
        d.clear_op_log();
        assert_eq!((d.op_log_len(), d.op_log_dropped()), (0, 0));
    }

    #[test]
    fn the_capacity_is_configurable_down_to_zero() {
        for capacity in [0, 1, 3] {
            let d = SimDriver::new(SimConfig {
                op_log_capacity: capacity,
                ..SimConfig::default()
            });
            d.init().unwrap();
            for _ in 0..5 {
                d.mem_get_info().unwrap();
            }
            let log = d.op_log();
            assert_eq!(log.len(), capacity);
            assert!(log.iter().all(|r| r.call == calls::MEM_GET_INFO));
            assert_eq!(d.op_log_dropped(), 6 - capacity as u64);
        }
    }
}
