//! The epochs of a run: their steps, read-backs, checkpoints, stops and lines.

use super::Context;
use std::time::Instant;

use zcompute::units::Bytes;
use zgrad::{Model, StepReport};

use crate::checkpoint::Progress;
use crate::console::Console;
use crate::data::feed::Feed;
use crate::data::{Samples, epoch_order};
use crate::error::{Result, TrainError};
use crate::fit::learner::Learner;
use crate::memory::MemorySource;
use crate::metrics::{MetricRow, Metrics};
use crate::progress::EpochBar;
use crate::resume::checkpoint_of;
use crate::rng::Rng;
use crate::soak::Soak;
use crate::step::{Tally, TrainBackend};

use crate::summary::{Ended, Throughput, sample_memory};
use crate::timeline::{StepTimes, Timeline};

/// Says a rank's failure at once (tearing the rank down after a dead peer may wait on the
/// device up to its deadline, and the launcher may take the rank down first).
fn rank_error(ctx: &Context<'_>, e: impl Into<TrainError>) -> TrainError {
    let e = e.into();
    if ctx.world > 1 {
        tracing::error!(
            target: "ztrain.rank",
            rank = ctx.rank,
            error = %crate::error::report(&e),
            "training stopped"
        );
    }
    e
}

/// The epochs of a run and what they carry from step to step.
pub(super) struct Epochs<'a, 'c, B: TrainBackend + MemorySource, M: Model<B, f32>> {
    pub(super) b: &'a B,
    pub(super) learner: Learner<B, M>,
    pub(super) progress: Progress,
    pub(super) rng: Rng,
    pub(super) feed: Feed<B>,
    pub(super) train_set: &'a Samples,
    pub(super) val_set: &'a Samples,
    pub(super) agree: crate::signals::Agreement<B>,
    pub(super) ctx: &'a Context<'c>,
    pub(super) config_json: &'a serde_json::Value,
    pub(super) soak: Option<Soak>,
    pub(super) validation: Option<Tally>,
    pub(super) training: Throughput,
    pub(super) started: Instant,
    /// `--timeline`: each step's host phases and GPU span.
    pub(super) timeline: Option<Timeline>,
    /// The metrics rows (`--metrics`) and the losses of the report's curves.
    pub(super) metrics: Metrics,
}

impl<B: TrainBackend + MemorySource, M: Model<B, f32>> Epochs<'_, '_, B, M> {
    /// Rank 0 writes the checkpoint (when one was asked for) of the progress so far. Its
    /// reads wait behind the step's collectives: when a peer's failure stopped those, that
    /// failure is the error, as the step's (not the read's timeout).
    fn save(&mut self) -> Result<()> {
        self.save_progress().map_err(|e| {
            match self
                .agree
                .comm()
                .and_then(|c| c.take_failure().map(|f| (c, f)))
            {
                Some((c, f)) => {
                    c.abort(&f.to_string());
                    let step = self.progress.step;
                    TrainError::Grad(zgrad::GradError::from(f).at_step(step, zgrad::Applied::Yes))
                }
                None => e,
            }
        })
    }

    fn save_progress(&mut self) -> Result<()> {
        let _local = crate::distributed::LocalPhase::enter(self.agree.comm(), "the checkpoint");
        self.progress.rng = self.rng.state();
        match &self.ctx.options.checkpoint {
            Some(path) if self.ctx.rank == 0 => checkpoint_of(
                &self.learner,
                &self.progress,
                self.config_json,
                self.ctx.backend_name,
            )?
            .save(path),
            _ => Ok(()),
        }
    }

    /// The read-back steps into the metrics.
    fn record(&mut self, reports: &[StepReport]) -> Result<()> {
        for r in reports {
            self.metrics.step(self.progress.epoch + 1, r)?;
        }
        Ok(())
    }

    /// Reads back every step not read back yet into `tally`.
    fn flush(&mut self, tally: &mut Tally) -> Result<()> {
        let t0 = Instant::now();
        let reports = self
            .feed
            .flush(&mut self.learner)
            .map_err(|e| rank_error(self.ctx, e))?;
        // The wait for the steps queued and not read back is training time: the host queues
        // up to a window ahead of the device, so the step calls alone would miss it.
        self.training.add(0, t0.elapsed());
        absorb(tally, &reports);
        self.record(&reports)?;
        if let Some(t) = self.timeline.as_mut() {
            // The read-back waited for every step queued, their events included.
            t.add_readback(self.learner.take_host_phases().readback);
            t.resolve(self.b, 0);
        }
        Ok(())
    }

