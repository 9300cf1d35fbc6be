//! The captured batched step: zero_grad, forward, backward, norm and AdamW in one graph, reading
//! static persistent inputs that are refilled before each replay; the learning rate and step
//! count reach the graph through AdamW's slot in device memory. Also the trainer's graphs (this
//! one and the per-sample one of `per_sample.rs`) and what both capture paths share.
//!
//! A failed capture logs a warning and turns capture off for the rest of the run. A body that
//! completed before the failure (the device backend's warm-up runs it for real) has done its
//! work, which the eager fallback then continues instead of repeating; a body that failed
//! inside its update leaves the state unknown (`Applied::Maybe`).
//!
//! The captured batched step holds its AdamW update, gated on the device by the finiteness of
//! the loss and the gradient norm (`OptimizerTensors::write_gate`): a non-finite step leaves the
//! model untouched. The host counts the step (`AdamW::commit`) only after reading back finite
//! stats.

use super::body::{ErrorSlot, into_body_error, take_body_error};
use super::per_sample::SampleSlots;
use super::source::Shard;
use super::{StepReport, Trainer, checks, in_step_split};
use crate::error::{Applied, GradError, Result};
use crate::memory::ClassGuard;
use crate::model::Model;
use crate::var::Var;
use std::cell::Cell;
use std::rc::Rc;
use zcompute::{AllocClass, BTensor, Capture, Element, GraphPool, prelude::*};

/// The captured batched step and its static inputs.
pub(super) struct BatchedGraph<B: Capture<T>, T: Element> {
    pub(super) graph: B::Graph,
    pub(super) x: Var<B, T>,
    pub(super) y: Var<B, T>,
    pub(super) shape: Vec<usize>,
    pub(super) errors: ErrorSlot,
}

/// The trainer's graphs.
pub(crate) struct Graphs<B: Capture<T>, T: Element> {
    /// Set after a capture failed: the rest of the run is eager. The trainer's policy, not
    /// capture state: where a capture is lives in the device's capture session alone.
    pub disabled: bool,
    pub(super) batched: Option<BatchedGraph<B, T>>,
    pub(super) samples: Option<SampleSlots<B, T>>,
    /// The queued batched step on the device data set (`queued.rs`).
    pub(super) tracked: Option<BatchedGraph<B, T>>,
    /// The queued batched step on a pinned batch (`Trainer::queue_pinned`).
    pub(super) tracked_pinned: Option<BatchedGraph<B, T>>,
    /// The window's track (`Window::made`) the two graphs above were captured with.
    pub(super) tracked_for: u64,
    /// The memory every graph of the trainer (these and the validation set's) is captured
    /// into: they replay one at a time on the engine stream and keep what outlives a replay
    /// (parameters, gradients, moments, the AdamW slot and gate, stats, history, inputs) in
    /// persistent tensors, so they share one reservation (see `zmem::GraphPool`).
    pub(super) pool: GraphPool,
}

impl<B: Capture<T>, T: Element> Default for Graphs<B, T> {
    fn default() -> Self {
        Graphs {
            disabled: false,
            batched: None,
            samples: None,
            tracked: None,
            tracked_pinned: None,
            tracked_for: 0,
            pool: GraphPool::new(),
        }
    }
}

/// Counts the body's completed runs (host side), to tell a failed capture whose body already
/// ran for real from one that did nothing.
pub(super) type Runs = Rc<Cell<u32>>;

pub(super) fn persistent_zeros<B: Ops<T>, T: Element>(
    b: &B,
    shape: &[usize],
) -> Result<BTensor<B, T>> {
    let _class = ClassGuard::new(b, AllocClass::Persistent);
    Ok(b.zeros(shape)?)
}

pub(super) fn warn_fallback(what: &str, e: &GradError) {
    tracing::warn!(
        target: "zgrad.trainer.capture",
        error = %e,
        "capture of the {what} failed; continuing with eager execution"
    );
}

/// What the first call of the captured batched step did.
enum FirstRun<G> {
    /// The body ran for real with its gated update (the device backend's warm-up, or the CPU
    /// backend's run); the graph, when the capture itself succeeded.
    Gated(Option<G>),
    /// The capture failed before the body completed without starting the update: the step
    /// ran eagerly (and was counted there), with this loss and norm.
    Eager(f64, f64),
}

