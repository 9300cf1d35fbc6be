//! The per-sample schedule queued with nothing read back per step (issue 21 items 2, 4, 5):
//! `Trainer::queue` of loaded rows and `Trainer::queue` of a pinned batch load a step's rows into the
//! per-sample slots' table (gathered from the device data set, or copied from a landing
//! buffer), run every sample (eagerly, or replaying the one-sample graph once per sample), then
//! queue the tail: the norm, the finiteness gate (folded into the window's sticky one), the
//! step's row of the window's history and the gated update.
//!
//! The history row is `[global loss, norm, the samples' losses..]` (`SampleSlots::record`). At
//! the drain one rank sums the samples' losses on the host in `f64`, in sample order, exactly
//! as the per-step path does, and refuses a non-finite one naming its sample; the gate on the
//! device is `sum(losses * 0)`, NaN exactly when one of them is not finite (an `f64` sum of
//! finite values is finite), so the device skips exactly the steps the host refuses. In data
//! parallel the loss rides in the loss slot after the flat gradient buffer (one all-reduce a step,
//! `StepParts::reduce_samples`) and the report is that global sum.

use super::body::StepParts;
use super::queued::{Queued, Track};
use super::source::{Shard, Source};
use super::{Trainer, checks, in_step_split};
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
    /// A queued per-sample step after its last sample: the gradients (and loss) summed over the
    /// ranks, the norm (and clipping), the gate, the history row, the gated update. Reads
    /// nothing back. `started` is set just before the first update kernel.
    fn sample_tail(
        &self,
        b: &B,
        inputs: &TailInputs<B, T>,
        optim: &OptimizerTensors<B, T>,
        track: &Track<B, T>,
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
        track.record(b, optim, record)?;
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

    /// Queues per-sample step `step` on rows `local` of `src` (`shape`: `[local, ..sample]`),
    /// its row in a window of `every` steps. Returns whether its samples ran captured and the
    /// closing of the tail's step scope. Errors before the update leave the model as it was
    /// (the step is not counted); one inside the update leaves it unknown (`Applied::Maybe`).
    pub(super) fn queue_samples(
        &mut self,
        src: &dyn Source<B, T>,
        local: Range<usize>,
        shape: &[usize],
        lr: f64,
        step: u64,
        every: usize,
    ) -> Result<Queued> {
        let b = Rc::clone(&self.backend);
        let batch = local.len();
        self.sample_slots(&checks::one_sample(shape), batch)?;
        let track = self
            .window
            .track(&*b, every, 2 + self.slots()?.capacity())?;
        let parts = self.parts.clone();
        self.accumulate(&Shard { src, rows: local }, &parts)?;
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
            parts.sample_tail(&*b, &inputs, &optim, &track, &started)
        });
        if let Err(e) = queued {
            if started.get() {
                self.optim.mark_unknown();
                return Err(e.at_step(step, Applied::Maybe));
            }
            return Err(e);
        }
        Ok((
            self.exec.on(),
            ended.map_err(|e| e.at_step(step, Applied::Yes)),
        ))
    }
}
