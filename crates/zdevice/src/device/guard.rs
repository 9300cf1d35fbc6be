//! The guards every device call goes through: lost-device latch, the capture session's gate,
//! hold-off of polling threads during capture, deadlines and the watchdog for blocking calls.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::driver::{Driver, DriverError, DriverResult};
use crate::error::{DeviceError, DeviceResult};
use crate::types::{Readiness, Stream};

use super::Device;
use super::session::{CaptureWatch, SessionBook};

/// How long a wait on a driver whose time is real polls before it sleeps between polls (see
/// `poll_until_ready`).
pub const SPIN_BEFORE_SLEEP: Duration = Duration::from_millis(1);

/// The longest sleep between two polls of a wait: a wait sees its work done at most this long
/// (and the OS's timer slack) after it is.
pub const MAX_POLL_SLEEP: Duration = Duration::from_micros(100);

/// How a wait paces its polls: none of them apart for its first `spin` (the thread yields
/// between them), then sleeps doubling from 2 us up to [`MAX_POLL_SLEEP`]. The device's waits
/// and the NCCL communicator's share it.
///
/// The spin window is measured on the clock the caller passes (the driver's): on a real
/// driver that is real time, on the simulated one its virtual clock, so a simulated wait
/// paces the same way however loaded the machine is.
#[derive(Debug)]
pub(crate) struct Pacing {
    spin: Duration,
    sleep: Duration,
    /// The longest sleep once the wait has lasted [`LONG_VIRTUAL_WAIT`] (a virtual clock's).
    long_cap: Duration,
}

/// On a virtual clock, a wait this long is one for work that may never complete.
const LONG_VIRTUAL_WAIT: Duration = Duration::from_millis(10);

impl Pacing {
    pub(crate) fn new(spin: Duration) -> Self {
        Pacing {
            spin,
            sleep: Duration::from_micros(2),
            long_cap: MAX_POLL_SLEEP,
        }
    }

    /// On a virtual clock: sleeps from the start, as [`Pacing::new`]'s do; once the wait has
    /// lasted [`LONG_VIRTUAL_WAIT`] they keep doubling up to a thousandth of `deadline`, so a
    /// wait that lasts to its deadline (work that never completes) takes about a thousand
    /// polls of real time, not a million.
    pub(crate) fn virtual_time(deadline: Duration) -> Self {
        Pacing {
            long_cap: MAX_POLL_SLEEP.max(deadline / 1000),
            ..Pacing::new(Duration::ZERO)
        }
    }

    /// Before the next poll, `elapsed` into the wait on the driver's clock: `None` to poll
    /// again at once (yield the thread first), or how long to sleep.
    pub(crate) fn next(&mut self, elapsed: Duration) -> Option<Duration> {
        if elapsed < self.spin {
            return None;
        }
        let sleep = self.sleep;
        let cap = if elapsed >= LONG_VIRTUAL_WAIT {
            self.long_cap
        } else {
            MAX_POLL_SLEEP
        };
        self.sleep = (self.sleep * 2).min(cap);
        Some(sleep)
    }
}

/// Mutex plus condition variable over the capture session's book, and its lock-free watch.
#[derive(Debug, Default)]
pub(crate) struct CaptureGate {
    pub(crate) book: Mutex<SessionBook>,
    pub(crate) changed: Condvar,
    /// The book's phase, published with `book` locked.
    pub(crate) watch: CaptureWatch,
}

impl CaptureGate {
    pub(crate) fn lock(&self) -> MutexGuard<'_, SessionBook> {
        // A poisoned lock only means another thread panicked while holding it; the book is
        // plain data that stays consistent, so keep going.
        self.book
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Released when a poll finishes, so a capture waiting to begin can proceed.
pub(crate) struct PollTicket<'a> {
    gate: &'a CaptureGate,
}

impl Drop for PollTicket<'_> {
    fn drop(&mut self) {
        let mut book = self.gate.lock();
        book.polls -= 1;
        self.gate.changed.notify_all();
    }
}

