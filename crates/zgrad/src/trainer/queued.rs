//! Steps queued on the device data set with nothing read back per step (issue 21 item 2).
//!
//! [`Trainer::queue_rows`] uploads a step's indices and its `[lr, t, gate]` slot, then runs
//! one body, captured once per batch shape and replayed: the rows gathered from the resident
//! data set, zero_grad, forward, backward, norm, the finiteness gate, the update. Each step
//! also scatters its `[loss, norm]` into a device history row (a cursor the graph advances)
//! and folds its gate into a sticky one: once a step of the window is non-finite, every later
//! step of the window is skipped on the device too. So when [`Trainer::drain`] reads the
//! window back (one download every `every` steps), a non-finite step `k` leaves the model
//! exactly as step `k - 1` left it, the step count is wound back to `k - 1`, and the error
//! names step `k` (and its sample, found on the host copy of its rows): the same state and
//! error as the per-step path, `every - 1` steps of device time later at most.
//!
//! The per-sample schedule is queued the same way (`queued_samples.rs`): its samples run one
//! after another, then its tail writes the history row, folds the gate and updates.
//!
//! The optimiser counts a queued step as soon as its update is queued (the `t` of the next
//! step's slot); a drained non-finite step takes the count back.

use super::body::{ErrorSlot, StepParts, into_body_error, take_body_error};
use super::captured::{BatchedGraph, Runs, persistent_zeros, warn_fallback};
use super::device_data::{DeviceData, Resident};
use super::source::{PinnedBatch, Source};
use super::staging::Staging;
use super::{StepReport, TrainSchedule, Trainer, checks, in_step_split, phases, shard};
use crate::error::{Applied, GradError, NonFiniteKind, Result};
use crate::memory::ClassGuard;
use crate::model::Model;
use crate::optim::AdamWTensors;
use crate::var::Var;
use std::cell::Cell;
use std::rc::Rc;
use zcompute::{ADAMW_SLOT_GATE, AllocClass, BTensor, Capture, Element, PinnedHost, prelude::*};

/// The device side of the window: every queued step's row (`[loss, norm]`; a per-sample
/// step's `[loss, norm, the samples' losses..]`), the row the next one writes, and the sticky
/// gate (0 while every step so far was finite, NaN after).
pub(super) struct Track<B: Ops<T>, T: Element> {
    history: BTensor<B, T>,
    cursor: BTensor<B, T>,
    poison: BTensor<B, T>,
}

impl<B: Ops<T>, T: Element> Clone for Track<B, T> {
    fn clone(&self) -> Self {
        Track {
            history: self.history.clone(),
            cursor: self.cursor.clone(),
            poison: self.poison.clone(),
        }
    }
}

impl<B: Ops<T>, T: Element> Track<B, T> {
    /// Folds the step's gate (written into AdamW's slot) into the sticky one, so the update
    /// of this step and of every later one of the window is skipped once one was not finite,
    /// and writes `row` into the history's next row. Legal inside a capture.
    pub(super) fn record(
        &self,
        b: &B,
        adamw: &AdamWTensors<B, T>,
        row: &BTensor<B, T>,
    ) -> Result<()> {
        let gate = adamw.slot.narrow(0, ADAMW_SLOT_GATE, 1)?;
        // gate + poison is NaN once any step of the window was: later steps are skipped too.
        b.add_into(&self.poison, &gate)?;
        b.copy_into(&gate, &self.poison)?;
        b.scatter_row(row, &self.cursor, &self.history, true)?;
        Ok(())
    }
}

/// What a queued step gathers: the resident features and labels, and its rows' indices.
pub(super) struct Gather<B: Ops<T>, T: Element> {
    xs: BTensor<B, T>,
    ys: BTensor<B, T>,
    index: BTensor<B, T>,
}

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

/// What a queued step's history row holds.
#[derive(Clone, Copy, Debug)]
enum Record {
    /// `[loss, norm]` (the batched schedule).
    Stats,
    /// `[global loss, norm, the losses of this rank's `local` samples..]` of a per-sample
    /// step of `global` samples.
    Samples { local: usize, global: usize },
}

