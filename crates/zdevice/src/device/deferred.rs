//! Releases the device performs later. An owner tearing down (an arena) must not free memory
//! that queued work may still touch, so it waits for the stream first; when that wait times
//! out and the device is not lost, it hands its memory and pools to the device instead of
//! leaking them. The device performs them after a later successful
//! [`Device::synchronize`] of that stream, or, when its last handle drops, after one more
//! bounded drain; what still cannot be released then (or on a lost device) is left to the
//! process with a warning. No wait here is without the sync deadline.

use std::sync::{Arc, Mutex};

use crate::driver::Driver;
use crate::error::{DeviceError, DeviceResult};
use crate::types::{DevicePtr, MemPool, Stream};

use super::Device;

/// One release handed to the device with [`Device::release_after_drain`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// `cuMemFree` of memory from [`Device::alloc`].
    Free(DevicePtr),
    /// `cuMemFreeAsync` of pool memory, in the stream's order.
    FreeAsync(DevicePtr),
    /// `cuMemPoolDestroy`, once the stream-ordered frees before it in the same list have run.
    DestroyPool(MemPool),
}

/// Releases waiting for their stream to drain, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Deferred {
    waiting: Mutex<Vec<(Stream, Vec<Release>)>>,
}

impl Deferred {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(Stream, Vec<Release>)>> {
        self.waiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn push(&self, stream: Stream, releases: Vec<Release>) {
        if !releases.is_empty() {
            self.lock().push((stream, releases));
        }
    }

    /// Takes every release waiting on `stream`, in the order they were handed over.
    fn take(&self, stream: Stream) -> Vec<Release> {
        let mut waiting = self.lock();
        if waiting.is_empty() {
            return Vec::new();
        }
        let (mine, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut *waiting)
            .into_iter()
            .partition(|(s, _)| *s == stream);
        *waiting = rest;
        mine.into_iter().flat_map(|(_, r)| r).collect()
    }

    /// The streams with releases waiting.
    fn streams(&self) -> Vec<Stream> {
        let mut streams: Vec<Stream> = self.lock().iter().map(|(s, _)| *s).collect();
        streams.dedup();
        streams
    }

    /// How many releases wait.
    pub(crate) fn len(&self) -> usize {
        self.lock().iter().map(|(_, r)| r.len()).sum()
    }
}

impl<D: Driver> Device<D> {
    /// Waits (bounded by the sync deadline) for the work queued on `stream`, then performs
    /// `releases` in order. If the wait fails and the device is not lost, the device keeps
    /// them and performs them after a later successful [`Device::synchronize`] of `stream`,
    /// or when its last handle drops (after one more bounded drain): memory queued work may
    /// still touch is never freed early, and never leaked while the device lives. Returns the
    /// wait's error when the releases were not performed now (`DeviceLost`: they are left to
    /// the process).
    pub fn release_after_drain(&self, stream: Stream, releases: Vec<Release>) -> DeviceResult<()> {
        if releases.is_empty() {
            return Ok(());
        }
        match self.drain(stream) {
            Ok(()) => {
                self.perform(stream, releases);
                Ok(())
            }
            Err(e) => {
                if self.lost_reason().is_some() {
                    tracing::warn!(target: "zdevice.device.release", error = %e, n = releases.len(), "device lost: memory left to the process");
                } else {
                    tracing::warn!(target: "zdevice.device.release", error = %e, n = releases.len(), "stream still busy: releases deferred to its next successful synchronize");
                    self.inner.deferred.push(stream, releases);
                }
                Err(e)
            }
        }
    }

    /// How many releases wait for their stream to drain (see [`Device::release_after_drain`]).
    #[must_use]
    pub fn deferred_releases(&self) -> usize {
        self.inner.deferred.len()
    }

    /// After a successful wait on `stream`: performs what waited on it.
    pub(crate) fn after_drained(&self, stream: Stream) {
        let releases = self.inner.deferred.take(stream);
        if !releases.is_empty() {
            tracing::info!(target: "zdevice.device.release", n = releases.len(), "stream drained: performing deferred releases");
            self.perform(stream, releases);
        }
    }

    /// Performs `releases` (their stream has drained). A release refused because a capture
    /// began meanwhile waits again, with those after it; other failures are logged (a release
    /// has nowhere else to report them); on a lost device the rest is left to the process.
    fn perform(&self, stream: Stream, releases: Vec<Release>) {
        let mut frees_queued = false;
        for (i, release) in releases.iter().enumerate() {
            let done = match *release {
                Release::Free(ptr) => self.free(ptr),
                Release::FreeAsync(ptr) => {
                    frees_queued = true;
                    self.free_async(ptr, stream)
                }
                Release::DestroyPool(pool) => {
                    // The pool goes once the frees queued before it have run.
                    let drained = if frees_queued {
                        self.drain(stream)
                    } else {
                        Ok(())
                    };
                    frees_queued = false;
                    drained.and_then(|()| {
                        self.refuse_during_capture(
                            "cuMemPoolDestroy",
                            "destroy pools after the capture",
                        )?;
                        self.call(|d| d.mem_pool_destroy(pool))
                    })
                }
            };
            match done {
                Ok(()) => {}
                Err(DeviceError::DeviceLost { reason }) => {
                    tracing::warn!(target: "zdevice.device.release", %reason, n = releases.len() - i, "device lost: memory left to the process");
                    return;
                }
                Err(e) if self.lost_reason().is_some() => {
                    tracing::warn!(target: "zdevice.device.release", error = %e, n = releases.len() - i, "device lost: memory left to the process");
                    return;
                }
                Err(e @ (DeviceError::CaptureIllegal { .. } | DeviceError::Timeout { .. })) => {
                    tracing::warn!(target: "zdevice.device.release", error = %e, "release deferred again");
                    self.inner.deferred.push(stream, releases[i..].to_vec());
                    return;
                }
                Err(e) => {
                    tracing::warn!(target: "zdevice.device.release", error = %e, ?release, "deferred release failed");
                }
            }
        }
    }

    /// The last handle is going: one bounded drain of each stream with releases waiting, then
    /// the releases; what still waits is left to the process.
    pub(crate) fn release_at_close(&self) {
        for stream in self.inner.deferred.streams() {
            if self.lost_reason().is_none() && self.drain(stream).is_ok() {
                self.after_drained(stream);
            }
        }
        let left = self.inner.deferred.take_all();
        if left > 0 {
            tracing::warn!(target: "zdevice.device.close", n = left, "the stream did not drain before the device closed: memory left to the process");
        }
    }
}

impl Deferred {
    /// Drops every waiting release; returns how many there were.
    fn take_all(&self) -> usize {
        let all = std::mem::take(&mut *self.lock());
        all.iter().map(|(_, r)| r.len()).sum()
    }
}

impl<D: Driver> Drop for Device<D> {
    fn drop(&mut self) {
        // The last handle (no weak ones exist, so none can be made meanwhile): perform what
        // waits while the device can still do it.
        if Arc::strong_count(&self.inner) == 1 && self.inner.deferred.len() > 0 {
            self.release_at_close();
        }
    }
}

#[cfg(test)]
#[path = "deferred_tests.rs"]
mod tests;
