//! A watchdog per rank that does not share the training thread (issue 44).
//!
//! Every abort used to be made from the training thread itself. On a GPU that thread can be
//! the one that is stuck: in `cuGraphLaunch` or `cuLaunchKernel` behind a queue full of work
//! that waits for a peer that stopped, or in a wait without a deadline. Then nothing ever
//! aborts, and the launcher kills the rank when its grace runs out (measured on 2 H200s).
//!
//! [`Watched`] wraps a rank's collective: the training thread's progress (a step begun, a
//! collective call returned) bumps a counter; a thread of its own (the watchdog) aborts the
//! communicators when the counter has not moved for the timeout (`--comm-timeout`), so the
//! stuck thread's wait returns with an error, which [`Watched`] reports as
//! [`CommError::NoProgress`] (with the collective's own failure, which names the silent peer
//! where the transport knows it). The abort given is the collective's own, callable from any
//! thread without blocking it (`NcclCollective::abort` stores the peer exchange's give-up flag
//! from the host and runs `ncclCommAbort` on its helper thread; the simulator's marks the
//! device lost and ends the waits it holds).
//!
//! A stop signal (SIGTERM, SIGINT) needs nothing more: a training thread that can still stop
//! stops after its step; one blocked in a wait makes no progress, and the watchdog ends it
//! within the timeout, before the launcher's grace (the timeout plus 5 s) runs out.
//!
//! The watchdog arms at the first step ([`Collective::set_step`]): the set-up before it has
//! deadlines of its own. A phase of the training thread's own, between drained steps (the
//! checkpoint written, an evaluation on the host: [`Collective::set_local_phase`]), is not a
//! stall however long it lasts, outside the collectives called in it; the other ranks' next
//! collective still waits at most its own deadline for this one.
//!
//! With [`Watched::polling`] it also reads the transport's asynchronous error at every poll
//! (NCCL's `ncclCommGetAsyncError`, never waiting for a call in progress), and aborts at once
//! on one: a training thread blocked in a launch returns before the timeout, with that error.
//!
//! An abort is not always enough: on 2 H200s a rank whose peer was killed (SIGKILL) in a
//! captured run never exited on its own after the abort (a thread stayed blocked on the
//! device, in a launch behind work that waits for the dead peer or in a teardown behind an
//! `ncclCommAbort` that does not return). With [`Watched::with_last_resort`], the first time
//! the rank gives the job up (an abort, from any thread, the watchdog's included) arms a
//! deadline that nothing disarms: if the process still runs when it passes, the application's
//! hook gets [`CommError::TeardownStuck`] (naming the silent peer where one is known) and ends
//! the process itself (ztrain prints its error line and exits 3 without running destructors).
//! The thread that keeps that deadline outlives the `Watched`: dropping it does not wait for it.

use crate::error::{CommError, Result, Silent};
use crate::{Collective, RankInfo};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use zcompute::{BTensor, Backend, Element};

/// Aborts a rank's communicators from the watchdog's thread: must not block on the device.
pub type AbortFn = Arc<dyn Fn(&str) + Send + Sync>;

/// The application's last resort ([`Watched::with_last_resort`]): called on the watchdog's
/// thread with [`CommError::TeardownStuck`] when the process still runs `after` the rank gave
/// the job up. Meant to end the process (it must not wait for the device); if it returns, the
/// watchdog logs that and stops.
struct LastResort {
    after: Duration,
    hook: Box<dyn Fn(&CommError) + Send + Sync>,
}

impl std::fmt::Debug for LastResort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LastResort")
            .field("after", &self.after)
            .finish_non_exhaustive()
    }
}

/// When and why the rank first gave the job up (an abort), and the peer found silent, if any.
#[derive(Debug, Default)]
struct GaveUp {
    at: Option<(Instant, String)>,
    silent: Option<usize>,
}

/// Reads a transport's asynchronous error from the watchdog's thread (NCCL's
/// `ncclCommGetAsyncError`): must never wait for the training thread.
struct Poll(Box<dyn Fn() -> Option<CommError> + Send + Sync>);

impl std::fmt::Debug for Poll {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Poll")
    }
}

