//! Where the host's time goes in the queued steps (`queue` of loaded rows, `queue` of a pinned batch, `drain`),
//! for a per-step timeline (`ztrain --timeline`): the trainer adds each phase's wall time as it
//! runs; the caller reads the sums (`TrainerStatus::host_phases`) when it likes.

use std::time::{Duration, Instant};

/// Host wall time the trainer spent in each phase of its queued steps since it was made
/// ([`TrainerStatus::host_phases`](super::TrainerStatus)), or between two such snapshots
/// ([`HostPhases::since`]).
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

    /// The time of each phase since `earlier`, a snapshot of the same trainer's sums taken
    /// before this one (the sums only grow; a phase that did not is zero).
    #[must_use]
    pub fn since(&self, earlier: &HostPhases) -> HostPhases {
        HostPhases {
            index_upload: self.index_upload.saturating_sub(earlier.index_upload),
            staging: self.staging.saturating_sub(earlier.staging),
            launch: self.launch.saturating_sub(earlier.launch),
            readback: self.readback.saturating_sub(earlier.readback),
        }
    }
}

/// Runs `f`, adding its wall time to `into`.
pub(super) fn timed<R>(into: &mut Duration, f: impl FnOnce() -> R) -> R {
    let t0 = Instant::now();
    let out = f();
    *into += t0.elapsed();
    out
}

#[cfg(test)]
mod tests {
    use super::HostPhases;
    use std::time::Duration;

    /// The time of each phase between two snapshots; an earlier snapshot given as the later
    /// one is zero, not an underflow.
    #[test]
    fn since_is_each_phases_time_between_two_snapshots() {
        let ms = Duration::from_millis;
        let earlier = HostPhases {
            index_upload: ms(1),
            staging: ms(2),
            launch: ms(3),
            readback: ms(4),
        };
        let later = HostPhases {
            index_upload: ms(1),
            staging: ms(5),
            launch: ms(10),
            readback: ms(4),
        };
        let between = HostPhases {
            index_upload: ms(0),
            staging: ms(3),
            launch: ms(7),
            readback: ms(0),
        };
        assert_eq!(later.since(&earlier), between);
        assert_eq!(later.since(&later), HostPhases::default());
        assert_eq!(earlier.since(&later).total(), Duration::ZERO);
    }
}