impl<B: Capture<T> + 'static, T: Element, M: Model<B, T>> Trainer<B, T, M> {
    pub(super) fn batched_captured(
        &mut self,
        data: &Shard<'_, B, T>,
        shape: &[usize],
        lr: f64,
    ) -> Result<StepReport> {
        match &self.graphs.batched {
            Some(g) if g.shape != shape => return self.batched_eager(data, shape, lr),
            Some(_) => return self.batched_replay(data, shape, lr),
            None => {}
        }
        let step = self.optim.step_count() + 1;
        let b = Rc::clone(&self.backend);
        let xv = Var::constant(persistent_zeros(&*b, shape)?);
        let yv = Var::constant(persistent_zeros(&*b, &self.targets_shape(shape[0]))?);
        let errors = ErrorSlot::default();
        let runs = Runs::default();
        let started = Rc::new(Cell::new(false));
        let (outcome, ended) = in_step_split(&*b, || {
            upload_inputs(&*b, data, &xv, &yv)?;
            self.optim.prepare(&*b, lr)?;
            let body = {
                let (b, parts, x, y) = (Rc::clone(&b), self.parts.clone(), xv.clone(), yv.clone());
                let (optim, errors, runs) = (self.optim.tensors(), errors.clone(), runs.clone());
                let started = Rc::clone(&started);
                move || {
                    parts
                        .batched_gated(&*b, &x, &y, &optim, &started)
                        .map_err(|e| into_body_error(e, &errors))?;
                    runs.set(runs.get() + 1);
                    Ok(())
                }
            };
            match b.capture_in_pool(&self.graphs.pool, Box::new(body)) {
                Ok(graph) => Ok(FirstRun::Gated(Some(graph))),
                Err(e) => {
                    let e = take_body_error(e, &errors);
                    if runs.get() > 0 {
                        warn_fallback("batched step", &e);
                        return Ok(FirstRun::Gated(None));
                    }
                    if started.get() {
                        // The body failed inside its update: some parameters may have moved.
                        self.optim.mark_unknown();
                        return Err(e.at_step(step, Applied::Maybe));
                    }
                    warn_fallback("batched step", &e);
                    // Nothing was applied: the eager step, which prepares its slot again (the
                    // failed body may have written the gate).
                    self.parts.batched(&*b, &xv, &yv)?;
                    let (loss, norm) = self.read_stats(step)?;
                    self.optim.step(&*b, &self.parts.params, lr)?;
                    Ok(FirstRun::Eager(loss, norm))
                }
            }
        });
        let outcome = checks::locate(outcome, |k| {
            let (x, y) = data.host()?;
            self.find_sample(&x, &y, shape, k)
        })?;
        let captured = match outcome {
            FirstRun::Gated(Some(graph)) => {
                self.graphs.batched = Some(BatchedGraph {
                    graph,
                    x: xv,
                    y: yv,
                    shape: shape.to_vec(),
                    errors,
                });
                true
            }
            FirstRun::Gated(None) => {
                self.graphs.disabled = true;
                false
            }
            FirstRun::Eager(loss, grad_norm) => {
                self.graphs.disabled = true;
                ended?;
                return Ok(self.report(step, loss, grad_norm, lr, shape[0], false));
            }
        };
        let (loss, grad_norm) = self.after_gated(data, shape, step, ended)?;
        Ok(self.report(step, loss, grad_norm, lr, shape[0], captured))
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

    /// Replays the captured batched step on new inputs. The update inside the graph is gated
    /// on the device by the finiteness of the loss and the norm; it is counted once the stats
    /// read back are finite.
    fn batched_replay(
        &mut self,
        data: &Shard<'_, B, T>,
        shape: &[usize],
        lr: f64,
    ) -> Result<StepReport> {
        let step = self.optim.step_count() + 1;
        let b = Rc::clone(&self.backend);
        let Some(g) = self.graphs.batched.as_mut() else {
            return self.batched_eager(data, shape, lr);
        };
        let (queued, ended) = in_step_split(&*b, || {
            upload_inputs(&*b, data, &g.x, &g.y)?;
            self.optim.prepare(&*b, lr)?;
            b.replay(&mut g.graph).map_err(|e| {
                // The graph may have run in part, its update included.
                self.optim.mark_unknown();
                take_body_error(e, &g.errors).at_step(step, Applied::Maybe)
            })
        });
        queued?;
        let (loss, grad_norm) = self.after_gated(data, shape, step, ended)?;
        Ok(self.report(step, loss, grad_norm, lr, shape[0], true))
    }
}

/// Refills the graph's static inputs from the shard (written outside zgrad's ops: their
/// versions move, as `Var::upload` moves them).
fn upload_inputs<B: Capture<T>, T: Element>(
    b: &B,
    data: &Shard<'_, B, T>,
    x: &Var<B, T>,
    y: &Var<B, T>,
) -> Result<()> {
    data.upload(b, x.value(), y.value())?;
    x.bump_version();
    y.bump_version();
    Ok(())
}
