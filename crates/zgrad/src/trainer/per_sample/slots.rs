//! The per-sample schedule's state ([`SampleSlots`]): the batch's device table, the static
//! slots a sample's graph reads, the losses, and the graph's body; a leaf below
//! `per_sample.rs`, which runs the schedule on the trainer.

use crate::batch::Shard;
use crate::error::Result;
use crate::memory::persistent_zeros;
use crate::model::Model;
use crate::trainer::body::StepParts;
use crate::var::Var;
use std::rc::Rc;
use zcompute::{BTensor, Capture, Element};

/// The per-sample schedule's device-resident batch, static slots and outputs (its graph is
/// the executor's, `GraphKey::Sample`, dropped with the slots).
pub(in crate::trainer) struct SampleSlots<B: Capture<T>, T: Element> {
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
    pub(in crate::trainer) scale: BTensor<B, T>,
    scale_batch: usize,
    /// Every sample's loss, `[capacity]` (kept between batches: freeing it would poison it
    /// after the step's update, an error nobody could report): a view of `record`.
    pub(in crate::trainer) losses: BTensor<B, T>,
    /// A queued step's row of the window's history, `[2 + capacity]`: the global loss (data
    /// parallel), the gradient norm, then the samples' losses (`queued_samples.rs`).
    pub(in crate::trainer) record: BTensor<B, T>,
    /// `[1, ..sample shape]`.
    pub(in crate::trainer) shape: Vec<usize>,
    /// `[1, ..target shape]` (`Task::target_shape`): a row's last `ty` values.
    pub(in crate::trainer) target: Vec<usize>,
}

impl<B: Capture<T>, T: Element> SampleSlots<B, T> {
    pub(in crate::trainer) fn new(
        b: &B,
        sample_shape: &[usize],
        target: &[usize],
        capacity: usize,
    ) -> Result<Self> {
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

    pub(in crate::trainer) fn capacity(&self) -> usize {
        self.table.shape()[0]
    }

    /// Uploads the batch as the table's first rows (host slices: interleaved on the host, one
    /// upload; pinned memory: features and labels each straight into their columns), writes
    /// 1/`global` (the global batch: `batch` on one rank) when it changed, and, for the graph,
    /// sets the index to sample 0.
    pub(in crate::trainer) fn load(
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
    pub(in crate::trainer) fn sample(&self, i: usize) -> Result<(Var<B, T>, Var<B, T>)> {
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
    pub(in crate::trainer) fn indexed_body<M: Model<B, T>>(
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
