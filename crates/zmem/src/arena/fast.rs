//! The scratch fast path: a window of a scratch segment that the open [`Step`](crate::Step)
//! bumps through without the arena's lock, and the counters and allocation events it leaves
//! for the arena to pick up.
//!
//! One writer: only the thread holding the open `Step` writes here outside the lock (`Step` is
//! not `Sync`, a plain `Scratch` is neither `Send` nor `Sync`, and one step is open at a time),
//! so every field is updated with a plain load and store, never a read-modify-write. Everything
//! else only reads: taking the arena's lock *folds* what was added since the last fold (the
//! counters are cumulative; the lock holder remembers how far it has folded) into the locked
//! bookkeeping, so diagnostics and the timeline stay exact. Allocation events wait in a small
//! ring (single producer, single consumer) until the next fold records them in the timeline.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::state::State;
use crate::class::AllocClass;

/// Longest a window of scratch claimed at once (a larger request gets a window of its size).
/// Bounds what a window keeps from other allocators of the same step; one lock per window.
pub(crate) const WINDOW_BYTES: u64 = 1 << 20;

/// Most allocation events waiting for a fold; a full log makes the next allocation fold.
const LOG_MAX: usize = 4096;

/// A scratch allocation made on the fast path: no handle, no reference count. Its memory is
/// reclaimed at the end of its step, which cannot come while it lives (it borrows the step).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plain {
    pub(crate) ptr: u64,
    pub(crate) size: u64,
    pub(crate) requested: u64,
    /// Its step: the allocation is valid while that step is open.
    pub(crate) step: u64,
    /// Its segment's generation (which cannot move before the step ends).
    pub(crate) generation: u64,
}

/// One logged allocation (address and aligned size).
#[derive(Default)]
struct LogSlot {
    ptr: AtomicU64,
    size: AtomicU64,
}

/// The open window and the fast path's counters. See the module documentation for who writes.
pub(crate) struct FastScratch {
    /// Whether the fast path may be taken at all: no recording, no active reservation, no
    /// deferred returns, no subscriber (each needs the locked path). Written under the lock.
    pub(crate) gate: AtomicBool,
    /// The window: `[cur, end)`, absolute addresses (both 0 when none is open).
    cur: AtomicU64,
    end: AtomicU64,
    /// The generation of the window's segment.
    generation: AtomicU64,
    /// Allocations starting below this address reuse memory an earlier step used.
    reuse_below: AtomicU64,
    /// Cumulative counters (never reset; the fold takes differences).
    allocs: AtomicU64,
    bytes: AtomicU64,
    largest: AtomicU64,
    reuses: AtomicU64,
    /// Plain scratch handles alive now.
    live: AtomicU64,
    /// The open step (0 when none): plain scratch of any other step is stale. Written under
    /// the lock.
    open_step: AtomicU64,
    /// Allocation events folded so far (the log's read index; `allocs` is its write index).
    drained: AtomicU64,
    /// Power-of-two ring of allocation events; empty when the timeline keeps no events.
    log: Box<[LogSlot]>,
}

/// A plain load and store: only the fast path's single writer updates these.
#[inline]
fn add(a: &AtomicU64, v: u64) {
    a.store(a.load(Ordering::Relaxed) + v, Ordering::Relaxed);
}

impl FastScratch {
    /// `timeline_events`: the ring size of the timeline (0: no allocation events are logged).
    pub(crate) fn new(timeline_events: usize) -> FastScratch {
        let slots = if timeline_events == 0 {
            0
        } else {
            timeline_events.min(LOG_MAX).next_power_of_two()
        };
        FastScratch {
            gate: AtomicBool::new(true),
            cur: AtomicU64::new(0),
            end: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            reuse_below: AtomicU64::new(0),
            allocs: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            largest: AtomicU64::new(0),
            reuses: AtomicU64::new(0),
            live: AtomicU64::new(0),
            open_step: AtomicU64::new(0),
            drained: AtomicU64::new(0),
            log: (0..slots).map(|_| LogSlot::default()).collect(),
        }
    }

