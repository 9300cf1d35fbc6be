//! Memory numbers for the progress bar and the summary, from whichever backend trains: the
//! arena's diagnostics and timeline on a device backend, the process's resident memory on the
//! CPU backend (which has no arena).

use zcompute::StepRecord;
use zcompute::{CpuBackend, CudaBackend, Driver};

use crate::progress::host_memory;

/// Where memory numbers come from.
pub trait MemorySource {
    /// What "memory" means here, for labels (`device` or `host`).
    fn kind(&self) -> &'static str;

    /// Bytes in use now.
    fn in_use(&self) -> u64;

    /// Highest bytes in use so far.
    fn peak(&self) -> u64;

    /// The arena's one-line diagnostics, or why there is none.
    fn diagnostics(&self) -> String;

    /// The arena's per-step aggregates for the whole run (`None`: no arena).
    fn steps(&self) -> Option<Vec<StepRecord>>;

    /// Arena bytes in use now (0 without an arena).
    fn arena_in_use(&self) -> u64;

    /// The arena's high-water mark so far (0 without an arena).
    fn arena_high_water(&self) -> u64;

    /// Device memory in use according to the driver (0 without a device).
    fn device_used(&self) -> u64;
}

impl MemorySource for CpuBackend {
    fn kind(&self) -> &'static str {
        "host"
    }

    fn in_use(&self) -> u64 {
        host_memory().map_or(0, |(now, _)| now)
    }

    fn peak(&self) -> u64 {
        host_memory().map_or(0, |(_, peak)| peak)
    }

    fn diagnostics(&self) -> String {
        "none: the CPU backend keeps tensors in host memory (no device arena); memory is the \
         process's resident size"
            .into()
    }

    fn steps(&self) -> Option<Vec<StepRecord>> {
        None
    }

    fn arena_in_use(&self) -> u64 {
        0
    }

    fn arena_high_water(&self) -> u64 {
        0
    }

    fn device_used(&self) -> u64 {
        0
    }
}

impl<D: Driver> MemorySource for CudaBackend<D> {
    fn kind(&self) -> &'static str {
        "device"
    }

    fn in_use(&self) -> u64 {
        self.arena().diagnostics().bytes_by_class.total()
    }

    fn peak(&self) -> u64 {
        let now = self.in_use();
        self.arena()
            .timeline()
            .steps
            .iter()
            .map(|r| r.peak_bytes)
            .max()
            .unwrap_or(0)
            .max(now)
    }

    fn diagnostics(&self) -> String {
        self.arena().diagnostics().to_string()
    }

    fn steps(&self) -> Option<Vec<StepRecord>> {
        Some(self.arena().timeline().steps)
    }

    fn arena_in_use(&self) -> u64 {
        self.in_use()
    }

    fn arena_high_water(&self) -> u64 {
        self.peak()
    }

    fn device_used(&self) -> u64 {
        self.device()
            .mem_info()
            .map_or(0, |(free, total)| total.saturating_sub(free))
    }
}
