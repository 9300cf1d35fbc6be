//! Where a step's batch comes from ([`StepSource`]): host slices (the backend stages them
//! through its own pinned buffers), a [`PinnedBatch`] (uploaded straight from the
//! page-locked memory the caller filled in place), rows of the data set loaded on the device,
//! or the batch a captured step already holds. The step paths see a `Shard` (`crate::batch`):
//! this rank's rows of a host-side batch, which they upload into their own tensors. Where an
//! evaluation's samples come from is an [`EvalSource`]; what `Trainer::load` puts on the device
//! is a [`Load`].

use crate::batch::{PinnedBatch, PinnedRows};
use zcompute::{Element, PinnedHost, prelude::*};

/// Where a step from the held batch (`StepSource::held`) is: just before or just after it queued the replay of
/// the captured batched step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayMark {
    /// The learning rate and step count are in place; nothing of the step is queued yet.
    Before,
    /// The whole step (forward, backward, norm, gated AdamW) is queued; nothing was read back.
    After,
}

/// Where the rows of one optimiser step come from (`Trainer::step`, `Trainer::queue`).
pub struct StepSource<'a, B: Ops<T>, T: Element>(pub(super) From<'a, B, T>);

impl<B: Ops<T>, T: Element> std::fmt::Debug for StepSource<'_, B, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            From::Host { batch, .. } => write!(f, "StepSource::host({batch} rows)"),
            From::Pinned { n, .. } => write!(f, "StepSource::pinned({n} rows)"),
            From::Loaded(rows) => write!(f, "StepSource::loaded({} rows)", rows.len()),
            From::Held(_) => write!(f, "StepSource::held"),
        }
    }
}

/// The sources, as the trainer dispatches them.
pub(super) enum From<'a, B: Ops<T>, T: Element> {
    Host {
        x: &'a [T],
        y: &'a [T],
        batch: usize,
    },
    Pinned {
        batch: &'a dyn PinnedRows<B, T>,
        n: usize,
    },
    Loaded(&'a [usize]),
    Held(Box<dyn FnMut(ReplayMark) + 'a>),
}

impl<'a, B: Ops<T>, T: Element> StepSource<'a, B, T> {
    /// `batch` samples in host memory: `x` `[batch, ..sample shape]` row-major (`[batch, S, F]`
    /// for XAsset; a sample the model cannot take, `Model::sample_shape`, is `BadInput`), `y`
    /// their targets (`Task::target_len` values each; binary: labels in {0, 1}).
    #[must_use]
    pub fn host(x: &'a [T], y: &'a [T], batch: usize) -> Self {
        StepSource(From::Host { x, y, batch })
    }

    /// Rows `rows` (the global batch) of the data set `Trainer::load(Load::Training)` put on the device:
    /// each rank of a data-parallel job gathers its shard there.
    #[must_use]
    pub fn loaded(rows: &'a [usize]) -> Self {
        StepSource(From::Loaded(rows))
    }

    /// The batch the captured batched step already holds on the device (the static inputs as
    /// the last host or pinned step filled them): nothing is uploaded but the `[lr, t, gate]`
    /// slot, before `ReplayMark::Before`. `mark` is called just before and just after the
    /// replay is queued (record timing events on the engine stream there). Refused with
    /// `BadInput` (nothing applied) before a batched step was captured.
    #[must_use]
    pub fn held(mark: impl FnMut(ReplayMark) + 'a) -> Self {
        StepSource(From::Held(Box::new(mark)))
    }
}

impl<'a, B: PinnedHost<T>, T: Element> StepSource<'a, B, T> {
    /// The first `n` samples of `batch`, uploaded straight from its pinned memory (no host
    /// copy: fill it in place with [`PinnedBatch::fill`]): the same device work and results
    /// as `host` on the same values, bit for bit. An `n` of 0 or above the batch's capacity,
    /// or samples `[S, F]` the model does not take as they are, is `BadInput`.
    #[must_use]
    pub fn pinned(batch: &'a PinnedBatch<B, T>, n: usize) -> Self {
        StepSource(From::Pinned { batch, n })
    }
}

/// Where the samples of an evaluation come from (`Trainer::evaluate`).
#[derive(Clone, Copy, Debug)]
pub enum EvalSource<'a, T> {
    /// Samples in host memory: `x` `[n, ..sample shape]` row-major, `y` their targets
    /// (`Task::target_len` values per sample; binary: one label per sample).
    Host(&'a [T], &'a [T]),
    /// The validation set `Trainer::load(Load::Validation)` put on the device: every chunk
    /// captured once per chunk shape and replayed (eagerly with capture off or after a failed
    /// capture).
    Validation,
    /// The training set `Trainer::load(Load::Training)` put on the device, evaluated where
    /// it lies, eagerly (it runs once, at the end of a run).
    Loaded,
}

/// What `Trainer::load` puts on the device: a data set (the training set the loaded steps
/// and `EvalSource::Loaded` read, or the validation set of `EvalSource::Validation`), each
/// `x` `[n, ..sample shape]` row-major and `y` its `n` samples' targets (`Task::target_len`
/// values each), or the order of the training set's rows the next queued steps take.
#[derive(Clone, Copy, Debug)]
pub enum Load<'a, T> {
    /// The training set, uploaded once for `StepSource::loaded` and `EvalSource::Loaded`.
    Training { x: &'a [T], y: &'a [T], n: usize },
    /// The validation set, uploaded once (in data parallel, this rank's shard of it) for
    /// `EvalSource::Validation`.
    Validation { x: &'a [T], y: &'a [T], n: usize },
    /// The rows the next queued steps of the loaded training set will take: `order` in
    /// chunks of `batch` rows (the last may be shorter), as a training loop walks an epoch's
    /// order; see `Trainer::load`.
    Order { order: &'a [usize], batch: usize },
}