/// What the watchdog found when it fired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stalled {
    /// What the training thread was in: a collective call, or `"a step"` (outside the
    /// collectives: a captured step's launch, a read-back).
    pub op: &'static str,
    /// The step it was in.
    pub step: u64,
    /// How long nothing moved.
    pub waited_for: Duration,
}

/// The training thread's side: progress and where it is.
#[derive(Debug, Default)]
struct Shared {
    ticks: AtomicU64,
    armed: AtomicBool,
    /// The watchdog's polls so far (tests count them, never the clock).
    polls: AtomicU64,
    step: AtomicU64,
    op: Mutex<Option<&'static str>>,
    /// In a phase of its own (`set_local_phase`): not a stall while outside a collective.
    local: AtomicBool,
    fired: Mutex<Option<Stalled>>,
    /// The transport's asynchronous error reader ([`Watched::polling`]).
    poll: Mutex<Option<Poll>>,
    /// The asynchronous error the watchdog read (it aborted then), until handed out.
    async_error: Mutex<Option<CommError>>,
    /// An asynchronous error was read: no more reads.
    async_seen: AtomicBool,
    /// The rank's place in the job (for the last resort's error).
    rank: usize,
    world: usize,
    /// [`Watched::with_last_resort`]'s hook.
    last_resort: Mutex<Option<LastResort>>,
    /// Set by the first abort: arms the last resort.
    gave_up: Mutex<GaveUp>,
    stop: Mutex<bool>,
    wake: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    fn tick(&self) {
        self.ticks.fetch_add(1, Ordering::Release);
    }

    fn fired(&self) -> Option<Stalled> {
        lock(&self.fired).clone()
    }

    /// The rank gives the job up (`why`): the first call arms the last resort's deadline,
    /// which nothing disarms.
    fn give_up(&self, why: &str) {
        let mut g = lock(&self.gave_up);
        if g.at.is_none() {
            g.at = Some((Instant::now(), why.to_string()));
            drop(g);
            self.wake.notify_all();
        }
    }

    /// Remembers the peer `e` names as silent (the first one known).
    fn note_silent(&self, e: &CommError) {
        if let Some(peer) = e.silent_peer() {
            lock(&self.gave_up).silent.get_or_insert(peer);
        }
    }

    /// When the last resort is due, if the rank gave up and a hook is installed.
    fn last_resort_due(&self) -> Option<Instant> {
        let after = lock(&self.last_resort).as_ref()?.after;
        let at = lock(&self.gave_up).at.as_ref()?.0;
        Some(at + after)
    }

    /// The peer a collective's error named silent, else what the job's shape says (a job of
    /// two ranks has only one peer to wait for).
    fn silent(&self) -> Silent {
        let info = RankInfo {
            rank: self.rank,
            world: self.world,
            local_rank: 0,
        };
        Silent::of(
            info,
            lock(&self.gave_up).silent,
            "no error of the collectives named the peer",
        )
    }

    /// The last resort's error: why the rank gave up, the silent peer, and how long the
    /// process has run on since.
    fn teardown_stuck(&self) -> CommError {
        let (at, cause) = lock(&self.gave_up)
            .at
            .clone()
            .unwrap_or_else(|| (Instant::now(), "unknown".into()));
        CommError::TeardownStuck {
            rank: self.rank,
            silent: self.silent(),
            within: at.elapsed(),
            cause,
        }
    }

    /// Calls the last resort's hook (it should end the process); false when there is none.
    fn run_last_resort(&self) -> bool {
        let e = self.teardown_stuck();
        tracing::error!(target: "zcomm.watchdog.last_resort", rank = self.rank, error = %e, "the rank gave up but did not end: its last resort ends it");
        let hook = lock(&self.last_resort);
        match hook.as_ref() {
            Some(h) => {
                (h.hook)(&e);
                true
            }
            None => false,
        }
    }

    /// One read of the transport's asynchronous error, until one is seen.
    fn read_async_error(&self) -> Option<CommError> {
        if self.async_seen.load(Ordering::Acquire) {
            return None;
        }
        let e = lock(&self.poll).as_ref().and_then(|p| (p.0)())?;
        self.async_seen.store(true, Ordering::Release);
        Some(e)
    }
}

