//! The batched schedule, eager: one forward and backward over the whole batch in one step
//! scope, then one AdamW step (its captured form is in `captured.rs`).

use super::source::Shard;
use super::{StepReport, Trainer, checks, in_step};
use crate::error::Result;
use crate::memory::ClassGuard;
use crate::model::Model;
use crate::var::Var;
use std::rc::Rc;
use zcompute::{AllocClass, Capture, Element};

impl<B: Capture<T> + 'static, T: Element, M: Model<B, T>> Trainer<B, T, M> {
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
            Var::constant(b.upload(y, &self.targets_shape(shape[0]))?),
        ))
    }

    /// Uploads a shard as constants, as `upload_batch` does host slices (pinned memory is
    /// copied straight into fresh tensors).
    fn upload_shard(
        &self,
        data: &Shard<'_, B, T>,
        shape: &[usize],
    ) -> Result<(Var<B, T>, Var<B, T>)> {
        if let Some((x, y)) = data.slices() {
            return self.upload_batch(x, y, shape);
        }
        let b = &*self.backend;
        let class = if self.parts.unprotected {
            AllocClass::Scratch
        } else {
            AllocClass::Saved
        };
        let _class = ClassGuard::new(b, class);
        let (x, y) = (b.zeros(shape)?, b.zeros(&self.targets_shape(shape[0]))?);
        data.upload(b, &x, &y)?;
        Ok((Var::constant(x), Var::constant(y)))
    }

    /// One forward and backward over the whole batch in one step scope, then the AdamW step
    /// (also the fallback of the captured batched step).
    pub(super) fn batched_eager(
        &mut self,
        data: &Shard<'_, B, T>,
        shape: &[usize],
        lr: f64,
    ) -> Result<StepReport> {
        let step = self.optim.step_count() + 1;
        let b = Rc::clone(&self.backend);
        let checked = in_step(&*b, || {
            let (xv, yv) = self.upload_shard(data, shape)?;
            self.parts.batched(&*b, &xv, &yv)?;
            let stats = self.read_stats(step)?;
            self.optim.step(&*b, &self.parts.params, lr)?;
            Ok(stats)
        });
        let (loss, grad_norm) = checks::locate(checked, |kind| {
            let (x, y) = data.host()?;
            self.find_sample(&x, &y, shape, kind)
        })?;
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
