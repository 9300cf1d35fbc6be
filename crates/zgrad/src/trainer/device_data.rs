//! A data set resident on the device (issue 21): uploaded once by `Trainer::load(Load::Training)`, each
//! step's samples then named by their indices (one small upload) and gathered on the device
//! (`SelectOps::gather_rows`), inside the captured step for the batched schedule
//! (`queued.rs`), before the step for the per-sample one. The indices come from the caller's
//! data-order generator, so a resumed run gathers exactly the rows the host path would have
//! copied, and the losses are bitwise those of a host `step` on the same rows.
//!
//! Evaluation of a resident data set runs on the device too (`eval_device.rs`).

use super::Trainer;
use super::sizes::max_device_rows;
use super::source::Source;
use super::step_table::{RowPlan, StepTable};
use crate::error::{GradError, Result};
use crate::memory::ClassGuard;
use crate::model::Model;
use std::ops::Range;
use zcompute::{AllocClass, BTensor, Capture, Element, prelude::*};

/// The resident data set: features `[n, ..sample shape]`, targets `[n, ..Task::target_shape]`
/// (`[n]` for one value a sample), and the index buffer
/// a step's rows are uploaded into (`[n]`: a step takes at most `n` rows).
pub(crate) struct DeviceData<B: Ops<T>, T: Element> {
    pub(super) x: BTensor<B, T>,
    pub(super) y: BTensor<B, T>,
    pub(super) index: BTensor<B, T>,
    /// The rows of the step the index buffer holds, from its start: this rank's shard
    /// (`upload_indices`).
    uploaded: Range<usize>,
    pub(super) sample: Vec<usize>,
    /// The targets on the host too (`Task::target_len` a sample): the unweighted binary
    /// task's evaluation sums them there (`evaluate(EvalSource::Loaded)`).
    pub(super) labels: Vec<T>,
    /// Host staging of the indices, reused from step to step.
    staging: Vec<T>,
    /// The queued batched steps' inputs (made at the first, `step_table.rs`) and the plan of
    /// the rows to come (`Load::Order`, `Trainer::plan_rows`).
    pub(super) steps: Option<StepTable<B, T>>,
    pub(super) plan: Option<RowPlan>,
}

impl<B: Ops<T>, T: Element> DeviceData<B, T> {
    pub(super) fn rows(&self) -> usize {
        self.y.shape()[0]
    }

    pub(super) fn per(&self) -> usize {
        self.sample.iter().product()
    }

    /// Target values per sample.
    pub(super) fn targets(&self) -> usize {
        self.y.numel() / self.rows().max(1)
    }

    /// Refuses a step of no rows, of more than `n` or naming a row not below `n` (the whole
    /// step's, so that every rank refuses the same step).
    pub(super) fn check_rows(&self, rows: &[usize]) -> Result<()> {
        let n = self.rows();
        if rows.is_empty() || rows.len() > n {
            return Err(GradError::BadInput(format!(
                "a step of {} rows from a device data set of {n} (1 to {n} rows per step)",
                rows.len()
            )));
        }
        if let Some(bad) = rows.iter().find(|&&r| r >= n) {
            return Err(GradError::BadInput(format!(
                "row {bad} of a device data set of {n} rows"
            )));
        }
        Ok(())
    }

    /// Checks `rows` (`check_rows`) and queues the upload of those at `local` (this rank's shard)
    /// into the index buffer's first slots (a host-to-device copy: outside a capture). Each
    /// rank copies its shard's indices only: a copy of up to 1,024 bytes costs the stream
    /// about 1 us, one above it several more (docs/benchmarks.md, the gap between replays).
    pub(super) fn upload_indices(
        &mut self,
        b: &B,
        rows: &[usize],
        local: Range<usize>,
    ) -> Result<()> {
        self.check_rows(rows)?;
        let Some(mine) = rows.get(local.clone()) else {
            return Err(GradError::BadInput(format!(
                "internal: shard {local:?} of a step of {} rows",
                rows.len()
            )));
        };
        self.uploaded = local.start..local.start;
        if !mine.is_empty() {
            self.staging.clear();
            self.staging
                .extend(mine.iter().map(|&r| T::from_f64(r as f64)));
            b.upload_into(&self.staging, &self.index.narrow(0, 0, mine.len())?)?;
        }
        self.uploaded = local;
        Ok(())
    }

