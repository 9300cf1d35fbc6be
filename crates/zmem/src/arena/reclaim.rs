//! Giving memory back: step end (scratch reclaim with exactly the live blocks kept), returns of
//! held/overflow/reservation memory, poison, deferral while a capture is active, teardown.

use std::sync::Arc;

use zdevice::{DevicePtr, Driver, Release};

use super::Shared;
use super::scratch::{Reclaimed, reclaim};
use super::state::State;
use crate::block::{Returned, Source};
use crate::class::AllocClass;
use crate::diag::ResetInfo;
use crate::error::{LiveBlock, MemError, MemResult};
use crate::timeline::{Event, EventKind};

/// The 0xFF byte: four of them are a float32 NaN, so stale reads compute NaN.
pub(crate) const POISON_BYTE: u8 = 0xFF;

/// Most dead scratch blocks kept for reuse.
const SPARE_MAX: usize = 1 << 16;

/// What a step's end did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepSummary {
    /// The step.
    pub step: u64,
    /// Scratch bytes made reusable.
    pub reclaimed_bytes: u64,
    /// Scratch blocks still referenced, kept exactly (their memory is not reissued while they
    /// live; everything around them is).
    pub kept: Vec<LiveBlock>,
    /// The reclaim was deferred to the next step end because a capture was active.
    pub deferred: bool,
}

impl<D: Driver> Shared<D> {
    fn poison(&self, ranges: &[(DevicePtr, u64)]) -> MemResult<()> {
        if !self.config.poison {
            return Ok(());
        }
        let stream = self.device.stream();
        for &(ptr, len) in ranges {
            self.device.memset_d8_async(ptr, POISON_BYTE, len, stream)?;
        }
        Ok(())
    }

    /// Ends the open step: reclaims its scratch except the blocks still referenced.
    pub(crate) fn end_step(&self, index: u64, by: String) -> MemResult<StepSummary> {
        let _span = tracing::debug_span!("zmem.arena.reset", step = index).entered();
        let capturing = self.device.is_capturing();
        let mut events: Vec<Event> = Vec::new();
        let mut kept_arcs = Vec::new();
        let result = {
            let mut st = self.lock();
            self.close_window(&mut st);
            // Plain scratch of the step is dead (it borrowed the step); any left is stale.
            self.core.fast.set_open_step(0);
            st.steps.open = None;
            st.overflow.prev_steps_peak = st.overflow.stats.peak;
            let at = Some(self.device.driver().now());
            if capturing || st.capture.routed() {
                // The graph may have baked in this step's addresses: reclaim at the next
                // step end instead, after the capture.
                st.timeline.current.kept_blocks = 0;
                st.timeline.end_step();
                events.push(st.timeline.push(
                    at,
                    EventKind::StepEnd {
                        kept_blocks: 0,
                        deferred: true,
                    },
                ));
                tracing::warn!(target: "zmem.arena.reset", step = index, "step ended during a capture: reclaim deferred");
                Err(MemError::CaptureActive {
                    op: "reclaiming a step's scratch",
                })
            } else {
                events.extend(self.flush_pending(&mut st));
                self.reclaim_scratch(&mut st, index, by, &mut kept_arcs, &mut events)
            }
        };
        drop(kept_arcs);
        self.publish(&events);
        result
    }

