//! The per-sample schedule (eager or with the per-sample forward+backward captured) and the
//! captured batched step (zero_grad, forward, backward, norm and AdamW in one graph). Captured
//! graphs read static persistent inputs that are refilled before each replay; the learning
//! rate and step count reach the graph through AdamW's slot in device memory.
//!
//! A failed capture logs a warning and turns capture off for the rest of the run. A body that
//! completed before the failure (the device backend's warm-up runs it for real) has done its
//! work, which the eager fallback then continues instead of repeating; a body that failed
//! inside its update leaves the state unknown (`Applied::Maybe`).
//!
//! The captured batched step holds its AdamW update, gated on the device by the finiteness of
//! the loss and the gradient norm (`AdamWTensors::write_gate`): a non-finite step leaves the
//! model untouched. The host counts the step (`AdamW::commit`) only after reading back finite
//! stats.

use super::body::{ErrorSlot, StepParts, into_body_error, take_body_error};
use super::{StepReport, Trainer, checks, in_step, in_step_split};
use crate::error::{Applied, GradError, NonFiniteKind, Result};
use crate::memory::ClassGuard;
use crate::optim::zero_grad;
use crate::var::Var;
use std::cell::Cell;
use std::rc::Rc;
use zcompute::{AllocClass, BTensor, Backend, Capture, Element};

/// The captured batched step and its static inputs.
struct BatchedGraph<B: Capture<T>, T: Element> {
    graph: B::Graph,
    x: Var<B, T>,
    y: Var<B, T>,
    shape: Vec<usize>,
    errors: ErrorSlot,
}

/// The per-sample schedule's static inputs and outputs, and its graph once captured.
struct SampleSlots<B: Capture<T>, T: Element> {
    xs: Var<B, T>,
    ys: Var<B, T>,
    scale: BTensor<B, T>,
    sample_loss: BTensor<B, T>,
    /// Every sample's loss of the batch (kept between batches of the same size: freeing it
    /// would poison it after the step's update, an error nobody could report).
    losses: BTensor<B, T>,
    shape: Vec<usize>,
    graph: Option<B::Graph>,
    errors: ErrorSlot,
}

/// The trainer's graphs.
pub(crate) struct Graphs<B: Capture<T>, T: Element> {
    /// Set after a capture failed: the rest of the run is eager.
    pub disabled: bool,
    batched: Option<BatchedGraph<B, T>>,
    samples: Option<SampleSlots<B, T>>,
}

impl<B: Capture<T>, T: Element> Default for Graphs<B, T> {
    fn default() -> Self {
        Graphs {
            disabled: false,
            batched: None,
            samples: None,
        }
    }
}

/// Counts the body's completed runs (host side), to tell a failed capture whose body already
/// ran for real from one that did nothing.
type Runs = Rc<Cell<u32>>;

fn persistent_zeros<B: Backend<T>, T: Element>(b: &B, shape: &[usize]) -> Result<BTensor<B, T>> {
    let _class = ClassGuard::new(b, AllocClass::Persistent);
    Ok(b.zeros(shape)?)
}