    /// The uploaded indices of rows `rows` of the step (within the uploaded shard).
    pub(super) fn indices(&self, rows: Range<usize>) -> Result<BTensor<B, T>> {
        let held = &self.uploaded;
        if rows.start < held.start || rows.end > held.end {
            return Err(GradError::BadInput(format!(
                "internal: rows {rows:?} of the step, its indices uploaded for {held:?}"
            )));
        }
        Ok(self.index.narrow(0, rows.start - held.start, rows.len())?)
    }

    /// Gathers the step's rows `rows` into `x` and `y` (any views of their sizes: a strided
    /// one gets the rows through a dense copy). Legal inside a capture.
    pub(super) fn gather(
        &self,
        b: &B,
        rows: Range<usize>,
        x: &BTensor<B, T>,
        y: &BTensor<B, T>,
    ) -> Result<()> {
        let index = self.indices(rows)?;
        for (table, dst) in [(&self.x, x), (&self.y, y)] {
            if dst.is_contiguous() {
                b.gather_rows(table, &index, dst)?;
            } else {
                let dense = b.zeros(dst.shape())?;
                b.gather_rows(table, &index, &dense)?;
                b.copy_into(&dense, dst)?;
            }
        }
        Ok(())
    }
}

/// A step's rows of the resident data set, as the step paths see a batch.
pub(super) struct Resident<'a, B: Ops<T>, T: Element> {
    pub data: &'a DeviceData<B, T>,
}

impl<B: Ops<T>, T: Element> Source<B, T> for Resident<'_, B, T> {
    fn per(&self) -> usize {
        self.data.per()
    }

    fn targets(&self) -> usize {
        self.data.targets()
    }

    fn upload(
        &self,
        b: &B,
        rows: Range<usize>,
        x: &BTensor<B, T>,
        y: &BTensor<B, T>,
    ) -> Result<()> {
        self.data.gather(b, rows, x, y)
    }
}