impl Record {
    /// The step's loss and norm from its history row, refused as the per-step path refuses
    /// them: one rank sums its samples' losses on the host in `f64` in sample order (and names
    /// the first non-finite one); several take the global loss the all-reduce summed.
    fn stats<T: Element>(self, step: u64, row: &[T], single: bool) -> Result<(f64, f64)> {
        let norm = row[1].to_f64();
        let loss = match self {
            Record::Samples { local, global } if single => {
                let losses = &row[2..2 + local];
                if let Some(bad) = losses.iter().position(|l| !l.to_f64().is_finite()) {
                    return Err(GradError::NonFinite {
                        step,
                        sample: Some(bad),
                        kind: NonFiniteKind::Loss,
                    });
                }
                losses.iter().map(|l| l.to_f64()).sum::<f64>() / global as f64
            }
            Record::Stats | Record::Samples { .. } => row[0].to_f64(),
        };
        checks::finite(step, loss, norm)?;
        Ok((loss, norm))
    }
}

/// A step whose update was queued: whether it ran captured, and the closing of its step scope
/// (an error there comes after the update: `Applied::Yes`).
pub(super) type Queued = (bool, Result<()>);

/// A queued step the host has not read back yet.
#[derive(Clone, Debug)]
struct Pending {
    step: u64,
    lr: f64,
    samples: usize,
    rows: Vec<usize>,
    captured: bool,
    record: Record,
}

/// Queued steps and their device history.
pub(crate) struct Window<B: Ops<T>, T: Element> {
    track: Option<Track<B, T>>,
    pending: Vec<Pending>,
}

impl<B: Ops<T>, T: Element> Default for Window<B, T> {
    fn default() -> Self {
        Window {
            track: None,
            pending: Vec::new(),
        }
    }
}

impl<B: Ops<T>, T: Element> Window<B, T> {
    /// Steps queued and not read back.
    pub(super) fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Whether the track holds windows of `every` steps of rows of `width` values.
    fn fits(&self, every: usize, width: usize) -> bool {
        self.track
            .as_ref()
            .is_some_and(|t| t.history.shape()[0] >= every && t.history.shape()[1] == width)
    }

    /// The track for windows of `every` steps of rows of `width` values (made anew only while
    /// nothing is pending: `Trainer::drain_before` reads the window back first).
    pub(super) fn track(&mut self, b: &B, every: usize, width: usize) -> Result<Track<B, T>> {
        match &self.track {
            Some(t) if self.fits(every, width) => Ok(t.clone()),
            _ if !self.pending.is_empty() => Err(GradError::BadInput(
                "internal: the window's history changes shape with steps pending".into(),
            )),
            _ => {
                self.track = None;
                let t = Track {
                    history: persistent_zeros(b, &[every, width])?,
                    cursor: persistent_zeros(b, &[1])?,
                    poison: persistent_zeros(b, &[1])?,
                };
                self.track = Some(t.clone());
                Ok(t)
            }
        }
    }
}

impl<B: Ops<T>, T: Element, M: Model<B, T>> StepParts<B, T, M> {
    /// The queued step's body: the step's rows gathered into `x` and `y`, `batched`, the gate
    /// (folded into the sticky one), the stats into the history, the gated update. Every call
    /// is legal inside a capture.
    #[allow(clippy::too_many_arguments)]
    fn tracked(
        &self,
        b: &B,
        data: Option<&Gather<B, T>>,
        x: &Var<B, T>,
        y: &Var<B, T>,
        adamw: &AdamWTensors<B, T>,
        track: &Track<B, T>,
        started: &Cell<bool>,
    ) -> Result<()> {
        if let Some(data) = data {
            b.gather_rows(&data.xs, &data.index, x.value())?;
            b.gather_rows(&data.ys, &data.index, y.value())?;
            x.bump_version();
            y.bump_version();
        }
        let (loss, norm) = self.batched(b, x, y)?;
        adamw.write_gate(b, &loss, &norm)?;
        track.record(b, adamw, &self.stats)?;
        started.set(true);
        adamw.apply(b, &self.params)
    }
}