    /// The stop signal after step `step`: this process's own in a job of one (a flag, read
    /// every step); in a job of several, the one the ranks agree on where a read-back
    /// window completes (the same steps on every rank, so they all stop after the same one).
    /// `drained`: nothing of the run is queued (an epoch's end, or every step in lock-step),
    /// so the agreement is read at once.
    fn signal(&mut self, drained: bool) -> Result<Option<i32>> {
        if self.ctx.world > 1 && !self.feed.settled(&self.learner) {
            return Ok(None);
        }
        self.agree
            .after_step(self.ctx.stop, self.b, self.progress.step, drained)
    }

    /// Every epoch left, or until a stop.
    pub(super) fn all(&mut self, out: &mut Console<'_>) -> Result<Ended> {
        let epochs = self.ctx.config.epochs as u64;
        while self.progress.epoch < epochs {
            if let Some(ended) = self.epoch(out)? {
                return Ok(ended);
            }
        }
        Ok(Ended::Finished)
    }

    /// One epoch (or what is left of it): its steps, then validation, the checkpoint and
    /// the epoch's line. `Some` when the run stops here.
    fn epoch(&mut self, out: &mut Console<'_>) -> Result<Option<Ended>> {
        let (ctx, n_train) = (self.ctx, self.train_set.len());
        let epochs = ctx.config.epochs as u64;
        let order: Vec<usize> = self.progress.order.iter().map(|&i| i as usize).collect();
        let bar = EpochBar::new(
            self.progress.epoch + 1,
            epochs,
            n_train as u64,
            self.progress.position,
            ctx.show_bar,
        );
        let mut tally = Tally::default();
        let rest = &order[(self.progress.position as usize).min(n_train)..];
        self.feed
            .plan(&mut self.learner, rest, ctx.config.batch)
            .map_err(|e| rank_error(ctx, e))?;
        while (self.progress.position as usize) < n_train {
            let start = self.progress.position as usize;
            let chunk = &order[start..(start + ctx.config.batch).min(n_train)];
            if let Some(ended) = self.step(chunk, &mut tally, &bar)? {
                bar.finish();
                return Ok(Some(ended));
            }
        }
        self.flush(&mut tally)?;
        let rate = bar.samples_per_second(self.progress.position);
        bar.finish();
        let local = crate::distributed::LocalPhase::enter(self.agree.comm(), "validation");
        let val = evaluate(&mut self.learner, &mut self.feed, self.val_set)?;
        drop(local);
        let line = epoch_line(
            self.progress.epoch + 1,
            epochs,
            &tally,
            val.as_ref(),
            rate,
            self.started,
            self.b,
        );
        self.metrics.push(MetricRow {
            kind: "epoch",
            epoch: self.progress.epoch + 1,
            step: self.progress.step,
            train_loss: (tally.samples > 0).then(|| tally.mean_loss()),
            val_loss: val.as_ref().map(Tally::mean_loss),
            val_accuracy: val.as_ref().and_then(Tally::reported_accuracy),
            val_mse: val.and_then(|v| v.regression).map(|r| r.mse),
            val_mae: val.and_then(|v| v.regression).map(|r| r.mae),
            val_pearson: val.and_then(|v| v.regression).map(|r| r.pearson),
            samples_per_second: Some(rate),
            elapsed_s: Some(self.started.elapsed().as_secs_f64()),
            samples: Some(tally.samples),
            ..MetricRow::default()
        })?;
        self.validation = val.or(self.validation);
        self.progress.epoch += 1;
        self.progress.position = 0;
        self.progress.order = epoch_order(n_train, &mut self.rng)
            .iter()
            .map(|&i| i as u64)
            .collect();
        // The checkpoint first: a line that announces the epoch means its checkpoint is there.
        self.save()?;
        out.line(&line);
        if let Some(sig) = self.signal(true)? {
            return Ok(Some(Ended::Signal(sig)));
        }
        let stop = ctx
            .options
            .stop_after
            .is_some_and(|s| self.progress.step >= s);
        Ok((stop && self.progress.epoch < epochs).then_some(Ended::StopAfter))
    }

