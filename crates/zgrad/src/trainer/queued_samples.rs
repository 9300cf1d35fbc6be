//! The per-sample step after its samples (issue 21 items 2, 4, 5), read back at once or
//! queued: a step's rows loaded into the per-sample slots' table (host slices, pinned memory,
//! gathered from the device data set, or copied from a landing buffer), every sample run
//! (eagerly, or replaying the one-sample graph once per sample), then the tail: the norm, the
//! finiteness gate (queued: folded into the window's sticky one), the step's record and the
//! gated update. `step` reads the record back at once; `queue` writes it into the window's
//! history.
//!
//! The record is `[global loss, norm, the samples' losses..]` (`SampleSlots::record`). At
//! the read-back one rank sums the samples' losses on the host in `f64`, in sample order, exactly
//! as the per-step path does, and refuses a non-finite one naming its sample; the gate on the
//! device is `sum(losses * 0)`, NaN exactly when one of them is not finite (an `f64` sum of
//! finite values is finite), so the device skips exactly the steps the host refuses. In data
//! parallel the loss rides in the loss slot after the flat gradient buffer (one all-reduce a step,
//! `StepParts::reduce_samples`) and the report is that global sum.

use super::body::StepParts;
use super::queued::{Record, Track};
use super::{StepReport, Trainer, checks, in_step_split};
use crate::batch::{Shard, Source};
use crate::error::{Applied, Result};
use crate::model::Model;
use crate::optim::OptimizerTensors;
use std::cell::Cell;
use std::ops::Range;
use std::rc::Rc;
use zcompute::{BTensor, BinaryOp, Capture, Element, ScalarSide, prelude::*};

/// The per-sample step's slots a tail reads.
struct TailInputs<B: Ops<T>, T: Element> {
    /// This step's samples' losses, `[local]`.
    losses: BTensor<B, T>,
    /// 1 / the global batch, rank 0.
    scale: BTensor<B, T>,
    /// The history row it fills, `[2 + capacity]`.
    record: BTensor<B, T>,
}

impl<B: Ops<T>, T: Element, M: Model<B, T>> StepParts<B, T, M> {
    /// A per-sample step after its last sample: the gradients (and loss) summed over the
    /// ranks, the norm (and clipping), the gate, the record (queued: into the window's history,
    /// the gate folded into the sticky one), the gated update. Reads nothing back. `started`
    /// is set just before the first update kernel.
    fn sample_tail(
        &self,
        b: &B,
        inputs: &TailInputs<B, T>,
        optim: &OptimizerTensors<B, T>,
        track: Option<&Track<B, T>>,
        started: &Cell<bool>,
    ) -> Result<()> {
        let TailInputs {
            losses,
            scale,
            record,
        } = inputs;
        let (global, gate_loss) = if self.dist.single() {
            // 0 while every sample's loss is finite, NaN otherwise: the host's own check.
            let zeroed = b.binary_scalar(BinaryOp::Mul, losses, T::ZERO, ScalarSide::Rhs)?;
            (None, b.sum(&zeroed, 0, false)?)
        } else {
            let loss = self.reduce_samples(b, losses, scale)?;
            (Some(loss.clone()), loss)
        };
        let norm = self.norm(b)?;
        optim.write_gate(b, &gate_loss, &norm)?;
        if let Some(loss) = global {
            b.copy_into(&loss.reshape(&[1])?, &record.narrow(0, 0, 1)?)?;
        }
        b.copy_into(&norm.reshape(&[1])?, &record.narrow(0, 1, 1)?)?;
        if let Some(track) = track {
            track.record(b, optim, record)?;
        }
        started.set(true);
        optim.apply(b, &self.params)
    }
}

impl<B: Capture<T> + 'static, T: Element, M: Model<B, T>> Trainer<B, T, M> {
    /// The width of the history rows a per-sample step of `local` samples of `sample` (one
    /// sample's shape) writes: 2 + the capacity of the slots it will use.
    pub(super) fn sample_width(&self, sample: &[usize], local: usize) -> usize {
        let one: Vec<usize> = std::iter::once(1).chain(sample.iter().copied()).collect();
        match self.samples.as_ref() {
            Some(s) if self.slots_fit(&one, local) => 2 + s.capacity(),
            _ => 2 + local,
        }
    }

    /// One per-sample step on `data` (`shape`: `[rows, ..sample]`), read back at once: its
    /// record read and refused as a queued step's is, the step counted when it is finite.
    pub(super) fn per_sample(
        &mut self,
        data: &Shard<'_, B, T>,
        shape: &[usize],
        lr: f64,
    ) -> Result<StepReport> {
        let (step, batch) = (self.optim.step_count() + 1, shape[0]);
        let rows = data.rows.clone();
        let (global, ended) = self.sample_step(data.src, rows, shape, lr, step, None)?;
        let single = self.parts.dist.single();
        let record = Record::Samples {
            local: batch,
            global,
        };
        let read = |t: &Self| {
            let row = t.slots()?.record.narrow(0, 0, 2 + batch)?;
            record.stats(step, &t.backend.download(&row)?, single)
        };
        let (loss, grad_norm) = self.after_gated(step, ended, read, |t, k| {
            let (x, y) = data.host(&t.backend)?;
            t.find_sample(&x, &y, shape, k)
        })?;
        let captured = self.exec.on();
        Ok(self.report(step, loss, grad_norm, lr, batch, captured))
    }

    /// Per-sample step `step` on rows `local` of `src` up to its queued tail (queued: its row
    /// in a window of `every` steps). Returns the global batch and the closing of the tail's
    /// step scope. Errors before the update leave the model as it was (the step is not
    /// counted); one inside the update leaves it unknown (`Applied::Maybe`).
    pub(super) fn sample_step(
        &mut self,
        src: &dyn Source<B, T>,
        local: Range<usize>,
        shape: &[usize],
        lr: f64,
        step: u64,
        every: Option<usize>,
    ) -> Result<(usize, Result<()>)> {
        let b = Rc::clone(&self.backend);
        let batch = local.len();
        self.sample_slots(&checks::one_sample(shape), batch)?;
        let track = match every {
            Some(every) => {
                let width = 2 + self.slots()?.capacity();
                Some(self.window.track(&*b, every, width)?)
            }
            None => None,
        };
        let parts = self.parts.clone();
        let global = self.accumulate(&Shard { src, rows: local }, &parts)?;
        let inputs = {
            let s = self.slots()?;
            TailInputs {
                losses: s.losses.narrow(0, 0, batch)?,
                scale: s.scale.clone(),
                record: s.record.clone(),
            }
        };
        let (optim, started) = (self.optim.tensors(), Cell::new(false));
        let (queued, ended) = in_step_split(&*b, || {
            self.optim.prepare(&*b, lr)?;
            parts.sample_tail(&*b, &inputs, &optim, track.as_ref(), &started)
        });
        if let Err(e) = queued {
            if started.get() {
                self.optim.mark_unknown();
                return Err(e.at_step(step, Applied::Maybe));
            }
            return Err(e);
        }
        Ok((global, ended))
    }
}
