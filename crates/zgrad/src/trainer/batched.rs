//! The batched schedule: one forward and backward over the whole batch, then the optimiser's
//! step, through the executor's door (`executor.rs`). One body, `StepParts::gated_step`, is
//! every batched step, eager or captured, read back at once (`step`, [`GraphKey::Batched`])
//! or queued (`queued.rs`: rows gathered from the device data set or copied from a landing
//! buffer, the history row written too).
//!
//! Captured, the whole step (zero_grad, forward, backward, norm and the update) is one graph
//! reading static persistent inputs that are refilled before each replay; the learning rate
//! and step count reach the graph through the optimiser's slot in device memory. Its update is
//! gated on the device by the finiteness of the loss and the gradient norm
//! (`OptimizerTensors::write_gate`): a non-finite step leaves the model untouched, and the host
//! counts the step (`commit`) only after reading back finite stats. Eagerly (capture off, a
//! batch of another shape than the graph's, or after a capture that did nothing) the same
//! body runs on the batch uploaded as constants.

use super::body::StepParts;
use super::executor::{Eager, GraphKey, Ran, Recording, Request, StaticInputs};
use super::gated::{GatedRows, GatedStep, Mark};
use super::source::ReplayMark;
use super::{StepReport, Trainer, checks, in_step_split};
use crate::error::{Applied, GradError, NonFiniteKind, Result};
use crate::memory::ClassGuard;
use crate::model::Model;
use crate::optim::Optimizer;
use crate::var::Var;
use std::rc::Rc;
use zcompute::{AllocClass, Capture, Element, prelude::*};

