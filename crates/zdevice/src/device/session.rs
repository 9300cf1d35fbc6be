//! The device's capture session: the one owner of capture state in the engine.
//!
//! A capture goes through phases, and every layer reads them here instead of keeping its own
//! copy: zcompute opens a [`CaptureSession`] for its warm-up, zmem hangs the reservation the
//! captured run allocates from on it ([`Device::route_capture_memory`]), and the device's own
//! guard ([`super::StreamCapture`]) marks the stream capturing. The phase is what the book
//! holds, in order of precedence:
//!
//! | phase | when | what it means |
//! |---|---|---|
//! | [`CapturePhase::Capturing`] | a stream captures | synchronous calls are refused; allocations come from the routed reservation or fail |
//! | [`CapturePhase::Reserved`] | a reservation is routed | allocations of its arena come from it |
//! | [`CapturePhase::WarmUp`] | a session is open | work runs for real; uploads, syncs and step changes are refused above |
//! | [`CapturePhase::Idle`] | none of these | eager |
//!
//! The book sits behind the gate's mutex; its phase and the owner of the routed reservation
//! are published to a [`CaptureWatch`] (atomics, written only with the book locked) for the
//! allocators' lock-free fast paths.

use std::any::Any;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::thread::ThreadId;
use std::time::Duration;

use crate::driver::Driver;
use crate::error::{DeviceError, DeviceResult};
use crate::types::Stream;

use super::Device;

/// Where the device's capture session is (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CapturePhase {
    /// No capture under way.
    Idle,
    /// A session is open, no reservation routed, no stream capturing: a capture's warm-up.
    WarmUp,
    /// A reservation is routed; no stream captures (yet, or any more).
    Reserved,
    /// A stream captures.
    Capturing,
}

impl CapturePhase {
    fn from_u8(v: u8) -> CapturePhase {
        match v {
            1 => CapturePhase::WarmUp,
            2 => CapturePhase::Reserved,
            3 => CapturePhase::Capturing,
            _ => CapturePhase::Idle,
        }
    }
}

/// Memory an allocator routes a capture's allocations to, as that allocator made it (zmem's
/// reservation); the device only carries it, tagged with its owner.
pub type CaptureMemory = Arc<dyn Any + Send + Sync>;

/// The capture session's book: the one place capture state is kept.
#[derive(Default)]
pub(crate) struct SessionBook {
    /// The capturing stream and the thread that began the capture (one capture at a time).
    pub(crate) stream: Option<(Stream, ThreadId)>,
    /// Threads between entering and leaving a stream/event query.
    pub(crate) polls: usize,
    /// Whether a [`CaptureSession`] is open.
    pub(crate) session: bool,
    /// The reservation allocations are routed to, and its owner's tag.
    pub(crate) routed: Option<(u64, CaptureMemory)>,
    /// The slowest call that queued work during the active capture, and how long it took.
    pub(crate) slowest: Option<(&'static str, Duration)>,
}

impl SessionBook {
    pub(crate) fn phase(&self) -> CapturePhase {
        if self.stream.is_some() {
            CapturePhase::Capturing
        } else if self.routed.is_some() {
            CapturePhase::Reserved
        } else if self.session {
            CapturePhase::WarmUp
        } else {
            CapturePhase::Idle
        }
    }
}

impl std::fmt::Debug for SessionBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionBook")
            .field("phase", &self.phase())
            .field("stream", &self.stream)
            .field("polls", &self.polls)
            .field("routed_to", &self.routed.as_ref().map(|(owner, _)| owner))
            .finish_non_exhaustive()
    }
}

/// The session's phase and the owner of the routed reservation, readable without a lock. A
/// read can be stale by one racing transition, as a locked read could be by the time it is
/// used; transitions that matter to a reader are ordered by the reader's own lock.
#[derive(Clone, Debug, Default)]
pub struct CaptureWatch(Arc<WatchCells>);

#[derive(Debug, Default)]
struct WatchCells {
    phase: AtomicU8,
    /// Owner tag of the routed reservation; 0 when none is routed.
    routed_to: AtomicU64,
}

impl CaptureWatch {
    /// The session's phase.
    #[must_use]
    pub fn phase(&self) -> CapturePhase {
        CapturePhase::from_u8(self.0.phase.load(Ordering::Acquire))
    }

    /// Whether a stream captures.
    #[must_use]
    pub fn capturing(&self) -> bool {
        self.phase() == CapturePhase::Capturing
    }

