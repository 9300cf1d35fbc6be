//! Step scopes. A `Step` borrows its arena, and scratch handles borrow the step, so ending the
//! step while one of them is alive does not compile. A handle cloned out of the scope (a plain
//! `Block`) is checked at run time instead: the step's end keeps exactly that block.

use std::marker::PhantomData;
use std::ops::Deref;

use zdevice::Driver;

use crate::StepSummary;
use crate::arena::Arena;
use crate::block::Block;
use crate::class::AllocClass;
use crate::error::{MemError, MemResult};

/// One step of a training loop. Ends with [`Step::end`] (or on drop, which logs errors).
pub struct Step<'a, D: Driver> {
    arena: &'a Arena<D>,
    index: u64,
    ended: bool,
}

/// A scratch block borrowed from its step: the step cannot end while this lives.
/// Derefs to [`Block`]; clone that to keep memory past the step (the step's end then keeps it).
#[derive(Debug)]
pub struct Scratch<'s> {
    block: Block,
    _step: PhantomData<&'s ()>,
}

impl Deref for Scratch<'_> {
    type Target = Block;
    fn deref(&self) -> &Block {
        &self.block
    }
}

impl<'a, D: Driver> Step<'a, D> {
    pub(crate) fn new(arena: &'a Arena<D>, index: u64) -> Step<'a, D> {
        Step {
            arena,
            index,
            ended: false,
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
    pub fn alloc_scratch(&self, bytes: u64) -> MemResult<Scratch<'_>> {
        let block = self.arena.shared.alloc(AllocClass::Scratch, bytes)?;
        Ok(Scratch {
            block,
            _step: PhantomData,
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
        let origin = self.arena.shared.lock().step_origin.clone();
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
