//! The allocation paths: scratch bump (the fast path), the held region, growth within the cap,
//! the overflow pool, and capture reservations.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use zdevice::{DeviceError, DevicePtr, Driver};

use super::Shared;
use super::held::HeldSegment;
use super::scratch::Segment;
use super::state::State;
use crate::block::{Block, BlockInner, GenCell, Source};
use crate::capture::ReservationMem;
use crate::class::AllocClass;
use crate::error::{MemError, MemResult};
use crate::timeline::{Event, EventKind};
use crate::units::{Bytes, align_up};

/// What a new block is.
struct Issue {
    class: AllocClass,
    source: Source,
    requested: u64,
    size: u64,
}

impl<D: Driver> Shared<D> {
    /// Issues a block of `class`. Never waits without a deadline, never synchronises the
    /// device, never makes a device call while a stream captures.
    pub(crate) fn alloc(&self, class: AllocClass, requested: u64) -> MemResult<Block> {
        let size = align_up(requested).ok_or_else(|| MemError::TooLarge {
            requested,
            class,
            why: "it overflows 64 bits".into(),
            device: None,
        })?;
        // Checked here, before any driver call, with the device's own answer kept as the source.
        if let Err(e) = self.device.check_fits("zmem.arena.alloc", size) {
            let total = self.device.info().total_memory;
            return Err(MemError::TooLarge {
                requested,
                class,
                why: format!("the device has {} in all", Bytes(total)),
                device: Some(e),
            });
        }
        let routing = self.core.flags.capture_routing.load(Ordering::Relaxed);
        let capturing = routing && self.device.is_capturing();
        let mut events = Vec::new();
        let block = {
            let mut st = self.lock();
            if !capturing && !st.capture.pending.is_empty() {
                events.extend(self.flush_pending(&mut st));
            }
            if let Some(rec) = st.capture.recording.as_mut() {
                rec.push(size);
            }
            let (block, held) = match (routing, self.routed_reservation()) {
                (true, Some(res)) => self.alloc_reserved(&mut st, &res, requested, size)?,
                _ if capturing => {
                    return Err(MemError::AllocationDuringCapture { class, requested });
                }
                _ => match class {
                    AllocClass::Scratch => (self.alloc_scratch(&mut st, requested, size)?, size),
                    _ => (self.alloc_held(&mut st, class, requested, size)?, size),
                },
            };
            st.count_alloc(block.class(), requested, size, held);
            if self.config.timeline_events > 0 || self.wants_events() {
                let (seq, step) = st.timeline.stamp();
                let kind = EventKind::Alloc {
                    class: block.class(),
                    bytes: size,
                    ptr: block.raw_ptr().0,
                    source: block.source(),
                };
                let ev = Event {
                    seq,
                    step,
                    at: None,
                    kind,
                };
                if self.wants_events() {
                    events.push(ev.clone());
                }
                st.timeline.record(ev);
            }
            if block.source() == Source::Overflow {
                self.overflowed(&mut st, &mut events);
            }
            block
        };
        self.publish(&events);
        Ok(block)
    }

    /// The reservation the device's capture session routes this arena's allocations to.
    fn routed_reservation(&self) -> Option<Arc<ReservationMem>> {
        let memory = self.device.capture_memory(self.core.flags.arena_id)?;
        memory.downcast::<ReservationMem>().ok()
    }

    /// A block over `ptr`; held and overflow blocks give their memory back on drop.
    fn make(&self, st: &State, what: Issue, ptr: DevicePtr, cell: &Arc<GenCell>) -> Block {
        let returns = matches!(what.source, Source::Held | Source::Overflow);
        Block(Arc::new(BlockInner {
            ptr: AtomicU64::new(ptr.0),
            size: AtomicU64::new(what.size),
            requested: AtomicU64::new(what.requested),
            class: what.class,
            source: what.source,
            step: AtomicU64::new(st.step_now()),
            generation: AtomicU64::new(cell.current()),
            cell: Arc::clone(cell),
            owner: returns.then(|| self.reclaimer()),
            _reservation: None,
        }))
    }

    fn alloc_scratch(&self, st: &mut State, requested: u64, size: u64) -> MemResult<Block> {
        // Sanitizer mode: never share a segment, every block gets a new one of its own size.
        let found = if self.sanitized() {
            None
        } else {
            (st.cur..st.segs.len()).find_map(|i| st.segs[i].fit(size).map(|off| (i, off)))
        };
        let (i, off) = match found {
            Some(hit) => hit,
            None => match self.room_for(st, size) {
                // Before the arena grows: memory saved blocks gave back (an eager step's
                // backward runs while its forward's saved tensors are freed).
                _ if let Some(b) = self.lend_held(st, requested, size) => return Ok(b),
                // Growth goes to the held region, lent from there: memory that scratch and
                // saved blocks both reuse, given back as each block drops.
                Some(seg_size) if !self.sanitized() => {
                    self.grow_held(st, AllocClass::Scratch, requested, seg_size)?;
                    // A fresh held segment always lends: it is at least `size` long.
                    if let Some(b) = self.lend_held(st, requested, size) {
                        return Ok(b);
                    }
                    return self.overflow_scratch(st, requested, size);
                }
                Some(seg_size) => {
                    self.grow_scratch(st, seg_size)?;
                    let i = st.segs.len() - 1;
                    // A fresh segment always fits: it is at least `size` long.
                    let off = st.segs[i].fit(size).unwrap_or(0);
                    (i, off)
                }
                None => return self.overflow_scratch(st, requested, size),
            },
        };
        st.cur = i;
        let step = st.step_now();
        let seg = &mut st.segs[i];
        if off < seg.used_ever {
            st.n.reuses += 1;
        }
        seg.used_ever = seg.used_ever.max(off + size);
        let generation = seg.cell.current();
        Ok(Block(seg.issue(off, size, requested, step, generation)))
    }

