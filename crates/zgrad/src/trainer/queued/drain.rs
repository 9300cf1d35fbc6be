//! The read-back of the queued steps' windows: a full window's copy queued to the host, the
//! window before read (its copy long finished), their reports, or the first non-finite step.

use super::super::device_data::DeviceData;
use super::super::{StepReport, Trainer, checks};
use super::window::{Copied, Pending};
use crate::error::{Applied, GradError, Result};
use crate::model::Model;
use std::rc::Rc;
use zcompute::{Capture, Element, prelude::*};

impl<B: Capture<T> + 'static, T: Element, M: Model<B, T>> Trainer<B, T, M> {
    /// Reads every queued step back, in step order (the window in flight, then the one being
    /// filled, whose copy is queued and waited for: the one wait on the device); see
    /// `Trainer::queue` of loaded rows for a non-finite step (the clean reports read before it in
    /// the same call are not returned: the caller stops or restarts from the error's state).
    /// A read-back that fails leaves the queued steps' updates unknown (`Applied::Maybe`
    /// naming the first unread).
    pub fn drain(&mut self) -> Result<Vec<StepReport>> {
        let mut reports = self.read_copied()?;
        self.copy_window()?;
        reports.extend(self.read_copied()?);
        Ok(reports)
    }

    /// At a full window: the reports of the window copied before (its copy long finished,
    /// as a whole window of steps was queued behind it), then this window's copy queued. The
    /// host waits for nothing queued after that older copy.
    pub(super) fn flip(&mut self) -> Result<Vec<StepReport>> {
        let reports = self.read_copied()?;
        self.copy_window()?;
        Ok(reports)
    }

    /// Queues the copy of the window being filled to the host and sets the cursor back to
    /// the history's first row. Both are queued behind the window's last step and before the
    /// next one, so the next window's rows overwrite the history only after the copy read it
    /// (stream order: nothing waits). The sticky gate stays as it is: a non-finite step's
    /// gate keeps every later step skipped until the host has read it.
    fn copy_window(&mut self) -> Result<()> {
        let steps = std::mem::take(&mut self.window.pending);
        let (Some(first), Some(track)) = (steps.first(), self.window.track.clone()) else {
            return Ok(());
        };
        let b = Rc::clone(&self.backend);
        let width = track.history.shape()[1];
        let t0 = std::time::Instant::now();
        let queued = (|| -> Result<_> {
            let read = b.queue_download(&track.history.narrow(0, 0, steps.len())?)?;
            b.fill(&track.cursor, T::ZERO)?;
            Ok(read)
        })();
        if queued.is_ok() {
            // The cursor is at the first row, where the host puts the next step's.
            self.window.unsynced = false;
        }
        self.phases.readback += t0.elapsed();
        match queued {
            Ok(read) => {
                self.window.copied = Some(Copied { steps, width, read });
                Ok(())
            }
            Err(e) => Err(self.lost_window(first.step, e)),
        }
    }

    /// Waits for the copied window's read-back (its copy only) and builds its reports; the
    /// first non-finite step ends the reading (`non_finite`).
    fn read_copied(&mut self) -> Result<Vec<StepReport>> {
        let Some(Copied { steps, width, read }) = self.window.copied.take() else {
            return Ok(Vec::new());
        };
        let t0 = std::time::Instant::now();
        let values = read.wait();
        self.phases.readback += t0.elapsed();
        let first = steps.first().map_or(0, |p| p.step);
        let values = values.map_err(|e| self.lost_window(first, e))?;
        let single = self.parts.dist.single();
        let mut reports = Vec::with_capacity(steps.len());
        for (p, row) in steps.iter().zip(values.chunks_exact(width)) {
            let (loss, grad_norm) = match p.record.stats(p.step, row, single) {
                Ok(stats) => stats,
                Err(e) => return Err(self.non_finite(p, e)),
            };
            let report = self.report(p.step, loss, grad_norm, p.lr, p.samples, p.captured);
            Self::log_step(&report);
            reports.push(report);
        }
        Ok(reports)
    }

    /// Step `p` was not finite: it and every later queued step (of its window and of the one
    /// queued since) were skipped on the device, so the model is as step `p - 1` left it.
    /// The count goes back there, the later steps are dropped and the window starts clean
    /// (cursor and sticky gate cleared, queued before any later step) for a caller that
    /// goes on.
    fn non_finite(&mut self, p: &Pending, e: GradError) -> GradError {
        self.optim.rewind(p.step - 1);
        let located = checks::locate(Err::<(), _>(e), |kind| self.locate_rows(&p.rows, kind));
        let e = located
            .err()
            .unwrap_or(GradError::BadInput("non-finite".into()));
        let e = self.distributed_error(e).at_step(p.step, Applied::No);
        self.window.pending.clear();
        if let Err(reset) = self.clear_track() {
            self.optim.mark_unknown_at(p.step);
            return self
                .distributed_error(reset)
                .at_step(p.step, Applied::Maybe);
        }
        e
    }

    /// A read-back that failed from step `first` on: the steps not read back may or may not
    /// have run (`Applied::Maybe`); they are dropped and the track is cleared as far as the
    /// device still allows.
    fn lost_window(&mut self, first: u64, e: impl Into<GradError>) -> GradError {
        self.optim.mark_unknown_at(first);
        self.window.pending.clear();
        self.window.copied = None;
        if let Err(reset) = self.clear_track() {
            tracing::warn!(target: "zgrad.trainer.readback", error = %reset, "clearing the window after a failed read-back");
        }
        self.distributed_error(e.into())
            .at_step(first, Applied::Maybe)
    }

    /// The cursor back to the first row and the sticky gate open.
    fn clear_track(&mut self) -> Result<()> {
        let Some(track) = self.window.track.as_ref() else {
            return Ok(());
        };
        let b = &*self.backend;
        b.fill(&track.cursor, T::ZERO)?;
        b.fill(&track.poison, T::ZERO)?;
        self.window.unsynced = false;
        Ok(())
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