impl<B: Capture<T> + 'static, T: Element, M: Model<B, T>> Trainer<B, T, M> {
    /// `load(Load::Training)`: uploads a data set to the device once, for `Trainer::queue`
    /// of loaded rows and `evaluate(EvalSource::Loaded)`: `x` `[n, ..sample shape]` row-major, `y` `n` samples'
    /// targets (`Task::target_len` values each, row-major: one label, a class index, `K`
    /// regression values, then the weights of a weighted task).
    /// Replaces a data set loaded before (dropping the captured steps that read it). Refuses
    /// with `BadInput` shapes a host `step` would refuse and more rows than indices of `T`
    /// can name exactly ([`max_device_rows`]); out of device memory is the backend's error
    /// (`TooLarge` / `OutOfMemory`), nothing loaded.
    pub(super) fn load_training(&mut self, x: &[T], y: &[T], n: usize) -> Result<()> {
        let sample = self.shape_of(x, y, n)?;
        if n > max_device_rows::<T>() {
            return Err(GradError::BadInput(format!(
                "{n} samples on the device: indices name at most {} rows exactly in this element type",
                max_device_rows::<T>()
            )));
        }
        let targets = self.targets_shape(n);
        self.load_with(n, sample, y.to_vec(), |b, shape| {
            Ok((b.upload(x, shape)?, b.upload(y, &targets)?))
        })
    }

    /// A resident data set of `n` samples of `sample` holding zeros, made on the device with
    /// no host copy: what a memory plan counts ([`crate::plan`]).
    pub(crate) fn load_zeroed(&mut self, n: usize, sample: Vec<usize>) -> Result<()> {
        if n == 0 || n > max_device_rows::<T>() {
            return Err(GradError::BadInput(format!(
                "{n} samples on the device: 1 to {} rows",
                max_device_rows::<T>()
            )));
        }
        let targets = self.targets_shape(n);
        let zeros = vec![T::ZERO; n * self.target_len()];
        self.load_with(n, sample, zeros, |b, shape| {
            Ok((b.zeros(shape)?, b.zeros(&targets)?))
        })
    }

    /// Replaces the resident data set by `n` samples of `sample` whose features and labels
    /// `make` puts on the device (persistent memory).
    fn load_with(
        &mut self,
        n: usize,
        sample: Vec<usize>,
        labels: Vec<T>,
        make: impl FnOnce(&B, &[usize]) -> Result<(BTensor<B, T>, BTensor<B, T>)>,
    ) -> Result<()> {
        // The old one (and the graphs reading it) go first, so the two never hold memory
        // together.
        self.data = None;
        self.exec
            .forget(|k| k == super::executor::GraphKey::QueuedDevice);
        let b = &*self.backend;
        let shape: Vec<usize> = std::iter::once(n).chain(sample.iter().copied()).collect();
        let _class = ClassGuard::new(b, AllocClass::Persistent);
        let (x, y) = make(b, &shape)?;
        self.data = Some(DeviceData {
            x,
            y,
            index: b.zeros(&[n])?,
            uploaded: 0..0,
            sample,
            labels,
            staging: Vec::with_capacity(n),
            steps: None,
            plan: None,
        });
        Ok(())
    }

    /// `load(Load::Order)`: announces the rows the next `Trainer::queue` of loaded rows calls will take: `order` in chunks
    /// of `batch` rows (the last may be shorter), as a training loop walks an epoch's order
    /// (`ztrain` at each epoch's start, and on resuming from its position). A batched step
    /// that takes the plan's next chunk then finds its row indices and `[lr, t]` on the
    /// device already: one host-to-device copy puts up those of the rest of a read-back
    /// window at its first step, and the steps after it upload nothing (without a plan, each
    /// step makes two small copies, and the GPU waits for them between two replays). A step
    /// that takes other rows, or another step number or learning rate than planned (after
    /// a non-finite step was read back), uploads its own and ends the plan: a plan never
    /// changes what a step computes. Replaces the plan before; the per-sample schedule
    /// ignores it. Refuses with `BadInput` before `load(Load::Training)`, a `batch` of 0 and
    /// a row not in the data set.
    pub(super) fn plan_rows(&mut self, order: &[usize], batch: usize) -> Result<()> {
        let Some(data) = self.data.as_mut() else {
            return Err(GradError::BadInput(
                "no data set on the device: call load with Load::Training first".into(),
            ));
        };
        let n = data.rows();
        if let Some(bad) = order.iter().find(|&&r| r >= n) {
            return Err(GradError::BadInput(format!(
                "row {bad} of a device data set of {n} rows in the planned order"
            )));
        }
        let plan = RowPlan::new(order, batch)?;
        if let Some(table) = data.steps.as_mut() {
            // Rows put up from the plan before name its chunks, not this one's.
            table.forget_plan();
        }
        data.plan = Some(plan);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::DeviceData;
    use zcompute::{Backend, CpuBackend};

    fn resident(b: &CpuBackend, n: usize) -> DeviceData<CpuBackend, f32> {
        DeviceData {
            x: b.zeros(&[n, 2]).expect("x"),
            y: b.zeros(&[n]).expect("y"),
            index: b.zeros(&[n]).expect("index"),
            uploaded: 0..0,
            sample: vec![2],
            labels: vec![0.0; n],
            staging: Vec::new(),
            steps: None,
            plan: None,
        }
    }

    /// A rank copies its shard's indices only, to the index buffer's start, and reads them by
    /// the step's row numbers; rows of other shards are not there to read. The whole step is
    /// checked on every rank (each refuses the same step), and an empty shard copies nothing.
    #[test]
    fn a_rank_uploads_its_shards_indices_only() {
        let b = CpuBackend;
        let mut d = resident(&b, 8);
        d.upload_indices(&b, &[5, 1, 7, 3, 0], 2..4)
            .expect("upload");
        assert_eq!(b.download(&d.index).expect("index")[..2], [7.0, 3.0]);
        let read = |d: &DeviceData<CpuBackend, f32>, r| b.download(&d.indices(r).expect("rows"));
        assert_eq!(read(&d, 2..4).expect("read"), [7.0, 3.0]);
        assert_eq!(read(&d, 3..4).expect("read"), [3.0]);
        assert!(d.indices(0..2).is_err(), "another rank's rows");
        assert!(d.indices(3..5).is_err(), "past the shard");
        let bad = d.upload_indices(&b, &[5, 9], 0..1);
        assert!(bad.is_err(), "row 9 of 8, outside this rank's shard");
        d.upload_indices(&b, &[1], 1..1).expect("an empty shard");
        assert_eq!(d.indices(1..1).expect("no rows").numel(), 0);
        assert_eq!(b.download(&d.index).expect("index")[..2], [7.0, 3.0]);
    }
}