    fn reclaim_scratch(
        &self,
        st: &mut State,
        index: u64,
        by: String,
        kept_arcs: &mut Vec<Arc<crate::block::BlockInner>>,
        events: &mut Vec<Event>,
    ) -> MemResult<StepSummary> {
        let keep = self
            .core
            .flags
            .keep_live_scratch
            .load(std::sync::atomic::Ordering::Relaxed);
        st.n.high_water = st.n.high_water.max(st.bumped());
        let mut kept: Vec<LiveBlock> = Vec::new();
        // Overflow scratch returns to the pool when its last handle drops; until then it is
        // listed as kept at every step end.
        let mut still_out = Vec::new();
        for w in std::mem::take(&mut st.overflow.blocks) {
            if let Some(inner) = w.upgrade() {
                kept.push(crate::block::describe(&inner));
                kept_arcs.push(inner);
                still_out.push(w);
            }
        }
        st.overflow.blocks = still_out;
        // So does scratch lent from the held region.
        st.usage.lent_blocks.retain(|w| match w.upgrade() {
            Some(inner) => {
                kept.push(crate::block::describe(&inner));
                kept_arcs.push(inner);
                true
            }
            None => false,
        });
        let mut out = Reclaimed::default();
        for seg in &mut st.segs {
            kept.extend(reclaim(seg, Vec::new(), keep, &mut out));
            // Bounded, so a step with a million tiny blocks does not pin their memory forever.
            let room = SPARE_MAX.saturating_sub(seg.spare.len());
            seg.spare.extend(out.spare.drain(..).take(room));
        }
        st.cur = 0;
        let pinned: u64 = st.segs.iter().map(|s| s.pinned_bytes()).sum();
        st.usage.by_class.0[AllocClass::Scratch as usize] =
            pinned + st.overflow.scratch + st.usage.lent_scratch;
        st.n.resets += 1;
        st.n.since_reset = 0;
        st.n.bytes_since_reset = 0;
        st.n.last_reset = Some(ResetInfo {
            step: index,
            by: by.clone(),
            reclaimed_bytes: out.bytes,
            kept_blocks: kept.len(),
        });
        st.timeline.current.resets += 1;
        st.timeline.current.kept_blocks = kept.len();
        st.timeline.end_step();
        let at = Some(self.device.driver().now());
        let reset = EventKind::Reset {
            reclaimed_bytes: out.bytes,
            cause: by,
        };
        events.push(st.timeline.push(at, reset));
        let end = EventKind::StepEnd {
            kept_blocks: kept.len(),
            deferred: false,
        };
        events.push(st.timeline.push(at, end));
        if !kept.is_empty() {
            tracing::debug!(target: "zmem.arena.reset", step = index, kept = kept.len(), "live scratch kept");
        }
        let poisoned = self.poison(&out.ranges);
        // Sanitizer mode: a segment is one block; once nothing keeps it, it goes back to the
        // driver (in stream order, after the poison), so a later access is one the sanitizer
        // sees. Freed even when the poison failed: the segments are no longer tracked.
        if self.sanitized() {
            self.free_dead_segments(st);
        }
        poisoned?;
        Ok(StepSummary {
            step: index,
            reclaimed_bytes: out.bytes,
            kept,
            deferred: false,
        })
    }

    /// Sanitizer mode: frees the scratch segments no kept block pins.
    fn free_dead_segments(&self, st: &mut State) {
        let (dead, live): (Vec<_>, Vec<_>) = std::mem::take(&mut st.segs)
            .into_iter()
            .partition(|s| s.pins.is_empty());
        st.segs = live;
        for seg in dead {
            st.seg_bytes = st.seg_bytes.saturating_sub(seg.size);
            if let Err(e) = self.device_free(st, seg.base) {
                tracing::warn!(target: "zmem.arena.free", error = %e, "sanitize: scratch block free failed");
            }
        }
    }

    /// A block's last handle is gone: return its memory now, or after the capture.
    pub(crate) fn return_memory(&self, r: Returned) {
        let capturing = self.device.is_capturing();
        let ev = {
            let mut st = self.lock();
            if capturing {
                // A free during capture would invalidate it; the memory cannot be reissued
                // meanwhile because nothing allocates from these regions while capturing.
                st.capture.pending.push(r);
                return;
            }
            let mut evs = self.flush_pending(&mut st);
            evs.push(self.apply_return(&mut st, r));
            evs
        };
        self.publish(&ev);
    }

    /// Applies the returns deferred during a capture; the caller publishes the events after
    /// releasing the lock.
    pub(crate) fn flush_pending(&self, st: &mut State) -> Vec<Event> {
        let pending = std::mem::take(&mut st.capture.pending);
        pending
            .into_iter()
            .map(|r| self.apply_return(st, r))
            .collect()
    }

