//! How the run's steps get their rows: gathered on the device from the training set uploaded
//! once (`queue_rows`), or, when it stays on the host, copied into a pinned batch and queued
//! from there (`queue_pinned`); either way read back every `--readback-every` steps. Rows held
//! in memory go through two pinned batches in turn (the host stages step k + 1 while step k's
//! copy is in flight; the rows dwarf a batch, so the second costs nothing that counts).
//! Windows cut on the fly and rows streamed from their file go through one, which the next
//! step refills once the copy that read it is done (an event wait) and an evaluation cuts or
//! reads its chunks into, so that the run holds the series (or nothing of the file) and one
//! batch of samples (`held`); in a job of several ranks each rank cuts or reads only its
//! shard of a step's rows and of an evaluated set. The rows are the data-order generator's,
//! so every path gives the losses of a step from a host slice on the same rows, bit for bit, and a
//! checkpoint of one resumes in the other.

use std::time::{Duration, Instant};

use zgrad::{Model, PinnedBatch, StepReport};

use super::Samples;
use crate::error::Result;
use crate::fit::learner::Learner;
use crate::step::TrainBackend;

/// Where the rows come from.
pub enum Feed<B: TrainBackend> {
    /// The training set on the host, staged in pinned batches (`staging_batches` of them,
    /// used in turn; `next` is the one the next step fills); reports read back every
    /// `every` steps.
    Host {
        every: usize,
        staging: Vec<PinnedBatch<B>>,
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
    /// Puts `train_set` on the device (`on_device`), else makes the pinned batches
    /// (`staging_batches`) of `batch` samples each, or of an evaluation chunk of `val_set`
    /// where that is more and is cut into them (`chunked`); out of memory is the backend's
    /// error, nothing trained yet.
    pub fn new<M: Model<B, f32>>(
        learner: &mut Learner<B, M>,
        train_set: &Samples,
        val_set: &Samples,
        on_device: bool,
        batch: usize,
        every: usize,
    ) -> Result<Feed<B>> {
        if on_device {
            let rows = train_set.rows()?;
            learner.load_training(&rows.x, &rows.y, train_set.len())?;
            return Ok(Feed::Device { every });
        }
        let chunk = learner.config().eval_batch.max(1);
        let mut capacity = batch.min(train_set.len());
        for set in [train_set, val_set] {
            if chunked(set) {
                capacity = capacity.max(chunk.min(set.len()));
            }
        }
        let b = learner.backend();
        let (scales, features) = train_set.shape();
        let targets = train_set.targets();
        let staging = (0..staging_batches(train_set))
            .map(|_| PinnedBatch::with_targets(b, capacity.max(1), scales, features, targets))
            .collect::<zgrad::Result<Vec<_>>>()?;
        Ok(Feed::Host {
            every,
            staging,
            next: 0,
            filled: Duration::ZERO,
        })
    }

    /// One step on the samples `rows` of `train_set`: the reports that are known now (the
    /// window's, when this step fills it).
    pub fn step<M: Model<B, f32>>(
        &mut self,
        learner: &mut Learner<B, M>,
        train_set: &Samples,
        rows: &[usize],
    ) -> Result<Vec<StepReport>> {
        match self {
            Feed::Host {
                every,
                staging,
                next,
                filled,
            } => {
                let t0 = Instant::now();
                let turns = staging.len();
                let batch = &mut staging[*next];
                *next = (*next + 1) % turns;
                let (per, t) = (train_set.sample_width(), train_set.targets());
                // Samples cut or read as they are staged: this rank's shard of the rows only,
                // the only rows of the batch its step copies to the device (`Trainer::queue`).
                let mine = if train_set.staged_one_batch_at_a_time() {
                    zgrad::shard(learner.rank(), learner.world(), rows.len())
                } else {
                    0..rows.len()
                };
                // Waits only for the copy that last read this batch (`turns` steps ago).
                batch.fill(|x, y| {
                    train_set.copy_rows(
                        &rows[mine.clone()],
                        &mut x[mine.start * per..mine.end * per],
                        &mut y[mine.start * t..mine.end * t],
                    )
                })??;
                *filled += t0.elapsed();
                Ok(learner.queue_pinned(batch, rows.len(), *every)?)
            }
            Feed::Device { every } => Ok(learner.queue_rows(rows, *every)?),
        }
    }

    /// Reads the next steps back every `every` steps (the ranks' agreed window,
    /// `signals::Agreement::next_window`; never more than the first step's).
    pub fn set_window(&mut self, every: usize) {
        match self {
            Feed::Host { every: e, .. } | Feed::Device { every: e } => *e = every.max(1),
        }
    }

    /// Tells the learner the rows the next steps take (`rest`, the epoch's order from the
    /// position on, in steps of `batch`): on the device its steps then find their indices
    /// there, put up once a read-back window (`Load::Order`). From the host: nothing.
    pub fn plan<M: Model<B, f32>>(
        &self,
        learner: &mut Learner<B, M>,
        rest: &[usize],
        batch: usize,
    ) -> zgrad::Result<()> {
        match self {
            Feed::Device { .. } => learner.plan_rows(rest, batch),
            Feed::Host { .. } => Ok(()),
        }
    }

    /// Host bytes of the pinned batches (features and targets per sample; 0 on the device).
    #[must_use]
    pub fn staging_bytes(&self) -> u64 {
        match self {
            Feed::Host { staging, .. } => staging
                .iter()
                .map(|b| (b.capacity() * (b.scales() * b.features() + b.targets()) * 4) as u64)
                .sum(),
            Feed::Device { .. } => 0,
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
    pub fn flush<M: Model<B, f32>>(
        &self,
        learner: &mut Learner<B, M>,
    ) -> zgrad::Result<Vec<StepReport>> {
        learner.drain()
    }

    /// Whether the last step completed a read-back window (or nothing is queued): the same
    /// steps on every rank of a job, so the ranks agree on stops there, once a window.
    #[must_use]
    pub fn settled<M: Model<B, f32>>(&self, learner: &Learner<B, M>) -> bool {
        learner.filling() == 0
    }

    /// Loss and accuracy over the training set: on the device from the loaded copy, with no
    /// second upload (bitwise `evaluate`'s; each rank its shard in data parallel), else
    /// `evaluate` of the host copy.
    pub fn evaluate_train<M: Model<B, f32>>(
        &mut self,
        learner: &mut Learner<B, M>,
        train_set: &Samples,
    ) -> Result<zgrad::EvalReport> {
        match self {
            Feed::Device { .. } => Ok(learner.evaluate_loaded()?),
            Feed::Host { .. } => self.evaluate(learner, train_set),
        }
    }

    /// The model's loss and metrics over `samples` from the host: `evaluate` of rows in
    /// memory; windows cut and streamed rows read a chunk at a time (this rank's shard of
    /// them, in the chunks `evaluate` itself takes: `Learner::chunked_evaluation` (`ChunkedEval`), so the
    /// report is bitwise `evaluate`'s of the samples held whole) into the first pinned staging
    /// batch once the copy that last read it is done; all at once where they are not
    /// evaluated in chunks (`chunked`).
    pub fn evaluate<M: Model<B, f32>>(
        &mut self,
        learner: &mut Learner<B, M>,
        samples: &Samples,
    ) -> Result<zgrad::EvalReport> {
        if !chunked(samples) {
            let rows = samples.rows()?;
            return Ok(learner.evaluate(&rows.x, &rows.y)?);
        }
        let (n, per, t) = (samples.len(), samples.sample_width(), samples.targets());
        let chunk = learner.config().eval_batch.max(1);
        let mut spare;
        let batch = match self {
            Feed::Host { staging, .. } if staging[0].capacity() >= chunk.min(n) => &mut staging[0],
            // Windows always train from the host (`feed_of`): a batch of their own otherwise.
            _ => {
                let (scales, features) = samples.shape();
                let b = learner.backend();
                spare = PinnedBatch::with_targets(b, chunk.min(n), scales, features, t)?;
                &mut spare
            }
        };
        let mut eval = learner.chunked_evaluation(n)?;
        while let Some(next) = eval.next_chunk() {
            let len = next.len();
            let rows: Vec<usize> = next.collect();
            batch.fill(|x, y| -> Result<()> {
                samples.copy_rows(&rows, &mut x[..len * per], &mut y[..len * t])?;
                learner.evaluate_chunk(&mut eval, &x[..len * per], &y[..len * t])?;
                Ok(())
            })??;
        }
        Ok(learner.finish_evaluation(eval)?)
    }
}

/// Pinned batches a host feed of `train_set` stages its steps in: two used in turn for rows
/// in memory (the set itself dwarfs them), one for windows cut and rows streamed as they are
/// staged, so that the run holds one batch of them (beside the series).
#[must_use]
pub fn staging_batches(train_set: &Samples) -> usize {
    if train_set.staged_one_batch_at_a_time() {
        1
    } else {
        2
    }
}

/// Whether an evaluation of `samples` cuts or reads them a chunk at a time into the staging
/// batch (`Feed::evaluate`): windows or streamed rows (the staging batch holds the model's
/// targets a sample, one value or `K`), in one process or each rank its shard.
#[must_use]
pub fn chunked(samples: &Samples) -> bool {
    samples.staged_one_batch_at_a_time() && !samples.is_empty()
}
