//! A batch the caller fills in place in the backend's pinned host memory ([`PinnedBatch`]).

use super::rows::Source;
use crate::error::{GradError, Result};
use std::ops::Range;
use zcompute::{BTensor, Element, PinnedHost, PinnedSlice};

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
