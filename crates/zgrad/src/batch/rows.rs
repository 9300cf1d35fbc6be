//! A batch in host memory as the step paths see it: a [`Source`] of rows and a [`Shard`] of it.

use crate::error::Result;
use std::borrow::Cow;
use std::ops::Range;
use zcompute::{BTensor, Element, prelude::*};

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