fn warn_fallback(what: &str, e: &GradError) {
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

impl<B: Capture<T> + 'static, T: Element> Trainer<B, T> {
    pub(super) fn batched_captured(
        &mut self,
        x: &[T],
        y: &[T],
        shape: &[usize],
        lr: f64,
    ) -> Result<StepReport> {
        match &self.graphs.batched {
            Some(g) if g.shape != shape => return self.batched_eager(x, y, shape, lr),
            Some(_) => return self.batched_replay(x, y, shape, lr),
            None => {}
        }
        let step = self.optim.step_count() + 1;
        let b = Rc::clone(&self.backend);
        let xv = Var::constant(persistent_zeros(&*b, shape)?);
        let yv = Var::constant(persistent_zeros(&*b, &shape[..1])?);
        let errors = ErrorSlot::default();
        let runs = Runs::default();
        let started = Rc::new(Cell::new(false));
        let (outcome, ended) = in_step_split(&*b, || {
            xv.upload(&*b, x)?;
            yv.upload(&*b, y)?;
            self.optim.prepare(&*b, lr)?;
            let body = {
                let (b, parts, x, y) = (Rc::clone(&b), self.parts.clone(), xv.clone(), yv.clone());
                let (adamw, errors, runs) = (self.optim.tensors(), errors.clone(), runs.clone());
                let started = Rc::clone(&started);
                move || {
                    parts
                        .batched_gated(&*b, &x, &y, &adamw, &started)
                        .map_err(|e| into_body_error(e, &errors))?;
                    runs.set(runs.get() + 1);
                    Ok(())
                }
            };
            match b.capture(Box::new(body)) {
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
        let outcome = checks::locate(outcome, |k| self.find_sample(x, y, shape, k))?;
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
        let (loss, grad_norm) = self.after_gated(x, y, shape, step, ended)?;
        Ok(self.report(step, loss, grad_norm, lr, shape[0], captured))
    }

    /// After a gated update was queued without error: reads the stats and counts the step when
    /// they are finite. Non-finite stats mean the gate skipped the update (`NonFinite`, not
    /// applied, the sample located on the unchanged parameters); stats that cannot be read
    /// leave the update unknown. `ended` is the closing of the step scope, which, failing
    /// after a counted update, is reported as applied.
    fn after_gated(
        &mut self,
        x: &[T],
        y: &[T],
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
            Err(e @ GradError::NonFinite { .. }) => {
                checks::locate(Err(e), |k| self.find_sample(x, y, shape, k))
            }
            Err(e) => {
                self.optim.mark_unknown();
                Err(e.at_step(step, Applied::Maybe))
            }
        }
    }

    fn report(
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
    fn batched_replay(&mut self, x: &[T], y: &[T], shape: &[usize], lr: f64) -> Result<StepReport> {
        let step = self.optim.step_count() + 1;
        let b = Rc::clone(&self.backend);
        let Some(g) = self.graphs.batched.as_mut() else {
            return self.batched_eager(x, y, shape, lr);
        };
        let (queued, ended) = in_step_split(&*b, || {
            g.x.upload(&*b, x)?;
            g.y.upload(&*b, y)?;
            self.optim.prepare(&*b, lr)?;
            b.replay(&mut g.graph).map_err(|e| {
                // The graph may have run in part, its update included.
                self.optim.mark_unknown();
                take_body_error(e, &g.errors).at_step(step, Applied::Maybe)
            })
        });
        queued?;
        let (loss, grad_norm) = self.after_gated(x, y, shape, step, ended)?;
        Ok(self.report(step, loss, grad_norm, lr, shape[0], true))
    }

    fn slots(&self) -> Result<&SampleSlots<B, T>> {
        self.graphs
            .samples
            .as_ref()
            .ok_or_else(|| GradError::BadInput("per-sample slots missing".into()))
    }

    fn sample_slots(&mut self, sample_shape: &[usize], batch: usize) -> Result<()> {
        let b = &*self.backend;
        if let Some(s) = self.graphs.samples.as_mut()
            && s.shape == sample_shape
        {
            if s.losses.shape() != [batch] {
                s.losses = persistent_zeros(b, &[batch])?;
            }
            return Ok(());
        }
        self.graphs.samples = Some(SampleSlots {
            losses: persistent_zeros(b, &[batch])?,
            xs: Var::constant(persistent_zeros(b, sample_shape)?),
            ys: Var::constant(persistent_zeros(b, &[1])?),
            scale: persistent_zeros(b, &[])?,
            sample_loss: persistent_zeros(b, &[])?,
            shape: sample_shape.to_vec(),
            graph: None,
            errors: ErrorSlot::default(),
        });
        Ok(())
    }

    /// Runs sample `i` (inputs already in the slots): eagerly, by capturing, or by replaying.
    /// Returns `false` when a failed capture left nothing done and the batch must restart.
    fn run_sample(&mut self, parts: &StepParts<B, T>) -> Result<bool> {
        let b = Rc::clone(&self.backend);
        let want = self.config.capture && !self.graphs.disabled;
        let Some(s) = self.graphs.samples.as_mut() else {
            return Err(GradError::BadInput("per-sample slots missing".into()));
        };
        if !want {
            parts.per_sample(&*b, &s.xs, &s.ys, &s.scale, &s.sample_loss)?;
            return Ok(true);
        }
        if let Some(graph) = s.graph.as_mut() {
            b.replay(graph).map_err(|e| take_body_error(e, &s.errors))?;
            return Ok(true);
        }
        let runs = Runs::default();
        let body = {
            let (b, parts, errors, runs) =
                (Rc::clone(&b), parts.clone(), s.errors.clone(), runs.clone());
            let (xs, ys, scale, out) = (
                s.xs.clone(),
                s.ys.clone(),
                s.scale.clone(),
                s.sample_loss.clone(),
            );
            move || {
                parts
                    .per_sample(&*b, &xs, &ys, &scale, &out)
                    .map_err(|e| into_body_error(e, &errors))?;
                runs.set(runs.get() + 1);
                Ok(())
            }
        };
        match b.capture(Box::new(body)) {
            Ok(graph) => {
                s.graph = Some(graph);
                Ok(true)
            }
            Err(e) => {
                warn_fallback(
                    "per-sample forward+backward",
                    &take_body_error(e, &s.errors),
                );
                self.graphs.disabled = true;
                Ok(runs.get() > 0)
            }
        }
    }

    /// Gradient accumulation over the batch, one step scope per sample, then one AdamW step.
    pub(super) fn per_sample(
        &mut self,
        x: &[T],
        y: &[T],
        shape: &[usize],
        lr: f64,
    ) -> Result<StepReport> {
        let step = self.optim.step_count() + 1;
        let batch = shape[0];
        let per: usize = shape[1..].iter().product();
        self.sample_slots(&[1, shape[1], shape[2]], batch)?;
        let b = Rc::clone(&self.backend);
        let parts = self.parts.clone();
        let losses = self.slots()?.losses.clone();
        self.slots()?.scale_upload(&*b, batch)?;
        zero_grad(&*b, &parts.params)?;
        let mut i = 0;
        while i < batch {
            let done = in_step(&*b, || {
                let s = self.slots()?;
                s.xs.upload(&*b, &x[i * per..(i + 1) * per])?;
                s.ys.upload(&*b, &y[i..=i])?;
                if !self.run_sample(&parts)? {
                    return Ok(false);
                }
                let dst = losses.narrow(0, i, 1)?.reshape(&[])?;
                b.copy_into(&self.slots()?.sample_loss, &dst)?;
                Ok(true)
            })?;
            if done {
                i += 1;
            } else {
                zero_grad(&*b, &parts.params)?;
                i = 0;
            }
        }
        let checked = in_step(&*b, || {
            let norm = parts.norm(&*b)?;
            let norm = b.download(&norm)?[0].to_f64();
            let losses = b.download(&losses)?;
            if let Some(bad) = losses.iter().position(|l| !l.to_f64().is_finite()) {
                return Err(GradError::NonFinite {
                    step,
                    sample: Some(bad),
                    kind: NonFiniteKind::Loss,
                });
            }
            let loss = losses.iter().map(|l| l.to_f64()).sum::<f64>() / batch as f64;
            checks::finite(step, loss, norm)?;
            self.optim.step(&*b, &parts.params, lr)?;
            Ok((loss, norm))
        });
        let (loss, grad_norm) = checks::locate(checked, |k| self.find_sample(x, y, shape, k))?;
        Ok(StepReport {
            step,
            loss,
            grad_norm,
            lr,
            samples: batch,
            captured: self.config.capture && !self.graphs.disabled,
        })
    }
}

impl<B: Capture<T>, T: Element> SampleSlots<B, T> {
    /// Writes 1/B into the loss-scale slot (read by the captured body on every replay).
    fn scale_upload(&self, b: &B, batch: usize) -> Result<()> {
        b.upload_into(&[T::from_f64(1.0 / batch as f64)], &self.scale)?;
        Ok(())
    }
}
