//! The arena's host-side bookkeeping, kept behind one mutex.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use zdevice::{CaptureWatch, DevicePool, DevicePtr};

use super::fast::Folded;
use super::held::HeldSegment;
use super::scratch::Segment;
use crate::block::{BlockInner, GenCell, Returned};
use crate::class::{AllocClass, ClassBytes};
use crate::diag::{CaptureStats, Diagnostics, OverflowStats, ResetInfo};
use crate::timeline::Timeline;

/// One driver allocation of a capture reservation. By default a reservation is one shared
/// slot that blocks bump through; in sanitizer mode it is one exclusive slot per recorded
/// request (plus a shared one for headroom), so that each graph block is its own allocation.
pub(crate) struct Slot {
    pub(crate) ptr: DevicePtr,
    /// Bytes blocks may use.
    pub(crate) size: u64,
    /// Bytes handed out (an exclusive slot is used whole by its one block).
    pub(crate) used: u64,
    /// Whether several blocks bump through it.
    pub(crate) shared: bool,
}

/// A capture reservation as the arena tracks it.
pub(crate) struct ResInfo {
    pub(crate) bytes: u64,
    /// Bytes counted in the graph class: the most any capture into it handed out (a graph
    /// pool's members share the memory, so it counts once, at the largest member).
    pub(crate) used: u64,
    /// Bytes the open (or last) capture into it handed out.
    pub(crate) cur: u64,
    /// Captures begun into it (more than one only for a graph pool's memory).
    pub(crate) captures: u64,
    pub(crate) slots: Vec<Slot>,
    pub(crate) blocks: Vec<Weak<BlockInner>>,
    /// The reservation's generation: moved at teardown, so that graph blocks outliving the
    /// arena go stale like every other class.
    pub(crate) cell: Arc<GenCell>,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) allocations: u64,
    pub(crate) since_reset: u64,
    pub(crate) bytes_since_reset: u64,
    pub(crate) largest: u64,
    pub(crate) reuses: u64,
    pub(crate) resets: u64,
    pub(crate) high_water: u64,
    pub(crate) last_reset: Option<ResetInfo>,
}

/// The overflow pool and what it serves.
#[derive(Default)]
pub(crate) struct Overflow {
    pub(crate) pool: Option<DevicePool>,
    pub(crate) stats: OverflowStats,
    /// Scratch bytes the pool serves now.
    pub(crate) scratch: u64,
    /// Scratch blocks served by the pool (they return themselves when dropped).
    pub(crate) blocks: Vec<Weak<BlockInner>>,
    /// Whether the first-overflow warning has been given.
    pub(crate) warned: bool,
    /// The step of the last overflow warning (at most one per step).
    pub(crate) warned_step: u64,
    /// Highest overflow outstanding over the steps already ended: a later step warns only
    /// when it goes above it, so a steady loop that overflows the same amount warns once.
    pub(crate) prev_steps_peak: u64,
}

/// The arena's capture reservations: the dry run being recorded, the live reservations, the
/// pool they come from, and the returns held back while a capture runs. Whether one of them
/// is routed to is not kept here: the device's capture session carries the routed
/// reservation, and this ledger reads it through `watch`.
pub(crate) struct ReservationLedger {
    /// The device's capture session, read lock-free.
    pub(crate) watch: CaptureWatch,
    /// This arena's tag on the session (its arena id).
    pub(crate) owner: u64,
    pub(crate) pool: Option<DevicePool>,
    pub(crate) recording: Option<Vec<u64>>,
    pub(crate) reservations: BTreeMap<u64, ResInfo>,
    pub(crate) next_reservation: u64,
    /// Returns that arrived while a capture was active: applied once it has ended.
    pub(crate) pending: Vec<Returned>,
}

impl ReservationLedger {
    pub(crate) fn new(watch: CaptureWatch, owner: u64) -> ReservationLedger {
        ReservationLedger {
            watch,
            owner,
            pool: None,
            recording: None,
            reservations: BTreeMap::new(),
            next_reservation: 1,
            pending: Vec::new(),
        }
    }

