//! The arena: scratch segments, the held region, the overflow pool and capture reservations
//! over one `Device<D>`, with one mutex around the host-side bookkeeping, and a lock-free
//! scratch window for the open `Step` (see `fast`).

mod alloc;
pub(crate) mod fast;
mod held;
mod locked;
mod reclaim;
pub(crate) mod reserve;
pub(crate) mod reclaim_summary {
    pub use super::reclaim::StepSummary;
}
mod scratch;
pub(crate) mod state;
pub(crate) mod window;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use zdevice::{Device, Driver};

use crate::block::{Block, Flags, GenCell, Reclaim, Returned};
use crate::class::AllocClass;
use crate::config::ArenaConfig;
use crate::diag::Diagnostics;
use crate::error::{MemError, MemResult};
use crate::step::{OwnedStep, Step};
use crate::timeline::{Event, Timeline, TimelineSnapshot};
use fast::FastScratch;
pub(crate) use locked::{Core, Locked};
use state::{Counters, Overflow, ReservationLedger, State, StepBook, Usage, WindowBook};

/// A subscriber to the timeline, called (outside the arena's lock) with each event.
pub type Sink = Arc<dyn Fn(&Event) + Send + Sync>;

static NEXT_ARENA: AtomicU64 = AtomicU64::new(1);

pub(crate) struct Shared<D: Driver> {
    pub(crate) device: Device<D>,
    pub(crate) config: ArenaConfig,
    pub(crate) core: Core,
    pub(crate) sinks: RwLock<Vec<Sink>>,
    pub(crate) me: Weak<Shared<D>>,
}

/// Device memory for one engine: step-scoped scratch, saved and persistent blocks, overflow
/// into a stream-ordered pool, and capture reservations. Cheap to clone (shared).
pub struct Arena<D: Driver> {
    pub(crate) shared: Arc<Shared<D>>,
}

impl<D: Driver> Clone for Arena<D> {
    fn clone(&self) -> Self {
        Arena {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<D: Driver> std::fmt::Debug for Arena<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Arena({})", self.diagnostics())
    }
}

/// Negative-control switches: each removes one protection so its test can be seen to fail.
/// Only with the `testing` feature.
#[cfg(any(test, feature = "testing"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protection {
    /// `Block::ptr` refuses handles whose memory was reclaimed.
    GenerationCheck,
    /// Step end keeps scratch blocks that are still referenced.
    KeepLiveScratch,
    /// Allocations during a capture come from the active reservation (or are refused).
    CaptureRouting,
}

impl<D: Driver> Arena<D> {
    /// Creates an arena on `device`: allocates the initial scratch segments and the overflow
    /// pool with its reserve, then logs the configuration and a diagnostics snapshot
    /// (`zmem.arena.new`). Refused during capture.
    pub fn new(device: Device<D>, config: ArenaConfig) -> MemResult<Arena<D>> {
        config.validate()?;
        let sanitize = config.sanitize || crate::config::sanitize_forced()?;
        if device.is_capturing() {
            return Err(MemError::CaptureActive {
                op: "creating an arena",
            });
        }
        let total = device.info().total_memory;
        let cap = config.cap_for(total);
        let flags = Arc::new(Flags {
            arena_id: NEXT_ARENA.fetch_add(1, Ordering::Relaxed),
            generation_check: AtomicBool::new(true),
            keep_live_scratch: AtomicBool::new(true),
            capture_routing: AtomicBool::new(true),
            overflow_enabled: AtomicBool::new(true),
            sanitize,
        });
        let state = State {
            segs: Vec::new(),
            cur: 0,
            held: Vec::new(),
            held_cell: GenCell::new(&flags),
            seg_bytes: 0,
            cap,
            block_pool: None,
            overflow: Overflow::default(),
            capture: ReservationLedger::new(device.capture_watch(), flags.arena_id),
            steps: StepBook::default(),
            window: WindowBook::default(),
            usage: Usage::default(),
            n: Counters::default(),
            timeline: Timeline::new(config.timeline_events),
        };
        let fast = FastScratch::new(config.timeline_events);
        let shared = Arc::new_cyclic(|me| Shared {
            device,
            config,
            core: Core {
                flags,
                state: Mutex::new(state),
                fast,
                has_sinks: AtomicBool::new(false),
            },
            sinks: RwLock::new(Vec::new()),
            me: me.clone(),
        });
        let arena = Arena { shared };
        {
            let sh = &arena.shared;
            let mut st = sh.lock();
            if sanitize {
                // Before any block: every one is allocated from it, none from segments made
                // up front (there are none in this mode).
                st.block_pool = Some(sh.device.create_pool(0, u64::MAX)?);
            }
            let want = if sanitize {
                0
            } else {
                sh.config.initial_bytes.min(cap)
            };
            while st.seg_bytes < want {
                let size = sh.config.segment_bytes.min(cap - st.seg_bytes);
                sh.grow_scratch(&mut st, size)?;
            }
            let reserve = sh.config.overflow_reserve_bytes;
            let pool = sh.device.create_pool(reserve, u64::MAX)?;
            st.overflow.stats.reserved = pool.reserved;
            st.raise_reserved_peak();
            st.overflow.pool = Some(pool);
            tracing::info!(
                target: "zmem.arena.new",
                config = %sh.config,
                sanitize,
                device = %sh.device.info().name,
                diagnostics = %st.diagnostics(),
                "arena created"
            );
        }
        Ok(arena)
    }