    /// Bumps `size` (aligned) out of the open window, or `None` when the window is too small
    /// or the event log is full (the caller then takes the locked path, which folds).
    #[inline]
    pub(crate) fn try_bump(&self, size: u64, requested: u64, step: u64) -> Option<Plain> {
        let cur = self.cur.load(Ordering::Relaxed);
        if size > self.end.load(Ordering::Relaxed) - cur {
            return None;
        }
        let n = self.allocs.load(Ordering::Relaxed);
        if !self.log.is_empty() {
            let waiting = n - self.drained.load(Ordering::Acquire);
            if waiting >= self.log.len() as u64 {
                return None;
            }
            let slot = &self.log[n as usize & (self.log.len() - 1)];
            slot.ptr.store(cur, Ordering::Relaxed);
            slot.size.store(size, Ordering::Relaxed);
        }
        self.cur.store(cur + size, Ordering::Relaxed);
        add(&self.bytes, size);
        if requested > self.largest.load(Ordering::Relaxed) {
            self.largest.store(requested, Ordering::Relaxed);
        }
        if cur < self.reuse_below.load(Ordering::Relaxed) {
            add(&self.reuses, 1);
        }
        add(&self.live, 1);
        // Publishes the log slot and the counters above to a folding thread.
        self.allocs.store(n + 1, Ordering::Release);
        Some(Plain {
            ptr: cur,
            size,
            requested,
            step,
            generation: self.generation.load(Ordering::Relaxed),
        })
    }

    /// Opens the window `[start, end)` (under the lock, by the step's thread).
    pub(crate) fn open_window(&self, start: u64, end: u64, generation: u64, reuse_below: u64) {
        self.generation.store(generation, Ordering::Relaxed);
        self.reuse_below.store(reuse_below, Ordering::Relaxed);
        self.end.store(end, Ordering::Relaxed);
        self.cur.store(start, Ordering::Relaxed);
    }

    /// Closes the window and returns what it was (`(cur, end)`).
    pub(crate) fn close_window(&self) -> (u64, u64) {
        let w = self.window();
        self.cur.store(0, Ordering::Relaxed);
        self.end.store(0, Ordering::Relaxed);
        w
    }

    /// The window `(cur, end)`.
    pub(crate) fn window(&self) -> (u64, u64) {
        (
            self.cur.load(Ordering::Relaxed),
            self.end.load(Ordering::Relaxed),
        )
    }

    /// A plain handle was dropped, or became a refcounted block (on the step's thread).
    #[inline]
    pub(crate) fn plain_gone(&self) {
        let live = self.live.load(Ordering::Relaxed);
        self.live.store(live.saturating_sub(1), Ordering::Relaxed);
    }

    /// Whether plain scratch of `step` is still valid (its step is open).
    #[inline]
    pub(crate) fn is_open(&self, step: u64) -> bool {
        self.open_step.load(Ordering::Acquire) == step
    }

    /// Marks `step` open, or none (0): from then on, plain scratch of any other step is stale.
    pub(crate) fn set_open_step(&self, step: u64) {
        self.open_step.store(step, Ordering::Release);
    }
}

/// What the locked side has folded so far.
#[derive(Default)]
pub(crate) struct Folded {
    allocs: u64,
    bytes: u64,
    reuses: u64,
}

/// Folds the fast path's news into the locked bookkeeping: counters, the step's aggregates
/// and peak, and the logged allocation events (in order, before any event the lock holder is
/// about to record). Runs at every acquisition of the arena's lock.
pub(crate) fn fold(st: &mut State, f: &FastScratch) {
    let (cur, end) = f.window();
    st.window.unused = end - cur;
    st.window.plain_live = f.live.load(Ordering::Relaxed);
    let allocs = f.allocs.load(Ordering::Acquire);
    if allocs == st.window.folded.allocs {
        return;
    }
    let bytes = f.bytes.load(Ordering::Relaxed);
    let reuses = f.reuses.load(Ordering::Relaxed);
    let (n, b) = (
        allocs - st.window.folded.allocs,
        bytes - st.window.folded.bytes,
    );
    if !f.log.is_empty() {
        let (mask, from) = (f.log.len() - 1, st.window.folded.allocs);
        st.timeline.record_scratch_allocs(n, |i| {
            let slot = &f.log[(from + i) as usize & mask];
            let size = slot.size.load(Ordering::Relaxed);
            (size, slot.ptr.load(Ordering::Relaxed))
        });
        f.drained.store(allocs, Ordering::Release);
    }
    st.n.allocations += n;
    st.n.since_reset += n;
    st.n.bytes_since_reset += b;
    st.n.largest = st.n.largest.max(f.largest.load(Ordering::Relaxed));
    st.n.reuses += reuses - st.window.folded.reuses;
    st.usage.by_class.add(AllocClass::Scratch, b);
    let t = &mut st.timeline.current;
    t.allocations += n;
    t.bytes += b;
    st.observe_held();
    st.window.folded = Folded {
        allocs,
        bytes,
        reuses,
    };
}