    /// Whether the device's capture session routes allocations to one of these reservations.
    pub(crate) fn routed(&self) -> bool {
        self.watch.routes_to(self.owner)
    }
}

/// Which step is open, the last one opened, and where it was opened.
#[derive(Default)]
pub(crate) struct StepBook {
    pub(crate) open: Option<u64>,
    pub(crate) last: u64,
    pub(crate) origin: String,
}

/// The open `Step`'s lock-free window, as of the last fold of the fast path.
#[derive(Default)]
pub(crate) struct WindowBook {
    /// How much of the fast path's counters and events has been folded in.
    pub(crate) folded: Folded,
    /// The segment of the window, if one is open.
    pub(crate) seg: Option<usize>,
    /// Bytes of the window not bumped yet: counted in its segment's offset, but not allocated.
    pub(crate) unused: u64,
    /// Plain scratch handles alive.
    pub(crate) plain_live: u64,
}

/// Bytes held by class now and at their peaks, and the live handles that report their drop.
#[derive(Default)]
pub(crate) struct Usage {
    pub(crate) by_class: ClassBytes,
    /// Highest `by_class` seen, per class independently (since creation or `reset_peaks`).
    pub(crate) peak: ClassBytes,
    /// Highest `by_class.total()` seen at one moment (since creation or `reset_peaks`): every
    /// class at once, overflow blocks included (they count in their class).
    pub(crate) peak_total: u64,
    /// Highest [`State::reserved_bytes`] seen (since creation or `reset_peaks`).
    pub(crate) peak_reserved: u64,
    /// Live held and overflow handles (they report their drop).
    pub(crate) returnable_live: u64,
    /// Scratch bytes the held region serves now (lent from its free memory; returned when
    /// their blocks drop, not at step end).
    pub(crate) lent_scratch: u64,
    /// The lent scratch blocks (listed as kept at every step end while referenced).
    pub(crate) lent_blocks: Vec<Weak<BlockInner>>,
}

/// The arena's bookkeeping, by concern: scratch segments and the held region here, the rest
/// in one small struct each.
pub(crate) struct State {
    pub(crate) segs: Vec<Segment>,
    /// Scratch segment the bump pointer is in.
    pub(crate) cur: usize,
    pub(crate) held: Vec<HeldSegment>,
    /// Generation of held and overflow memory: moves only when the arena is torn down.
    pub(crate) held_cell: Arc<GenCell>,
    pub(crate) seg_bytes: u64,
    pub(crate) cap: u64,
    /// Sanitizer mode only: the stream-ordered pool every scratch and held block is its own
    /// allocation from (freed in stream order, so giving one back never syncs the device).
    pub(crate) block_pool: Option<DevicePool>,
    pub(crate) overflow: Overflow,
    pub(crate) capture: ReservationLedger,
    pub(crate) steps: StepBook,
    pub(crate) window: WindowBook,
    pub(crate) usage: Usage,
    pub(crate) n: Counters,
    pub(crate) timeline: Timeline,
}

