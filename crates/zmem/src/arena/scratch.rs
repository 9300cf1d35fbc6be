//! Scratch segments: 256-byte aligned bump allocation within a step, reclaimed at step end.
//!
//! A block still referenced when its step ends is *kept*: its range becomes a pin that later
//! steps bump around, and only that range. There is no floor: memory below a pin is reused as
//! freely as memory above it, so one long-lived tensor never strands the rest of the arena.
//!
//! The arena holds one strong reference to each scratch block it issued; the block is alive
//! while anyone else holds one too (`strong_count > 1`). Dead blocks' allocations are recycled
//! for later steps, so the fast path neither mallocs nor frees in steady state.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use zdevice::DevicePtr;

use crate::block::{BlockInner, GenCell, Source};
use crate::class::AllocClass;
use crate::error::LiveBlock;

/// A range `[start, end)` of a segment and the block issued there (the arena's reference).
pub(crate) struct Pin {
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) block: Arc<BlockInner>,
}

impl Pin {
    /// Whether a handle other than the arena's own refers to the block.
    pub(crate) fn alive(&self) -> bool {
        Arc::strong_count(&self.block) > 1
    }
}

pub(crate) struct Segment {
    pub(crate) base: DevicePtr,
    pub(crate) size: u64,
    /// Bump offset of the current step.
    pub(crate) off: u64,
    /// Highest offset ever handed out (to count reuses).
    pub(crate) used_ever: u64,
    /// Kept blocks, sorted by start, non-overlapping.
    pub(crate) pins: Vec<Pin>,
    /// Blocks issued here since the last reclaim (its buffer is kept across steps, so the
    /// fast path does not reallocate it).
    pub(crate) fresh: Vec<Pin>,
    /// Dead blocks of this segment whose allocations later ones reuse.
    pub(crate) spare: Vec<Arc<BlockInner>>,
    /// First pin whose end is above `off` (pins below it are already passed).
    cursor: usize,
    pub(crate) cell: Arc<GenCell>,
}

impl Segment {
    pub(crate) fn new(base: DevicePtr, size: u64, cell: Arc<GenCell>) -> Segment {
        Segment {
            base,
            size,
            off: 0,
            used_ever: 0,
            pins: Vec::new(),
            fresh: Vec::new(),
            spare: Vec::new(),
            cursor: 0,
            cell,
        }
    }

    /// Offset of a `size`-byte block (size already aligned) bumped from `off`, skipping pins.
    pub(crate) fn fit(&mut self, size: u64) -> Option<u64> {
        loop {
            let start = self.off;
            let end = start.checked_add(size)?;
            if end > self.size {
                return None;
            }
            while self.cursor < self.pins.len() && self.pins[self.cursor].end <= start {
                self.cursor += 1;
            }
            match self.pins.get(self.cursor) {
                Some(pin) if pin.start < end => self.off = pin.end,
                _ => {
                    self.off = end;
                    return Some(start);
                }
            }
        }
    }

    /// Claims a window for bump allocation without the lock: at least `size` bytes (aligned)
    /// from where `fit` would place them, extended up to `want` bytes, the next pin or the
    /// segment's end. Returns `[start, end)`.
    pub(crate) fn claim(&mut self, size: u64, want: u64) -> Option<(u64, u64)> {
        let start = self.fit(size)?;
        // `fit` left `cursor` at the first pin ending above `start`, which begins at or after
        // `start + size`.
        let mut end = self.size.min(start.saturating_add(want.max(size)));
        if let Some(pin) = self.pins.get(self.cursor) {
            end = end.min(pin.start).max(start + size);
        }
        self.off = end;
        Some((start, end))
    }

    /// Gives back the unbumped tail `[cur, end)` of a window (if nothing was bumped above it
    /// since) and records how far it was used.
    pub(crate) fn unclaim(&mut self, cur: u64, end: u64) {
        self.used_ever = self.used_ever.max(cur);
        if self.off == end {
            self.off = cur;
        }
    }

    /// The arena's reference to a block over `[off, off + size)`, registered as issued in
    /// this step: a dead block's allocation is reused when there is one (no malloc).
    pub(crate) fn issue(
        &mut self,
        off: u64,
        size: u64,
        requested: u64,
        step: u64,
        generation: u64,
    ) -> Arc<BlockInner> {
        let ptr = self.base.offset(off).0;
        // A segment's spares are its own dead blocks (same generation cell), referred to by
        // the arena alone: nothing else can make a new reference to them.
        let recycled = self
            .spare
            .pop()
            .filter(|spare| Arc::strong_count(spare) == 1 && Arc::weak_count(spare) == 0);
        let arc = match recycled {
            Some(inner) => {
                inner.ptr.store(ptr, Ordering::Relaxed);
                inner.size.store(size, Ordering::Relaxed);
                inner.requested.store(requested, Ordering::Relaxed);
                inner.step.store(step, Ordering::Relaxed);
                inner.generation.store(generation, Ordering::Release);
                inner
            }
            None => Arc::new(BlockInner {
                ptr: AtomicU64::new(ptr),
                size: AtomicU64::new(size),
                requested: AtomicU64::new(requested),
                class: AllocClass::Scratch,
                source: Source::Arena,
                step: AtomicU64::new(step),
                generation: AtomicU64::new(generation),
                cell: Arc::clone(&self.cell),
                owner: None,
                _reservation: None,
            }),
        };
        self.fresh.push(Pin {
            start: off,
            end: off + size,
            block: Arc::clone(&arc),
        });
        arc
    }