    /// Whether the reservation of `owner` (a non-zero tag) is routed.
    #[must_use]
    pub fn routes_to(&self, owner: u64) -> bool {
        owner != 0 && self.0.routed_to.load(Ordering::Acquire) == owner
    }

    /// Publishes `book`; called with the book locked, after every change.
    pub(crate) fn publish(&self, book: &SessionBook) {
        let owner = book.routed.as_ref().map_or(0, |(owner, _)| *owner);
        self.0.routed_to.store(owner, Ordering::Release);
        self.0.phase.store(book.phase() as u8, Ordering::Release);
    }
}

/// An open capture session (phase [`CapturePhase::WarmUp`] until a reservation is routed or a
/// stream captures). One per device at a time; closed on drop. It stays on the thread that
/// opened it, as the stream capture it frames does.
#[derive(Debug)]
pub struct CaptureSession<'d, D: Driver> {
    device: &'d Device<D>,
    _this_thread: PhantomData<*const ()>,
}

impl<'d, D: Driver> CaptureSession<'d, D> {
    /// The device the session is on.
    #[must_use]
    pub fn device(&self) -> &'d Device<D> {
        self.device
    }
}

impl<D: Driver> Drop for CaptureSession<'_, D> {
    fn drop(&mut self) {
        self.device.update_session(|book| book.session = false);
    }
}

/// A reservation routed to by the device's capture session; unrouted on drop.
#[derive(Debug)]
pub struct RoutedMemory<'d, D: Driver> {
    device: &'d Device<D>,
}

impl<D: Driver> Drop for RoutedMemory<'_, D> {
    fn drop(&mut self) {
        // Dropped after the book's lock is released: the last handle on the memory may give it
        // back to its allocator, which must not run under the gate.
        drop(self.device.update_session(|book| book.routed.take()));
    }
}

impl<D: Driver> Device<D> {
    /// Opens the device's capture session: refused (`CaptureIllegal`) while another is open, a
    /// reservation is routed or a stream captures.
    pub fn open_capture_session(&self) -> DeviceResult<CaptureSession<'_, D>> {
        self.check_lost()?;
        self.update_session(|book| {
            if book.phase() != CapturePhase::Idle {
                return Err(DeviceError::CaptureIllegal {
                    call: "open_capture_session",
                    why: "a capture is already under way on this device; one capture at a time",
                });
            }
            book.session = true;
            Ok(())
        })?;
        Ok(CaptureSession {
            device: self,
            _this_thread: PhantomData,
        })
    }

    /// Routes the capture's allocations to `memory`, the reservation of the allocator tagged
    /// `owner` (non-zero), until the returned guard is dropped. One reservation at a time:
    /// `CaptureIllegal` while another is routed.
    pub fn route_capture_memory(
        &self,
        owner: u64,
        memory: CaptureMemory,
    ) -> DeviceResult<RoutedMemory<'_, D>> {
        if owner == 0 {
            return Err(DeviceError::InvalidArgument {
                call: "route_capture_memory",
                reason: "the owner tag 0 means no owner".into(),
            });
        }
        self.update_session(|book| {
            if book.routed.is_some() {
                return Err(DeviceError::CaptureIllegal {
                    call: "route_capture_memory",
                    why: "another reservation is routed on this device; one at a time",
                });
            }
            book.routed = Some((owner, memory));
            Ok(())
        })?;
        Ok(RoutedMemory { device: self })
    }

    /// The routed reservation, when it is `owner`'s.
    #[must_use]
    pub fn capture_memory(&self, owner: u64) -> Option<CaptureMemory> {
        if !self.inner.gate.watch.routes_to(owner) {
            return None;
        }
        match &self.inner.gate.lock().routed {
            Some((o, mem)) if *o == owner => Some(Arc::clone(mem)),
            _ => None,
        }
    }

    /// The capture session's phase.
    #[must_use]
    pub fn capture_phase(&self) -> CapturePhase {
        self.inner.gate.watch.phase()
    }

    /// A lock-free view of the capture session, for allocators' fast paths.
    #[must_use]
    pub fn capture_watch(&self) -> CaptureWatch {
        self.inner.gate.watch.clone()
    }

    /// Changes the book under its lock, publishes it and wakes held-off threads.
    pub(crate) fn update_session<T>(&self, change: impl FnOnce(&mut SessionBook) -> T) -> T {
        let gate = &self.inner.gate;
        let mut book = gate.lock();
        let r = change(&mut book);
        gate.watch.publish(&book);
        gate.changed.notify_all();
        r
    }
}