/// The watchdog thread of one rank; dropping it stops the thread (at once) and joins it.
#[derive(Debug)]
pub struct Watchdog {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Starts the thread: once armed, `abort` is called (once) when no progress was made for
    /// `timeout`.
    ///
    /// # Errors
    /// The thread could not be started (`CommError::Io`).
    pub fn spawn(rank: usize, timeout: Duration, abort: AbortFn) -> Result<Watchdog> {
        Self::spawn_in(rank, 0, timeout, abort)
    }

    /// As [`Watchdog::spawn`], for rank `rank` of `world` (named by the last resort's error).
    fn spawn_in(rank: usize, world: usize, timeout: Duration, abort: AbortFn) -> Result<Watchdog> {
        let shared = Arc::new(Shared {
            rank,
            world,
            ..Shared::default()
        });
        let seen = Arc::clone(&shared);
        // Often enough to fire within a twentieth of the timeout, rarely enough to cost nothing.
        let poll = (timeout / 20).clamp(Duration::from_millis(1), Duration::from_millis(100));
        let thread = std::thread::Builder::new()
            .name(format!("zcomm-watchdog-{rank}"))
            .spawn(move || watch(&seen, rank, timeout, poll, &*abort))
            .map_err(|source| CommError::Io {
                op: "starting the watchdog thread",
                source,
            })?;
        Ok(Watchdog {
            shared,
            thread: Some(thread),
        })
    }

    /// What the watchdog found, if it fired.
    #[must_use]
    pub fn fired(&self) -> Option<Stalled> {
        self.shared.fired()
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        *lock(&self.shared.stop) = true;
        self.shared.wake.notify_all();
        // A rank that gave up keeps its last resort's deadline through the teardown that
        // follows (which is what may block): the thread is left to run until then, or until
        // the process ends.
        if self.shared.last_resort_due().is_some() {
            return;
        }
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            tracing::warn!(target: "zcomm.watchdog.stop", "the watchdog thread panicked");
        }
    }
}

/// The watchdog's loop: see the module documentation.
fn watch(shared: &Shared, rank: usize, timeout: Duration, poll: Duration, abort: &dyn Fn(&str)) {
    let mut last = shared.ticks.load(Ordering::Acquire);
    let mut since = Instant::now();
    loop {
        let stopped = {
            let stop = lock(&shared.stop);
            let (stop, _) = shared
                .wake
                .wait_timeout_while(stop, poll, |stop| !*stop)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            *stop
        };
        // The last resort first: it holds whatever else happens, the end of the watch included.
        if let Some(due) = shared.last_resort_due() {
            let now = Instant::now();
            if now >= due {
                if !shared.run_last_resort() {
                    tracing::error!(target: "zcomm.watchdog.last_resort", rank, "the last resort returned; the watchdog stops");
                }
                return;
            }
            if stopped {
                // Dropped: nothing else to watch, only the deadline.
                std::thread::sleep(due - now);
                continue;
            }
        } else if stopped {
            return;
        }
        shared.polls.fetch_add(1, Ordering::AcqRel);
        if lock(&shared.fired).is_some() {
            continue;
        }
        let armed = shared.armed.load(Ordering::Acquire);
        if armed && let Some(e) = shared.read_async_error() {
            let why = format!("rank {rank}: the transport failed on its own threads: {e}");
            tracing::error!(target: "zcomm.watchdog.async", rank, error = %e, "asynchronous error: aborting the communicators from the watchdog thread");
            shared.note_silent(&e);
            *lock(&shared.async_error) = Some(e);
            shared.give_up(&why);
            abort(&why);
        }
        // Outside a collective call, a phase of the thread's own is not a stall.
        let local = shared.local.load(Ordering::Acquire) && lock(&shared.op).is_none();
        let now = shared.ticks.load(Ordering::Acquire);
        if now != last || !armed || local {
            last = now;
            since = Instant::now();
            continue;
        }
        let waited_for = since.elapsed();
        if waited_for < timeout {
            continue;
        }
        let stalled = Stalled {
            op: lock(&shared.op).unwrap_or("a step"),
            step: shared.step.load(Ordering::Acquire),
            waited_for,
        };
        let why = format!(
            "rank {rank}: no progress for {waited_for:.1?} in {} at step {}: the watchdog aborts the communicators",
            stalled.op, stalled.step
        );
        tracing::error!(target: "zcomm.watchdog.fire", rank, op = stalled.op, step = stalled.step, ?waited_for, "no progress: aborting the communicators from the watchdog thread");
        *lock(&shared.fired) = Some(stalled);
        // Armed before the abort: an abort can itself block.
        shared.give_up(&why);
        abort(&why);
    }
}

