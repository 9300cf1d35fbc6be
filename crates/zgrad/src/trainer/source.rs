//! Where a step's batch comes from ([`StepSource`]): host slices (the backend stages them
//! through its own pinned buffers), a [`PinnedBatch`] (uploaded straight from the
//! page-locked memory the caller filled in place), rows of the data set loaded on the device,
//! or the batch a captured step already holds. The step paths see a [`Shard`]: this rank's
//! rows of a host-side batch, which they upload into their own tensors. Where an evaluation's
//! samples come from is an [`EvalSource`].

use super::staging::{Landed, Staging};
use crate::error::{GradError, Result};
use std::borrow::Cow;
use std::ops::Range;
use zcompute::{BTensor, Element, PinnedHost, PinnedSlice, prelude::*};

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

/// A pinned batch as the trainer uses it whatever its backend: its sizes, its rows as a
/// source, and its copies into the landing buffers of the copy stream (`staging.rs`), which
/// need the backend's pinned memory (`PinnedHost`).
pub(super) trait PinnedRows<B: Ops<T>, T: Element> {
    /// `[capacity, S, F]`.
    fn dims(&self) -> [usize; 3];
    /// Target values per sample.
    fn targets(&self) -> usize;
    fn source(&self) -> &dyn Source<B, T>;
    /// Two landing buffers of `shape`.
    fn staging(&self, b: &B, shape: &[usize]) -> Result<Staging<B, T>>;
    /// `Staging::stage` of rows `rows` of this batch.
    fn stage(
        &self,
        staging: &mut Staging<B, T>,
        b: &B,
        rows: Range<usize>,
    ) -> Result<(Landed<B, T>, usize)>;
    /// `Staging::release` of slot `slot`.
    fn release(&self, staging: &Staging<B, T>, b: &B, slot: usize) -> Result<()>;
}

impl<B: PinnedHost<T>, T: Element> PinnedRows<B, T> for PinnedBatch<B, T> {
    fn dims(&self) -> [usize; 3] {
        [self.capacity, self.scales, self.features]
    }

    fn targets(&self) -> usize {
        self.targets
    }

    fn source(&self) -> &dyn Source<B, T> {
        self
    }

    fn staging(&self, b: &B, shape: &[usize]) -> Result<Staging<B, T>> {
        Staging::new(b, shape, self.targets)
    }

    fn stage(
        &self,
        staging: &mut Staging<B, T>,
        b: &B,
        rows: Range<usize>,
    ) -> Result<(Landed<B, T>, usize)> {
        staging.stage(b, self, rows)
    }

    fn release(&self, staging: &Staging<B, T>, b: &B, slot: usize) -> Result<()> {
        staging.release(b, slot)
    }
}

/// A batch in host memory that a step uploads rows of.
pub(super) trait Source<B: Ops<T>, T: Element> {
    /// Values per sample (S x F).
    fn per(&self) -> usize;
    /// Target values per sample (`Task::target_len`).
    fn targets(&self) -> usize;
    /// Rows `rows` as host slices, when the batch lies in ordinary memory (only host slices
    /// do; pinned, landed and resident rows are device-bound).
    fn slices(&self, _rows: Range<usize>) -> Option<(&[T], &[T])> {
        None
    }
    /// Queues rows `rows` of x into `x` and of y into `y` (views of the rows' sizes).
    fn upload(&self, b: &B, rows: Range<usize>, x: &BTensor<B, T>, y: &BTensor<B, T>)
    -> Result<()>;
    /// A host copy of rows `rows` (error paths: locating a non-finite sample): by default
    /// the rows put into fresh device tensors (`[rows, S*F]`, `[rows, targets]`) and read back.
    fn copy(&self, b: &B, rows: Range<usize>) -> Result<(Vec<T>, Vec<T>)> {
        let n = rows.len();
        let (x, y) = (b.zeros(&[n, self.per()])?, b.zeros(&[n, self.targets()])?);
        self.upload(b, rows, &x, &y)?;
        Ok((b.download(&x)?, b.download(&y)?))
    }
}

/// A batch given as host slices: `x` `[n, S, F]`, `y` `[n, ..target shape]`.
pub(super) struct HostSlices<'a, T> {
    pub x: &'a [T],
    pub y: &'a [T],
    pub per: usize,
    /// Target values per sample (`Task::target_len`).
    pub ty: usize,
}

