//! The work of one training step, as functions of cloned handles only, so the same code runs
//! eagerly and as the body of a captured graph (a `'static` closure holding clones). Nothing
//! here moves data between host and device or opens or closes a step: every call is legal
//! inside a capture.

use super::distributed::Dist;
use super::queued::Track;
use crate::error::{GradError, Result};
use crate::model::Model;
use crate::optim::{OptimizerTensors, clip_by_norm, clip_grad_norm, grad_norm, zero_grad};
use crate::tape::Tape;
use crate::var::Var;
use crate::weight_shadow::WeightShadow;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use zcompute::{BTensor, ComputeError, Element, prelude::*};

/// What every step body reads and writes. Cloning shares the tensors.
pub(crate) struct StepParts<B: Ops<T>, T: Element, M: Model<B, T>> {
    pub model: M,
    pub params: Vec<Var<B, T>>,
    /// Persistent `[loss, grad norm]` of the last batched step (read back after it).
    pub stats: BTensor<B, T>,
    /// Persistent rank-0 1: backward's seed for an unscaled loss (no fill in every step).
    pub one: BTensor<B, T>,
    pub clip: Option<T>,
    /// Negative control: saved tensors stay in scratch (always `false` without the `testing`
    /// feature).
    pub unprotected: bool,
    /// The products' arithmetic under `TrainerConfig::precision` (every training tape's).
    pub math_mode: zcompute::MathMode,
    /// Under bf16, the weights' bf16 copy the tapes' Linear products read (refreshed at the
    /// start of every step: `refresh_weight_copy`); none under float32 and TF32.
    pub weight_shadow: Option<WeightShadow<B, T>>,
    /// The collective and this rank's share of the batch (a single process by default).
    pub dist: Dist<B, T>,
}

impl<B: Ops<T>, T: Element, M: Model<B, T>> Clone for StepParts<B, T, M> {
    fn clone(&self) -> Self {
        StepParts {
            model: self.model.clone(),
            params: self.params.clone(),
            stats: self.stats.clone(),
            one: self.one.clone(),
            clip: self.clip,
            unprotected: self.unprotected,
            math_mode: self.math_mode,
            weight_shadow: self.weight_shadow.clone(),
            dist: self.dist.clone(),
        }
    }
}

