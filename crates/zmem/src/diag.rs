//! The diagnostics snapshot: everything needed to say why an arena is full, in one line.

use std::fmt;

use crate::class::ClassBytes;
use crate::units::Bytes;

/// What drove a reset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResetInfo {
    /// The step whose end reclaimed.
    pub step: u64,
    /// Who: `Step::end at src/train.rs:42`, `Step drop (opened at …)`.
    pub by: String,
    /// Bytes made reusable.
    pub reclaimed_bytes: u64,
    /// Scratch blocks kept because they were still referenced.
    pub kept_blocks: usize,
}

/// Overflow pool counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OverflowStats {
    /// Requests served by the pool.
    pub calls: u64,
    /// Bytes they asked for in all.
    pub bytes: u64,
    /// Bytes outstanding now.
    pub outstanding: u64,
    /// Highest outstanding.
    pub peak: u64,
    /// Bytes the pool reserved up front.
    pub reserved: u64,
}

/// Capture reservation counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CaptureStats {
    /// Reservations alive (held by a graph or by a block from it).
    pub reservations: usize,
    /// Their bytes.
    pub reserved: u64,
    /// Bytes handed out from them.
    pub used: u64,
    /// Whether allocations are being routed to a reservation right now.
    pub active: bool,
}

/// Why an arena could not serve a request from its segments, as read from a snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FillCause {
    /// The arena has room (or has never been asked for more than it has).
    NotFull,
    /// The arena filled without a single step reset: a loop that never ends its steps.
    NeverReset,
    /// Memory held by live handles (kept scratch, saved, persistent) fills the cap: the
    /// working set is genuinely larger than the arena.
    WorkingSetFull,
    /// One request was larger than a segment could ever hold within the cap.
    HugeRequest,
    /// Full after resets with little held: many allocations in one step.
    StepTooLarge,
}

impl FillCause {
    /// Lower-case name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            FillCause::NotFull => "not full",
            FillCause::NeverReset => "never reset",
            FillCause::WorkingSetFull => "working set full",
            FillCause::HugeRequest => "one huge request",
            FillCause::StepTooLarge => "one step allocates more than the arena",
        }
    }
}

/// A snapshot of an arena. Cheap to take; `Display` prints it on one line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Diagnostics {
    /// Bytes in segments (scratch and held).
    pub capacity: u64,
    /// Most the segments may add up to.
    pub cap: u64,
    /// Scratch segments.
    pub scratch_segments: usize,
    /// Saved/persistent segments.
    pub held_segments: usize,
    /// Scratch bytes bumped in the current step (including skipped pins).
    pub offset: u64,
    /// Highest `offset` seen.
    pub high_water: u64,
    /// Allocations since the last reset.
    pub allocations_since_reset: u64,
    /// Bytes since the last reset.
    pub bytes_since_reset: u64,
    /// Allocations over the arena's life.
    pub allocations: u64,
    /// Largest request over the arena's life.
    pub largest_request: u64,
    /// Requests served from memory that earlier steps or frees had used.
    pub reuses: u64,
    /// Step resets.
    pub resets: u64,
    /// The last reset.
    pub last_reset: Option<ResetInfo>,
    /// Overflow pool counters.
    pub overflow: OverflowStats,
    /// Bytes held by class (scratch counts this step's blocks and kept ones).
    pub bytes_by_class: ClassBytes,
    /// Peak live bytes by class, each class's own highest (since the arena was made or
    /// [`Arena::reset_peaks`](crate::Arena::reset_peaks)): scratch counts the bytes a step
    /// bumped through plus kept blocks, graph the bytes handed out from capture reservations.
    /// What a memory plan predicts.
    pub peak_bytes_by_class: ClassBytes,
    /// Peak live bytes over all classes at one moment (scratch + saved + persistent + graph,
    /// overflow blocks included in their class), since the arena was made or `reset_peaks`:
    /// the counterpart of PyTorch's `max_memory_allocated`. At most the sum of the per-class
    /// peaks, which need not fall at the same moment.
    pub peak_live_bytes: u64,
    /// Device bytes the arena holds now, used or not: segments (scratch and held region),
    /// capture reservations and the overflow pool (its up-front reserve, or what is
    /// outstanding when more). The counterpart of PyTorch's `memory_reserved`.
    pub reserved_bytes: u64,
    /// Highest `reserved_bytes` since the arena was made or `reset_peaks` (PyTorch's
    /// `max_memory_reserved`).
    pub peak_reserved_bytes: u64,
    /// Live handles (blocks with at least one clone alive).
    pub live_handles: u64,
    /// Scratch bytes kept across step ends by live handles.
    pub pinned_bytes: u64,
    /// Free bytes in the held region.
    pub held_free: u64,
    /// Capture reservations.
    pub capture: CaptureStats,
    /// The step open now (0 if none).
    pub open_step: u64,
    /// Sanitizer mode: every block is its own driver allocation (segments hold one block each;
    /// `capacity` counts the bytes of those allocations).
    pub sanitize: bool,
}

