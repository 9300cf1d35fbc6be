//! The resident data set's state ([`DeviceData`]): its features, targets and index buffer on
//! the device, the rows a step uploaded, and the queued steps' table and plan; a leaf below
//! `device_data.rs`, which loads it on the trainer.

use crate::batch::Source;
use crate::error::{GradError, Result};
use crate::trainer::step_table::{RowPlan, StepTable};
use std::ops::Range;
use zcompute::{BTensor, Element, prelude::*};

/// The resident data set: features `[n, ..sample shape]`, targets `[n, ..Task::target_shape]`
/// (`[n]` for one value a sample), and the index buffer
/// a step's rows are uploaded into (`[n]`: a step takes at most `n` rows).
pub(crate) struct DeviceData<B: Ops<T>, T: Element> {
    pub(in crate::trainer) x: BTensor<B, T>,
    pub(in crate::trainer) y: BTensor<B, T>,
    pub(in crate::trainer) index: BTensor<B, T>,
    /// The rows of the step the index buffer holds, from its start: this rank's shard
    /// (`upload_indices`).
    uploaded: Range<usize>,
    pub(in crate::trainer) sample: Vec<usize>,
    /// The targets on the host too (`Task::target_len` a sample): the unweighted binary
    /// task's evaluation sums them there (`evaluate(EvalSource::Loaded)`).
    pub(in crate::trainer) labels: Vec<T>,
    /// Host staging of the indices, reused from step to step.
    staging: Vec<T>,
    /// The queued batched steps' inputs (made at the first, `step_table.rs`) and the plan of
    /// the rows to come (`Load::Order`).
    pub(in crate::trainer) steps: Option<StepTable<B, T>>,
    pub(in crate::trainer) plan: Option<RowPlan>,
}

impl<B: Ops<T>, T: Element> DeviceData<B, T> {
    /// The set of features `x` and targets `y` (`labels` on the host too), its index buffer
    /// `index` (`[n]`), no step uploaded or planned yet.
    pub(in crate::trainer) fn new(
        x: BTensor<B, T>,
        y: BTensor<B, T>,
        index: BTensor<B, T>,
        sample: Vec<usize>,
        labels: Vec<T>,
    ) -> Self {
        let n = index.numel();
        DeviceData {
            x,
            y,
            index,
            uploaded: 0..0,
            sample,
            labels,
            staging: Vec::with_capacity(n),
            steps: None,
            plan: None,
        }
    }

    pub(in crate::trainer) fn rows(&self) -> usize {
        self.y.shape()[0]
    }

    pub(in crate::trainer) fn per(&self) -> usize {
        self.sample.iter().product()
    }

    /// Target values per sample.
    pub(in crate::trainer) fn targets(&self) -> usize {
        self.y.numel() / self.rows().max(1)
    }

    /// Refuses a step of no rows, of more than `n` or naming a row not below `n` (the whole
    /// step's, so that every rank refuses the same step).
    pub(in crate::trainer) fn check_rows(&self, rows: &[usize]) -> Result<()> {
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
    pub(in crate::trainer) fn upload_indices(
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
    pub(in crate::trainer) fn indices(&self, rows: Range<usize>) -> Result<BTensor<B, T>> {
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
    pub(in crate::trainer) fn gather(
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
pub(in crate::trainer) struct Resident<'a, B: Ops<T>, T: Element> {
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
