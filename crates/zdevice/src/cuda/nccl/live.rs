//! The communicator handle of [`super::NcclComm`]: calls on it take turns, and an abort takes
//! it without waiting for its turn (issue 44).
//!
//! NCCL's calls on one communicator must not overlap, so they take turns under a mutex held
//! across each call. An enqueue (`ncclAllReduce`) can itself block: NCCL launches its kernel,
//! and a launch waits while the stream's queue is full of work that waits for a stopped peer.
//! The abort that would end that wait (`ncclCommAbort`, from the watchdog's thread) must then
//! not wait for the same mutex, or nothing ever ends it. So the handle lives apart from the
//! turn: an abort marks the communicator aborted and takes the handle under a lock no call
//! holds for longer than a copy, and runs `ncclCommAbort` while the blocked call is still in
//! NCCL, which is what `ncclCommAbort` exists for (NCCL's documentation: it may be called to
//! abort a communicator whose operations hang; the blocked call then returns an error). A
//! call that starts after the abort is refused without touching the handle.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A handle `H` (copied into each call) with turns for calls and an abort that needs no turn.
#[derive(Debug)]
pub(crate) struct Live<H: Copy> {
    /// Held across each call: calls on the handle never overlap.
    turn: Mutex<()>,
    /// The handle; `None` once taken by an abort or a teardown. Held only to copy or take it.
    handle: Mutex<Option<H>>,
    aborted: AtomicBool,
}

impl<H: Copy> Live<H> {
    pub(crate) fn new(handle: Option<H>) -> Self {
        Live {
            turn: Mutex::new(()),
            aborted: AtomicBool::new(handle.is_none()),
            handle: Mutex::new(handle),
        }
    }

    /// Runs `f` on the handle in its turn; `None` (and `f` not run) once aborted or torn down.
    pub(crate) fn call<R>(&self, f: impl FnOnce(H) -> R) -> Option<R> {
        let _turn = lock(&self.turn);
        if self.aborted.load(Ordering::Acquire) {
            return None;
        }
        let h = (*lock(&self.handle))?;
        Some(f(h))
    }

    /// As [`Live::call`], but only when no call holds its turn now: `None` (and `f` not run)
    /// when one does, or once aborted. For a watcher on another thread that must never wait
    /// behind a blocked call.
    pub(crate) fn try_call<R>(&self, f: impl FnOnce(H) -> R) -> Option<R> {
        let _turn = match self.turn.try_lock() {
            Ok(t) => t,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        if self.aborted.load(Ordering::Acquire) {
            return None;
        }
        let h = (*lock(&self.handle))?;
        Some(f(h))
    }

    /// Marks it aborted and takes the handle, without waiting for a call in progress (see the
    /// module documentation); `None` when an abort or a teardown took it before.
    pub(crate) fn take_for_abort(&self) -> Option<H> {
        if self.aborted.swap(true, Ordering::AcqRel) {
            return None;
        }
        lock(&self.handle).take()
    }

    /// Takes the handle after the last call (a teardown): waits for a call in progress, then
    /// refuses every later one. `None` when an abort took it.
    pub(crate) fn take_after_calls(&self) -> Option<H> {
        let _turn = lock(&self.turn);
        if self.aborted.swap(true, Ordering::AcqRel) {
            return None;
        }
        lock(&self.handle).take()
    }

    /// Whether an abort or a teardown took the handle.
    pub(crate) fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::mpsc::{Sender, channel};
    use std::thread::JoinHandle;
    use std::time::Duration;

    /// A thread whose call on `live` blocks inside its turn (as an enqueue behind a full queue)
    /// until `release` is sent; returned once the call has begun, with the handle it was given.
    fn blocked_call(live: &Arc<Live<u32>>) -> (u32, Sender<()>, JoinHandle<Option<u32>>) {
        let (entered, in_call) = channel();
        let (release, released) = channel::<()>();
        let live = Arc::clone(live);
        let caller = std::thread::spawn(move || {
            live.call(|h| {
                entered.send(h).expect("the test waits");
                released.recv().ok();
                h
            })
        });
        (in_call.recv().expect("the call began"), release, caller)
    }

    /// Issue 44: a call blocked inside NCCL (an enqueue behind a full queue) holds its turn;
    /// the watchdog's abort takes the handle at once all the same, and the blocked call's
    /// return is the only thing the blocked thread waits for. A call after the abort is
    /// refused without the handle.
    #[test]
    fn an_abort_does_not_wait_for_a_call_blocked_in_its_turn() {
        let live = Arc::new(Live::new(Some(7u32)));
        let (seen, release, caller) = blocked_call(&live);
        assert_eq!(seen, 7);
        let (took, taken) = channel();
        let aborter = {
            let live = Arc::clone(&live);
            std::thread::spawn(move || took.send(live.take_for_abort()).ok())
        };
        // Bounded so that the test fails rather than hangs: the abort returns at once, and
        // a minute is only reached when it waits for the blocked call.
        let got = taken.recv_timeout(Duration::from_secs(60));
        release.send(()).ok();
        assert_eq!(
            got,
            Ok(Some(7)),
            "the abort waited for the call blocked in its turn"
        );
        assert_eq!(caller.join().expect("caller"), Some(7));
        aborter.join().expect("aborter");
        assert!(live.is_aborted());
        assert_eq!(live.call(|h| h), None, "a call after the abort ran");
        assert_eq!(live.take_for_abort(), None, "aborted twice");
        assert_eq!(live.take_after_calls(), None, "torn down after the abort");
    }

    /// A watcher's try does not wait for a call in its turn, and runs when none is.
    #[test]
    fn a_try_skips_a_turn_held_by_a_call() {
        let live = Arc::new(Live::new(Some(5u32)));
        let (_, release, caller) = blocked_call(&live);
        assert_eq!(live.try_call(|h| h), None, "ran during another call's turn");
        release.send(()).ok();
        assert_eq!(caller.join().expect("caller"), Some(5));
        assert_eq!(live.try_call(|h| h * 2), Some(10));
        live.take_for_abort();
        assert_eq!(live.try_call(|h| h), None, "ran after the abort");
    }

    #[test]
    fn a_teardown_takes_the_handle_once_and_refuses_later_calls() {
        let live = Live::new(Some(3u32));
        assert_eq!(live.call(|h| h + 1), Some(4));
        assert_eq!(live.take_after_calls(), Some(3));
        assert_eq!(live.call(|h| h), None);
        assert_eq!(live.take_for_abort(), None);
        assert!(Live::<u32>::new(None).is_aborted());
    }
}
