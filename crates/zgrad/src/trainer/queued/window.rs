//! The device side of the read-back window (its history, cursor and sticky gate) and the
//! queued steps pending on it.

use super::super::checks;
use crate::error::{GradError, Result};
use crate::memory::persistent_zeros;
use crate::optim::OptimizerTensors;
use zcompute::{ADAMW_SLOT_GATE, BTensor, Element, Readback, prelude::*};

/// The device side of the window: every queued step's row (`[loss, norm]`; a per-sample
/// step's `[loss, norm, the samples' losses..]`), the row the next one writes, and the sticky
/// gate (0 while every step so far was finite, NaN after).
pub(in crate::trainer) struct Track<B: Ops<T>, T: Element> {
    pub(super) history: BTensor<B, T>,
    pub(super) cursor: BTensor<B, T>,
    pub(super) poison: BTensor<B, T>,
}

impl<B: Ops<T>, T: Element> Clone for Track<B, T> {
    fn clone(&self) -> Self {
        Track {
            history: self.history.clone(),
            cursor: self.cursor.clone(),
            poison: self.poison.clone(),
        }
    }
}

impl<B: Ops<T>, T: Element> Track<B, T> {
    /// Folds the step's gate (written into the optimiser's slot) into the sticky one, so the update
    /// of this step and of every later queued one is skipped once one was not finite (until
    /// the host reads that step back and clears the gate: `drain.rs`),
    /// and writes `row` into the history's next row. Legal inside a capture.
    pub(in crate::trainer) fn record(
        &self,
        b: &B,
        optim: &OptimizerTensors<B, T>,
        row: &BTensor<B, T>,
    ) -> Result<()> {
        let gate = optim.slot().narrow(0, ADAMW_SLOT_GATE, 1)?;
        // gate + poison is NaN once any step not read back yet was: later steps are skipped too.
        b.add_into(&self.poison, &gate)?;
        b.copy_into(&gate, &self.poison)?;
        b.scatter_row(row, &self.cursor, &self.history, true)?;
        Ok(())
    }
}

impl<B: Ops<T>, T: Element> Track<B, T> {
    /// A batched step's tail: `stats = [loss, norm]`, the step's gate written into the optimiser's slot
    /// and folded into the sticky one, and `stats` into the history's next row, as
    /// `StepOps::step_tail` does it (one launch on the CUDA backend; the same values as
    /// `write_stats`, `write_gate` and [`Track::record`]). Legal inside a capture.
    pub(in crate::trainer) fn record_step(
        &self,
        b: &B,
        optim: &OptimizerTensors<B, T>,
        loss_norm: [&BTensor<B, T>; 2],
        stats: &BTensor<B, T>,
    ) -> Result<()> {
        let gate = optim.gate()?;
        let history = Some((&self.history, &self.cursor));
        b.step_tail(loss_norm, stats, &gate, Some(&self.poison), history)?;
        Ok(())
    }
}

/// What a queued step's history row holds.
#[derive(Clone, Copy, Debug)]
pub(in crate::trainer) enum Record {
    /// `[loss, norm]` (the batched schedule).
    Stats,
    /// `[global loss, norm, the losses of this rank's `local` samples..]` of a per-sample
    /// step of `global` samples.
    Samples { local: usize, global: usize },
}

impl Record {
    /// The step's loss and norm from its history row, refused as the per-step path refuses
    /// them: one rank sums its samples' losses on the host in `f64` in sample order (and names
    /// the first non-finite one); several take the global loss the all-reduce summed.
    pub(in crate::trainer) fn stats<T: Element>(
        self,
        step: u64,
        row: &[T],
        single: bool,
    ) -> Result<(f64, f64)> {
        let norm = row[1].to_f64();
        let loss = match self {
            Record::Samples { local, global } if single => {
                checks::sample_losses(step, &row[2..2 + local], global)?
            }
            Record::Stats | Record::Samples { .. } => row[0].to_f64(),
        };
        checks::finite(step, loss, norm)?;
        Ok((loss, norm))
    }
}

/// A queued step the host has not read back yet.
#[derive(Clone, Debug)]
pub(super) struct Pending {
    pub(super) step: u64,
    pub(super) lr: f64,
    pub(super) samples: usize,
    pub(super) rows: Vec<usize>,
    pub(super) captured: bool,
    pub(super) record: Record,
}

/// A full window whose rows are on their way to the host: its steps, the width of their
/// rows and the queued copy.
pub(super) struct Copied<T> {
    pub(super) steps: Vec<Pending>,
    pub(super) width: usize,
    pub(super) read: Readback<T>,
}

/// Queued steps and their device history: the steps whose rows are in the history
/// (`pending`, the window being filled) and the window before, copied to the host and not
/// read yet (`copied`).
pub(crate) struct Window<B: Ops<T>, T: Element> {
    pub(super) track: Option<Track<B, T>>,
    /// How many tracks were made: a graph captured with an earlier one writes into a history
    /// the host no longer reads (`Executor::queued_track`).
    pub(super) made: u64,
    /// Whether a step that may have run in part left the device's cursor unknown
    /// (`Trainer::resync_cursor`).
    pub(super) unsynced: bool,
    pub(super) pending: Vec<Pending>,
    pub(super) copied: Option<Copied<T>>,
}

impl<B: Ops<T>, T: Element> Default for Window<B, T> {
    fn default() -> Self {
        Window {
            track: None,
            made: 0,
            unsynced: false,
            pending: Vec::new(),
            copied: None,
        }
    }
}

impl<B: Ops<T>, T: Element> Window<B, T> {
    /// Steps queued and not read back (the window being filled and the one copied).
    pub(in crate::trainer) fn pending(&self) -> usize {
        self.filling() + self.copied.as_ref().map_or(0, |c| c.steps.len())
    }

    /// Steps of the window being filled (their rows not on their way to the host yet).
    pub(in crate::trainer) fn filling(&self) -> usize {
        self.pending.len()
    }

    /// Whether the track holds windows of `every` steps of rows of `width` values.
    pub(super) fn fits(&self, every: usize, width: usize) -> bool {
        self.track
            .as_ref()
            .is_some_and(|t| t.history.shape()[0] >= every && t.history.shape()[1] == width)
    }

    /// The track for windows of `every` steps of rows of `width` values (made anew only while
    /// nothing is pending: `Trainer::drain_before` reads the window back first).
    pub(in crate::trainer) fn track(
        &mut self,
        b: &B,
        every: usize,
        width: usize,
    ) -> Result<Track<B, T>> {
        match &self.track {
            Some(t) if self.fits(every, width) => Ok(t.clone()),
            _ if self.pending() > 0 => Err(GradError::BadInput(
                "internal: the window's history changes shape with steps pending".into(),
            )),
            _ => {
                self.track = None;
                let t = Track {
                    history: persistent_zeros(b, &[every, width])?,
                    cursor: persistent_zeros(b, &[1])?,
                    poison: persistent_zeros(b, &[1])?,
                };
                self.track = Some(t.clone());
                self.made += 1;
                Ok(t)
            }
        }
    }
}