impl<B: Capture<T> + 'static, T: Element, M: Model<B, T>> Trainer<B, T, M> {
    /// Queues one optimiser step on rows `rows` of the data set [`Trainer::load_data`] put on
    /// the device (the global batch: each rank of a data-parallel job gathers its shard),
    /// reading nothing back: the reports of the window come back, in step order, from the
    /// call that fills it (every `every` steps) or from [`Trainer::drain`]; other calls return
    /// none. The step is `train_batch`'s on the same rows, bit for bit, eager or captured, in
    /// either schedule (a per-sample step keeps its samples' losses in the window, summed on
    /// the host in `f64` when it is read back: `queued_samples.rs`).
    ///
    /// Errors are `GradError::Step`s as for `train_batch`: `BadInput` (nothing loaded, no
    /// rows, a row out of range) applies nothing; a non-finite step found by the read-back
    /// is `NonFinite` naming its step and sample, with the model and step count as that
    /// step's predecessor left them (`Applied::No`: the later steps of its window were
    /// skipped on the device).
    pub fn queue_rows(&mut self, rows: &[usize], every: usize) -> Result<Vec<StepReport>> {
        let every = every.max(1);
        let step = self.optim.step_count() + 1;
        let sample = self.data.as_ref().map(|d| d.sample.clone());
        let mut reports = self.drain_before(sample.as_deref(), rows.len(), every)?;
        self.queue_inner(rows, every, step)
            .map_err(|e| self.settle(step, self.distributed_error(e)))?;
        if self.window.pending() >= every {
            reports.extend(self.drain()?);
        }
        Ok(reports)
    }

    /// [`Trainer::queue_rows`] for a batch the caller stages in pinned memory (when the data
    /// set does not fit the device): the first `n` samples of `batch` are copied on the
    /// backend's copy stream into one of two device landing buffers while the engine stream
    /// still runs the steps before (ordered by events, `staging.rs`), the step queued behind
    /// the copy, nothing read back. Refill the *other* of two batches while this one's copy
    /// and step run (`PinnedBatch::fill` waits only for the copy that last read a batch, never
    /// for a step), so the host stages batch k+1 while the device runs step k. The same errors as `train_batch_pinned`; a
    /// non-finite step read back later is named by its step (its sample is no longer there;
    /// a per-sample step's non-finite loss still names its sample).
    pub fn queue_pinned(
        &mut self,
        batch: &PinnedBatch<B, T>,
        n: usize,
        every: usize,
    ) -> Result<Vec<StepReport>>
    where
        B: PinnedHost<T>,
    {
        let every = every.max(1);
        let step = self.optim.step_count() + 1;
        let sample = [batch.scales(), batch.features()];
        let mut reports = self.drain_before(Some(&sample), n, every)?;
        let queued = self
            .optim
            .check_state()
            .and_then(|()| self.pinned_sample(batch, n))
            .and_then(|sample| self.queue_staged(batch, n, &sample, step, every));
        queued.map_err(|e| self.settle(step, self.distributed_error(e)))?;
        if self.window.pending() >= every {
            reports.extend(self.drain()?);
        }
        Ok(reports)
    }

    /// Stages this rank's rows of the first `n` samples of `batch` on the copy stream
    /// (`staging.rs`), queues the step on them and marks their landing buffer free after it.
    fn queue_staged(
        &mut self,
        batch: &PinnedBatch<B, T>,
        n: usize,
        sample: &[usize],
        step: u64,
        every: usize,
    ) -> Result<()>
    where
        B: PinnedHost<T>,
    {
        let b = Rc::clone(&self.backend);
        let info = self.parts.dist.info();
        let local = shard(info.rank, info.world, n);
        let shape: Vec<usize> = std::iter::once(local.len())
            .chain(sample.iter().copied())
            .collect();
        if !self.staging.as_ref().is_some_and(|s| s.holds(&shape)) {
            // Room for the largest shard of a full batch, so the landing buffers are made once.
            let rows = shard(info.rank, info.world, batch.capacity()).len();
            let mut room = shape.clone();
            room[0] = rows.max(local.len());
            self.staging = None;
            self.staging = Some(Staging::new(&*b, &room)?);
        }
        let Some(staging) = self.staging.as_mut() else {
            return Err(GradError::BadInput("internal: no landing buffers".into()));
        };
        let (landed, slot) =
            phases::timed(&mut self.phases.staging, || staging.stage(&b, batch, local))?;
        let pending = Pending {
            step,
            lr: 0.0,
            samples: n,
            rows: Vec::new(),
            captured: false,
            record: Record::Stats,
        };
        let queued = self.queue_from(Rows::Pinned(&landed), pending, sample, every);
        // Released whatever became of the step: the next copy into it follows what was queued.
        let released = self
            .staging
            .as_ref()
            .map_or(Ok(()), |s| s.release(&*b, slot));
        queued.and(released)
    }

    /// Steps queued by `queue_rows` and not read back yet.
    #[must_use]
    pub fn queued(&self) -> usize {
        self.window.pending()
    }

    /// Reads every queued step back (one wait on the device), in step order; see
    /// [`Trainer::queue_rows`] for a non-finite step. A read-back that fails leaves the
    /// queued steps' updates unknown (`Applied::Maybe` naming the first).
    pub fn drain(&mut self) -> Result<Vec<StepReport>> {
        let pending = std::mem::take(&mut self.window.pending);
        let (Some(first), Some(track)) = (pending.first(), self.window.track.clone()) else {
            return Ok(Vec::new());
        };
        let b = Rc::clone(&self.backend);
        let read = || -> Result<Vec<T>> {
            let values = b.download(&track.history.narrow(0, 0, pending.len())?)?;
            b.fill(&track.cursor, T::ZERO)?;
            b.fill(&track.poison, T::ZERO)?;
            Ok(values)
        };
        let t0 = std::time::Instant::now();
        let values = read();
        self.phases.readback += t0.elapsed();
        let values = values.map_err(|e| {
            self.optim.mark_unknown_at(first.step);
            self.distributed_error(e)
                .at_step(first.step, Applied::Maybe)
        })?;
        let (width, single) = (track.history.shape()[1], self.parts.dist.single());
        let mut reports = Vec::with_capacity(pending.len());
        for (p, row) in pending.iter().zip(values.chunks_exact(width)) {
            let stats = p.record.stats(p.step, row, single);
            let (loss, grad_norm) = match stats {
                Ok(stats) => stats,
                Err(e) => {
                    // This step and every later one of the window were skipped on the device.
                    self.optim.rewind(p.step - 1);
                    let e = checks::locate(Err::<(), _>(e), |kind| self.locate_rows(&p.rows, kind));
                    let e = e.err().unwrap_or(GradError::BadInput("non-finite".into()));
                    return Err(self.distributed_error(e).at_step(p.step, Applied::No));
                }
            };
            let report = self.report(p.step, loss, grad_norm, p.lr, p.samples, p.captured);
            Self::log_step(&report);
            reports.push(report);
        }
        Ok(reports)
    }

    /// The sample of rows `rows` whose input, loss or gradient is not finite (the error path).
    fn locate_rows(&self, rows: &[usize], kind: crate::NonFiniteKind) -> Result<Option<usize>> {
        let Some(data) = self.data.as_ref().filter(|_| !rows.is_empty()) else {
            // A pinned batch's rows are gone (refilled) by the read-back: the step is named.
            return Ok(None);
        };
        let b = &*self.backend;
        let mut staging = Vec::new();
        let (x, y) = host_rows(b, data, rows, &mut staging)?;
        let shape: Vec<usize> = std::iter::once(rows.len())
            .chain(data.sample.iter().copied())
            .collect();
        self.find_sample(&x, &y, &shape, kind)
    }

    fn queue_inner(&mut self, rows: &[usize], every: usize, step: u64) -> Result<()> {
        self.optim.check_state()?;
        let b = Rc::clone(&self.backend);
        let Some(data) = self.data.as_mut() else {
            return Err(no_data());
        };
        phases::timed(&mut self.phases.index_upload, || {
            data.upload_indices(&*b, rows)
        })?;
        let sample = data.sample.clone();
        let pending = Pending {
            step,
            lr: 0.0,
            samples: rows.len(),
            rows: rows.to_vec(),
            captured: false,
            record: Record::Stats,
        };
        self.queue_from(Rows::Device, pending, &sample, every)
    }

    /// Queues step `pending.step` on `pending.samples` rows of samples `sample` from `from`,
    /// counts it and records it as pending.
    fn queue_from(
        &mut self,
        from: Rows<'_, B, T>,
        mut pending: Pending,
        sample: &[usize],
        every: usize,
    ) -> Result<()> {
        let (b, step, batch) = (Rc::clone(&self.backend), pending.step, pending.samples);
        let lr = self.config.lr_schedule.lr_at(self.config.lr, step);
        let info = self.parts.dist.info();
        let local = shard(info.rank, info.world, batch);
        self.parts.dist.prepare(&*b, local.len(), batch, step)?;
        let shape: Vec<usize> = std::iter::once(local.len())
            .chain(sample.iter().copied())
            .collect();
        let t0 = std::time::Instant::now();
        let captured = match self.config.schedule {
            TrainSchedule::Batched => self
                .window
                .track(&*b, every, 2)
                .and_then(|track| self.queue_step(from, &track, local, &shape, lr, step)),
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
        let pending = self.window.pending();
        if pending >= every || (pending > 0 && reshaped) {
            self.drain()
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
        let Rows::Pinned(src) = from else {
            let data = self.data.take().ok_or_else(no_data)?;
            let b = Rc::clone(&self.backend);
            let resident = Resident {
                data: &data,
                b: &*b,
            };
            let queued = self.queue_samples(&resident, local, shape, lr, step, every);
            self.data = Some(data);
            return queued;
        };
        self.queue_samples(src, local, shape, lr, step, every)
    }

    /// The graph slot of rows from `from`.
    fn tracked_slot(&mut self, from: Rows<'_, B, T>) -> &mut Option<BatchedGraph<B, T>> {
        match from {
            Rows::Device => &mut self.graphs.tracked,
            Rows::Pinned(_) => &mut self.graphs.tracked_pinned,
        }
    }

    /// The gather of rows `local` of the device data set, for rows from it.
    fn gather_of(
        &self,
        from: Rows<'_, B, T>,
        local: std::ops::Range<usize>,
    ) -> Result<Option<Gather<B, T>>> {
        if let Rows::Pinned(_) = from {
            return Ok(None);
        }
        let data = self.data.as_ref().ok_or_else(no_data)?;
        Ok(Some(Gather {
            xs: data.x.clone(),
            ys: data.y.clone(),
            index: data.indices(local)?,
        }))
    }

    /// Queues the step's body: replayed when a graph of this shape exists, captured when
    /// capture is on and none exists yet, else run eagerly.
    fn queue_step(
        &mut self,
        from: Rows<'_, B, T>,
        track: &Track<B, T>,
        local: std::ops::Range<usize>,
        shape: &[usize],
        lr: f64,
        step: u64,
    ) -> Result<Queued> {
        let b = Rc::clone(&self.backend);
        let want = self.config.capture && !self.graphs.disabled;
        let graph_shape = self.tracked_slot(from).as_ref().map(|g| g.shape.clone());
        let (queued, ended) = in_step_split(&*b, || {
            self.optim.prepare(&*b, lr)?;
            match (want, graph_shape) {
                (true, Some(s)) if s == shape => {
                    let Some(g) = self.tracked_slot(from).as_mut() else {
                        return Err(no_data());
                    };
                    if let Rows::Pinned(src) = from {
                        src.upload(&*b, local, g.x.value(), g.y.value())?;
                        g.x.bump_version();
                        g.y.bump_version();
                    }
                    let (graph, errors) = (&mut g.graph, g.errors.clone());
                    b.replay(graph).map_err(|e| {
                        // The graph may have run in part, its update included.
                        self.optim.mark_unknown();
                        take_body_error(e, &errors).at_step(step, Applied::Maybe)
                    })?;
                    Ok(true)
                }
                (true, None) => self.tracked_capture(from, track, local, shape, step),
                // Capture off, or a batch of another shape (an epoch's last): eagerly.
                _ => {
                    self.tracked_eager(from, track, local, shape)?;
                    Ok(false)
                }
            }
        });
        let captured = queued?;
        Ok((captured, ended.map_err(|e| e.at_step(step, Applied::Yes))))
    }

    /// The body run eagerly on fresh inputs (saved class: the first product keeps `x`).
    fn tracked_eager(
        &mut self,
        from: Rows<'_, B, T>,
        track: &Track<B, T>,
        local: std::ops::Range<usize>,
        shape: &[usize],
    ) -> Result<()> {
        let b = &*self.backend;
        let gather = self.gather_of(from, local.clone())?;
        let (x, y) = {
            let _class = ClassGuard::new(b, AllocClass::Saved);
            (
                Var::constant(b.zeros(shape)?),
                Var::constant(b.zeros(&shape[..1])?),
            )
        };
        if let Rows::Pinned(src) = from {
            src.upload(b, local, x.value(), y.value())?;
        }
        let started = Cell::new(false);
        let adamw = self.optim.tensors();
        self.parts
            .tracked(b, gather.as_ref(), &x, &y, &adamw, track, &started)
            .inspect_err(|_| {
                if started.get() {
                    self.optim.mark_unknown();
                }
            })
    }

    /// Captures the body (its warm-up, or the CPU backend's recording, runs it for real).
    fn tracked_capture(
        &mut self,
        from: Rows<'_, B, T>,
        track: &Track<B, T>,
        local: std::ops::Range<usize>,
        shape: &[usize],
        step: u64,
    ) -> Result<bool> {
        let b = Rc::clone(&self.backend);
        let gather = self.gather_of(from, local.clone())?;
        let (xv, yv) = (
            Var::constant(persistent_zeros(&*b, shape)?),
            Var::constant(persistent_zeros(&*b, &shape[..1])?),
        );
        if let Rows::Pinned(src) = from {
            src.upload(&*b, local.clone(), xv.value(), yv.value())?;
        }
        let (errors, runs, started) = (ErrorSlot::default(), Runs::default(), Rc::default());
        let body = tracked_body(
            &b,
            &self.parts,
            gather,
            (xv.clone(), yv.clone()),
            self.optim.tensors(),
            track.clone(),
            (errors.clone(), runs.clone(), Rc::clone(&started)),
        );
        match b.capture_in_pool(&self.graphs.pool, Box::new(body)) {
            Ok(graph) => {
                *self.tracked_slot(from) = Some(BatchedGraph {
                    graph,
                    x: xv,
                    y: yv,
                    shape: shape.to_vec(),
                    errors,
                });
                Ok(true)
            }
            Err(e) => {
                let e = take_body_error(e, &errors);
                if runs.get() == 0 && started.get() {
                    self.optim.mark_unknown();
                    return Err(e.at_step(step, Applied::Maybe));
                }
                warn_fallback("queued batched step", &e);
                self.graphs.disabled = true;
                if runs.get() == 0 {
                    // Nothing ran: the step eagerly (its slot was prepared, its gate unused).
                    self.tracked_eager(from, track, local, shape)?;
                }
                Ok(false)
            }
        }
    }
}

/// The capture body of `StepParts::tracked`, a `'static` closure over clones.
fn tracked_body<B: Capture<T> + 'static, T: Element, M: Model<B, T>>(
    b: &Rc<B>,
    parts: &StepParts<B, T, M>,
    data: Option<Gather<B, T>>,
    inputs: (Var<B, T>, Var<B, T>),
    adamw: AdamWTensors<B, T>,
    track: Track<B, T>,
    slots: (ErrorSlot, Runs, Rc<Cell<bool>>),
) -> impl FnMut() -> zcompute::Result<()> + 'static {
    let (b, parts) = (Rc::clone(b), parts.clone());
    let (errors, runs, started) = slots;
    move || {
        parts
            .tracked(
                &*b,
                data.as_ref(),
                &inputs.0,
                &inputs.1,
                &adamw,
                &track,
                &started,
            )
            .map_err(|e| into_body_error(e, &errors))?;
        runs.set(runs.get() + 1);
        Ok(())
    }
}

/// Rows `rows` of the resident data set on the host (gathered on the device, read back).
fn host_rows<B: Ops<T>, T: Element>(
    b: &B,
    data: &DeviceData<B, T>,
    rows: &[usize],
    staging: &mut Vec<T>,
) -> Result<(Vec<T>, Vec<T>)> {
    staging.extend(rows.iter().map(|&r| T::from_f64(r as f64)));
    let index = b.upload(staging, &[rows.len()])?;
    let shape: Vec<usize> = std::iter::once(rows.len())
        .chain(data.sample.iter().copied())
        .collect();
    let (x, y) = (b.zeros(&shape)?, b.zeros(&[rows.len()])?);
    b.gather_rows(&data.x, &index, &x)?;
    b.gather_rows(&data.y, &index, &y)?;
    Ok((b.download(&x)?, b.download(&y)?))
}

fn no_data() -> GradError {
    GradError::BadInput("no data set on the device: call load_data first".into())
}
