//! The step bookkeeping every optimiser here shares: the count of applied steps, written into
//! the `[lr, t, gate]` slot its fused kernel reads, and the step a failure left of unknown
//! state. The count moves only once an update was queued (`commit`); a failure after the
//! first update kernel may have run marks the state unknown, and the optimiser refuses to step
//! until a checkpoint's state is imported.

use crate::error::{Applied, GradError, Result};
use zcompute::{ADAMW_SLOT_GATE, ADAMW_SLOT_LR, ADAMW_SLOT_STEP, BTensor, Element, prelude::*};

/// Steps taken and the step of unknown state, if any (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct StepBook {
    step: u64,
    /// Set to the step that failed after its update may have started: the state is unknown
    /// until `import` restores it.
    unknown: Option<u64>,
}

impl StepBook {
    pub(crate) fn count(&self) -> u64 {
        self.step
    }

    pub(crate) fn unknown(&self) -> Option<u64> {
        self.unknown
    }

    /// Refuses with `StateUnknown` while a failed step left the state unknown.
    pub(crate) fn check(&self) -> Result<()> {
        match self.unknown {
            Some(step) => Err(GradError::StateUnknown { step }),
            None => Ok(()),
        }
    }

    /// Writes `[lr, t, 0]` for the next step `t = count() + 1` into `slot` (a host-to-device
    /// copy: outside a capture). Refuses while the state is unknown.
    pub(crate) fn prepare<B: Ops<T>, T: Element>(
        &self,
        b: &B,
        slot: &BTensor<B, T>,
        lr: f64,
    ) -> Result<()> {
        self.check()?;
        let mut values = [T::ZERO; 3];
        values[ADAMW_SLOT_LR] = T::from_f64(lr);
        values[ADAMW_SLOT_STEP] = T::from_f64((self.step + 1) as f64);
        values[ADAMW_SLOT_GATE] = T::ZERO;
        b.upload_into(&values, slot)?;
        Ok(())
    }

    pub(crate) fn commit(&mut self) {
        self.step += 1;
    }

    pub(crate) fn mark_unknown(&mut self) {
        self.unknown = Some(self.step + 1);
    }

    pub(crate) fn mark_unknown_at(&mut self, step: u64) {
        self.unknown = Some(step);
    }

    pub(crate) fn rewind(&mut self, step: u64) {
        self.step = self.step.min(step);
    }

    /// One eager step: `prepare`, then `apply` (which says how far a failure got), then
    /// `commit`. A failure is a `GradError::Step`: `No` leaves everything as it was, `Maybe`
    /// marks the state unknown.
    pub(crate) fn step<B: Ops<T>, T: Element>(
        &mut self,
        b: &B,
        slot: &BTensor<B, T>,
        lr: f64,
        apply: impl FnOnce() -> std::result::Result<(), (Applied, GradError)>,
    ) -> Result<()> {
        let next = self.step + 1;
        self.prepare(b, slot, lr)
            .map_err(|e| e.at_step(next, Applied::No))?;
        if let Err((applied, e)) = apply() {
            if applied == Applied::Maybe {
                self.mark_unknown();
            }
            return Err(e.at_step(next, applied));
        }
        self.commit();
        Ok(())
    }

    /// After an import wrote some buffers and then failed: the state is unknown (the step
    /// already marked, if any, kept).
    pub(crate) fn import_failed(&mut self) {
        self.unknown = Some(self.unknown.unwrap_or(self.step + 1));
    }

    /// After an import wrote every buffer: the saved count, the state known again.
    pub(crate) fn imported(&mut self, step: u64) {
        self.step = step;
        self.unknown = None;
    }
}

/// The public step bookkeeping of an optimiser holding `book: StepBook` and `tensors` with a
/// `slot` and an `apply_tracked` (AdamW's and SGD's): one text for both, delegating to the
/// book.
macro_rules! step_book_methods {
    () => {
        /// Steps taken so far (the next step is `step_count() + 1`).
        #[must_use]
        pub fn step_count(&self) -> u64 {
            self.book.count()
        }

        /// The step a failure left of unknown state, if any (cleared by `import`).
        #[must_use]
        pub fn unknown_step(&self) -> Option<u64> {
            self.book.unknown()
        }

        /// Refuses with `StateUnknown` while a failed step left the state unknown.
        pub fn check_state(&self) -> Result<()> {
            self.book.check()
        }

        /// Writes `[lr, t, 0]` for the next step `t = step_count() + 1` into the slot (a
        /// host-to-device copy: call it outside a capture, before `apply` or a replay). Does not
        /// count the step: `commit` does, once its update was queued. Refuses while the state is
        /// unknown.
        pub fn prepare(&mut self, b: &B, lr: f64) -> Result<()> {
            self.book.prepare(b, &self.tensors.slot, lr)
        }

        /// Counts the prepared step: call it once its update was queued (or replayed) without
        /// error and was not skipped by its gate.
        pub fn commit(&mut self) {
            self.book.commit();
        }

        /// Records that step `step_count() + 1` failed after its update may have started: the
        /// optimiser refuses to step until `import` restores the state.
        pub fn mark_unknown(&mut self) {
            self.book.mark_unknown();
        }

        /// Records that step `step` (queued, not yet read back) may have been applied in part:
        /// the optimiser refuses to step until `import` restores the state.
        pub(crate) fn mark_unknown_at(&mut self, step: u64) {
            self.book.mark_unknown_at(step);
        }

        /// Takes the count back to `step` after queued steps beyond it were found skipped on the
        /// device (their gate was closed: their updates never ran).
        pub(crate) fn rewind(&mut self, step: u64) {
            self.book.rewind(step);
        }

        /// `prepare`, `apply` and `commit`: one eager optimiser step. On failure the error is a
        /// `GradError::Step` saying whether the update was applied: `No` leaves `t`, the state
        /// and the parameters bitwise unchanged (retry freely); `Maybe` marks the state unknown.
        pub fn step(&mut self, b: &B, params: &[Var<B, T>], lr: f64) -> Result<()> {
            let tensors = &self.tensors;
            self.book
                .step(b, &tensors.slot, lr, || tensors.apply_tracked(b, params))
        }
    };
}
pub(crate) use step_book_methods;