impl State {
    pub(crate) fn diagnostics(&self) -> Diagnostics {
        // Scratch blocks issued in the open step (or in steps whose reclaim was deferred) that
        // became refcounted handles; plain ones are counted by the fast path.
        let scratch_live = self
            .segs
            .iter()
            .flat_map(|s| s.fresh.iter())
            .filter(|p| p.alive())
            .count();
        let pins_live: usize = self
            .segs
            .iter()
            .flat_map(|s| s.pins.iter())
            .filter(|p| p.alive())
            .count();
        let graph_live: usize = self
            .capture
            .reservations
            .values()
            .flat_map(|r| r.blocks.iter())
            .filter(|b| b.strong_count() > 0)
            .count();
        let capture = CaptureStats {
            reservations: self.capture.reservations.len(),
            reserved: self.capture.reservations.values().map(|r| r.bytes).sum(),
            used: self.capture.reservations.values().map(|r| r.used).sum(),
            active: self.capture.routed(),
        };
        Diagnostics {
            capacity: self.seg_bytes,
            cap: self.cap,
            scratch_segments: self.segs.len(),
            held_segments: self.held.len(),
            offset: self.bumped(),
            high_water: self.n.high_water.max(self.bumped()),
            allocations_since_reset: self.n.since_reset,
            bytes_since_reset: self.n.bytes_since_reset,
            allocations: self.n.allocations,
            largest_request: self.n.largest,
            reuses: self.n.reuses,
            resets: self.n.resets,
            last_reset: self.n.last_reset.clone(),
            overflow: self.overflow.stats,
            bytes_by_class: self.usage.by_class,
            peak_bytes_by_class: self.usage.peak,
            peak_live_bytes: self.usage.peak_total,
            reserved_bytes: self.reserved_bytes(),
            peak_reserved_bytes: self.usage.peak_reserved.max(self.reserved_bytes()),
            // Overflow scratch blocks are counted as returnable (they report their drop).
            live_handles: (scratch_live + pins_live + graph_live) as u64
                + self.usage.returnable_live
                + self.window.plain_live,
            pinned_bytes: self.segs.iter().map(Segment::pinned_bytes).sum(),
            held_free: self.held.iter().map(HeldSegment::free_bytes).sum(),
            capture,
            open_step: self.steps.open.unwrap_or(0),
            sanitize: self.block_pool.is_some(),
        }
    }

    /// Counts one issued block of `size` bytes, of which `held` are new to its class (less
    /// than `size` only for a graph pool member reusing memory another member counted).
    pub(crate) fn count_alloc(&mut self, class: AllocClass, requested: u64, size: u64, held: u64) {
        self.n.allocations += 1;
        self.n.since_reset += 1;
        self.n.bytes_since_reset += size;
        self.n.largest = self.n.largest.max(requested);
        self.usage.by_class.add(class, held);
        let t = &mut self.timeline.current;
        t.allocations += 1;
        t.bytes += size;
        self.observe_held();
    }

    /// Feeds the bytes held by class now to the step's timeline record and to the per-class
    /// peaks. Called wherever `by_class` grows.
    pub(crate) fn observe_held(&mut self) {
        let held = self.usage.by_class;
        self.timeline.observe(&held);
        self.usage.peak.raise_to(&held);
        self.usage.peak_total = self.usage.peak_total.max(held.total());
        self.raise_reserved_peak();
    }

    /// Raises the reserved peak to the bytes reserved now. Called wherever they grow (a new
    /// segment, a capture reservation, the overflow pool) and with every `observe_held`.
    pub(crate) fn raise_reserved_peak(&mut self) {
        self.usage.peak_reserved = self.usage.peak_reserved.max(self.reserved_bytes());
    }

    /// Device bytes the arena holds now, used or not: its segments (scratch and the held
    /// region), its live capture reservations, and the overflow pool (what it reserved up
    /// front, or what is outstanding in it when that is more).
    pub(crate) fn reserved_bytes(&self) -> u64 {
        let reservations: u64 = self.capture.reservations.values().map(|r| r.bytes).sum();
        let o = &self.overflow.stats;
        self.seg_bytes + reservations + o.reserved.max(o.outstanding)
    }

    /// Scratch bytes bumped in the current step. Offsets only grow within a step, so the
    /// high-water mark is taken from this at each step end instead of on every allocation.
    pub(crate) fn bumped(&self) -> u64 {
        let offsets: u64 = self.segs.iter().map(|s| s.off).sum();
        offsets.saturating_sub(self.window.unused)
    }

    /// The step events are attributed to.
    pub(crate) fn step_now(&self) -> u64 {
        self.steps.open.unwrap_or(self.steps.last)
    }
}