impl<B: Ops<T>, T: Element, M: Model<B, T>> StepParts<B, T, M> {
    pub(crate) fn tape<'b>(&self, b: &'b B) -> Tape<'b, B, T> {
        let tape = if self.unprotected {
            Tape::unprotected_in_crate(b)
        } else {
            Tape::new(b)
        };
        tape.with_math_mode(self.math_mode)
            .with_weight_shadow(self.weight_shadow.clone())
    }

    /// A no-grad tape whose products run under the policy, as training's do: evaluation and
    /// `predict` see the model the policy trains. Its weights convert per call (evaluation
    /// reads no copy, so it needs no refresh and can never read a stale one); under float32
    /// it is `Tape::no_grad` itself.
    pub fn eval_tape<'b>(&self, b: &'b B) -> Tape<'b, B, T> {
        Tape::no_grad(b).with_math_mode(self.math_mode)
    }

    /// Converts the parameters into their bf16 copy (one launch; nothing without a copy).
    /// Every step does it before its first product, so the copy is never older than the
    /// parameters, whatever wrote them since the last step.
    pub fn refresh_weight_copy(&self, b: &B) -> Result<()> {
        match &self.weight_shadow {
            Some(shadow) => shadow.refresh(b),
            None => Ok(()),
        }
    }

    /// Forward and backward of the model's mean loss over `x`'s samples, the loss multiplied by `scale`
    /// (a rank-0 tensor in device memory) for backward when given; gradients accumulate into
    /// the parameters' buffers. Returns the unscaled loss (rank 0).
    pub fn forward_backward(
        &self,
        b: &B,
        x: &Var<B, T>,
        y: &Var<B, T>,
        scale: Option<&BTensor<B, T>>,
    ) -> Result<BTensor<B, T>> {
        let tape = self.tape(b);
        let (loss, out) = self.model.loss(&tape, x, y)?;
        // The target contract (host-side shapes only: legal inside a capture), before backward.
        let task = self.model.task();
        task.check_output(out.shape(), x.shape().first().copied().unwrap_or(0))?;
        task.check_loss(loss.shape())?;
        // d(loss * s)/d loss = s: the scale is the seed of backward itself, so scaling costs
        // no product forward, no seed fill and no product backward; unscaled, the seed is the
        // persistent 1.
        tape.backward_with(&loss, scale.unwrap_or(&self.one).clone())?;
        Ok(loss.value().clone())
    }

    /// Global gradient norm (clipping first when configured), rank 0.
    pub fn norm(&self, b: &B) -> Result<BTensor<B, T>> {
        match self.clip {
            Some(c) => clip_grad_norm(b, &self.params, c),
            None => grad_norm(b, &self.params),
        }
    }

    /// The step up to the update: zero_grad, forward, backward (and in data parallel the
    /// gradients' all-reduce), norm (and clipping). Returns the loss and the norm (rank 0).
    pub fn loss_and_norm(
        &self,
        b: &B,
        x: &Var<B, T>,
        y: &Var<B, T>,
    ) -> Result<(BTensor<B, T>, BTensor<B, T>)> {
        self.refresh_weight_copy(b)?;
        zero_grad(b, &self.params)?;
        let (loss, norm) = if self.dist.single() {
            (self.forward_backward(b, x, y, None)?, None)
        } else {
            self.shard_forward_backward(b, x, y)?
        };
        let norm = match norm {
            // The collective took the norm with the last bucket: clip by it.
            Some(norm) => {
                if let Some(c) = self.clip {
                    clip_by_norm(b, &self.params, &norm, c)?;
                }
                norm
            }
            None => self.norm(b)?,
        };
        Ok((loss, norm))
    }

    /// A whole batched step, the same body eager and captured: the step's rows gathered
    /// into `x` and `y` when they come from the device data set (`gather`), `loss_and_norm`,
    /// then in one launch (`StepOps::step_tail`) the stats, the optimiser's gate (open while
    /// loss and norm are finite) and, for a queued step (`track`), the sticky gate and the
    /// history row; then the update, skipped on the device when the gate is closed (a
    /// non-finite step leaves the model untouched). `started` is set just before the first
    /// update kernel.
    pub fn gated_step(
        &self,
        b: &B,
        (x, y): (&Var<B, T>, &Var<B, T>),
        gather: Option<&Gather<B, T>>,
        optim: &OptimizerTensors<B, T>,
        track: Option<&Track<B, T>>,
        started: &Cell<bool>,
    ) -> Result<()> {
        if let Some(data) = gather {
            // The step's row of the table (indices, lr, t), picked by the history cursor the
            // tail advances: the host uploads nothing for a planned step.
            let (table, cursor) = (&data.table, &data.cursor);
            b.gather_rows_at_cursor(&data.xs, table, cursor, x.value(), Some(&data.lr_t))?;
            b.gather_rows_at_cursor(&data.ys, table, cursor, y.value(), None)?;
            x.bump_version();
            y.bump_version();
        }
        let (loss, norm) = self.loss_and_norm(b, x, y)?;
        match track {
            Some(track) => track.record_step(b, optim, [&loss, &norm], &self.stats)?,
            None => {
                let gate = optim.gate()?;
                b.step_tail([&loss, &norm], &self.stats, &gate, None, None)?;
            }
        }
        started.set(true);
        optim.apply(b, &self.params)
    }

    /// One sample of the per-sample schedule: forward and backward with the loss scaled by
    /// `scale` (1/B), the sample's loss copied to `sample_loss`.
    pub fn per_sample(
        &self,
        b: &B,
        xs: &Var<B, T>,
        ys: &Var<B, T>,
        scale: &BTensor<B, T>,
        sample_loss: &BTensor<B, T>,
    ) -> Result<()> {
        let loss = self.forward_backward(b, xs, ys, Some(scale))?;
        b.copy_into(&loss, sample_loss)?;
        Ok(())
    }
}

/// What a queued step on the device data set gathers: the resident features and labels by
/// the indices in the window's step table (the row the history cursor picks), and its
/// `[lr, t]` there into the optimiser's slot.
pub(crate) struct Gather<B: Ops<T>, T: Element> {
    pub xs: BTensor<B, T>,
    pub ys: BTensor<B, T>,
    pub table: BTensor<B, T>,
    pub lr_t: BTensor<B, T>,
    pub cursor: BTensor<B, T>,
}

impl<B: Ops<T>, T: Element> Clone for Gather<B, T> {
    fn clone(&self) -> Self {
        Gather {
            xs: self.xs.clone(),
            ys: self.ys.clone(),
            table: self.table.clone(),
            lr_t: self.lr_t.clone(),
            cursor: self.cursor.clone(),
        }
    }
}

/// Where a capture body leaves an error that is not the backend's own (a capture body can only
/// return `ComputeError`); the trainer reports it instead of the placeholder.
pub(crate) type ErrorSlot = Rc<RefCell<Option<GradError>>>;

/// Turns a body's `GradError` into the `ComputeError` a capture body returns.
pub(crate) fn into_body_error(e: GradError, slot: &ErrorSlot) -> ComputeError {
    match e {
        GradError::Compute(c) => c,
        other => {
            let detail = other.to_string();
            *slot.borrow_mut() = Some(other);
            ComputeError::CaptureFailed {
                stage: "running the zgrad training body",
                source: Box::new(ComputeError::BodyFailed { detail }),
            }
        }
    }
}

/// The error to report after a capture or replay failed: the body's own, if it left one.
pub(crate) fn take_body_error(e: ComputeError, slot: &ErrorSlot) -> GradError {
    slot.borrow_mut().take().unwrap_or(GradError::Compute(e))
}