    /// Opens a step. Scratch blocks allocated through it are reclaimed when it ends, except
    /// those a handle still refers to (kept, exactly). One step at a time per arena.
    #[track_caller]
    pub fn step(&self) -> MemResult<Step<'_, D>> {
        let origin = std::panic::Location::caller();
        let index = self.shared.open_step(origin)?;
        Ok(Step::new(self, index))
    }

    /// Opens a step that holds its own handle to the arena (see [`OwnedStep`]). Same rules as
    /// [`Arena::step`]: one step at a time.
    #[track_caller]
    pub fn step_owned(&self) -> MemResult<OwnedStep<D>> {
        let origin = std::panic::Location::caller();
        let index = self.shared.open_step(origin)?;
        Ok(OwnedStep::new(self.clone(), index))
    }

    /// Allocates scratch in the open step, as a plain [`Block`] (`NoOpenStep` if none is open).
    /// Prefer [`Step::alloc_scratch`], whose handles cannot outlive the step at compile time.
    pub fn alloc_scratch(&self, bytes: u64) -> MemResult<Block> {
        if self.shared.lock().steps.open.is_none() {
            return Err(MemError::NoOpenStep { requested: bytes });
        }
        self.shared.alloc(AllocClass::Scratch, bytes)
    }

    /// Allocates a block saved for backward: it lives until its last handle is dropped, and no
    /// step reclaim ever touches it.
    pub fn alloc_saved(&self, bytes: u64) -> MemResult<Block> {
        self.shared.alloc(AllocClass::Saved, bytes)
    }

    /// Allocates a persistent block (parameters, gradients, optimiser state).
    pub fn alloc_persistent(&self, bytes: u64) -> MemResult<Block> {
        self.shared.alloc(AllocClass::Persistent, bytes)
    }

    /// Allocates a block of the shadow class (a reduced-precision copy of persistent
    /// tensors): held as a persistent block is, counted apart.
    pub fn alloc_shadow(&self, bytes: u64) -> MemResult<Block> {
        self.shared.alloc(AllocClass::Shadow, bytes)
    }

    /// The block's address, checked: `UseAfterReclaim` if its memory was reclaimed,
    /// `ForeignBlock` if another arena issued it.
    pub fn resolve(&self, block: &Block) -> MemResult<zdevice::DevicePtr> {
        if block.arena_id() != self.shared.core.flags.arena_id {
            return Err(MemError::ForeignBlock);
        }
        block.ptr()
    }

    /// A snapshot of the arena's state.
    #[must_use]
    pub fn diagnostics(&self) -> Diagnostics {
        self.shared.lock().diagnostics()
    }

    /// Starts the peaks ([`Diagnostics::peak_bytes_by_class`], `peak_live_bytes`,
    /// `peak_reserved_bytes`) again from the bytes held now, to measure a later stretch of the
    /// run alone (one step, say, as PyTorch's `reset_peak_memory_stats` does).
    pub fn reset_peaks(&self) {
        let mut st = self.shared.lock();
        st.usage.peak = st.usage.by_class;
        st.usage.peak_total = st.usage.by_class.total();
        st.usage.peak_reserved = st.reserved_bytes();
    }

    /// A copy of the timeline (recent events and every step's aggregates).
    #[must_use]
    pub fn timeline(&self) -> TimelineSnapshot {
        let st = self.shared.lock();
        st.timeline.snapshot(st.steps.open.is_some())
    }

    /// Calls `sink` with every later event, outside the arena's lock (a sink may use the arena).
    /// Allocations then take the locked path, so that the sink sees each event as it happens.
    pub fn subscribe(&self, sink: Sink) {
        // Under the arena's lock: releasing it closes the fast path's gate.
        let _st = self.shared.lock();
        let mut sinks = self
            .shared
            .sinks
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        sinks.push(sink);
        self.shared.core.has_sinks.store(true, Ordering::Release);
    }

    /// The configuration the arena runs with.
    #[must_use]
    pub fn config(&self) -> &ArenaConfig {
        &self.shared.config
    }

    /// Whether the arena runs in sanitizer mode (its config or `ZMEM_SANITIZE=1`): every block
    /// is its own driver allocation.
    #[must_use]
    pub fn sanitize(&self) -> bool {
        self.shared.core.flags.sanitize
    }

    /// The device underneath.
    #[must_use]
    pub fn device(&self) -> &Device<D> {
        &self.shared.device
    }

    /// Applies frees and poison that arrived while a capture was active. Every allocation and
    /// step end does this too; call it after a capture to return memory sooner.
    pub fn flush(&self) -> MemResult<()> {
        if self.shared.device.is_capturing() {
            return Err(MemError::CaptureActive { op: "flush" });
        }
        let events = {
            let mut st = self.shared.lock();
            self.shared.flush_pending(&mut st)
        };
        self.shared.publish(&events);
        Ok(())
    }

    /// Allows or forbids overflow into the stream-ordered pool (allowed by default). With it
    /// forbidden, a request the segments cannot serve within the cap is `OutOfMemory` at once,
    /// carrying the diagnostics: for runs that must stay inside the arena's budget.
    pub fn set_overflow_enabled(&self, enabled: bool) {
        self.shared
            .core
            .flags
            .overflow_enabled
            .store(enabled, Ordering::Relaxed);
        tracing::info!(target: "zmem.arena.overflow", enabled, "overflow into the pool switched");
    }

    /// Whether requests may overflow into the pool.
    #[must_use]
    pub fn overflow_enabled(&self) -> bool {
        self.shared
            .core
            .flags
            .overflow_enabled
            .load(Ordering::Relaxed)
    }

    /// Test-only: switches one protection off or on, to prove that its test can fail.
    /// Never turn a protection off in real code. Only with the `testing` feature (tests enable
    /// it; a release build of `ztrain` has no such switch).
    #[cfg(any(test, feature = "testing"))]
    pub fn set_protection_for_tests(&self, protection: Protection, enabled: bool) {
        let f = &self.shared.core.flags;
        let flag = match protection {
            Protection::GenerationCheck => &f.generation_check,
            Protection::KeepLiveScratch => &f.keep_live_scratch,
            Protection::CaptureRouting => &f.capture_routing,
        };
        flag.store(enabled, Ordering::Relaxed);
    }
}

