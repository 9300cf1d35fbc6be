//! Steps queued on the device data set with nothing read back per step (issue 21 item 2).
//!
//! `Trainer::queue` of rows of the loaded data set uploads a step's indices and its `[lr, t, gate]` slot, then runs
//! one body, captured once per batch shape and replayed: the rows gathered from the resident
//! data set, zero_grad, forward, backward, norm, the finiteness gate, the update. Each step
//! also scatters its `[loss, norm]` into a device history row (a cursor the graph advances)
//! and folds its gate into a sticky one: once a step is non-finite, every later queued step
//! is skipped on the device too, until the host has read that step back.
//!
//! The read-back never waits for the steps just queued. When a window of `every` steps is
//! full, the call that filled it queues the copy of its rows to the host and sets the cursor
//! back to row 0 (both on the engine stream, so the next window's rows overwrite the history
//! only after the copy read it: stream order, no wait and no second history), then reads the
//! window copied one window earlier, waiting for that copy alone (long finished: a whole
//! window of steps was queued behind it), and returns its reports. [`Trainer::drain`] reads
//! both (the window in flight, then the one being filled): exact state for checkpoints,
//! stops and epoch ends. A non-finite step `k` found by a read leaves the model exactly as
//! step `k - 1` left it; the step count is wound back to `k - 1`, the steps queued after it
//! (of its window and the next) are dropped, the cursor and sticky gate are cleared, and the
//! error names step `k` (and its sample, found on the host copy of its rows): the same state
//! and error as the per-step path, `2 * every - 1` steps of device time later at most.
//!
//! The per-sample schedule is queued the same way (`queued_samples.rs`): its samples run one
//! after another, then its tail writes the history row, folds the gate and updates.
//!
//! The optimiser counts a queued step as soon as its update is queued (the `t` of the next
//! step's slot); a non-finite step read back takes the count back.
//!
//! The modules: `window.rs` (the device history and the steps pending on it), `drain.rs`
//! (the read-back). The step's body is the batched one (`batched.rs`, `gated_step`), writing
//! its history row too.

mod drain;
mod window;

use window::Pending;
pub(super) use window::{Record, Track, Window};

use super::body::Gather;
use super::device_data::Resident;
use super::executor::GraphKey;
use super::gated::{GatedRows, GatedStep, GatheredRows};
use super::step_table::{StepRow, StepTable};
use super::{StepReport, StepRows, TrainSchedule, Trainer, phases, shard};
use crate::batch::{PinnedRows, Shard, Source};
use crate::error::{Applied, GradError, Result};
use crate::model::Model;
use std::rc::Rc;
use zcompute::{Capture, Element, prelude::*};

/// Where a queued step's rows come from.
enum Rows<'a, B: Ops<T>, T: Element> {
    /// Gathered from the device data set by the indices uploaded for the step.
    Device,
    /// Copied from the caller's pinned batch into the step's inputs before it runs.
    Pinned(&'a dyn Source<B, T>),
}

impl<B: Ops<T>, T: Element> Clone for Rows<'_, B, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Ops<T>, T: Element> Copy for Rows<'_, B, T> {}

/// A step whose update was queued: whether it ran captured, and the closing of its step scope
/// (an error there comes after the update: `Applied::Yes`).
pub(super) type Queued = (bool, Result<()>);

