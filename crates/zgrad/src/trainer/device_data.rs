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
use super::step_table::RowPlan;
use crate::error::{GradError, Result};
use crate::memory::ClassGuard;
use crate::model::Model;
use zcompute::{AllocClass, BTensor, Capture, Element};

mod set;
pub(super) use set::{DeviceData, Resident};

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
        self.data = Some(DeviceData::new(x, y, b.zeros(&[n])?, sample, labels));
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