impl Diagnostics {
    /// Reads the snapshot to tell the ways an arena fills apart.
    #[must_use]
    pub fn fill_cause(&self) -> FillCause {
        if self.largest_request > self.cap {
            return FillCause::HugeRequest;
        }
        if self.overflow.calls == 0 && self.capacity < self.cap {
            return FillCause::NotFull;
        }
        let held = self.pinned_bytes
            + self.bytes_by_class.get(crate::AllocClass::Saved)
            + self.bytes_by_class.get(crate::AllocClass::Persistent)
            + self.bytes_by_class.get(crate::AllocClass::Shadow);
        if self.resets == 0 && self.allocations_since_reset > 0 && held * 2 < self.cap {
            return FillCause::NeverReset;
        }
        if held * 2 >= self.cap {
            return FillCause::WorkingSetFull;
        }
        FillCause::StepTooLarge
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "arena {} of cap {} in {}+{} segs, step {} offset {} hwm {}, {} allocs/{} since reset, {} allocs total, largest {}, {} reuses, {} resets",
            Bytes(self.capacity),
            Bytes(self.cap),
            self.scratch_segments,
            self.held_segments,
            self.open_step,
            Bytes(self.offset),
            Bytes(self.high_water),
            self.allocations_since_reset,
            Bytes(self.bytes_since_reset),
            self.allocations,
            Bytes(self.largest_request),
            self.reuses,
            self.resets,
        )?;
        if let Some(r) = &self.last_reset {
            write!(
                f,
                " (last: step {} by {}, {} reclaimed, {} kept)",
                r.step,
                r.by,
                Bytes(r.reclaimed_bytes),
                r.kept_blocks
            )?;
        }
        write!(
            f,
            "; overflow {} calls/{} (now {}, peak {}, reserve {}); held {} (peak {}); live peak {}, reserved {} (peak {}); {} live handles, pinned {}, held free {}; capture {} res {} used {}{}{}; verdict: {}",
            self.overflow.calls,
            Bytes(self.overflow.bytes),
            Bytes(self.overflow.outstanding),
            Bytes(self.overflow.peak),
            Bytes(self.overflow.reserved),
            self.bytes_by_class,
            self.peak_bytes_by_class,
            Bytes(self.peak_live_bytes),
            Bytes(self.reserved_bytes),
            Bytes(self.peak_reserved_bytes),
            self.live_handles,
            Bytes(self.pinned_bytes),
            Bytes(self.held_free),
            self.capture.reservations,
            Bytes(self.capture.reserved),
            Bytes(self.capture.used),
            if self.capture.active { " (active)" } else { "" },
            if self.sanitize {
                "; sanitize on (one driver allocation per block)"
            } else {
                ""
            },
            self.fill_cause().name(),
        )
    }
}