    /// Returns one block's memory (poisoned first when poison is on). Errors are logged: a
    /// drop has nowhere to report them.
    fn apply_return(&self, st: &mut State, r: Returned) -> Event {
        if let Err(e) = self.poison(&[(r.ptr, r.size)]) {
            tracing::warn!(target: "zmem.arena.free", error = %e, "poisoning freed memory failed");
        }
        let stream = self.device.stream();
        match r.source {
            Source::Held if self.sanitized() => {
                // The block was its segment: give it back to the driver.
                if let Some(i) = st.held.iter().position(|h| h.contains(r.ptr)) {
                    let h = st.held.swap_remove(i);
                    st.seg_bytes = st.seg_bytes.saturating_sub(h.size);
                    if let Err(e) = self.device_free(st, h.base) {
                        tracing::warn!(target: "zmem.arena.free", error = %e, "sanitize: held block free failed");
                    }
                }
                st.usage.by_class.sub(r.class, r.size);
                st.usage.returnable_live = st.usage.returnable_live.saturating_sub(1);
            }
            Source::Held => {
                if let Some(h) = st.held.iter_mut().find(|h| h.contains(r.ptr)) {
                    h.free(r.ptr.0 - h.base.0, r.size);
                }
                if r.class == AllocClass::Scratch {
                    st.usage.lent_scratch = st.usage.lent_scratch.saturating_sub(r.size);
                }
                st.usage.by_class.sub(r.class, r.size);
                st.usage.returnable_live = st.usage.returnable_live.saturating_sub(1);
            }
            Source::Overflow => {
                if let Err(e) = self.device.free_async(r.ptr, stream) {
                    tracing::warn!(target: "zmem.arena.free", error = %e, "overflow free failed");
                }
                st.overflow.stats.outstanding =
                    st.overflow.stats.outstanding.saturating_sub(r.size);
                if r.class == AllocClass::Scratch {
                    st.overflow.scratch = st.overflow.scratch.saturating_sub(r.size);
                }
                st.usage.by_class.sub(r.class, r.size);
                st.usage.returnable_live = st.usage.returnable_live.saturating_sub(1);
            }
            Source::Reservation => {
                if let Err(e) = self.device.free_async(r.ptr, stream) {
                    tracing::warn!(target: "zmem.arena.free", error = %e, "reservation free failed");
                }
                if let Some(info) = st.capture.reservations.remove(&r.reservation) {
                    st.usage.by_class.sub(AllocClass::Graph, info.used);
                }
            }
            Source::Arena => {}
        }
        let kind = EventKind::Free {
            class: r.class,
            bytes: r.size,
            ptr: r.ptr.0,
            source: r.source,
        };
        st.timeline.push(None, kind)
    }

    /// Frees everything the arena owns. Handles that outlive it go stale (their generation
    /// moves), so a later `ptr()` is `UseAfterReclaim`, not a read of someone else's memory.
    pub(crate) fn teardown(&self) {
        let mut st = self.lock();
        for s in &st.segs {
            s.cell.advance();
        }
        st.held_cell.advance();
        // Graph blocks too: their reservation's memory goes with the capture pool below.
        for r in st.capture.reservations.values() {
            r.cell.advance();
        }
        if self.device.is_capturing() || self.device.lost_reason().is_some() {
            tracing::warn!(target: "zmem.arena.drop", "arena dropped during a capture or after device loss: its memory is left to the process");
            return;
        }
        drop(self.flush_pending(&mut st));
        // Queued work may still read the segments: the device frees them once the stream has
        // drained (bounded). A drain that times out leaves them with the device, which frees
        // them after a later successful wait or when it closes; never freed early, never
        // leaked while the device can still free them.
        let free = |base| {
            if st.block_pool.is_some() {
                Release::FreeAsync(base)
            } else {
                Release::Free(base)
            }
        };
        let mut releases: Vec<Release> = st
            .segs
            .iter()
            .map(|s| free(s.base))
            .chain(st.held.iter().map(|h| free(h.base)))
            .collect();
        // Pools last: each goes once the stream-ordered frees before it have run.
        releases.extend(
            [
                st.overflow.pool.take(),
                st.capture.pool.take(),
                st.block_pool.take(),
            ]
            .into_iter()
            .flatten()
            .map(|p| Release::DestroyPool(p.pool)),
        );
        if let Err(e) = self
            .device
            .release_after_drain(self.device.stream(), releases)
        {
            tracing::warn!(target: "zmem.arena.drop", error = %e, "could not drain the stream: the device frees the arena's memory once it has");
        }
    }
}