    /// One step on `chunk`, and what follows it: the checkpoint every --checkpoint-every
    /// steps, --stop-after and signals, each after reading back every step (so exact).
    fn step(
        &mut self,
        chunk: &[usize],
        tally: &mut Tally,
        bar: &EpochBar,
    ) -> Result<Option<Ended>> {
        let ctx = self.ctx;
        let t0 = Instant::now();
        let mark = match self.timeline.as_mut() {
            Some(t) => Some(t.before(self.b)?),
            None => None,
        };
        // The read-back window the ranks agreed on (the whole of it in a job of one).
        self.feed.set_window(self.agree.next_window());
        let reports = self
            .feed
            .step(&mut self.learner, self.train_set, chunk)
            .map_err(|e| rank_error(ctx, e))?;
        let queued = Instant::now();
        self.training.add(chunk.len(), queued - t0);
        if let (Some(t), Some(start)) = (self.timeline.as_mut(), mark) {
            let times = StepTimes {
                step: self.learner.steps(),
                samples: chunk.len(),
                host: queued - t0,
                fill: self.feed.take_fill(),
                phases: self.learner.take_host_phases(),
                ..StepTimes::default()
            };
            t.after(self.b, start, times)?;
            if !reports.is_empty() {
                // A window came back: the steps before its copy are done, later ones as far
                // as the stream has passed them (this one's last event was recorded after it).
                t.resolve(self.b, 1);
            }
        }
        let result = self.after_step(chunk, tally, bar, &reports);
        if let Some(t) = self.timeline.as_mut() {
            t.add_progress(queued.elapsed());
        }
        result
    }

    /// What follows a step: the tally, the checkpoint every --checkpoint-every steps,
    /// --stop-after and signals, each after reading back every step (so exact).
    fn after_step(
        &mut self,
        chunk: &[usize],
        tally: &mut Tally,
        bar: &EpochBar,
        reports: &[StepReport],
    ) -> Result<Option<Ended>> {
        let options = self.ctx.options;
        absorb(tally, reports);
        self.record(reports)?;
        self.progress.step = self.learner.steps();
        self.progress.position += chunk.len() as u64;
        if let Some(s) = self.soak.as_mut().filter(|s| s.due(self.progress.step)) {
            s.samples.push(sample_memory(self.b, self.progress.step));
        }
        // Long steps go lock-step (`signals::Agreement::lock_step`, on the same step on every
        // rank): the step just queued is read back before the stop is asked, so a signal stops
        // the run after the step the device was running, not after one queued behind it.
        let lock_step = self.agree.lock_step();
        if lock_step {
            self.flush(tally)?;
        }
        let t0 = Instant::now();
        let signal = self.signal(lock_step)?;
        // In a job of several the ranks agree once a window through a collective queued behind
        // the window's steps, so this waits for them: training time, as the flush's wait.
        self.training.add(0, t0.elapsed());
        let stop = options.stop_after.is_some_and(|s| self.progress.step >= s);
        let every = options
            .checkpoint_every
            .is_some_and(|e| self.progress.step.is_multiple_of(e));
        if stop || every || signal.is_some() {
            self.flush(tally)?;
            self.save()?;
        }
        if !reports.is_empty() || lock_step || stop || every || signal.is_some() {
            bar.update(self.progress.position, tally.mean_loss(), self.b.in_use());
        }
        if let Some(sig) = signal {
            return Ok(Some(Ended::Signal(sig)));
        }
        let more = (self.progress.position as usize) < self.train_set.len();
        Ok((stop && more).then_some(Ended::StopAfter))
    }
}

/// Adds read-back steps to the epoch's running tally, in step order.
fn absorb(tally: &mut Tally, reports: &[StepReport]) {
    for r in reports {
        tally.add(Tally::of(r.samples, r.loss, 0.0));
    }
}

/// The line that ends an epoch: its running train loss, the validation numbers, the rate,
/// the time so far and the device memory in use.
fn epoch_line<B: MemorySource>(
    epoch: u64,
    epochs: u64,
    tally: &Tally,
    val: Option<&Tally>,
    rate: f64,
    started: Instant,
    b: &B,
) -> String {
    let mut line = format!("epoch {epoch}/{epochs}: ");
    if tally.samples > 0 {
        line += &format!("train loss {:.4} (running)", tally.mean_loss());
    }
    if let Some(v) = val {
        line += &format!(", val loss {:.4} {}", v.mean_loss(), v.metrics_text());
    }
    line += &format!(
        ", {rate:.0} samples/s, {:.1} s, {} memory {}",
        started.elapsed().as_secs_f64(),
        b.kind(),
        Bytes(b.in_use())
    );
    line
}

/// Loss and accuracy over `data` in no-grad mode (`None` for an empty set): on the device when
/// the validation set was put there (`validation_of`), else from the host.
pub(crate) fn evaluate<B: TrainBackend, M: Model<B, f32>>(
    learner: &mut Learner<B, M>,
    feed: &mut Feed<B>,
    data: &Samples,
) -> Result<Option<Tally>> {
    if data.is_empty() {
        return Ok(None);
    }
    let e = if learner.validation_on_device() {
        learner.evaluate_validation()?
    } else {
        feed.evaluate(learner, data)?
    };
    Ok(Some(Tally::of_report(&e)))
}
