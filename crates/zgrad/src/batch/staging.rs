//! The host path's second stream (issue 21 item 1): when the data set stays on the host, a
//! queued step's rows are copied from the caller's pinned batch into one of two device
//! landing buffers on the backend's copy stream (`PinnedHost::upload_pinned_beside`), while
//! the engine stream still runs the step before. The orders are events only:
//!
//! - the copy of step k into landing buffer `k % 2` waits for that buffer's *free* mark,
//!   recorded on the engine stream after step k - 2 (the last step that read it);
//! - the engine stream waits for the copy before step k copies the landing buffer into its
//!   inputs (a device-to-device copy on the engine stream, the first thing of the step);
//! - the pinned batch is refilled by the host only after its copy ran (`PinnedBatch::fill`
//!   waits for the copy alone, never for a step).
//!
//! So the host never waits on a step, and step k + 1's rows are on the device when it starts.

use super::pinned::PinnedBatch;
use super::rows::Source;
use crate::error::Result;
use std::ops::Range;
use zcompute::{BTensor, CopyMark, Element, PinnedHost, prelude::*};

/// One landing buffer: room for `rows` samples of `sample`, and the engine-stream mark after
/// the last step that read it.
struct Landing<B: Ops<T>, T: Element> {
    x: BTensor<B, T>,
    y: BTensor<B, T>,
    free: CopyMark,
}

/// The two landing buffers, used in turn.
pub(crate) struct Staging<B: Ops<T>, T: Element> {
    slots: Vec<Landing<B, T>>,
    /// `[rows, ..sample]` each slot holds.
    shape: Vec<usize>,
    /// Target values per sample each slot holds (`[rows, targets]`).
    targets: usize,
    next: usize,
}

impl<B: Ops<T>, T: Element> Staging<B, T> {
    /// Whether it holds batches of up to `shape[0]` samples of `shape[1..]` and `targets`
    /// target values each.
    pub(crate) fn holds(&self, shape: &[usize], targets: usize) -> bool {
        self.shape[1..] == shape[1..] && self.shape[0] >= shape[0] && self.targets == targets
    }
}

impl<B: PinnedHost<T>, T: Element> Staging<B, T> {
    /// Two landing buffers of `shape` (`[rows, ..sample]`, persistent) and `[rows, targets]`
    /// target values. Each one's free mark is
    /// recorded at once: memory just allocated may have been read by engine-stream work still
    /// queued, which the first copy into it must follow.
    pub(crate) fn new(b: &B, shape: &[usize], targets: usize) -> Result<Self> {
        let slots = (0..2)
            .map(|_| {
                let landing = Landing {
                    x: crate::memory::persistent_zeros(b, shape)?,
                    y: crate::memory::persistent_zeros(b, &[shape[0], targets])?,
                    free: b.copy_mark()?,
                };
                b.mark_engine(&landing.free)?;
                Ok(landing)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Staging {
            slots,
            shape: shape.to_vec(),
            targets,
            next: 0,
        })
    }

    /// Queues the copy of rows `rows` of `batch` into the next landing buffer on the copy
    /// stream (after that buffer's free mark; the engine stream's later work waits for it),
    /// and returns the buffer as a step's source, and the slot to release after the step.
    pub(crate) fn stage(
        &mut self,
        b: &B,
        batch: &PinnedBatch<B, T>,
        rows: Range<usize>,
    ) -> Result<(Landed<B, T>, usize)> {
        let slot = self.next;
        self.next = 1 - self.next;
        let landing = &self.slots[slot];
        let (x, y) = (
            landing.x.narrow(0, 0, rows.len())?,
            landing.y.narrow(0, 0, rows.len())?,
        );
        batch.stage(b, rows.clone(), &x, &y, &landing.free)?;
        let landed = Landed {
            x,
            y,
            first: rows.start,
            per: Source::<B, T>::per(batch),
            targets: self.targets,
        };
        Ok((landed, slot))
    }

    /// Records slot `slot`'s free mark on the engine stream, after the step that read it.
    pub(crate) fn release(&self, b: &B, slot: usize) -> Result<()> {
        Ok(b.mark_engine(&self.slots[slot].free)?)
    }
}

/// A step's rows in a landing buffer: rows `first..` of the batch, on the device.
pub(crate) struct Landed<B: Ops<T>, T: Element> {
    x: BTensor<B, T>,
    y: BTensor<B, T>,
    first: usize,
    per: usize,
    targets: usize,
}

impl<B: Ops<T>, T: Element> Landed<B, T> {
    fn rows(&self, rows: &Range<usize>) -> Result<(BTensor<B, T>, BTensor<B, T>)> {
        let start = rows.start.saturating_sub(self.first);
        Ok((
            self.x.narrow(0, start, rows.len())?,
            self.y.narrow(0, start, rows.len())?,
        ))
    }
}

impl<B: Ops<T>, T: Element> Source<B, T> for Landed<B, T> {
    fn per(&self) -> usize {
        self.per
    }

    fn targets(&self) -> usize {
        self.targets
    }

    /// A device-to-device copy on the engine stream (which already waits for the landing
    /// copy), into views of the rows' sizes in any shape (the per-sample table's columns are
    /// `[rows, S*F]` and `[rows, 1]`).
    fn upload(
        &self,
        b: &B,
        rows: Range<usize>,
        x: &BTensor<B, T>,
        y: &BTensor<B, T>,
    ) -> Result<()> {
        let (lx, ly) = self.rows(&rows)?;
        b.copy_into(&lx.reshape(x.shape())?, x)?;
        b.copy_into(&ly.reshape(y.shape())?, y)?;
        Ok(())
    }
}

/// A pinned batch as the trainer uses it whatever its backend: its sizes, its rows as a
/// source, and its copies into the landing buffers of the copy stream (below), which
/// need the backend's pinned memory (`PinnedHost`).
pub(crate) trait PinnedRows<B: Ops<T>, T: Element> {
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
        [self.capacity(), self.scales(), self.features()]
    }

    fn targets(&self) -> usize {
        PinnedBatch::targets(self)
    }

    fn source(&self) -> &dyn Source<B, T> {
        self
    }

    fn staging(&self, b: &B, shape: &[usize]) -> Result<Staging<B, T>> {
        Staging::new(b, shape, PinnedBatch::targets(self))
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