impl<B: Capture<T> + 'static, T: Element, M: Model<B, T>> Trainer<B, T, M> {
    /// Uploads a batch as constants (in the saved class: the first matmul keeps `x`).
    pub(super) fn upload_batch(
        &self,
        x: &[T],
        y: &[T],
        shape: &[usize],
    ) -> Result<(Var<B, T>, Var<B, T>)> {
        let b = &*self.backend;
        let _class = ClassGuard::new(b, batch_class(&self.parts));
        Ok((
            Var::constant(b.upload(x, shape)?),
            Var::constant(b.upload(y, &self.targets_shape(shape[0]))?),
        ))
    }

    /// One optimiser step of the batched schedule on `rows` (`shape`: `[rows, ..sample]`; the
    /// held batch: `mark` called around its replay), read back at once; `find` looks for the
    /// sample of a non-finite step.
    pub(super) fn batched_step(
        &mut self,
        (rows, mark): (GatedRows<'_, B, T>, Mark<'_>),
        shape: &[usize],
        lr: f64,
        find: impl FnOnce(&Self, NonFiniteKind) -> Result<Option<usize>>,
    ) -> Result<StepReport> {
        let step = self.optim.step_count() + 1;
        let target = self.targets_shape(shape[0]);
        let (ran, ended) = self.gated_step(GatedStep {
            key: GraphKey::Batched,
            what: "batched step",
            step,
            lr: Some(lr),
            rows,
            mark,
            track: None,
            shape,
            target: &target,
        });
        let ran = ran?;
        let read = |t: &Self| t.read_stats(step);
        let (loss, grad_norm) = self.after_gated(step, ended, read, find)?;
        Ok(self.report(step, loss, grad_norm, lr, shape[0], ran.captured()))
    }

    /// A gated step (`StepParts::gated_step`) through the executor's door (`executor.rs`):
    /// its graph replayed on its static inputs refilled from the rows, captured, or the same
    /// body run eagerly on fresh inputs (or on the recording's, after a capture that did
    /// nothing). Nothing is read back. Returns how it ran and the closing of its step scope
    /// (an error there comes after the update: `Applied::Yes` once it is counted); a failure
    /// that may have applied the update in part leaves the optimiser's state unknown.
    pub(super) fn gated_step(&mut self, s: GatedStep<'_, '_, B, T>) -> (Result<Ran>, Result<()>) {
        let b = Rc::clone(&self.backend);
        let req = match s.rows {
            GatedRows::Held => Request::held(s.key, s.shape, s.what, s.step),
            _ => Request::new(s.key, s.shape, s.what, Some(s.step)),
        };
        let (shape, target, track, rows) = (s.shape, s.target, s.track, &s.rows);
        let mut mark = s.mark;
        // What each run reads: the optimiser's tensors (a step on the device data set reads
        // `[lr, t, gate]` from its table's slot) and the rows it gathers.
        let (slot, gather) = match rows {
            GatedRows::Gathered(g) => (Some(g.slot.clone()), Some(&g.gather)),
            GatedRows::Shard(_) | GatedRows::Held => (None, None),
        };
        let tensors = move |optim: &Optimizer<B, T>| match &slot {
            Some(slot) => optim.tensors().with_slot(slot.clone()),
            None => optim.tensors(),
        };
        let refill = |inputs: &StaticInputs<B, T>| match rows {
            GatedRows::Shard(data) => inputs.refill(&*b, data),
            GatedRows::Gathered(_) | GatedRows::Held => Ok(()),
        };
        in_step_split(&*b, || {
            if let Some(lr) = s.lr {
                self.optim.prepare(&*b, lr)?;
            }
            let parts = &self.parts;
            let ran = self
                .exec
                .run(
                    &*b,
                    &mut self.optim,
                    req,
                    |_, inputs| {
                        if let Some(mark) = mark.as_deref_mut() {
                            mark(ReplayMark::Before);
                        }
                        inputs.map_or(Ok(()), &refill)
                    },
                    |optim, started| {
                        let inputs = StaticInputs::zeros(&*b, shape, target)?;
                        refill(&inputs)?;
                        let (bc, parts, gather) = (Rc::clone(&b), parts.clone(), gather.cloned());
                        let (optim, track) = (tensors(optim), track.cloned());
                        let (x, y, started) = (inputs.x.clone(), inputs.y.clone(), started.clone());
                        let body = move || {
                            let (gather, track) = (gather.as_ref(), track.as_ref());
                            parts.gated_step(&*bc, (&x, &y), gather, &optim, track, &started)
                        };
                        Ok(Recording {
                            body: Box::new(body),
                            inputs: Some(inputs),
                        })
                    },
                    // Capture off, rows of another shape than the graph's (an epoch's last), or
                    // a capture that did nothing: the body eagerly.
                    |optim, how, started| {
                        let (x, y) = match how {
                            Eager::AfterFailedCapture(Some(i)) => (i.x.clone(), i.y.clone()),
                            _ => fresh_inputs(&*b, parts, rows, shape, target)?,
                        };
                        let optim = tensors(optim);
                        parts.gated_step(&*b, (&x, &y), gather, &optim, track, started)
                    },
                )
                .map_err(|e| e.settle(&mut self.optim))?;
            if let Some(mark) = mark {
                mark(ReplayMark::After);
            }
            Ok(ran)
        })
    }

    /// After a gated update was queued without error: reads the step's loss and norm (`read`,
    /// refusing non-finite ones) and counts the step when they are finite. Non-finite ones
    /// mean the gate skipped the update (`NonFinite`, not applied, the sample located by
    /// `find` on the unchanged parameters); values that cannot be read leave the update
    /// unknown. `ended` is the closing of the step scope, which, failing after a counted
    /// update, is reported as applied.
    pub(super) fn after_gated(
        &mut self,
        step: u64,
        ended: Result<()>,
        read: impl FnOnce(&Self) -> Result<(f64, f64)>,
        find: impl FnOnce(&Self, NonFiniteKind) -> Result<Option<usize>>,
    ) -> Result<(f64, f64)> {
        match read(self) {
            Ok(stats) => {
                self.optim.commit();
                ended.map_err(|e| e.at_step(step, Applied::Yes))?;
                Ok(stats)
            }
            Err(e @ GradError::NonFinite { .. }) => checks::locate(Err(e), |k| find(self, k)),
            Err(e) => {
                self.optim.mark_unknown();
                Err(e.at_step(step, Applied::Maybe))
            }
        }
    }

    pub(super) fn report(
        &self,
        step: u64,
        loss: f64,
        grad_norm: f64,
        lr: f64,
        samples: usize,
        captured: bool,
    ) -> StepReport {
        StepReport {
            step,
            loss,
            grad_norm,
            lr,
            samples,
            captured,
        }
    }
}

/// Where an eager batch lives: the saved class (the first matmul keeps `x`), or scratch for
/// the negative control.
fn batch_class<B: Ops<T>, T: Element, M: Model<B, T>>(parts: &StepParts<B, T, M>) -> AllocClass {
    if parts.unprotected {
        AllocClass::Scratch
    } else {
        AllocClass::Saved
    }
}

/// Fresh inputs of an eager step (`target`: the targets' shape): a shard uploaded as
/// constants, as `upload_batch` does host slices (pinned memory and landing buffers are copied
/// straight into fresh tensors); zeros for rows the body gathers.
fn fresh_inputs<B: Capture<T>, T: Element, M: Model<B, T>>(
    b: &B,
    parts: &StepParts<B, T, M>,
    rows: &GatedRows<'_, B, T>,
    shape: &[usize],
    target: &[usize],
) -> Result<(Var<B, T>, Var<B, T>)> {
    let _class = ClassGuard::new(b, batch_class(parts));
    if let GatedRows::Shard(data) = rows
        && let Some((x, y)) = data.slices()
    {
        return Ok((
            Var::constant(b.upload(x, shape)?),
            Var::constant(b.upload(y, target)?),
        ));
    }
    let (x, y) = (b.zeros(shape)?, b.zeros(target)?);
    if let GatedRows::Shard(data) = rows {
        data.upload(b, &x, &y)?;
    }
    Ok((Var::constant(x), Var::constant(y)))
}