    /// Bytes of live pins.
    pub(crate) fn pinned_bytes(&self) -> u64 {
        self.pins
            .iter()
            .filter(|p| p.alive())
            .map(|p| p.end - p.start)
            .sum()
    }
}

/// What one segment's reclaim did.
#[derive(Default)]
pub(crate) struct Reclaimed {
    /// Bytes made reusable.
    pub(crate) bytes: u64,
    /// Ranges (absolute address, length) that were made reusable, for poisoning.
    pub(crate) ranges: Vec<(DevicePtr, u64)>,
    /// Dead blocks whose allocations can be reused.
    pub(crate) spare: Vec<Arc<BlockInner>>,
}

/// Reclaims one segment at step end. The segment's `fresh` blocks and `new_pins` are this
/// step's blocks in this segment. When `keep` is false (negative control only), live blocks
/// are reclaimed too.
pub(crate) fn reclaim(
    seg: &mut Segment,
    mut new_pins: Vec<Pin>,
    keep: bool,
    out: &mut Reclaimed,
) -> Vec<LiveBlock> {
    let old = std::mem::take(&mut seg.pins);
    let mut fresh = std::mem::take(&mut seg.fresh);
    // The touched extent: this step's bump offset, and any pin that died since the last reclaim.
    let mut extent = seg.off;
    let mut pins: Vec<Pin> = Vec::new();
    for p in old
        .into_iter()
        .chain(fresh.drain(..))
        .chain(new_pins.drain(..))
    {
        if keep && p.alive() {
            pins.push(p);
        } else {
            extent = extent.max(p.end);
            if !p.alive() {
                out.spare.push(p.block);
            }
        }
    }
    pins.sort_by_key(|p| p.start);
    let generation = seg.cell.advance();
    let mut kept_desc = Vec::new();
    let first_range = out.ranges.len();
    let mut cursor = 0;
    for p in &pins {
        if p.start > cursor && cursor < extent {
            let end = p.start.min(extent);
            out.ranges.push((seg.base.offset(cursor), end - cursor));
        }
        cursor = cursor.max(p.end);
        // A kept block moves to the new generation with its memory: it stays valid.
        p.block.generation.store(generation, Ordering::Release);
        kept_desc.push(crate::block::describe(&p.block));
    }
    if cursor < extent {
        out.ranges.push((seg.base.offset(cursor), extent - cursor));
    }
    out.bytes += out.ranges[first_range..].iter().map(|r| r.1).sum::<u64>();
    seg.pins = pins;
    // Keep the larger (now empty) buffer for the next step's blocks.
    seg.fresh = if fresh.capacity() >= new_pins.capacity() {
        fresh
    } else {
        new_pins
    };
    seg.off = 0;
    seg.cursor = 0;
    kept_desc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::Flags;
    use std::sync::atomic::AtomicBool;

    fn seg(size: u64) -> Segment {
        let flags = Arc::new(Flags {
            arena_id: 0,
            generation_check: AtomicBool::new(true),
            keep_live_scratch: AtomicBool::new(true),
            capture_routing: AtomicBool::new(true),
            overflow_enabled: AtomicBool::new(true),
            sanitize: false,
        });
        Segment::new(DevicePtr(0x1000), size, GenCell::new(&flags))
    }

    fn block(s: &Segment) -> Arc<BlockInner> {
        Arc::new(BlockInner {
            ptr: std::sync::atomic::AtomicU64::new(s.base.0),
            size: std::sync::atomic::AtomicU64::new(512),
            requested: std::sync::atomic::AtomicU64::new(512),
            class: crate::AllocClass::Scratch,
            source: crate::Source::Arena,
            step: std::sync::atomic::AtomicU64::new(0),
            generation: std::sync::atomic::AtomicU64::new(0),
            cell: Arc::clone(&s.cell),
            owner: None,
            _reservation: None,
        })
    }

    #[test]
    fn bump_skips_pins_and_fills_around_them() {
        let mut s = seg(4096);
        let b = block(&s);
        let pin = Pin {
            start: 512,
            end: 1024,
            block: b,
        };
        assert!(!pin.alive(), "only the arena's reference");
        s.pins.push(pin);
        // A dead pin is still skipped until a reclaim drops it (and recycles its block).
        assert_eq!(s.fit(256), Some(0));
        assert_eq!(s.fit(256), Some(256));
        assert_eq!(s.fit(256), Some(1024));
        assert_eq!(s.fit(4096), None);
        let mut out = Reclaimed::default();
        let kept = reclaim(&mut s, Vec::new(), true, &mut out);
        assert!(kept.is_empty());
        assert!(s.pins.is_empty());
        assert_eq!(out.spare.len(), 1);
        assert_eq!(s.fit(1024), Some(0));
    }
}
