//! Step scopes. A `Step` borrows its arena, and scratch handles borrow the step, so ending the
//! step while one of them is alive does not compile. A handle cloned out of the scope (a plain
//! `Block`) is checked at run time instead: the step's end keeps exactly that block.

use std::cell::Cell;
use std::marker::PhantomData;

use zdevice::Driver;

use crate::StepSummary;
use crate::arena::Arena;
use crate::arena::window::StepScratch;
use crate::block::Block;
use crate::class::AllocClass;
use crate::error::{MemError, MemResult};
use crate::scratch::Scratch;
use crate::units::align_up;

/// One step of a training loop. Ends with [`Step::end`] (or on drop, which logs errors).
///
/// `Send` but not `Sync`: its scratch fast path bumps through a window of the arena without
/// the arena's lock, which is sound because one thread at a time allocates from it. Other
/// threads allocate through the [`Arena`] (locked) meanwhile.
pub struct Step<'a, D: Driver> {
    arena: &'a Arena<D>,
    index: u64,
    ended: bool,
    _one_thread: PhantomData<Cell<()>>,
}

impl<'a, D: Driver> Step<'a, D> {
    pub(crate) fn new(arena: &'a Arena<D>, index: u64) -> Step<'a, D> {
        Step {
            arena,
            index,
            ended: false,
            _one_thread: PhantomData,
        }
    }

    /// The step's number (1 for the arena's first step).
    #[must_use]
    pub fn index(&self) -> u64 {
        self.index
    }

    /// The arena.
    #[must_use]
    pub fn arena(&self) -> &'a Arena<D> {
        self.arena
    }

    /// Bump-allocates `bytes` of scratch (256-aligned). Inside a capture it comes from the
    /// active reservation instead (class `Graph`).
    ///
    /// The fast path takes no lock and counts no references: the step's window serves the
    /// request unless it is too small (then the arena's lock is taken once to claim the next
    /// window) or the arena must see the request (a recording, an active reservation, a
    /// capture, a subscriber, returns deferred by a capture).
    #[inline]
    pub fn alloc_scratch(&self, bytes: u64) -> MemResult<Scratch<'_>> {
        let shared = &*self.arena.shared;
        let core = &shared.core;
        if core.fast.gate.load(std::sync::atomic::Ordering::Relaxed)
            && !shared.device.is_capturing()
            && let Some(size) = align_up(bytes)
            && let Some(p) = core.fast.try_bump(size, bytes, self.index)
        {
            return Ok(Scratch::plain(p, core));
        }
        Ok(match shared.alloc_step_scratch(bytes, self.index)? {
            StepScratch::Plain(p) => Scratch::plain(p, core),
            StepScratch::Block(b) => Scratch::block(b, core),
        })
    }

    /// Allocates a block saved for backward (outlives the step; see [`Arena::alloc_saved`]).
    pub fn alloc_saved(&self, bytes: u64) -> MemResult<Block> {
        self.arena.alloc_saved(bytes)
    }

    /// Ends the step: its scratch is reclaimed (and poisoned when poison is on), except the
    /// blocks still referenced, which are kept exactly and listed in the summary. During a
    /// capture the reclaim is deferred to the next step end and `CaptureActive` is returned.
    #[track_caller]
    pub fn end(mut self) -> MemResult<StepSummary> {
        self.ended = true;
        let by = format!("Step::end at {}", std::panic::Location::caller());
        self.arena.shared.end_step(self.index, by)
    }

    /// Like [`Step::end`], but live scratch is an error: `LiveScratchAtStepEnd` lists it. The
    /// step has ended either way and exactly those blocks were kept.
    #[track_caller]
    pub fn end_strict(mut self) -> MemResult<StepSummary> {
        self.ended = true;
        let by = format!("Step::end_strict at {}", std::panic::Location::caller());
        let summary = self.arena.shared.end_step(self.index, by)?;
        if summary.kept.is_empty() {
            Ok(summary)
        } else {
            Err(MemError::LiveScratchAtStepEnd {
                step: summary.step,
                alive: summary.kept,
            })
        }
    }
}

impl<D: Driver> Drop for Step<'_, D> {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let origin = self.arena.shared.lock().steps.origin.clone();
        let by = format!("Step drop (opened at {origin})");
        if let Err(e) = self.arena.shared.end_step(self.index, by) {
            tracing::warn!(target: "zmem.arena.reset", step = self.index, error = %e, "ending a dropped step");
        }
    }
}

impl<D: Driver> std::fmt::Debug for Step<'_, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Step")
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

/// A step that owns a handle to its arena instead of borrowing it, for owners that hold the
/// arena and the open step side by side (a compute backend driven by a training loop). Scratch
/// comes out as plain [`Block`]s, checked at run time only: the step's end keeps exactly the
/// ones still referenced, and generations catch any use after their reclaim.
pub struct OwnedStep<D: Driver> {
    arena: Arena<D>,
    index: u64,
    ended: bool,
}

impl<D: Driver> OwnedStep<D> {
    pub(crate) fn new(arena: Arena<D>, index: u64) -> OwnedStep<D> {
        OwnedStep {
            arena,
            index,
            ended: false,
        }
    }

    /// The step's number.
    #[must_use]
    pub fn index(&self) -> u64 {
        self.index
    }

    /// Bump-allocates `bytes` of scratch in this step (from the active reservation while a
    /// capture is on).
    pub fn alloc_scratch(&self, bytes: u64) -> MemResult<Block> {
        self.arena.shared.alloc(AllocClass::Scratch, bytes)
    }

    /// Ends the step, as [`Step::end`].
    #[track_caller]
    pub fn end(mut self) -> MemResult<StepSummary> {
        self.ended = true;
        let by = format!("OwnedStep::end at {}", std::panic::Location::caller());
        self.arena.shared.end_step(self.index, by)
    }
}

impl<D: Driver> Drop for OwnedStep<D> {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let by = format!("OwnedStep drop (step {})", self.index);
        if let Err(e) = self.arena.shared.end_step(self.index, by) {
            tracing::warn!(target: "zmem.arena.reset", step = self.index, error = %e, "ending a dropped step");
        }
    }
}

impl<D: Driver> std::fmt::Debug for OwnedStep<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedStep")
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}