/// A rank's collective under a [`Watchdog`]: see the module documentation. Every call goes to
/// the inner collective; the calls and the steps are the progress the watchdog sees.
pub struct Watched<C> {
    inner: Arc<C>,
    dog: Watchdog,
    /// The watchdog's error was handed out by `take_failure` (once, as every failure).
    reported: AtomicBool,
}

impl<C> std::fmt::Debug for Watched<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watched")
            .field("dog", &self.dog)
            .finish_non_exhaustive()
    }
}

impl<C> Watched<C> {
    /// `inner` under a watchdog that calls `abort` on it (from its own thread) after `timeout`
    /// without progress.
    ///
    /// # Errors
    /// The watchdog's thread could not be started.
    pub fn new(
        inner: Arc<C>,
        rank: usize,
        timeout: Duration,
        abort: impl Fn(&C, &str) + Send + Sync + 'static,
    ) -> Result<Self>
    where
        C: Send + Sync + 'static,
    {
        Self::new_in(
            inner,
            RankInfo {
                rank,
                world: 0,
                local_rank: 0,
            },
            timeout,
            abort,
        )
    }

    /// As [`Watched::new`], for the rank `info` says (the last resort's error names the only
    /// peer of a job of two ranks).
    ///
    /// # Errors
    /// The watchdog's thread could not be started.
    pub fn new_in(
        inner: Arc<C>,
        info: RankInfo,
        timeout: Duration,
        abort: impl Fn(&C, &str) + Send + Sync + 'static,
    ) -> Result<Self>
    where
        C: Send + Sync + 'static,
    {
        let target = Arc::clone(&inner);
        let abort: AbortFn = Arc::new(move |why: &str| abort(&target, why));
        Ok(Watched {
            inner,
            dog: Watchdog::spawn_in(info.rank, info.world, timeout, abort)?,
            reported: AtomicBool::new(false),
        })
    }

    /// The last resort (see the module documentation): once the rank gives the job up, if the
    /// process still runs `after` that, `hook` is called on the watchdog's thread with
    /// [`CommError::TeardownStuck`]; it is to end the process without waiting for anything on
    /// the device (ztrain prints its error line and exits 3, running no destructors).
    #[must_use]
    pub fn with_last_resort(
        self,
        after: Duration,
        hook: impl Fn(&CommError) + Send + Sync + 'static,
    ) -> Self {
        *lock(&self.dog.shared.last_resort) = Some(LastResort {
            after,
            hook: Box::new(hook),
        });
        self
    }

