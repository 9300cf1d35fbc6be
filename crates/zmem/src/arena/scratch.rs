//! Scratch segments: 256-byte aligned bump allocation within a step, reclaimed at step end.
//!
//! A block still referenced when its step ends is *kept*: its range becomes a pin that later
//! steps bump around, and only that range. There is no floor: memory below a pin is reused as
//! freely as memory above it, so one long-lived tensor never strands the rest of the arena.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use zdevice::DevicePtr;

use crate::block::{BlockInner, GenCell};
use crate::error::LiveBlock;

/// A kept range `[start, end)` of a segment and the block that keeps it.
pub(crate) struct Pin {
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) block: Weak<BlockInner>,
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

    /// Bytes of live pins.
    pub(crate) fn pinned_bytes(&self) -> u64 {
        self.pins
            .iter()
            .filter(|p| p.block.strong_count() > 0)
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
    /// Blocks kept because a handle still refers to them (upgraded: drop them outside the lock).
    pub(crate) kept: Vec<Arc<BlockInner>>,
}

/// Reclaims one segment at step end. `new_pins` are this step's blocks in this segment that are
/// still alive. When `keep` is false (negative control only), live blocks are reclaimed too.
pub(crate) fn reclaim(
    seg: &mut Segment,
    mut new_pins: Vec<Pin>,
    keep: bool,
    out: &mut Reclaimed,
) -> Vec<LiveBlock> {
    let old = std::mem::take(&mut seg.pins);
    // The touched extent: this step's bump offset, and any pin that died since the last reclaim.
    let mut extent = seg.off;
    let mut pins: Vec<Pin> = Vec::with_capacity(old.len() + new_pins.len());
    for p in old.into_iter().chain(new_pins.drain(..)) {
        if keep && p.block.strong_count() > 0 {
            pins.push(p);
        } else {
            extent = extent.max(p.end);
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
        if let Some(b) = p.block.upgrade() {
            b.generation.store(generation, Ordering::Release);
            kept_desc.push(crate::block::describe(&b));
            out.kept.push(b);
        }
    }
    if cursor < extent {
        out.ranges.push((seg.base.offset(cursor), extent - cursor));
    }
    out.bytes += out.ranges[first_range..].iter().map(|r| r.1).sum::<u64>();
    seg.pins = pins;
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
        });
        Segment::new(DevicePtr(0x1000), size, GenCell::new(&flags))
    }

    #[test]
    fn bump_skips_pins_and_fills_around_them() {
        let mut s = seg(4096);
        let keep = Arc::new(0u8);
        // A Weak to an Arc<u8> stands in for a live block: only strong_count matters here.
        let w: Weak<u8> = Arc::downgrade(&keep);
        assert_eq!(w.strong_count(), 1);
        s.pins.push(Pin {
            start: 512,
            end: 1024,
            block: Weak::new(),
        });
        // A dead pin (Weak::new) is still skipped until a reclaim drops it.
        assert_eq!(s.fit(256), Some(0));
        assert_eq!(s.fit(256), Some(256));
        assert_eq!(s.fit(256), Some(1024));
        assert_eq!(s.fit(4096), None);
        let mut out = Reclaimed::default();
        let kept = reclaim(&mut s, Vec::new(), true, &mut out);
        assert!(kept.is_empty());
        assert!(s.pins.is_empty());
        assert_eq!(s.fit(1024), Some(0));
    }
}
