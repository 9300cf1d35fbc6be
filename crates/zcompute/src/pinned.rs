//! Host memory a backend copies from without staging: page-locked on a device, so a batch is
//! written in place by the caller and then copied straight to the device (`Device::
//! pinned_f32_mut`, `Device::upload_range_async`); plain memory on the CPU backend.
//!
//! A batch can also be staged on a second stream, the *copy stream*
//! ([`PinnedHost::upload_pinned_beside`]), so that its copy runs while the engine stream
//! still runs the step before: the copy waits for a [`CopyMark`] the caller recorded on the
//! engine stream where the copy's destination was last read ([`PinnedHost::mark_engine`]),
//! and the engine stream's later work waits for the copy. Both orders are device events:
//! the host waits for neither.

use crate::backend::BTensor;
use crate::element::Element;
use crate::error::{ComputeError, Result};

/// Host memory of `len` elements that the backend uploads from directly.
pub trait PinnedSlice<T> {
    /// Elements held.
    fn len(&self) -> usize;

    /// Whether it holds no element.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Lends the elements to `f` mutably once the upload that last read them has finished
    /// (an upload still queued is waited for, bounded by the device's sync deadline, so a
    /// refill never changes a batch in flight). Returns what `f` returns.
    fn with_mut<R>(&mut self, f: impl FnOnce(&mut [T]) -> R) -> Result<R>;

    /// A copy of elements `start..start + len` (after the last transfer), for error paths.
    fn read(&self, start: usize, len: usize) -> Result<Vec<T>>;
}

/// A point of the engine stream's queued work that the copy stream can wait for (a device
/// event on a device backend; nothing on the CPU, whose work runs in call order). Made by
/// [`PinnedHost::copy_mark`], recorded by [`PinnedHost::mark_engine`]; a mark never recorded
/// orders nothing. Its event is destroyed when it is dropped.
pub struct CopyMark(Option<Box<dyn std::any::Any>>);

impl CopyMark {
    /// A mark with nothing behind it (the CPU backend's).
    #[must_use]
    pub fn none() -> Self {
        CopyMark(None)
    }

    /// A mark holding a backend's own handle.
    pub(crate) fn of<M: std::any::Any>(handle: M) -> Self {
        CopyMark(Some(Box::new(handle)))
    }

    /// Whether nothing is behind it.
    #[must_use]
    pub fn is_none(&self) -> bool {
        self.0.is_none()
    }

    /// The backend's handle, when the mark holds one of type `M`.
    pub(crate) fn get<M: std::any::Any>(&self) -> Option<&M> {
        self.0.as_ref().and_then(|h| h.downcast_ref())
    }
}

impl std::fmt::Debug for CopyMark {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("CopyMark").field(&self.0.is_some()).finish()
    }
}

/// A backend that uploads from its own host memory ([`PinnedHost::Pinned`]) without an extra
/// host copy. Like `Capture`, a capability on top of the whole op set (`Ops`), so code bounded
/// by it calls any op.
pub trait PinnedHost<T: Element>: crate::Ops<T> {
    type Pinned: PinnedSlice<T>;

    /// `len` elements of host memory to upload from (zeroed). Refused while capturing.
    fn alloc_pinned(&self, len: usize) -> Result<Self::Pinned>;

    /// Queues a copy of `src[start..start + dst.numel()]` into the view `dst` (logical
    /// row-major order), as `upload_into` does for a slice; `src` is not touched by the host
    /// until the copy ran (`PinnedSlice::with_mut` waits). Refused while capturing.
    fn upload_pinned(&self, src: &Self::Pinned, start: usize, dst: &BTensor<Self, T>)
    -> Result<()>;

    /// A new [`CopyMark`] (refused while capturing). The default has nothing behind it.
    fn copy_mark(&self) -> Result<CopyMark> {
        Ok(CopyMark::none())
    }

    /// Records `mark` on the engine stream: a copy told to wait for it
    /// ([`PinnedHost::upload_pinned_beside`]) starts after the engine-stream work queued so
    /// far. Refused while capturing. The default does nothing (work runs in call order).
    fn mark_engine(&self, mark: &CopyMark) -> Result<()> {
        let _ = mark;
        Ok(())
    }

    /// Whether the engine stream has run past where `mark` was last recorded
    /// ([`PinnedHost::mark_engine`]), without waiting: a mark never recorded, or one with
    /// nothing behind it, has been passed. The default is `true` (work runs in call order).
    fn mark_passed(&self, mark: &CopyMark) -> Result<bool> {
        let _ = mark;
        Ok(true)
    }

    /// A [`CopyMark`] that also keeps when the engine stream reached it (a timing event;
    /// record it with [`PinnedHost::mark_engine`]), for [`PinnedHost::elapsed_ms`]. Refused
    /// while capturing. The default has nothing behind it.
    fn timing_mark(&self) -> Result<CopyMark> {
        Ok(CopyMark::none())
    }

    /// Milliseconds of device time between two timing marks recorded on the engine stream,
    /// both complete (after a wait on the device that followed them). `None` where the
    /// backend keeps no device time (the default: the CPU's work has no second timeline).
    fn elapsed_ms(&self, start: &CopyMark, end: &CopyMark) -> Result<Option<f64>> {
        let _ = (start, end);
        Ok(None)
    }

    /// [`PinnedHost::upload_pinned`] on the backend's copy stream: the copy waits (on the
    /// device) for `after` as last recorded by [`PinnedHost::mark_engine`], not for the rest
    /// of the engine stream, and every engine-stream op queued after this call waits for the
    /// copy. So the copy of batch k + 1 into a buffer the engine stream is done with runs
    /// while step k still runs, and step k + 1 reads it complete. `src` is not touched by the
    /// host until the copy ran (`PinnedSlice::with_mut` waits). A strided `dst` is copied on
    /// the engine stream. Refused while capturing. The default is `upload_pinned`.
    fn upload_pinned_beside(
        &self,
        src: &Self::Pinned,
        start: usize,
        dst: &BTensor<Self, T>,
        after: &CopyMark,
    ) -> Result<()> {
        let _ = after;
        self.upload_pinned(src, start, dst)
    }
}

/// The range `start..start + n` of a pinned slice of `len` elements, or `LengthMismatch`.
pub(crate) fn pinned_range(
    op: &'static str,
    len: usize,
    start: usize,
    n: usize,
) -> Result<std::ops::Range<usize>> {
    match start.checked_add(n) {
        Some(end) if end <= len => Ok(start..end),
        _ => Err(ComputeError::LengthMismatch {
            op,
            expected: len.saturating_sub(start),
            got: n,
        }),
    }
}

/// The CPU backend's "pinned" memory: a plain vector (the CPU has nothing to wait for).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostVec<T>(pub(crate) Vec<T>);

impl<T: Element> PinnedSlice<T> for HostVec<T> {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn with_mut<R>(&mut self, f: impl FnOnce(&mut [T]) -> R) -> Result<R> {
        Ok(f(&mut self.0))
    }

    fn read(&self, start: usize, len: usize) -> Result<Vec<T>> {
        let r = pinned_range("pinned_read", self.0.len(), start, len)?;
        Ok(self.0[r].to_vec())
    }
}