    /// Also reads the transport's asynchronous error (`poll`, NCCL's
    /// `NcclCollective::poll_async_error`) at every poll once armed: an error aborts the
    /// communicators at once, without waiting for the timeout, so a training thread blocked
    /// in a launch returns; its calls then fail with that error (handed out once). `poll`
    /// runs on the watchdog's thread and must never wait for the training thread.
    #[must_use]
    pub fn polling(self, poll: impl Fn(&C) -> Option<CommError> + Send + Sync + 'static) -> Self
    where
        C: Send + Sync + 'static,
    {
        let target = Arc::clone(&self.inner);
        *lock(&self.dog.shared.poll) = Some(Poll(Box::new(move || poll(&target))));
        self
    }

    /// The collective underneath.
    #[must_use]
    pub fn inner(&self) -> &C {
        &self.inner
    }

    /// What the watchdog found, if it fired.
    #[must_use]
    pub fn fired(&self) -> Option<Stalled> {
        self.dog.fired()
    }

    /// Runs one call of the inner collective as progress: where the thread is while it runs,
    /// a tick when it returns; an error after the watchdog fired is its `NoProgress`.
    fn call<R>(&self, op: &'static str, rank: usize, f: impl FnOnce(&C) -> Result<R>) -> Result<R> {
        let shared = &self.dog.shared;
        let outer = lock(&shared.op).replace(op);
        let r = f(&self.inner);
        *lock(&shared.op) = outer;
        shared.tick();
        r.map_err(|e| {
            shared.note_silent(&e);
            self.stalled_error(rank, e)
        })
    }

    /// `e`, or the watchdog's error when it fired (with `e`, and the collective's own failure
    /// which names the silent peer where one is known, as its detail).
    fn stalled_error(&self, rank: usize, e: CommError) -> CommError {
        let Some(s) = self.fired() else {
            // The asynchronous error the watchdog aborted on says why; the call's own error
            // only that the communicator was aborted.
            return lock(&self.dog.shared.async_error).take().unwrap_or(e);
        };
        if matches!(e, CommError::NoProgress { .. }) {
            return e;
        }
        CommError::NoProgress {
            rank,
            op: s.op,
            step: s.step,
            waited_for: s.waited_for,
            silent: self.dog.shared.silent(),
            detail: chain(&e),
        }
    }
}

/// `e` and its sources, as one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

impl<B: Backend<T>, T: Element, C: Collective<B, T>> Collective<B, T> for Watched<C> {
    fn info(&self) -> RankInfo {
        self.inner.info()
    }

    fn all_reduce_sum(&self, b: &B, x: &BTensor<B, T>, step: u64) -> Result<()> {
        let rank = self.info().rank;
        self.call("all_reduce", rank, |c| c.all_reduce_sum(b, x, step))
    }

    fn all_reduce_sum_overlapped(&self, b: &B, x: &BTensor<B, T>, step: u64) -> Result<()> {
        let rank = self.info().rank;
        self.call("all_reduce", rank, |c| {
            c.all_reduce_sum_overlapped(b, x, step)
        })
    }

    fn join_overlapped(&self, b: &B) -> Result<()> {
        let rank = self.info().rank;
        self.call("join_overlapped", rank, |c| c.join_overlapped(b))
    }

    fn prepare_last_and_norm(&self, b: &B, len: usize, last: usize, step: u64) -> Result<bool> {
        let rank = self.info().rank;
        self.call("prepare_last_and_norm", rank, |c| {
            c.prepare_last_and_norm(b, len, last, step)
        })
    }

    fn all_reduce_last_and_norm(
        &self,
        b: &B,
        grads: &BTensor<B, T>,
        last: usize,
        step: u64,
    ) -> Result<Option<BTensor<B, T>>> {
        let rank = self.info().rank;
        self.call("all_reduce_last_and_norm", rank, |c| {
            c.all_reduce_last_and_norm(b, grads, last, step)
        })
    }

    fn broadcast(&self, b: &B, x: &BTensor<B, T>, root: usize, step: u64) -> Result<()> {
        let rank = self.info().rank;
        self.call("broadcast", rank, |c| c.broadcast(b, x, root, step))
    }

    fn synchronize(&self, b: &B) -> Result<()> {
        let rank = self.info().rank;
        self.call("synchronize", rank, |c| c.synchronize(b))
    }

    /// A step begins: progress, and the watchdog is armed from the first one.
    fn set_step(&self, step: u64) {
        let shared = &self.dog.shared;
        shared.step.store(step, Ordering::Release);
        shared.tick();
        shared.armed.store(true, Ordering::Release);
        self.inner.set_step(step);
    }

    fn take_failure(&self) -> Option<CommError> {
        let inner = self.inner.take_failure();
        if let Some(e) = &inner {
            self.dog.shared.note_silent(e);
        }
        match (self.fired(), inner) {
            (None, inner) => lock(&self.dog.shared.async_error).take().or(inner),
            (Some(_), Some(e)) => {
                self.reported.store(true, Ordering::Release);
                Some(self.stalled_error(self.info().rank, e))
            }
            (Some(_), None) if self.reported.swap(true, Ordering::AcqRel) => None,
            (Some(s), None) => Some(CommError::NoProgress {
                rank: self.info().rank,
                op: s.op,
                step: s.step,
                waited_for: s.waited_for,
                silent: Collective::silent(self),
                detail: "no collective failure was recorded".into(),
            }),
        }
    }

