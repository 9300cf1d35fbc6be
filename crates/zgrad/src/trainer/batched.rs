//! The batched schedule, eager: one forward and backward over the whole batch in one step
//! scope, then one AdamW step (its captured form is in `captured.rs`).

use super::{StepReport, Trainer, checks, in_step};
use crate::error::Result;
use crate::memory::ClassGuard;
use crate::var::Var;
use std::rc::Rc;
use zcompute::{AllocClass, Capture, Element};

impl<B: Capture<T> + 'static, T: Element> Trainer<B, T> {
    /// Uploads a batch as constants (in the saved class: the first matmul keeps `x`).
    pub(super) fn upload_batch(
        &self,
        x: &[T],
        y: &[T],
        shape: &[usize],
    ) -> Result<(Var<B, T>, Var<B, T>)> {
        let b = &*self.backend;
        let class = if self.parts.unprotected {
            AllocClass::Scratch
        } else {
            AllocClass::Saved
        };
        let _class = ClassGuard::new(b, class);
        Ok((
            Var::constant(b.upload(x, shape)?),
            Var::constant(b.upload(y, &shape[..1])?),
        ))
    }

    /// One forward and backward over the whole batch in one step scope, then the AdamW step
    /// (also the fallback of the captured batched step).
    pub(super) fn batched_eager(
        &mut self,
        x: &[T],
        y: &[T],
        shape: &[usize],
        lr: f64,
    ) -> Result<StepReport> {
        let step = self.optim.step_count() + 1;
        let b = Rc::clone(&self.backend);
        let checked = in_step(&*b, || {
            let (xv, yv) = self.upload_batch(x, y, shape)?;
            self.parts.batched(&*b, &xv, &yv)?;
            let stats = self.read_stats(step)?;
            self.optim.step(&*b, &self.parts.params, lr)?;
            Ok(stats)
        });
        let (loss, grad_norm) =
            checks::locate(checked, |kind| self.find_sample(x, y, shape, kind))?;
        Ok(StepReport {
            step,
            loss,
            grad_norm,
            lr,
            samples: shape[0],
            captured: false,
        })
    }
}