    fn alloc_held(
        &self,
        st: &mut State,
        class: AllocClass,
        requested: u64,
        size: u64,
    ) -> MemResult<Block> {
        let mut found = if self.sanitized() {
            None
        } else {
            st.held
                .iter_mut()
                .find_map(|h| h.alloc(size).map(|(o, r)| (h.base, o, r)))
        };
        if found.is_none()
            && let Some(seg_size) = self.room_for(st, size)
        {
            self.grow_held(st, class, requested, seg_size)?;
            found = st
                .held
                .last_mut()
                .and_then(|h| h.alloc(size).map(|(o, r)| (h.base, o, r)));
        }
        match found {
            Some(at) => Ok(self.held_block(st, class, requested, size, at)),
            None => self.overflow(st, class, requested, size),
        }
    }

    /// Scratch from the overflow pool (returned when its last handle drops).
    fn overflow_scratch(&self, st: &mut State, requested: u64, size: u64) -> MemResult<Block> {
        let b = self.overflow(st, AllocClass::Scratch, requested, size)?;
        st.overflow.scratch += size;
        st.overflow.blocks.push(Arc::downgrade(&b.0));
        Ok(b)
    }

    /// A new held segment of `seg_size` bytes.
    fn grow_held(
        &self,
        st: &mut State,
        class: AllocClass,
        requested: u64,
        seg_size: u64,
    ) -> MemResult<()> {
        let base = self.device_alloc(st, class, requested, seg_size)?;
        st.held.push(HeldSegment::new(base, seg_size));
        st.seg_bytes += seg_size;
        st.raise_reserved_peak();
        Ok(())
    }

    /// Scratch from the held region's free memory, without growing it: a block returned when
    /// its last handle drops, like every held block, so no step end reclaims it while it is
    /// referenced and no saved block lands on it meanwhile. `None` in sanitizer mode (every
    /// block its own allocation) or when no free range fits.
    fn lend_held(&self, st: &mut State, requested: u64, size: u64) -> Option<Block> {
        if self.sanitized() {
            return None;
        }
        let at = st
            .held
            .iter_mut()
            .find_map(|h| h.alloc(size).map(|(o, r)| (h.base, o, r)))?;
        st.usage.lent_scratch += size;
        tracing::trace!(target: "zmem.arena.lend", bytes = size, "scratch served from held memory");
        let b = self.held_block(st, AllocClass::Scratch, requested, size, at);
        st.usage.lent_blocks.push(Arc::downgrade(&b.0));
        Some(b)
    }

    /// A held block at `(base, offset, whether it reuses freed memory)`.
    fn held_block(
        &self,
        st: &mut State,
        class: AllocClass,
        requested: u64,
        size: u64,
        (base, off, reused): (DevicePtr, u64, bool),
    ) -> Block {
        st.n.reuses += u64::from(reused);
        st.usage.returnable_live += 1;
        let cell = Arc::clone(&st.held_cell);
        let what = Issue {
            class,
            source: Source::Held,
            requested,
            size,
        };
        self.make(st, what, base.offset(off), &cell)
    }

    /// The size of a new segment for `size` bytes if the cap allows one.
    pub(crate) fn room_for(&self, st: &State, size: u64) -> Option<u64> {
        let left = st.cap.saturating_sub(st.seg_bytes);
        if self.sanitized() {
            // A segment of exactly the block (a zero-byte block still needs a driver allocation).
            let seg = size.max(crate::units::ALIGN);
            return (seg <= left).then_some(seg);
        }
        let seg = size.max(self.config.segment_bytes);
        if seg <= left {
            Some(seg)
        } else if size <= left {
            // The last, partial segment up to the cap.
            Some(left - left % crate::units::ALIGN)
        } else {
            None
        }
    }

    pub(crate) fn grow_scratch(&self, st: &mut State, size: u64) -> MemResult<()> {
        let base = self.device_alloc(st, AllocClass::Scratch, size, size)?;
        st.segs
            .push(Segment::new(base, size, GenCell::new(&self.core.flags)));
        st.seg_bytes += size;
        st.raise_reserved_peak();
        Ok(())
    }