impl<B: Ops<T>, T: Element> Source<B, T> for HostSlices<'_, T> {
    fn per(&self) -> usize {
        self.per
    }

    fn targets(&self) -> usize {
        self.ty
    }

    fn slices(&self, rows: Range<usize>) -> Option<(&[T], &[T])> {
        Some((
            &self.x[rows.start * self.per..rows.end * self.per],
            &self.y[rows.start * self.ty..rows.end * self.ty],
        ))
    }

    fn upload(
        &self,
        b: &B,
        rows: Range<usize>,
        x: &BTensor<B, T>,
        y: &BTensor<B, T>,
    ) -> Result<()> {
        let (xs, ys) = <Self as Source<B, T>>::slices(self, rows).unwrap_or_default();
        b.upload_into(xs, x)?;
        b.upload_into(ys, y)?;
        Ok(())
    }

    fn copy(&self, _: &B, rows: Range<usize>) -> Result<(Vec<T>, Vec<T>)> {
        let (xs, ys) = <Self as Source<B, T>>::slices(self, rows).unwrap_or_default();
        Ok((xs.to_vec(), ys.to_vec()))
    }
}

/// A batch's features and labels on the host, borrowed or copied.
pub(super) type HostRows<'a, T> = (Cow<'a, [T]>, Cow<'a, [T]>);

/// This rank's rows of a batch.
pub(super) struct Shard<'a, B: Ops<T>, T: Element> {
    pub src: &'a dyn Source<B, T>,
    pub rows: Range<usize>,
}

impl<'a, B: Ops<T>, T: Element> Shard<'a, B, T> {
    /// Rows held.
    pub(crate) fn len(&self) -> usize {
        self.rows.len()
    }

    /// The rows as host slices, if the batch lies in ordinary memory.
    pub(crate) fn slices(&self) -> Option<(&'a [T], &'a [T])> {
        self.src.slices(self.rows.clone())
    }

    /// Queues the rows into `x` (`[rows, S, F]` or a view of that size) and `y`.
    pub(crate) fn upload(&self, b: &B, x: &BTensor<B, T>, y: &BTensor<B, T>) -> Result<()> {
        self.src.upload(b, self.rows.clone(), x, y)
    }

    /// The rows on the host: borrowed host slices, or a copy out of pinned or device memory.
    pub(crate) fn host(&self, b: &B) -> Result<HostRows<'a, T>> {
        match self.slices() {
            Some((x, y)) => Ok((Cow::Borrowed(x), Cow::Borrowed(y))),
            None => {
                let (x, y) = self.src.copy(b, self.rows.clone())?;
                Ok((Cow::Owned(x), Cow::Owned(y)))
            }
        }
    }
}

/// A batch held in the backend's pinned host memory, filled in place and uploaded from there
/// by a step from [`StepSource::pinned`] with no host copy:
/// `x` is `[capacity, S, F]`, `y` `[capacity, targets]` (a sample's `Task::target_len` values:
/// one label, or `K` regression values, then a weighted task's weights), both row-major; a
/// step trains on the first `n` samples. Refilling it waits for the upload that last read it
/// (bounded by the device's sync deadline), so a batch in flight is never changed under the
/// copy.
pub struct PinnedBatch<B: PinnedHost<T>, T: Element = f32> {
    x: B::Pinned,
    y: B::Pinned,
    capacity: usize,
    scales: usize,
    features: usize,
    targets: usize,
}

impl<B: PinnedHost<T>, T: Element> std::fmt::Debug for PinnedBatch<B, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedBatch")
            .field("capacity", &self.capacity)
            .field("scales", &self.scales)
            .field("features", &self.features)
            .field("targets", &self.targets)
            .finish_non_exhaustive()
    }
}

impl<B: PinnedHost<T>, T: Element> PinnedBatch<B, T> {
    /// Pinned room for `capacity` samples of `scales` x `features` values and one target
    /// value each (zeroed): `with_targets` of 1.
    pub fn new(b: &B, capacity: usize, scales: usize, features: usize) -> Result<Self> {
        Self::with_targets(b, capacity, scales, features, 1)
    }

    /// Pinned room for `capacity` samples of `scales` x `features` values and `targets` target
    /// values each (the model's `Task::target_len`; a step of a model of another count is
    /// `BadInput`), zeroed. Refuses an empty shape with `BadInput`; allocation failures come
    /// from the backend.
    pub fn with_targets(
        b: &B,
        capacity: usize,
        scales: usize,
        features: usize,
        targets: usize,
    ) -> Result<Self> {
        let per = scales.checked_mul(features);
        let len = per.and_then(|p| p.checked_mul(capacity));
        let ys = capacity.checked_mul(targets).filter(|&l| l > 0);
        let (Some(len), Some(ys)) = (len.filter(|&l| l > 0), ys) else {
            return Err(GradError::BadInput(format!(
                "a pinned batch of {capacity} x {scales} x {features} with {targets} target values a sample: every size must be positive (and the product fit in memory)"
            )));
        };
        Ok(PinnedBatch {
            x: b.alloc_pinned(len)?,
            y: b.alloc_pinned(ys)?,
            capacity,
            scales,
            features,
            targets,
        })
    }

