//! Where the host's time goes in the queued steps (`queue` of loaded rows, `queue` of a pinned batch, `drain`),
//! for a per-step timeline (`ztrain --timeline`): the trainer adds each phase's wall time as it
//! runs; the caller takes the sums when it likes.

use std::time::{Duration, Instant};

/// Host wall time the trainer spent in each phase of its queued steps since the last
/// [`Trainer::take_host_phases`](super::Trainer::take_host_phases).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostPhases {
    /// Uploading the step's row indices (data on the device).
    pub index_upload: Duration,
    /// Queueing the step's rows on the copy stream (data staged from the host).
    pub staging: Duration,
    /// Queueing the step's work: the learning-rate slot, then the graph's replay (or its
    /// capture, or the eager ops).
    pub launch: Duration,
    /// Waiting for and reading back a window of steps.
    pub readback: Duration,
}

impl HostPhases {
    /// The sum of every phase.
    #[must_use]
    pub fn total(&self) -> Duration {
        self.index_upload + self.staging + self.launch + self.readback
    }
}

/// Runs `f`, adding its wall time to `into`.
pub(super) fn timed<R>(into: &mut Duration, f: impl FnOnce() -> R) -> R {
    let t0 = Instant::now();
    let out = f();
    *into += t0.elapsed();
    out
}