    fn device_alloc(
        &self,
        st: &State,
        class: AllocClass,
        requested: u64,
        bytes: u64,
    ) -> MemResult<DevicePtr> {
        let got = match st.block_pool {
            Some(pool) => self
                .device
                .alloc_from_pool(pool.pool, bytes, self.device.stream()),
            None => self.device.alloc(bytes),
        };
        got.map_err(|e| self.map_device_error(st, class, requested, e))
    }

    /// Gives a segment's memory back to the driver: in stream order in sanitizer mode (after
    /// the work queued on it), else synchronously (teardown only, after draining the stream).
    pub(crate) fn device_free(&self, st: &State, base: DevicePtr) -> zdevice::DeviceResult<()> {
        match st.block_pool {
            Some(_) => self.device.free_async(base, self.device.stream()),
            None => self.device.free(base),
        }
    }

    pub(crate) fn map_device_error(
        &self,
        st: &State,
        class: AllocClass,
        requested: u64,
        e: DeviceError,
    ) -> MemError {
        match e {
            DeviceError::OutOfMemory { .. } => MemError::OutOfMemory {
                requested,
                class,
                diagnostics: Box::new(st.diagnostics()),
                device: Some(e),
            },
            DeviceError::TooLarge { total, .. } => MemError::TooLarge {
                requested,
                class,
                why: format!("the device has {} in all", Bytes(total)),
                device: Some(e),
            },
            DeviceError::Timeout { deadline, .. } => MemError::Timeout {
                deadline,
                diagnostics: Box::new(st.diagnostics()),
                device: e,
            },
            other => MemError::Device(other),
        }
    }

    /// Serves a request the segments cannot, from the stream-ordered pool, in stream order on
    /// the engine's stream, bounded by the device's allocation deadline.
    fn overflow(
        &self,
        st: &mut State,
        class: AllocClass,
        requested: u64,
        size: u64,
    ) -> MemResult<Block> {
        let _span = tracing::debug_span!("zmem.arena.overflow", requested, %class).entered();
        let enabled = self.core.flags.overflow_enabled.load(Ordering::Relaxed);
        let (Some(pool), true) = (st.overflow.pool, enabled) else {
            return Err(MemError::OutOfMemory {
                requested,
                class,
                diagnostics: Box::new(st.diagnostics()),
                device: None,
            });
        };
        let stream = self.device.stream();
        let ptr = self
            .device
            .alloc_from_pool(pool.pool, size, stream)
            .map_err(|e| self.map_device_error(st, class, requested, e))?;
        let o = &mut st.overflow.stats;
        o.calls += 1;
        o.bytes += size;
        o.outstanding += size;
        o.peak = o.peak.max(o.outstanding);
        st.timeline.current.overflow_calls += 1;
        st.timeline.current.overflow_bytes += size;
        st.usage.returnable_live += 1;
        let cell = Arc::clone(&st.held_cell);
        let what = Issue {
            class,
            source: Source::Overflow,
            requested,
            size,
        };
        Ok(self.make(st, what, ptr, &cell))
    }

    /// Records the overflow event; warns (with the full diagnostics) the first time the arena
    /// overflows, and afterwards at most once per step, when the step goes above the highest
    /// overflow of every earlier step.
    fn overflowed(&self, st: &mut State, events: &mut Vec<Event>) {
        let o = st.overflow.stats;
        let step = st.step_now();
        let at = Some(self.device.driver().now());
        let ev = st.timeline.push(
            at,
            EventKind::Overflow {
                bytes: o.bytes,
                outstanding: o.outstanding,
            },
        );
        if self.wants_events() {
            events.push(ev);
        }
        let first = !st.overflow.warned && o.calls > 0;
        let new_peak = st.overflow.warned
            && st.overflow.warned_step != step
            && o.outstanding > st.overflow.prev_steps_peak;
        if !first && !new_peak {
            return;
        }
        st.overflow.warned = true;
        st.overflow.warned_step = step;
        tracing::warn!(
            target: "zmem.arena.overflow",
            first,
            step,
            outstanding = o.outstanding,
            peak = o.peak,
            diagnostics = %st.diagnostics(),
            "{}",
            if first { "arena overflowed into the stream-ordered pool" } else { "arena overflow reached a new peak" }
        );
    }

    /// Marks a step open.
    pub(crate) fn open_step(&self, origin: &std::panic::Location<'_>) -> MemResult<u64> {
        let (index, ev) = {
            let mut st = self.lock();
            if let Some(open) = st.steps.open {
                return Err(MemError::StepAlreadyOpen { open });
            }
            let index = st.steps.last + 1;
            st.steps.open = Some(index);
            self.core.fast.set_open_step(index);
            st.steps.last = index;
            st.steps.origin = origin.to_string();
            st.timeline.current = crate::timeline::StepRecord {
                step: index,
                ..Default::default()
            };
            st.observe_held();
            let at = Some(self.device.driver().now());
            (index, st.timeline.push(at, EventKind::StepStart))
        };
        self.publish(&[ev]);
        Ok(index)
    }
}
