//! The read-back of the queued steps' window: their reports, or the first non-finite step.

use super::super::device_data::DeviceData;
use super::super::{StepReport, Trainer, checks};
use crate::error::{Applied, GradError, Result};
use crate::model::Model;
use std::rc::Rc;
use zcompute::{Capture, Element, prelude::*};

impl<B: Capture<T> + 'static, T: Element, M: Model<B, T>> Trainer<B, T, M> {
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