impl<D: Driver> Shared<D> {
    pub(crate) fn lock(&self) -> Locked<'_> {
        self.core.lock()
    }

    /// Sends events to subscribers (call after releasing the lock).
    pub(crate) fn publish(&self, events: &[Event]) {
        if events.is_empty() || !self.core.has_sinks.load(Ordering::Acquire) {
            return;
        }
        let sinks = self
            .sinks
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        for e in events {
            for s in &sinks {
                s(e);
            }
        }
    }

    pub(crate) fn wants_events(&self) -> bool {
        self.core.has_sinks.load(Ordering::Relaxed)
    }

    /// Sanitizer mode (see [`ArenaConfig::sanitize`]).
    pub(crate) fn sanitized(&self) -> bool {
        self.core.flags.sanitize
    }

    pub(crate) fn reclaimer(&self) -> Weak<dyn Reclaim> {
        self.me.clone()
    }
}

impl<D: Driver> Reclaim for Shared<D> {
    fn give_back(&self, r: Returned) {
        self.return_memory(r);
    }

    fn graph_dropped(&self, reservation: u64) {
        let ev = {
            let mut st = self.lock();
            let at = Some(self.device.driver().now());
            st.timeline
                .push(at, crate::timeline::EventKind::GraphDrop { reservation })
        };
        self.publish(&[ev]);
    }
}

impl<D: Driver> Drop for Shared<D> {
    fn drop(&mut self) {
        self.teardown();
    }
}
