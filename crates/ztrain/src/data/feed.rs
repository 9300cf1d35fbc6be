//! How the run's steps get their rows: gathered on the device from the training set uploaded
//! once (`queue_rows`), or, when it stays on the host, copied into one of two pinned batches
//! in turn and queued from there (`queue_pinned`: the host stages step k + 1 while the device
//! runs step k); either way read back every `--readback-every` steps. The rows are the
//! data-order generator's, so both give the losses of `train_batch` on the same rows, bit for
//! bit, and a checkpoint of one resumes in the other.

use std::time::{Duration, Instant};

use zgrad::{PinnedBatch, StepReport, Trainer};

use super::Dataset;
use crate::step::TrainBackend;

/// Where the rows come from.
pub enum Feed<B: TrainBackend> {
    /// The training set on the host, staged in two pinned batches used in turn (`next` is
    /// the one the next step fills); reports read back every `every` steps.
    Host {
        every: usize,
        staging: Box<[PinnedBatch<B>; 2]>,
        next: usize,
        /// Host time spent filling the pinned batches, until taken (`take_fill`).
        filled: Duration,
    },
    /// The training set on the device; reports read back every `every` steps.
    Device { every: usize },
}

impl<B: TrainBackend> std::fmt::Debug for Feed<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Feed::Host { every, .. } => write!(f, "Feed::Host {{ every: {every} }}"),
            Feed::Device { every } => write!(f, "Feed::Device {{ every: {every} }}"),
        }
    }
}

impl<B: TrainBackend> Feed<B> {
    /// Puts `train_set` on the device (`on_device`), else makes the two pinned batches of
    /// `batch` samples each; out of memory is the backend's error, nothing trained yet.
    pub fn new(
        learner: &mut Trainer<B>,
        train_set: &Dataset,
        on_device: bool,
        batch: usize,
        every: usize,
    ) -> zgrad::Result<Feed<B>> {
        if on_device {
            learner.load_data(&train_set.x, &train_set.y, train_set.len())?;
            return Ok(Feed::Device { every });
        }
        let b = learner.backend();
        let batch = batch.min(train_set.len()).max(1);
        let one = || PinnedBatch::new(b, batch, train_set.scales, train_set.features);
        Ok(Feed::Host {
            every,
            staging: Box::new([one()?, one()?]),
            next: 0,
            filled: Duration::ZERO,
        })
    }

    /// One step on the samples `rows` of `train_set`: the reports that are known now (the
    /// window's, when this step fills it).
    pub fn step(
        &mut self,
        learner: &mut Trainer<B>,
        train_set: &Dataset,
        rows: &[usize],
    ) -> zgrad::Result<Vec<StepReport>> {
        match self {
            Feed::Host {
                every,
                staging,
                next,
                filled,
            } => {
                let t0 = Instant::now();
                let batch = &mut staging[*next];
                *next = 1 - *next;
                let per = train_set.sample_width();
                // Waits only for the copy that last read this batch (two steps ago).
                batch.fill(|x, y| {
                    for (i, &r) in rows.iter().enumerate() {
                        x[i * per..(i + 1) * per]
                            .copy_from_slice(&train_set.x[r * per..(r + 1) * per]);
                        y[i] = train_set.y[r];
                    }
                })?;
                *filled += t0.elapsed();
                learner.queue_pinned(batch, rows.len(), *every)
            }
            Feed::Device { every } => learner.queue_rows(rows, *every),
        }
    }

    /// Tells the learner the rows the next steps take (`rest`, the epoch's order from the
    /// position on, in steps of `batch`): on the device its steps then find their indices
    /// there, put up once a read-back window (`Trainer::plan_rows`). From the host: nothing.
    pub fn plan(
        &self,
        learner: &mut Trainer<B>,
        rest: &[usize],
        batch: usize,
    ) -> zgrad::Result<()> {
        match self {
            Feed::Device { .. } => learner.plan_rows(rest, batch),
            Feed::Host { .. } => Ok(()),
        }
    }

    /// Host time spent filling pinned batches since the last call.
    pub fn take_fill(&mut self) -> Duration {
        match self {
            Feed::Host { filled, .. } => std::mem::take(filled),
            Feed::Device { .. } => Duration::ZERO,
        }
    }

    /// Every step not read back yet.
    pub fn flush(&self, learner: &mut Trainer<B>) -> zgrad::Result<Vec<StepReport>> {
        learner.drain()
    }

    /// Whether the last step completed a read-back window (or nothing is queued): the same
    /// steps on every rank of a job, so the ranks agree on stops there, once a window.
    #[must_use]
    pub fn settled(&self, learner: &Trainer<B>) -> bool {
        learner.filling() == 0
    }

    /// Loss and accuracy over the training set: on the device from the loaded copy, with no
    /// second upload (bitwise `evaluate`'s; each rank its shard in data parallel), else
    /// `evaluate` of the host copy.
    pub fn evaluate_train(
        &self,
        learner: &Trainer<B>,
        train_set: &Dataset,
    ) -> zgrad::Result<zgrad::EvalReport> {
        match self {
            Feed::Device { .. } => learner.evaluate_loaded(),
            Feed::Host { .. } => learner.evaluate(&train_set.x, &train_set.y),
        }
    }
}
