//! Host memory a backend copies from without staging: page-locked on a device, so a batch is
//! written in place by the caller and then copied straight to the device (`Device::
//! pinned_f32_mut`, `Device::upload_range_async`); plain memory on the CPU backend.

use crate::backend::{BTensor, Backend};
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
pub struct HostVec<T>(Vec<T>);

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

impl<T: Element> PinnedHost<T> for crate::cpu::CpuBackend {
    type Pinned = HostVec<T>;

    fn alloc_pinned(&self, len: usize) -> Result<HostVec<T>> {
        Ok(HostVec(vec![T::ZERO; len]))
    }

    fn upload_pinned(&self, src: &HostVec<T>, start: usize, dst: &BTensor<Self, T>) -> Result<()> {
        let r = pinned_range("upload_pinned", src.0.len(), start, dst.numel())?;
        self.upload_into(&src.0[r], dst)
    }
}