    fn set_local_phase(&self, phase: Option<&'static str>) {
        let shared = &self.dog.shared;
        shared.local.store(phase.is_some(), Ordering::Release);
        shared.tick();
        self.inner.set_local_phase(phase);
    }

    /// Gives the job up: arms the last resort (first: the abort can itself block), then
    /// aborts the inner collective.
    fn abort(&self, why: &str) {
        self.dog.shared.give_up(why);
        self.inner.abort(why);
    }

    /// The peer an error of the collective named silent, else the inner collective's answer.
    fn silent(&self) -> Silent {
        match lock(&self.dog.shared.gave_up).silent {
            Some(peer) => Silent::Rank(peer),
            None => self.inner.silent(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SingleProcess;
    use zcompute::CpuBackend;

    /// A watched single process whose abort only says it was called.
    fn watched(timeout: Duration) -> (Watched<SingleProcess>, Arc<AtomicBool>) {
        let aborted = Arc::new(AtomicBool::new(false));
        let seen = Arc::clone(&aborted);
        let w = Watched::new(
            Arc::new(SingleProcess),
            0,
            timeout,
            move |_: &SingleProcess, _: &str| seen.store(true, Ordering::SeqCst),
        )
        .expect("the watchdog starts");
        (w, aborted)
    }

    /// Waits (bounded by a minute, never reached when it holds) until the watchdog has polled
    /// `n` more times: each poll waits its whole period, so `n` periods have passed.
    fn polls(w: &Watched<SingleProcess>, n: u64) {
        let shared = &w.dog.shared;
        let from = shared.polls.load(Ordering::Acquire);
        let until = Instant::now() + Duration::from_secs(60);
        while shared.polls.load(Ordering::Acquire) < from + n && w.fired().is_none() {
            assert!(Instant::now() < until, "the watchdog stopped polling");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Issue 44: a phase with no step and no collective (the last checkpoint written, an
    /// evaluation on the host) longer than the timeout is not a stall; once it ends, a
    /// training thread that makes no progress is one again.
    #[test]
    fn a_local_phase_longer_than_the_timeout_is_not_a_stall() {
        // A 5 ms timeout polled every 1 ms: 40 polls are 40 ms or more, 8 timeouts.
        let (w, aborted) = watched(Duration::from_millis(5));
        let c: &dyn Collective<CpuBackend, f32> = &w;
        c.set_step(1);
        c.set_local_phase(Some("writing the checkpoint"));
        polls(&w, 40);
        assert_eq!(w.fired(), None, "fired inside the local phase");
        assert!(!aborted.load(Ordering::SeqCst));
        c.set_local_phase(None);
        let until = Instant::now() + Duration::from_secs(60);
        while w.fired().is_none() {
            assert!(
                Instant::now() < until,
                "no stall seen after the phase ended"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(aborted.load(Ordering::SeqCst));
        assert_eq!(w.fired().map(|s| (s.op, s.step)), Some(("a step", 1)));
    }

    /// Issue 44: the transport's asynchronous error (NCCL's `ncclCommGetAsyncError`), read by
    /// the watchdog, aborts at once (the timeout here is an hour) and is what the training
    /// thread's next call returns, once; it is read no more after that.
    #[test]
    fn an_asynchronous_error_aborts_at_once_and_is_the_calls_error() {
        let reads = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&reads);
        let (w, aborted) = watched(Duration::from_secs(3600));
        let w = w.polling(move |_: &SingleProcess| {
            // Fine for the first reads, then the error NCCL's threads found.
            (counted.fetch_add(1, Ordering::SeqCst) >= 3).then(|| CommError::PeerFailed {
                rank: 0,
                op: "ncclCommGetAsyncError",
                step: 0,
                detail: "remote process exited".into(),
            })
        });
        let c: &dyn Collective<CpuBackend, f32> = &w;
        let b = CpuBackend;
        polls(&w, 10);
        assert_eq!(
            reads.load(Ordering::SeqCst),
            0,
            "read before the first step"
        );
        c.set_step(4);
        let until = Instant::now() + Duration::from_secs(60);
        while !aborted.load(Ordering::SeqCst) {
            assert!(
                Instant::now() < until,
                "the asynchronous error did not abort"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(w.fired(), None, "not a stall");
        polls(&w, 10);
        assert_eq!(
            reads.load(Ordering::SeqCst),
            4,
            "read again after the error"
        );
        // SingleProcess's own calls never fail; the failure goes to `take_failure`.
        let e = c.take_failure().expect("the asynchronous error");
        assert!(e.to_string().contains("remote process exited"), "{e}");
        assert!(c.take_failure().is_none(), "handed out twice");
        let x = zcompute::Backend::upload(&b, &[1.0f32], &[1]).expect("upload");
        c.all_reduce_sum(&b, &x, 4)
            .expect("a call after the error was handed out");
    }

    /// Issue 44: a rank that gave the job up (its abort did not unblock it: here the abort
    /// does nothing at all, as one that does not return) is ended by its last resort, which
    /// holds through the drop of its `Watched` (the teardown that may block), and whose error
    /// names the only peer of a job of two and why the rank gave up. Nothing is due before the
    /// rank gives up.
    #[test]
    fn a_rank_that_gave_up_but_does_not_end_is_ended_by_its_last_resort_after_the_drop() {
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let tx = Mutex::new(tx);
        let info = RankInfo {
            rank: 0,
            world: 2,
            local_rank: 0,
        };
        let w = Watched::new_in(
            Arc::new(SingleProcess),
            info,
            Duration::from_secs(3600),
            |_: &SingleProcess, _: &str| {},
        )
        .expect("the watchdog starts")
        .with_last_resort(Duration::from_millis(20), move |e: &CommError| {
            lock(&tx).send(e.to_string()).ok();
        });
        let c: &dyn Collective<CpuBackend, f32> = &w;
        c.set_step(7);
        polls(&w, 3);
        assert!(rx.try_recv().is_err(), "a last resort before any abort");
        c.abort("rank 0: all_reduce of step 7 failed: rank 1 vanished: connection reset");
        drop(w);
        let e = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the last resort did not run after the drop");
        assert!(e.contains("rank 1 stopped answering"), "{e}");
        assert!(e.contains("rank 1 vanished"), "{e}");
        assert!(e.contains("did not end within"), "{e}");
    }

    /// Rank 0 of two, whose collective calls never fail (the watchdog's own error is tested).
    struct Pair;

    impl Collective<CpuBackend, f32> for Pair {
        fn info(&self) -> RankInfo {
            RankInfo {
                rank: 0,
                world: 2,
                local_rank: 0,
            }
        }
        fn all_reduce_sum(
            &self,
            _: &CpuBackend,
            _: &BTensor<CpuBackend, f32>,
            _: u64,
        ) -> Result<()> {
            Ok(())
        }
        fn broadcast(
            &self,
            _: &CpuBackend,
            _: &BTensor<CpuBackend, f32>,
            _: usize,
            _: u64,
        ) -> Result<()> {
            Ok(())
        }
        fn synchronize(&self, _: &CpuBackend) -> Result<()> {
            Ok(())
        }
    }

    /// Issue 44: a watchdog that fired with no failure of the collectives recorded (the
    /// training thread blocked outside them, in a launch behind a collective whose peer
    /// stopped) still names the peer: of two ranks, the other one.
    #[test]
    fn a_stall_with_no_collective_failure_names_the_only_peer() {
        let info = Pair.info();
        let w = Watched::new_in(
            Arc::new(Pair),
            info,
            Duration::from_millis(5),
            |_: &Pair, _: &str| {},
        )
        .expect("the watchdog starts");
        let c: &dyn Collective<CpuBackend, f32> = &w;
        c.set_step(3);
        let until = Instant::now() + Duration::from_secs(60);
        while w.fired().is_none() {
            assert!(Instant::now() < until, "the watchdog did not fire");
            std::thread::sleep(Duration::from_millis(1));
        }
        let e = c.take_failure().expect("the watchdog's error");
        assert!(matches!(e, CommError::NoProgress { .. }), "{e:?}");
        assert_eq!(e.silent_peer(), Some(1), "{e}");
        assert!(e.to_string().contains("(rank 1 did not answer)"), "{e}");
    }
}
