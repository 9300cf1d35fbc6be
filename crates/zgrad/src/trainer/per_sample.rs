//! The per-sample schedule (docs/xasset.md): gradient accumulation over the batch, one step scope
//! per sample, then one AdamW step.
//!
//! The batch goes to the device once per step, as a persistent table whose row `i` is sample
//! `i`'s features followed by its label. Eagerly, sample `i` reads views of row `i` and writes
//! its loss into `losses[i]`. With capture on, one sample's work is captured once as a graph
//! that reads its sample through an index held in device memory: it gathers row `index` into
//! a static slot, runs forward+backward on views of the slot, scatters the loss into
//! `losses[index]` and advances the index, so each replay takes the next sample and the host's
//! work per sample is one graph launch. Samples still run one after another, so the memory
//! peak is one sample's whatever the batch. The sample goes through the executor's door
//! (`executor.rs`, [`GraphKey::Sample`]); a failed capture that left nothing done restarts the
//! batch eagerly.
//!
//! a host `step` reads the step back at once (one rank sums the losses on the host in `f64`);
//! `queue` of loaded rows and `queue` of a pinned batch queue the same samples with nothing read back
//! (`queued_samples.rs`). In data parallel the loss rides in the gradient all-reduce
//! (`StepParts::reduce_samples`): one collective a step.

use super::body::StepParts;
use super::executor::{Eager, GraphKey, Ran, Recording, Request};
use super::{Trainer, in_step};
use crate::batch::Shard;
use crate::error::{GradError, Result};
use crate::model::Model;
use crate::optim::zero_grad;
use std::rc::Rc;
use zcompute::{Capture, Element};

mod slots;
pub(super) use slots::SampleSlots;

impl<B: Capture<T> + 'static, T: Element, M: Model<B, T>> Trainer<B, T, M> {
    pub(super) fn slots(&self) -> Result<&SampleSlots<B, T>> {
        self.samples
            .as_ref()
            .ok_or_else(|| GradError::BadInput("per-sample slots missing".into()))
    }

    pub(super) fn slots_mut(&mut self) -> Result<&mut SampleSlots<B, T>> {
        self.samples
            .as_mut()
            .ok_or_else(|| GradError::BadInput("per-sample slots missing".into()))
    }

    /// Slots for samples of `sample_shape` and a batch of `batch`: kept while they fit (a
    /// smaller batch uses the table's first rows), made anew (graph and all) otherwise.
    pub(super) fn sample_slots(&mut self, sample_shape: &[usize], batch: usize) -> Result<()> {
        if self.slots_fit(sample_shape, batch) {
            return Ok(());
        }
        // Dropped (with the graph reading them) before the new ones are made, so the two never
        // hold memory together.
        self.samples = None;
        self.exec.forget(|k| k == GraphKey::Sample);
        let target = self.targets_shape(1);
        self.samples = Some(SampleSlots::new(
            &*self.backend,
            sample_shape,
            &target,
            batch,
        )?);
        Ok(())
    }

    /// Whether the slots made hold a batch of `batch` samples of `sample_shape`.
    pub(super) fn slots_fit(&self, sample_shape: &[usize], batch: usize) -> bool {
        self.samples.as_ref().is_some_and(|s| {
            s.shape == sample_shape && s.target == self.targets_shape(1) && s.capacity() >= batch
        })
    }

    /// Runs sample `i` through the executor's door: eagerly (on views of row `i`), by
    /// capturing (the capture's warm-up runs it), or by replaying. Returns `false` when a
    /// failed capture left nothing done and the batch must restart.
    fn run_sample(&mut self, parts: &StepParts<B, T, M>, i: usize) -> Result<bool> {
        let b = Rc::clone(&self.backend);
        let Some(s) = self.samples.as_ref() else {
            return Err(GradError::BadInput("per-sample slots missing".into()));
        };
        let req = Request::new(
            GraphKey::Sample,
            &s.shape,
            "per-sample forward+backward",
            None,
        );
        let ran = self
            .exec
            .run(
                &*b,
                &mut (),
                req,
                |_, _| Ok(()),
                |_, _| {
                    Ok(Recording {
                        body: Box::new(s.indexed_body(&b, parts)),
                        inputs: None,
                    })
                },
                |_, how, _| match how {
                    Eager::Plain => {
                        let (xs, ys) = s.sample(i)?;
                        let loss = s.losses.narrow(0, i, 1)?.reshape(&[])?;
                        parts.per_sample(&*b, &xs, &ys, &s.scale, &loss)
                    }
                    // The gradients may hold part of the failed run: the batch restarts.
                    Eager::AfterFailedCapture(_) => Ok(()),
                },
            )
            .map_err(|e| e.into_error())?;
        Ok(ran != Ran::FellBack { done: false })
    }

    /// Zeroes the gradients and runs samples `0..batch` of the loaded slots, each in its own
    /// step scope (a failed capture that left nothing done restarts the batch).
    fn run_samples(&mut self, parts: &StepParts<B, T, M>, batch: usize) -> Result<()> {
        let b = Rc::clone(&self.backend);
        // Once a step, before the samples' products (eager: the samples' graphs read it).
        parts.refresh_weight_copy(&*b)?;
        zero_grad(&*b, &parts.params)?;
        let mut i = 0;
        while i < batch {
            if in_step(&*b, || self.run_sample(parts, i))? {
                i += 1;
            } else {
                zero_grad(&*b, &parts.params)?;
                i = 0;
            }
        }
        Ok(())
    }

    /// The samples of `data` loaded into the slots made for them and run, their gradients
    /// accumulated (1 / global batch: the all-reduce sums the ranks' accumulations; one rank:
    /// the batch): a per-sample step up to its tail, whenever it is read back. Returns the
    /// global batch.
    pub(super) fn accumulate(
        &mut self,
        data: &Shard<'_, B, T>,
        parts: &StepParts<B, T, M>,
    ) -> Result<usize> {
        let b = Rc::clone(&self.backend);
        let batch = data.len();
        let indexed = self.exec.on();
        let global = parts.dist.global.get().max(batch);
        self.slots_mut()?.load(&*b, data, global, indexed)?;
        self.run_samples(parts, batch)?;
        Ok(global)
    }
}