impl<D: Driver> Device<D> {
    /// Fails with `DeviceLost` once the device has been lost.
    pub(crate) fn check_lost(&self) -> DeviceResult<()> {
        let lost = self
            .inner
            .lost
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match &*lost {
            Some(reason) => Err(DeviceError::DeviceLost {
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Latches the device as lost (first reason wins).
    pub(crate) fn mark_lost(&self, reason: String) {
        let mut lost = self
            .inner
            .lost
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if lost.is_none() {
            tracing::error!(target: "zdevice.device.lost", %reason, "device lost");
            *lost = Some(reason);
        }
    }

    /// Whether a capture is active on any of this device's streams.
    #[must_use]
    pub fn is_capturing(&self) -> bool {
        // The session's published phase, read without the lock: allocators ask on every
        // allocation. The answer can be stale by one racing begin/end, as the locked read could.
        self.inner.gate.watch.capturing()
    }

    /// Refuses `call` while any stream captures (the guard over the driver's silent rows).
    pub(crate) fn refuse_during_capture(
        &self,
        call: &'static str,
        why: &'static str,
    ) -> DeviceResult<()> {
        if !self
            .inner
            .guard_enabled
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return Ok(());
        }
        if self.is_capturing() {
            tracing::warn!(target: "zdevice.device.capture", call, "refused during capture");
            return Err(DeviceError::CaptureIllegal { call, why });
        }
        Ok(())
    }

    /// Converts a raw driver result, latching the device as lost on a sticky status.
    pub(crate) fn checked<T>(&self, r: DriverResult<T>) -> DeviceResult<T> {
        match r {
            Ok(v) => Ok(v),
            Err(DriverError::Cuda { call, code }) if code.is_sticky() => {
                self.mark_lost(format!("{call} returned sticky {code}"));
                Err(DeviceError::Driver { call, code })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Runs one non-blocking driver call: lost check, status check, sticky latch.
    pub(crate) fn call<T>(&self, f: impl FnOnce(&D) -> DriverResult<T>) -> DeviceResult<T> {
        self.check_lost()?;
        let r = f(&self.inner.driver);
        self.checked(r)
    }

    /// Runs a driver call that queues work on a stream (a launch, a copy, a memset). While a
    /// capture is active it is timed on the driver's clock: the slowest such call is the one
    /// a capture that ends past its deadline names ([`super::StreamCapture::end`]).
    pub(crate) fn call_queued<T>(
        &self,
        call: &'static str,
        f: impl FnOnce(&D) -> DriverResult<T>,
    ) -> DeviceResult<T> {
        if !self.is_capturing() {
            return self.call(f);
        }
        let start = self.inner.driver.now();
        let r = self.call(f);
        let took = self.inner.driver.now().saturating_sub(start);
        let mut book = self.inner.gate.lock();
        if book.slowest.is_none_or(|(_, t)| took > t) {
            book.slowest = Some((call, took));
        }
        r
    }

    /// Runs a driver call that may block inside the driver (allocations, module loads) so that
    /// the caller gets `Timeout` at `deadline` instead of hanging. The call runs on a watchdog
    /// thread; a call that outlives its deadline is abandoned there and the device is marked
    /// lost (the driver may never return). With virtual time the caller waits for the worker
    /// and the time the call took on the driver's clock is judged against the deadline. The
    /// call runs on the worker thread in both cases, so a call that depends on its thread (the
    /// driver ends a global-mode capture only from the thread that began it) fails on the
    /// simulated driver as it does on the GPU: such calls must not be watched.
    pub(crate) fn call_watched<T: Send + 'static>(
        &self,
        call: &'static str,
        deadline: Duration,
        f: impl FnOnce(&D) -> DriverResult<T> + Send + 'static,
    ) -> DeviceResult<T> {
        self.check_lost()?;
        let driver = Arc::clone(&self.inner.driver);
        let virtual_time = driver.is_virtual_time();
        let start = driver.now();
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let job = Box::new(move || {
            // The receiver may be gone if we timed out; nothing to do then.
            let _ = tx.send(f(&driver));
        });
        if let Err(reason) = self.inner.watchdog.submit(job) {
            return Err(DeviceError::InvalidArgument { call, reason });
        }
        if virtual_time {
            let Ok(r) = rx.recv() else {
                let reason = format!("{call} gave no answer (it panicked on the watchdog worker)");
                self.mark_lost(reason.clone());
                return Err(DeviceError::DeviceLost { reason });
            };
            let elapsed = self.inner.driver.now().saturating_sub(start);
            if elapsed > deadline {
                return Err(self.driver_call_timed_out(call, deadline));
            }
            return self.checked(r);
        }
        match rx.recv_timeout(deadline) {
            Ok(r) => self.checked(r),
            Err(_) => Err(self.driver_call_timed_out(call, deadline)),
        }
    }

    fn driver_call_timed_out(&self, call: &'static str, deadline: Duration) -> DeviceError {
        self.mark_lost(format!("{call} did not return within {deadline:?}"));
        DeviceError::Timeout {
            waited_for: format!("{call} to return"),
            deadline,
            elapsed: deadline,
            device_lost: true,
        }
    }

    /// Enters a poll: waits (bounded) while a capture is active, unless this thread owns the
    /// capture, in which case polling would invalidate it and is refused.
    pub(crate) fn enter_poll(
        &self,
        call: &'static str,
        deadline: Instant,
    ) -> DeviceResult<PollTicket<'_>> {
        let gate = &self.inner.gate;
        let mut book = gate.lock();
        while let Some((_, owner)) = book.stream {
            if owner == std::thread::current().id() {
                return Err(DeviceError::CaptureIllegal {
                    call,
                    why: "waiting on the device from the capturing thread would invalidate the capture; end the capture first",
                });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(DeviceError::Timeout {
                    waited_for: "the active stream capture to end before polling".into(),
                    deadline: self.inner.config.sync_deadline,
                    elapsed: self.inner.config.sync_deadline,
                    device_lost: false,
                });
            }
            book = gate
                .changed
                .wait_timeout(book, deadline - now)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        book.polls += 1;
        Ok(PollTicket { gate })
    }

    /// Polls `query` until it reports ready or `deadline` passes on the driver's clock. Never
    /// issues a query while a stream captures (the thread holds off instead).
    ///
    /// On a driver whose time is real, the first [`SPIN_BEFORE_SLEEP`] of a wait polls without
    /// sleeping (yielding the thread between queries): a training step of a millisecond or less
    /// is seen done as it ends, where a sleep that doubles from 2 us would see a 0.7 ms step at
    /// about 1 ms, and each rank of a data-parallel job at its own moment (the others' next
    /// collectives wait for the latest). Longer waits then sleep, doubling from 2 us up to
    /// [`MAX_POLL_SLEEP`].
    pub(crate) fn poll_until_ready(
        &self,
        call: &'static str,
        what: impl Fn() -> String,
        query: impl Fn(&D) -> DriverResult<Readiness>,
    ) -> DeviceResult<()> {
        self.check_lost()?;
        let deadline = self.inner.config.sync_deadline;
        let driver = &self.inner.driver;
        let start = driver.now();
        let real_deadline = Instant::now() + deadline;
        // Spinning would not move a virtual clock: such a driver sleeps from the start.
        let mut pacing = if driver.is_virtual_time() {
            Pacing::virtual_time(deadline)
        } else {
            Pacing::new(SPIN_BEFORE_SLEEP)
        };
        loop {
            let ticket = self.enter_poll(call, real_deadline)?;
            let state = self.checked(query(driver));
            drop(ticket);
            if state? == Readiness::Ready {
                return Ok(());
            }
            let elapsed = driver.now().saturating_sub(start);
            if elapsed >= deadline {
                return Err(DeviceError::Timeout {
                    waited_for: what(),
                    deadline,
                    elapsed,
                    device_lost: false,
                });
            }
            match pacing.next(elapsed) {
                None => std::thread::yield_now(),
                Some(sleep) => driver.pause(sleep.min(deadline - elapsed)),
            }
        }
    }

    /// Marks `stream` as capturing for this thread; waits (bounded) for in-flight polls first.
    pub(crate) fn book_capture(&self, stream: Stream) -> DeviceResult<()> {
        let gate = &self.inner.gate;
        let deadline = Instant::now() + self.inner.config.sync_deadline;
        let mut book = gate.lock();
        if book.stream.is_some() {
            return Err(DeviceError::CaptureIllegal {
                call: "cuStreamBeginCapture_v2",
                why: "another capture is active on this device; one capture at a time",
            });
        }
        while book.polls > 0 {
            let now = Instant::now();
            if now >= deadline {
                return Err(DeviceError::Timeout {
                    waited_for: "in-flight stream queries to finish before capture".into(),
                    deadline: self.inner.config.sync_deadline,
                    elapsed: self.inner.config.sync_deadline,
                    device_lost: false,
                });
            }
            book = gate
                .changed
                .wait_timeout(book, deadline - now)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        book.stream = Some((stream, std::thread::current().id()));
        book.slowest = None;
        gate.watch.publish(&book);
        Ok(())
    }

    /// Clears the capture mark and wakes held-off threads.
    pub(crate) fn unbook_capture(&self) {
        self.update_session(|book| book.stream = None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pacing_spins_first_then_sleeps_doubling_to_its_cap() {
        let mut spinning = Pacing::new(Duration::from_millis(1));
        assert!((0..1000).all(|us| spinning.next(Duration::from_micros(us)).is_none()));
        let mut sleeping = Pacing::new(Duration::ZERO);
        let sleeps: Vec<u64> = (0..9)
            .map(|_| sleeping.next(Duration::ZERO).expect("a sleep").as_micros() as u64)
            .collect();
        assert_eq!(sleeps, [2, 4, 8, 16, 32, 64, 100, 100, 100]);
    }

    /// On a virtual clock a short wait paces as any other; one that lasts (work that never
    /// completes) sleeps up to a thousandth of its deadline, so it costs few polls.
    #[test]
    fn a_long_virtual_wait_sleeps_up_to_a_thousandth_of_its_deadline() {
        let mut p = Pacing::virtual_time(Duration::from_secs(60));
        let short: Vec<u64> = (0..8)
            .map(|_| p.next(Duration::ZERO).expect("a sleep").as_micros() as u64)
            .collect();
        assert_eq!(short, [2, 4, 8, 16, 32, 64, 100, 100]);
        let long = (0..20)
            .map(|_| p.next(LONG_VIRTUAL_WAIT).expect("a sleep"))
            .last();
        assert_eq!(long, Some(Duration::from_millis(60)));
    }
}
