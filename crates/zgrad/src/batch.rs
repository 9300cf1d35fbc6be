//! A step's rows in host memory as the trainer's step paths see them: a [`Source`] of rows
//! (host slices, a [`PinnedBatch`] the caller fills in place, and the trainer's own landing
//! buffers and resident set), and a [`Shard`], this rank's rows of one, which a step uploads
//! into its own tensors.

use crate::error::{GradError, Result};
use std::borrow::Cow;
use std::ops::Range;
use zcompute::{BTensor, Element, PinnedHost, PinnedSlice, prelude::*};

/// A batch in host memory that a step uploads rows of.
pub(crate) trait Source<B: Ops<T>, T: Element> {
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
pub(crate) struct HostSlices<'a, T> {
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
pub(crate) type HostRows<'a, T> = (Cow<'a, [T]>, Cow<'a, [T]>);

/// This rank's rows of a batch.
pub(crate) struct Shard<'a, B: Ops<T>, T: Element> {
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
/// by a step from `StepSource::pinned` with no host copy:
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
    pub(crate) fn stage(
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
