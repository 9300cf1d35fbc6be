//! How the run's steps get their rows: gathered on the device from the training set uploaded
//! once (`queue_rows`), or, when it stays on the host, copied into one of two pinned batches
//! in turn and queued from there (`queue_pinned`: the host stages step k + 1 while the device
//! runs step k); either way read back every `--readback-every` steps. The rows are the
//! data-order generator's, so both give the losses of `train_batch` on the same rows, bit for
//! bit, and a checkpoint of one resumes in the other.

use std::time::{Duration, Instant};

use zgrad::{Model, PinnedBatch, StepReport, Task};

use super::Samples;
use crate::fit::learner::Learner;
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
    pub fn new<M: Model<B, f32>>(
        learner: &mut Learner<B, M>,
        train_set: &Samples,
        on_device: bool,
        batch: usize,
        every: usize,
    ) -> zgrad::Result<Feed<B>> {
        if on_device {
            let rows = train_set.rows();
            learner.load_training(&rows.x, &rows.y, train_set.len())?;
            return Ok(Feed::Device { every });
        }
        let b = learner.backend();
        let batch = batch.min(train_set.len()).max(1);
        let (scales, features) = train_set.shape();
        let one = || PinnedBatch::new(b, batch, scales, features);
        Ok(Feed::Host {
            every,
            staging: Box::new([one()?, one()?]),
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
                        y[i] = train_set.copy(r, &mut x[i * per..(i + 1) * per]);
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

    /// Host bytes of the pinned batches (features and a label per sample; 0 on the device).
    #[must_use]
    pub fn staging_bytes(&self) -> u64 {
        match self {
            Feed::Host { staging, .. } => staging
                .iter()
                .map(|b| (b.capacity() * (b.scales() * b.features() + 1) * 4) as u64)
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
        &self,
        learner: &mut Learner<B, M>,
        train_set: &Samples,
    ) -> zgrad::Result<zgrad::EvalReport> {
        match self {
            Feed::Device { .. } => learner.evaluate_loaded(),
            Feed::Host { .. } => evaluate_samples(learner, train_set),
        }
    }
}

/// Loss and accuracy over `samples` from the host: `evaluate` of the rows; windows cut a chunk
/// at a time (`eval_batch` windows, the chunks `evaluate` itself takes, so the logits and the
/// report are bitwise `evaluate`'s of the pre-cut windows), or all at once in a job of several
/// ranks (each evaluates its shard of them).
pub fn evaluate_samples<B: TrainBackend, M: Model<B, f32>>(
    learner: &mut Learner<B, M>,
    samples: &Samples,
) -> zgrad::Result<zgrad::EvalReport> {
    let windows = match samples {
        // The sums below are a binary classifier's (BCE, accuracy): another task's windows
        // are cut whole and evaluated by the model's own metrics.
        Samples::Windows(w) if learner.world() == 1 && learner.model().task() == Task::binary() => {
            w
        }
        _ => {
            let rows = samples.rows();
            return learner.evaluate(&rows.x, &rows.y);
        }
    };
    let n = windows.len;
    let chunk = learner.config().eval_batch.max(1);
    let per = windows.sample_width();
    // One chunk of windows, labels and logits at a time (`held::eval_chunk_bytes`).
    let (mut x, mut labels) = (vec![0.0; chunk.min(n) * per], vec![0.0; chunk.min(n)]);
    let mut sums = Sums::default();
    for start in (0..n).step_by(chunk) {
        let len = chunk.min(n - start);
        for (i, label) in labels[..len].iter_mut().enumerate() {
            *label = windows.copy(start + i, &mut x[i * per..(i + 1) * per]);
        }
        let logits = learner.predict(&x[..len * per], len)?;
        sums.add(&logits, &labels[..len]);
    }
    Ok(sums.report())
}

/// Running sums of BCE-with-logits and correct predictions, added in sample order in `f64`:
/// zgrad's formula for `evaluate` (`trainer/eval.rs`), term for term, so the two agree bitwise
/// however the samples are chunked.
#[derive(Default)]
struct Sums {
    loss: f64,
    correct: usize,
    samples: usize,
}

impl Sums {
    fn add(&mut self, logits: &[f32], y: &[f32]) {
        for (&l, &t) in logits.iter().zip(y) {
            let (l, t) = (f64::from(l), f64::from(t));
            self.loss += l.max(0.0) - l * t + (-l.abs()).exp().ln_1p();
            if (l > 0.0) == (t > 0.5) {
                self.correct += 1;
            }
        }
        self.samples += y.len();
    }

    fn report(&self) -> zgrad::EvalReport {
        let denom = self.samples.max(1) as f64;
        zgrad::EvalReport {
            loss: self.loss / denom,
            accuracy: self.correct as f64 / denom,
            samples: self.samples,
            // A binary classifier (its `Model::task`): no regression metrics.
            regression: None,
        }
    }
}
