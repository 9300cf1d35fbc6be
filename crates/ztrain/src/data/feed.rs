//! How the run's steps get their rows: copied from the host data set and uploaded every step
//! (`train_batch`, read back every step), or gathered on the device from the training set
//! uploaded once (`queue_rows`, read back every `--readback-every` steps). Either way the
//! rows are the data-order generator's, so the two give the same losses, bit for bit, and a
//! checkpoint of one resumes in the other.

use zgrad::{StepReport, Trainer};

use super::Dataset;
use crate::step::TrainBackend;

/// Where the rows come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feed {
    /// Host rows uploaded every step.
    Host,
    /// The training set on the device; reports read back every `every` steps.
    Device { every: usize },
}

impl Feed {
    /// Puts `train_set` on the device for `Device` (out of memory there is the backend's
    /// error, nothing trained yet).
    pub fn load<B: TrainBackend>(
        self,
        learner: &mut Trainer<B>,
        train_set: &Dataset,
    ) -> zgrad::Result<Feed> {
        if let Feed::Device { .. } = self {
            learner.load_data(&train_set.x, &train_set.y, train_set.len())?;
        }
        Ok(self)
    }

    /// One step on the samples `rows` of `train_set`: the reports that are known now (the
    /// host path's at once; the device path's when its window fills).
    pub fn step<B: TrainBackend>(
        self,
        learner: &mut Trainer<B>,
        train_set: &Dataset,
        rows: &[usize],
    ) -> zgrad::Result<Vec<StepReport>> {
        match self {
            Feed::Host => {
                let (x, y) = train_set.gather(rows);
                Ok(vec![learner.train_batch(&x, &y, rows.len())?])
            }
            Feed::Device { every } => learner.queue_rows(rows, every),
        }
    }

    /// Every step not read back yet (none on the host path).
    pub fn flush<B: TrainBackend>(
        self,
        learner: &mut Trainer<B>,
    ) -> zgrad::Result<Vec<StepReport>> {
        match self {
            Feed::Host => Ok(Vec::new()),
            Feed::Device { .. } => learner.drain(),
        }
    }

    /// Whether every step so far has been read back (the ranks of a job agree on stops only
    /// there, so the check costs no extra round trip).
    #[must_use]
    pub fn settled<B: TrainBackend>(self, learner: &Trainer<B>) -> bool {
        learner.queued() == 0
    }

    /// Loss and accuracy over the training set: on the device from the loaded copy for one
    /// process (bitwise `evaluate`'s), else `evaluate` of the host copy.
    pub fn evaluate_train<B: TrainBackend>(
        self,
        learner: &Trainer<B>,
        train_set: &Dataset,
        world: usize,
    ) -> zgrad::Result<zgrad::EvalReport> {
        match self {
            Feed::Device { .. } if world == 1 => learner.evaluate_loaded(),
            _ => learner.evaluate(&train_set.x, &train_set.y),
        }
    }
}