    /// Samples it holds room for.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// S: scales per sample.
    #[must_use]
    pub fn scales(&self) -> usize {
        self.scales
    }

    /// F: features per scale.
    #[must_use]
    pub fn features(&self) -> usize {
        self.features
    }

    /// Target values per sample.
    #[must_use]
    pub fn targets(&self) -> usize {
        self.targets
    }

    /// Lends `x` (`[capacity, S, F]`) and `y` (`[capacity, targets]`) to `f` to write in place,
    /// after the upload that last read them; returns what `f` returns.
    pub fn fill<R>(&mut self, f: impl FnOnce(&mut [T], &mut [T]) -> R) -> Result<R> {
        let y = &mut self.y;
        Ok(self.x.with_mut(|x| y.with_mut(|y| f(x, y)))??)
    }

    /// Queues rows `rows` into `x` and `y` on the backend's copy stream, after `after` (see
    /// `staging.rs`).
    pub(super) fn stage(
        &self,
        b: &B,
        rows: Range<usize>,
        x: &BTensor<B, T>,
        y: &BTensor<B, T>,
        after: &zcompute::CopyMark,
    ) -> Result<()> {
        let per = Source::<B, T>::per(self);
        b.upload_pinned_beside(&self.x, rows.start * per, x, after)?;
        b.upload_pinned_beside(&self.y, rows.start * self.targets, y, after)?;
        Ok(())
    }
}

impl<B: PinnedHost<T>, T: Element> Source<B, T> for PinnedBatch<B, T> {
    fn per(&self) -> usize {
        self.scales * self.features
    }

    fn targets(&self) -> usize {
        self.targets
    }

    fn upload(
        &self,
        b: &B,
        rows: Range<usize>,
        x: &BTensor<B, T>,
        y: &BTensor<B, T>,
    ) -> Result<()> {
        b.upload_pinned(&self.x, rows.start * Source::<B, T>::per(self), x)?;
        b.upload_pinned(&self.y, rows.start * self.targets, y)?;
        Ok(())
    }

    fn copy(&self, _: &B, rows: Range<usize>) -> Result<(Vec<T>, Vec<T>)> {
        let per = Source::<B, T>::per(self);
        Ok((
            self.x.read(rows.start * per, rows.len() * per)?,
            self.y
                .read(rows.start * self.targets, rows.len() * self.targets)?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::{PinnedBatch, Source};
    use zcompute::{Engine, prelude::*};

    /// A pinned batch refilled while its upload is still queued (the simulator runs the copy
    /// when the stream is waited on, reading host memory then): the refill waits for the
    /// copy, so the device gets the first batch and the next upload the second.
    #[test]
    fn a_refill_waits_for_the_upload_in_flight() {
        let b = Engine::sim(256 << 20).unwrap();
        let mut p = PinnedBatch::new(&b, 4, 2, 3).unwrap();
        p.fill(|x, y| {
            x.fill(1.0);
            y.fill(1.0);
        })
        .unwrap();
        let (x, y) = (b.zeros(&[4, 2, 3]).unwrap(), b.zeros(&[4]).unwrap());
        p.upload(&b, 0..4, &x, &y).unwrap();
        let (dev, stream) = (b.device(), b.device().stream());
        assert!(
            dev.driver().pending_ops(stream) > 0,
            "the upload is in flight"
        );
        p.fill(|x, y| {
            x.fill(2.0);
            y.fill(2.0);
        })
        .unwrap();
        assert_eq!(b.download(&x).unwrap(), vec![1.0; 24]);
        assert_eq!(b.download(&y).unwrap(), vec![1.0; 4]);
        let (x2, y2) = (b.zeros(&[2, 2, 3]).unwrap(), b.zeros(&[2]).unwrap());
        p.upload(&b, 2..4, &x2, &y2).unwrap();
        assert_eq!(b.download(&x2).unwrap(), vec![2.0; 12]);
        assert_eq!(p.copy(&b, 1..2).unwrap(), (vec![2.0; 6], vec![2.0]));
    }
}
