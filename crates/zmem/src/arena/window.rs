//! The open `Step`'s scratch window: claiming one (the fast path's slow path), closing it.
//! The fast path itself is in `fast`.

use zdevice::Driver;

use super::Shared;
use super::fast::{Plain, WINDOW_BYTES};
use super::state::State;
use crate::block::Block;
use crate::class::AllocClass;
use crate::error::MemResult;
use crate::units::align_up;

/// A scratch allocation of the open `Step`: plain (from a window, no handle) or a block (from
/// the locked path: overflow, a reservation, or while the fast path is closed).
pub(crate) enum StepScratch {
    Plain(Plain),
    Block(Block),
}

impl<D: Driver> Shared<D> {
    /// The open `Step`'s slow path, when its window cannot serve `requested`: claims a new
    /// window (growing the arena within its cap if need be) and bumps from it, or, when the
    /// fast path is closed or the arena full, takes the locked path.
    pub(crate) fn alloc_step_scratch(&self, requested: u64, step: u64) -> MemResult<StepScratch> {
        let total = self.device.info().total_memory;
        let capturing = self.device.is_capturing();
        if let Some(size) = align_up(requested).filter(|s| *s <= total && !capturing) {
            let mut st = self.lock();
            let open = !self.sanitized()
                && st.capture.recording.is_none()
                && !st.capture.routed()
                && st.capture.pending.is_empty()
                && !self.wants_events();
            if open {
                // The fold on locking emptied the event log, so a window that fits serves it.
                if let Some(p) = self.core.fast.try_bump(size, requested, step) {
                    return Ok(StepScratch::Plain(p));
                }
                if self.claim_window(&mut st, size)?
                    && let Some(p) = self.core.fast.try_bump(size, requested, step)
                {
                    return Ok(StepScratch::Plain(p));
                }
            }
        }
        self.alloc(AllocClass::Scratch, requested)
            .map(StepScratch::Block)
    }

    /// Closes the open window and claims one that fits `size`. `false` when no segment has
    /// room: the locked path then lends the request from the held region, growing that, not
    /// the scratch segments (the fast path never runs in sanitizer mode, which grows them).
    fn claim_window(&self, st: &mut State, size: u64) -> MemResult<bool> {
        self.close_window(st);
        let found = (st.cur..st.segs.len())
            .find_map(|i| st.segs[i].claim(size, WINDOW_BYTES).map(|w| (i, w)));
        let Some((i, (start, end))) = found else {
            return Ok(false);
        };
        st.cur = i;
        st.window.seg = Some(i);
        st.window.unused = end - start;
        let seg = &st.segs[i];
        let base = seg.base.0;
        self.core.fast.open_window(
            base + start,
            base + end,
            seg.cell.current(),
            base + seg.used_ever,
        );
        Ok(true)
    }

    /// Closes the open `Step`'s window, giving its unbumped tail back to its segment.
    pub(crate) fn close_window(&self, st: &mut State) {
        if let Some(i) = st.window.seg.take() {
            let (cur, end) = self.core.fast.close_window();
            let seg = &mut st.segs[i];
            let base = seg.base.0;
            seg.unclaim(cur - base, end - base);
            st.window.unused = 0;
        }
    }
}
