//! The arena's lock, and what a scratch handle reaches through it.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::fast::{self, FastScratch, Plain};
use super::state::State;
use crate::block::{Block, Flags};

/// The bookkeeping and the scratch fast path: what a scratch handle reaches (not generic over
/// the driver, so `Scratch` is not either).
pub(crate) struct Core {
    pub(crate) flags: Arc<Flags>,
    pub(super) state: Mutex<State>,
    pub(crate) fast: FastScratch,
    pub(crate) has_sinks: AtomicBool,
}

/// The arena's lock. Taking it folds the fast path's news in (so what the holder reads is
/// exact); releasing it decides whether the fast path may run, from what the holder left.
pub(crate) struct Locked<'a> {
    st: MutexGuard<'a, State>,
    core: &'a Core,
}

impl Deref for Locked<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.st
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.st
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // Still under the lock: every change of these is, so the gate cannot go stale.
        let open = !self.core.flags.sanitize
            && self.st.capture.recording.is_none()
            && !self.st.capture.routed()
            && self.st.capture.pending.is_empty()
            && !self.core.has_sinks.load(Ordering::Relaxed);
        self.core.fast.gate.store(open, Ordering::Relaxed);
    }
}

impl Core {
    pub(crate) fn lock(&self) -> Locked<'_> {
        // A panic while holding the lock cannot leave the bookkeeping half-updated in a way
        // that matters more than losing the arena, so keep going.
        let mut st = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        fast::fold(&mut st, &self.fast);
        Locked { st, core: self }
    }

    /// The current generation of the scratch segment holding `ptr` (for error reports).
    pub(crate) fn generation_at(&self, ptr: u64) -> u64 {
        let st = self.lock();
        let seg = st
            .segs
            .iter()
            .find(|s| s.base.0 <= ptr && ptr < s.base.0 + s.size);
        seg.map_or(0, |s| s.cell.current())
    }

    /// The refcounted block for a plain scratch allocation that is being kept (cloned):
    /// registered with its segment so that the step's end keeps it while referenced.
    pub(crate) fn materialize(&self, p: &Plain) -> Block {
        let mut st = self.lock();
        self.fast.plain_gone();
        st.window.plain_live = st.window.plain_live.saturating_sub(1);
        let seg = st
            .segs
            .iter_mut()
            .find(|s| s.base.0 <= p.ptr && p.ptr < s.base.0 + s.size);
        match seg {
            Some(seg) => {
                let off = p.ptr - seg.base.0;
                Block(seg.issue(off, p.size, p.requested, p.step, p.generation))
            }
            // Plain scratch always lies in a segment, and segments are never given back while
            // the arena lives; were it not so, a handle that never resolves is the safe answer.
            None => Block::stale_scratch(&self.flags, p),
        }
    }
}
