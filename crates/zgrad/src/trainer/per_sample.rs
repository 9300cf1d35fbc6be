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
use super::source::Shard;
use super::{Trainer, in_step};
use crate::error::{GradError, Result};
use crate::memory::persistent_zeros;
use crate::model::Model;
use crate::optim::zero_grad;
use crate::var::Var;
use std::rc::Rc;
use zcompute::{BTensor, Capture, Element};

/// The per-sample schedule's device-resident batch, static slots and outputs (its graph is
/// the executor's, [`GraphKey::Sample`], dropped with the slots).
pub(super) struct SampleSlots<B: Capture<T>, T: Element> {
    /// The batch, `[capacity, S*F + 1]`: row `i` is sample `i`'s features, then its label.
    /// Grown (and the graph dropped) only when a larger batch comes.
    table: BTensor<B, T>,
    /// Host staging of the table's rows, reused from step to step.
    staging: Vec<T>,
    /// The row the graph gathers, `[S*F + 1]`; `xs` and `ys` are views of it.
    row: BTensor<B, T>,
    xs: Var<B, T>,
    ys: Var<B, T>,
    /// The sample the graph runs next (a whole number in `T`), advanced by the graph itself.
    index: BTensor<B, T>,
    /// 1/B, and the B it holds (0: not written yet).
    pub(super) scale: BTensor<B, T>,
    scale_batch: usize,
    /// Every sample's loss, `[capacity]` (kept between batches: freeing it would poison it
    /// after the step's update, an error nobody could report): a view of `record`.
    pub(super) losses: BTensor<B, T>,
    /// A queued step's row of the window's history, `[2 + capacity]`: the global loss (data
    /// parallel), the gradient norm, then the samples' losses (`queued_samples.rs`).
    pub(super) record: BTensor<B, T>,
    /// `[1, ..sample shape]`.
    shape: Vec<usize>,
    /// `[1, ..target shape]` (`Task::target_shape`): a row's last `ty` values.
    target: Vec<usize>,
}

impl<B: Capture<T>, T: Element> SampleSlots<B, T> {
    fn new(b: &B, sample_shape: &[usize], target: &[usize], capacity: usize) -> Result<Self> {
        let per: usize = sample_shape.iter().product();
        let ty: usize = target.iter().product();
        let row = persistent_zeros(b, &[per + ty])?;
        let record = persistent_zeros(b, &[2 + capacity])?;
        Ok(SampleSlots {
            table: persistent_zeros(b, &[capacity, per + ty])?,
            staging: Vec::new(),
            xs: Var::constant(row.narrow(0, 0, per)?.reshape(sample_shape)?),
            ys: Var::constant(row.narrow(0, per, ty)?.reshape(target)?),
            row,
            index: persistent_zeros(b, &[1])?,
            scale: persistent_zeros(b, &[])?,
            scale_batch: 0,
            losses: record.narrow(0, 2, capacity)?,
            record,
            shape: sample_shape.to_vec(),
            target: target.to_vec(),
        })
    }

    pub(super) fn capacity(&self) -> usize {
        self.table.shape()[0]
    }

    /// Uploads the batch as the table's first rows (host slices: interleaved on the host, one
    /// upload; pinned memory: features and labels each straight into their columns), writes
    /// 1/`global` (the global batch: `batch` on one rank) when it changed, and, for the graph,
    /// sets the index to sample 0.
    pub(super) fn load(
        &mut self,
        b: &B,
        data: &Shard<'_, B, T>,
        global: usize,
        indexed: bool,
    ) -> Result<()> {
        let batch = data.len();
        // An empty shard (a rank of a data-parallel job with no row of this batch) uploads
        // nothing; its step still joins the collectives with zero gradients.
        match data.slices() {
            Some((x, y)) if batch > 0 => {
                let per = x.len() / batch;
                let ty = y.len() / batch;
                self.staging.clear();
                for (features, targets) in x.chunks_exact(per).zip(y.chunks_exact(ty)) {
                    self.staging.extend_from_slice(features);
                    self.staging.extend_from_slice(targets);
                }
                b.upload_into(&self.staging, &self.table.narrow(0, 0, batch)?)?;
            }
            None if batch > 0 => {
                let per: usize = self.shape.iter().product();
                let ty: usize = self.target.iter().product();
                let rows = self.table.narrow(0, 0, batch)?;
                data.upload(b, &rows.narrow(1, 0, per)?, &rows.narrow(1, per, ty)?)?;
            }
            _ => {}
        }
        if self.scale_batch != global {
            b.upload_into(&[T::from_f64(1.0 / global as f64)], &self.scale)?;
            self.scale_batch = global;
        }
        if indexed {
            b.fill(&self.index, T::ZERO)?;
        }
        Ok(())
    }

    /// Sample `i`'s features `[1, ..sample shape]` and targets `[1, ..target shape]`: views
    /// of the table's row `i`.
    fn sample(&self, i: usize) -> Result<(Var<B, T>, Var<B, T>)> {
        let per: usize = self.shape.iter().product();
        let ty: usize = self.target.iter().product();
        let row = self.table.narrow(0, i, 1)?;
        Ok((
            Var::constant(row.narrow(1, 0, per)?.reshape(&self.shape)?),
            Var::constant(row.narrow(1, per, ty)?.reshape(&self.target)?),
        ))
    }

    /// The body of the captured graph: the sample at the index, its forward+backward, its
    /// loss into `losses[index]`, the index advanced. Every call is legal inside a capture.
    fn indexed_body<M: Model<B, T>>(
        &self,
        b: &Rc<B>,
        parts: &StepParts<B, T, M>,
    ) -> impl FnMut() -> Result<()> + 'static
    where
        B: 'static,
    {
        let (b, parts) = (Rc::clone(b), parts.clone());
        let (table, row, index, losses) = (
            self.table.clone(),
            self.row.clone(),
            self.index.clone(),
            self.losses.clone(),
        );
        let (xs, ys, scale) = (self.xs.clone(), self.ys.clone(), self.scale.clone());
        move || {
            b.gather_row(&table, &index, &row)?;
            let loss = parts.forward_backward(&*b, &xs, &ys, Some(&scale))?;
            b.scatter_row(&loss, &index, &losses, true)?;
            Ok(())
        }
    }
}

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
