//! The fault matrix: every driver call a training workload makes x {fails now, fails at the
//! next sync, stalls, sticky error at the next sync}, through `FaultyDriver` over any driver.
//!
//! The workload is two zgrad steps of the XAsset model through zcompute's `CudaBackend`, in
//! each of the four modes (batched or per-sample, eager or captured). A clean recording run
//! lists the calls it makes, at setup (device, arena, backend, model, trainer) and in the
//! steps. Each case then runs on a fresh driver with one fault: on the first call of its name
//! in the steps, or at setup for a call only setup makes. Every case must end without a hang
//! (deadlines of at most 1 s) or a panic, with typed errors; when the device is not lost, a
//! restored state (initial parameters and optimiser state) then trains to the clean run's
//! parameters, and after teardown the wrapper's ledger shows nothing left allocated or alive.
//! A case whose faulted run returned `Ok` must also have matched the clean run: a fault the
//! engine swallows must not change the result.
//!
//! `case` runs one case, `table` the whole matrix; `sim` and `gpu` are the two drivers.

#![allow(clippy::print_stdout)] // the matrix's table is the test's output

mod case;
mod child;
#[cfg(feature = "gpu")]
mod gpu;
mod sim;
mod table;

use std::time::Duration;

use zdevice::{AsyncStall, CuCode, DeviceConfig, FaultAction};
use zgrad::TrainSchedule;
use zmem::ArenaConfig;

use crate::common::Size;

pub use table::matrix;

/// One of the four ways the trainer runs a step.
#[derive(Clone, Copy, Debug)]
pub struct Mode {
    pub name: &'static str,
    pub schedule: TrainSchedule,
    pub capture: bool,
}

pub const MODES: [Mode; 4] = [
    Mode {
        name: "batched eager",
        schedule: TrainSchedule::Batched,
        capture: false,
    },
    Mode {
        name: "batched captured",
        schedule: TrainSchedule::Batched,
        capture: true,
    },
    Mode {
        name: "per-sample eager",
        schedule: TrainSchedule::PerSample,
        capture: false,
    },
    Mode {
        name: "per-sample captured",
        schedule: TrainSchedule::PerSample,
        capture: true,
    },
];

/// The fault a case injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The call fails with a non-sticky code and has no effect.
    Now,
    /// The call succeeds; the next sync or query fails with a non-sticky code.
    AtNextSync,
    /// The call is late by more than every deadline.
    Stall,
    /// The call succeeds; the next sync or query fails with 700 (sticky: the device is lost).
    StickyAtNextSync,
}

impl Fault {
    pub const ALL: [Fault; 4] = [
        Fault::Now,
        Fault::AtNextSync,
        Fault::Stall,
        Fault::StickyAtNextSync,
    ];

    pub fn header(self) -> &'static str {
        match self {
            Fault::Now => "fails now",
            Fault::AtNextSync => "fails at next sync",
            Fault::Stall => "stalls",
            Fault::StickyAtNextSync => "sticky 700 at next sync",
        }
    }

    pub(crate) fn action(self, call: &str, stall: Duration) -> FaultAction {
        match self {
            // An allocation fails as it does in practice; any other call with a bad value.
            Fault::Now if call.contains("Alloc") || call.starts_with("cublasCreate") => {
                FaultAction::Fail(CuCode::OUT_OF_MEMORY)
            }
            Fault::Now => FaultAction::Fail(CuCode::INVALID_VALUE),
            Fault::AtNextSync => FaultAction::FailAtNextSync(CuCode::INVALID_VALUE),
            Fault::Stall => FaultAction::Stall(stall),
            Fault::StickyAtNextSync => FaultAction::FailAtNextSync(CuCode::ILLEGAL_ADDRESS),
        }
    }
}

/// Sizes and deadlines of a matrix run.
#[derive(Clone, Debug)]
pub struct Settings {
    pub size: Size,
    pub arena: ArenaConfig,
    /// Deadlines of the faulted devices (each at most 1 s).
    pub device: DeviceConfig,
    /// How late a stalled call is (longer than every deadline).
    pub stall: Duration,
    /// How a stalled asynchronous call keeps its stream busy (a spinning kernel on the GPU).
    pub async_stall: AsyncStall,
    /// Largest relative difference per parameter tensor from the clean run.
    pub tolerance: f64,
}

/// The calls a clean run makes: setup first, then the steps, each in first-call order.
#[derive(Clone, Debug, Default)]
pub struct CallList {
    pub setup: Vec<&'static str>,
    pub steps: Vec<&'static str>,
}

impl CallList {
    /// Every call once: those of the steps, then those only setup makes.
    pub fn all(&self) -> Vec<(&'static str, bool)> {
        let mut out: Vec<_> = self.steps.iter().map(|c| (*c, true)).collect();
        out.extend(
            self.setup
                .iter()
                .filter(|c| !self.steps.contains(c))
                .map(|c| (*c, false)),
        );
        out
    }
}

/// What a case ended as.
#[derive(Clone, Debug)]
pub struct CaseResult {
    /// `ok`, or where it failed and the error's variant path (`step 1: Compute::Timeout`).
    pub outcome: String,
    /// `recovered` (restored state trained to the clean result), `lost` or `sticky`.
    pub after: String,
    /// The promise the case broke (a panic, a leak, a wrong result, no recovery), if any.
    pub broken: Option<String>,
}

impl CaseResult {
    pub(crate) fn broken(why: String) -> Self {
        CaseResult {
            outcome: "**BROKEN**".to_string(),
            after: "see below".to_string(),
            broken: Some(why),
        }
    }

    pub fn cell(&self) -> String {
        format!("{} → {}", self.outcome, self.after)
    }
}

/// The device configuration of a matrix: every deadline `deadline` (at most 1 s).
pub fn deadlines(base: DeviceConfig, sync: Duration, build: Duration) -> DeviceConfig {
    DeviceConfig {
        sync_deadline: sync,
        alloc_deadline: sync,
        build_deadline: build,
        ..base
    }
}

/// A small arena: the tiny model fits in a segment; growth and overflow stay possible.
pub fn small_arena() -> ArenaConfig {
    ArenaConfig {
        initial_bytes: 1 << 20,
        segment_bytes: 1 << 20,
        cap_bytes: Some(64 << 20),
        overflow_reserve_bytes: 1 << 20,
        poison: true,
        sanitize: false,
        timeline_events: 64,
        from_env: Vec::new(),
    }
}
