//! The batched schedule: one forward and backward over the whole batch, then the optimiser's
//! step, through the executor's door (`executor.rs`) under [`GraphKey::Batched`].
//!
//! Captured, the whole step (zero_grad, forward, backward, norm and the update) is one graph
//! reading static persistent inputs that are refilled before each replay; the learning rate
//! and step count reach the graph through the optimiser's slot in device memory. Its update is
//! gated on the device by the finiteness of the loss and the gradient norm
//! (`OptimizerTensors::write_gate`): a non-finite step leaves the model untouched, and the host
//! counts the step (`commit`) only after reading back finite stats. Eagerly (capture off, a
//! batch of another shape than the graph's, or after a capture that did nothing) the batch is
//! uploaded as constants, the stats read back and the update applied only when they are finite.

use super::body::StepParts;
use super::executor::{Eager, GraphKey, Recording, Request, StaticInputs};
use super::source::Shard;
use super::{StepReport, Trainer, checks, in_step_split};
use crate::error::{Applied, GradError, Result};
use crate::memory::ClassGuard;
use crate::model::Model;
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

    /// One optimiser step of the batched schedule on `data` (`shape`: `[rows, ..sample]`):
    /// the graph replayed, captured, or the step run eagerly (`executor.rs` decides).
    pub(super) fn batched_step(
        &mut self,
        data: &Shard<'_, B, T>,
        shape: &[usize],
        lr: f64,
    ) -> Result<StepReport> {
        let step = self.optim.step_count() + 1;
        let b = Rc::clone(&self.backend);
        let target = self.targets_shape(shape[0]);
        let req = Request::new(GraphKey::Batched, shape, "batched step", Some(step));
        // The eager forms read their stats and take the step themselves.
        let mut eager_stats = None;
        let (ran, ended) = in_step_split(&*b, || {
            let (parts, stats) = (&self.parts, &mut eager_stats);
            self.exec
                .run(
                    &*b,
                    &mut self.optim,
                    req,
                    |optim, inputs| {
                        if let Some(inputs) = inputs {
                            upload_inputs(&*b, data, inputs)?;
                        }
                        optim.prepare(&*b, lr)
                    },
                    |optim, started| {
                        let inputs = StaticInputs::zeros(&*b, shape, &target)?;
                        upload_inputs(&*b, data, &inputs)?;
                        optim.prepare(&*b, lr)?;
                        let (b, parts, optim) = (Rc::clone(&b), parts.clone(), optim.tensors());
                        let (x, y, started) = (inputs.x.clone(), inputs.y.clone(), started.clone());
                        Ok(Recording {
                            body: Box::new(move || {
                                parts.batched_gated(&*b, &x, &y, &optim, &started)
                            }),
                            inputs: Some(inputs),
                        })
                    },
                    |optim, how| {
                        let (x, y) = match how {
                            Eager::Plain => upload_shard(&*b, parts, data, shape, &target)?,
                            // Nothing was applied: the eager step on the recording's inputs,
                            // which prepares its slot again (the failed body may have written
                            // the gate).
                            Eager::AfterFailedCapture(Some(i)) => (i.x.clone(), i.y.clone()),
                            Eager::AfterFailedCapture(None) => {
                                return Err(GradError::BadInput(
                                    "the batched step's recording has no inputs".into(),
                                ));
                            }
                        };
                        parts.batched(&*b, &x, &y)?;
                        *stats = Some(read_stats(&*b, parts, step)?);
                        optim.step(&*b, &parts.params, lr)
                    },
                )
                .map_err(|e| e.settle(&mut self.optim))
        });
        let ran = checks::locate(ran, |k| {
            let (x, y) = data.host()?;
            self.find_sample(&x, &y, shape, k)
        })?;
        let (loss, grad_norm) = match eager_stats {
            Some(stats) => {
                ended?;
                stats
            }
            None => self.after_gated(data, shape, step, ended)?,
        };
        Ok(self.report(step, loss, grad_norm, lr, shape[0], ran.captured()))
    }

    /// After a gated update was queued without error: reads the stats and counts the step when
    /// they are finite. Non-finite stats mean the gate skipped the update (`NonFinite`, not
    /// applied, the sample located on the unchanged parameters); stats that cannot be read
    /// leave the update unknown. `ended` is the closing of the step scope, which, failing
    /// after a counted update, is reported as applied.
    pub(super) fn after_gated(
        &mut self,
        data: &Shard<'_, B, T>,
        shape: &[usize],
        step: u64,
        ended: Result<()>,
    ) -> Result<(f64, f64)> {
        match self.read_stats(step) {
            Ok(stats) => {
                self.optim.commit();
                ended.map_err(|e| e.at_step(step, Applied::Yes))?;
                Ok(stats)
            }
            Err(e @ GradError::NonFinite { .. }) => checks::locate(Err(e), |k| {
                let (x, y) = data.host()?;
                self.find_sample(&x, &y, shape, k)
            }),
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

/// Uploads a shard as constants (`target`: the targets' shape), as `upload_batch` does host
/// slices (pinned memory is copied straight into fresh tensors).
fn upload_shard<B: Capture<T>, T: Element, M: Model<B, T>>(
    b: &B,
    parts: &StepParts<B, T, M>,
    data: &Shard<'_, B, T>,
    shape: &[usize],
    target: &[usize],
) -> Result<(Var<B, T>, Var<B, T>)> {
    let _class = ClassGuard::new(b, batch_class(parts));
    if let Some((x, y)) = data.slices() {
        return Ok((
            Var::constant(b.upload(x, shape)?),
            Var::constant(b.upload(y, target)?),
        ));
    }
    let (x, y) = (b.zeros(shape)?, b.zeros(target)?);
    data.upload(b, &x, &y)?;
    Ok((Var::constant(x), Var::constant(y)))
}

/// Reads `[loss, norm]` back and refuses non-finite values.
pub(super) fn read_stats<B: Ops<T>, T: Element, M: Model<B, T>>(
    b: &B,
    parts: &StepParts<B, T, M>,
    step: u64,
) -> Result<(f64, f64)> {
    let s = b.download(&parts.stats)?;
    let (loss, norm) = (s[0].to_f64(), s[1].to_f64());
    checks::finite(step, loss, norm)?;
    Ok((loss, norm))
}

/// Refills the graph's static inputs from the shard (written outside zgrad's ops: their
/// versions move, as `Var::upload` moves them).
fn upload_inputs<B: Capture<T>, T: Element>(
    b: &B,
    data: &Shard<'_, B, T>,
    inputs: &StaticInputs<B, T>,
) -> Result<()> {
    data.upload(b, inputs.x.value(), inputs.y.value())?;
    inputs.x.bump_version();
    inputs.y.bump_version();
    Ok(())
}