impl<B: Capture<T> + 'static, T: Element, M: Model<B, T>> Trainer<B, T, M> {
    /// `queue` of rows `rows` of the loaded data set (the global batch: each rank of a
    /// data-parallel job gathers its shard).
    pub(super) fn queue_rows(&mut self, rows: &[usize], every: usize) -> Result<Vec<StepReport>> {
        let sample = self.data.as_ref().map(|d| d.sample.clone());
        self.queue_with(
            sample.as_deref(),
            rows.len(),
            every,
            true,
            |t, step, every| t.queue_inner(rows, every, step),
        )
    }

    /// `queue` of the first `n` samples of `batch`, staged on the copy stream (`batch/staging.rs`).
    pub(super) fn queue_pinned(
        &mut self,
        batch: &dyn PinnedRows<B, T>,
        n: usize,
        every: usize,
    ) -> Result<Vec<StepReport>> {
        let [_, scales, features] = batch.dims();
        self.queue_with(
            Some(&[scales, features][..]),
            n,
            every,
            false,
            |t, step, every| {
                t.optim.check_state()?;
                let sample = t.pinned_sample(batch, n)?;
                t.queue_staged(batch, n, &sample, step, every)
            },
        )
    }

    /// A step of `batch` rows of samples `sample` queued by `queue` in windows of `every`
    /// (`device`: rows of the loaded data set, read through its step table): the window read
    /// back first where the step needs it (`drain_before`), then the step, then the window
    /// flipped when it is full. Returns the reports read back.
    fn queue_with(
        &mut self,
        sample: Option<&[usize]>,
        batch: usize,
        every: usize,
        device: bool,
        queue: impl FnOnce(&mut Self, u64, usize) -> Result<()>,
    ) -> Result<Vec<StepReport>> {
        let every = every.max(1);
        let step = self.optim.step_count() + 1;
        self.resync_cursor()?;
        let mut reports = self.drain_before(sample, batch, every)?;
        if device && self.window.pending() > 0 && !self.table_fits(batch, every) {
            // Steps queued read the table made anew below: they finish first.
            reports.extend(self.drain()?);
        }
        let queued = queue(self, step, every);
        self.note_unsynced();
        queued.map_err(|e| self.settle(step, self.distributed_error(e)))?;
        if self.window.filling() >= every {
            reports.extend(self.flip()?);
        }
        Ok(reports)
    }

    /// Stages this rank's rows of the first `n` samples of `batch` on the copy stream
    /// (`batch/staging.rs`), queues the step on them and marks their landing buffer free after it.
    fn queue_staged(
        &mut self,
        batch: &dyn PinnedRows<B, T>,
        n: usize,
        sample: &[usize],
        step: u64,
        every: usize,
    ) -> Result<()> {
        let b = Rc::clone(&self.backend);
        let info = self.parts.dist.info();
        let local = shard(info.rank, info.world, n);
        let shape: Vec<usize> = std::iter::once(local.len())
            .chain(sample.iter().copied())
            .collect();
        let targets = batch.targets();
        if !self
            .staging
            .as_ref()
            .is_some_and(|s| s.holds(&shape, targets))
        {
            // Room for the largest shard of a full batch, so the landing buffers are made once.
            let rows = shard(info.rank, info.world, batch.dims()[0]).len();
            let mut room = shape.clone();
            room[0] = rows.max(local.len());
            self.staging = None;
            self.staging = Some(batch.staging(&*b, &room)?);
        }
        let Some(staging) = self.staging.as_mut() else {
            return Err(GradError::BadInput("internal: no landing buffers".into()));
        };
        let (landed, slot) = phases::timed(&mut self.phases.staging, || {
            batch.stage(staging, &*b, local)
        })?;
        let from = Rows::Pinned(&landed);
        let queued = self.queue_from(from, (step, n, Vec::new()), sample, every);
        // Released whatever became of the step: the next copy into it follows what was queued.
        let released = self
            .staging
            .as_ref()
            .map_or(Ok(()), |s| batch.release(s, &*b, slot));
        queued.and(released)
    }

    /// A step that may have run in part (the optimiser's state unknown) may have moved the
    /// window's cursor on the device past the rows the host counts: noted, so that the next
    /// call sets it back (`resync_cursor`) before a step reads its inputs at it.
    fn note_unsynced(&mut self) {
        if self.optim.unknown_step().is_some() {
            self.window.unsynced = true;
        }
    }

    /// The device's window cursor set to the steps the host counts in the window, after a
    /// step that may have run in part (`note_unsynced`): the next step's inputs and history
    /// row are then the row the host puts up.
    fn resync_cursor(&mut self) -> Result<()> {
        if !self.window.unsynced {
            return Ok(());
        }
        if let Some(track) = self.window.track.as_ref() {
            let row = T::from_f64(self.window.filling() as f64);
            self.backend.fill(&track.cursor, row)?;
        }
        self.window.unsynced = false;
        Ok(())
    }

    /// Whether a batched step of `batch` rows in windows of `every` finds a step table that
    /// holds it (the per-sample schedule has none).
    fn table_fits(&self, batch: usize, every: usize) -> bool {
        let info = self.parts.dist.info();
        let local = shard(info.rank, info.world, batch).len();
        match (&self.config.schedule, self.data.as_ref()) {
            (TrainSchedule::Batched, Some(d)) => {
                d.steps.as_ref().is_some_and(|t| t.fits(every, local))
            }
            _ => true,
        }
    }

    fn queue_inner(&mut self, rows: &[usize], every: usize, step: u64) -> Result<()> {
        self.optim.check_state()?;
        let b = Rc::clone(&self.backend);
        let fits = self.table_fits(rows.len(), every);
        let Some(data) = self.data.as_mut() else {
            return Err(no_data());
        };
        let info = self.parts.dist.info();
        let local = shard(info.rank, info.world, rows.len());
        match self.config.schedule {
            TrainSchedule::Batched => {
                data.check_rows(rows)?;
                if !fits {
                    // The graph captured with the old table would read it.
                    self.exec.forget(|k| k == GraphKey::QueuedDevice);
                    data.steps = None;
                    data.steps = Some(StepTable::new(&*b, every, local.len())?);
                }
                let (schedule, base) = (self.config.lr_schedule, self.config.lr);
                let row = StepRow {
                    window_row: self.window.filling(),
                    rows,
                    local: local.clone(),
                    step,
                    lr: schedule.lr_at(base, step),
                    every,
                    rank: info.rank,
                    world: info.world,
                };
                let Some(table) = data.steps.as_mut() else {
                    return Err(no_data());
                };
                phases::timed(&mut self.phases.index_upload, || {
                    table.stage(&*b, &row, &mut data.plan, |s| schedule.lr_at(base, s))
                })?;
            }
            TrainSchedule::PerSample => phases::timed(&mut self.phases.index_upload, || {
                data.upload_indices(&*b, rows, local)
            })?,
        }
        let sample = data.sample.clone();
        let pending = (step, rows.len(), rows.to_vec());
        self.queue_from(Rows::Device, pending, &sample, every)
    }

    /// Queues step `step` on `batch` rows of samples `sample` from `from` (`rows`: their
    /// indices in the device data set, to locate a non-finite sample), counts it and records
    /// it as pending.
    fn queue_from(
        &mut self,
        from: Rows<'_, B, T>,
        (step, batch, rows): (u64, usize, Vec<usize>),
        sample: &[usize],
        every: usize,
    ) -> Result<()> {
        let b = Rc::clone(&self.backend);
        let mut pending = Pending {
            step,
            lr: 0.0,
            samples: batch,
            rows,
            captured: false,
            record: Record::Stats,
        };
        let StepRows {
            lr,
            rows: local,
            shape,
        } = self.step_rows(batch, sample, step)?;
        let t0 = std::time::Instant::now();
        let captured = match self.config.schedule {
            TrainSchedule::Batched => self.window.track(&*b, every, 2).and_then(|track| {
                // A graph captured with an earlier history would write its rows there.
                self.exec.queued_track(self.window.made);
                self.queue_step(from, &track, local, &shape, lr, step)
            }),
            TrainSchedule::PerSample => {
                pending.record = Record::Samples {
                    local: local.len(),
                    global: batch,
                };
                self.samples_from(from, local, &shape, lr, step, every)
            }
        };
        self.phases.launch += t0.elapsed();
        let (captured, closed) = captured?;
        // The update is queued: counted and read back with the window even when closing its
        // step scope failed (`closed`, `Applied::Yes`).
        pending.captured = captured;
        pending.lr = lr;
        self.optim.commit();
        self.window.pending.push(pending);
        closed
    }

    /// Reads the window back before a step of `batch` rows of samples `sample` is queued: when
    /// it is full, or when the step needs a history of another shape (a per-sample step on
    /// slots made anew, or a longer window).
    fn drain_before(
        &mut self,
        sample: Option<&[usize]>,
        batch: usize,
        every: usize,
    ) -> Result<Vec<StepReport>> {
        let info = self.parts.dist.info();
        let width = match (self.config.schedule, sample) {
            (TrainSchedule::Batched, _) => Some(2),
            (TrainSchedule::PerSample, Some(sample)) => {
                Some(self.sample_width(sample, shard(info.rank, info.world, batch).len()))
            }
            // No data set: the step is refused before it queues anything.
            (TrainSchedule::PerSample, None) => None,
        };
        let reshaped = width.is_some_and(|w| !self.window.fits(every, w));
        if reshaped && self.window.pending() > 0 {
            self.drain()
        } else if self.window.filling() >= every {
            // A window left full by a longer `every` before.
            self.flip()
        } else {
            Ok(Vec::new())
        }
    }

    /// A per-sample step queued on rows `local` from `from` (`queued_samples.rs`).
    fn samples_from(
        &mut self,
        from: Rows<'_, B, T>,
        local: std::ops::Range<usize>,
        shape: &[usize],
        lr: f64,
        step: u64,
        every: usize,
    ) -> Result<Queued> {
        let queued = match from {
            Rows::Pinned(src) => self.sample_step(src, local, shape, lr, step, Some(every)),
            Rows::Device => {
                let data = self.data.take().ok_or_else(no_data)?;
                let resident = Resident { data: &data };
                let queued = self.sample_step(&resident, local, shape, lr, step, Some(every));
                self.data = Some(data);
                queued
            }
        };
        let (_, ended) = queued?;
        Ok((
            self.exec.on(),
            ended.map_err(|e| e.at_step(step, Applied::Yes)),
        ))
    }

    /// Queues a batched step on rows `local` from `from` through the door (`gated_step`), its
    /// history row written into `track`.
    fn queue_step(
        &mut self,
        from: Rows<'_, B, T>,
        track: &Track<B, T>,
        local: std::ops::Range<usize>,
        shape: &[usize],
        lr: f64,
        step: u64,
    ) -> Result<Queued> {
        let (shard, gathered);
        let (key, rows, lr) = match from {
            Rows::Pinned(src) => {
                shard = Shard { src, rows: local };
                (GraphKey::QueuedPinned, GatedRows::Shard(&shard), Some(lr))
            }
            Rows::Device => {
                // `[lr, t]` is in the step table's row, gathered with the rows.
                let data = self.data.as_ref().ok_or_else(no_data)?;
                let views = data.steps.as_ref().ok_or_else(no_data)?.views()?;
                let gather = Gather {
                    xs: data.x.clone(),
                    ys: data.y.clone(),
                    table: views.table,
                    lr_t: views.lr_t,
                    cursor: track.cursor.clone(),
                };
                let slot = views.slot;
                gathered = GatheredRows { gather, slot };
                (GraphKey::QueuedDevice, GatedRows::Gathered(&gathered), None)
            }
        };
        // The targets as the model's loss takes them (`[rows, 1]` for one regression value).
        let target = self.targets_shape(shape[0]);
        let (queued, ended) = self.gated_step(GatedStep {
            key,
            what: "queued batched step",
            step,
            lr,
            rows,
            mark: None,
            track: Some(track),
            shape,
            target: &target,
        });
        Ok((
            queued?.captured(),
            ended.map_err(|e| e.at_step(step, Applied::Yes)),
        ))
    }
}

fn no_data() -> GradError {
    GradError::BadInput("no data set on the device: call load with Load::Training first".into())
}
