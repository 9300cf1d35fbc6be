//! The per-sample schedule (XASSET.md): gradient accumulation over the batch, one step scope
//! per sample, then one AdamW step. Each sample's forward+backward runs eagerly, or, with
//! capture on, is captured once as a graph over static persistent slots (refilled before each
//! replay) and replayed. A failed capture falls back to eager execution as `captured.rs`
//! describes; a capture that left nothing done restarts the batch.

use super::body::{ErrorSlot, StepParts, into_body_error, take_body_error};
use super::captured::{Runs, persistent_zeros, warn_fallback};
use super::{StepReport, Trainer, checks, in_step};
use crate::error::{GradError, NonFiniteKind, Result};
use crate::optim::zero_grad;
use crate::var::Var;
use std::rc::Rc;
use zcompute::{BTensor, Capture, Element};

/// The per-sample schedule's static inputs and outputs, and its graph once captured.
pub(super) struct SampleSlots<B: Capture<T>, T: Element> {
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

impl<B: Capture<T> + 'static, T: Element> Trainer<B, T> {
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
        // 1 / global batch: the all-reduce sums the ranks' accumulations (one rank: `batch`).
        self.slots()?
            .scale_upload(&*b, self.parts.dist.global.get().max(batch))?;
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
            let losses = b.download(&losses)?;
            let local_sum = losses.iter().map(|l| l.to_f64()).sum::<f64>();
            let global = self.parts.dist.global.get().max(batch);
            // Several ranks: gradients and loss summed over them first (a non-finite value on
            // one rank reaches every rank's loss and norm).
            let loss = self.per_sample_reduce(&*b, local_sum, global)?;
            let norm = parts.norm(&*b)?;
            let norm = b.download(&norm)?[0].to_f64();
            if let Some(bad) = losses.iter().position(|l| !l.to_f64().is_finite())
                && self.parts.dist.single()
            {
                return Err(GradError::NonFinite {
                    step,
                    sample: Some(bad),
                    kind: NonFiniteKind::Loss,
                });
            }
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
