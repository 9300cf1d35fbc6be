//! SIGINT and SIGTERM: the first one asks the run to stop after the current step (write the
//! checkpoint if one was asked for, print the summary, exit 128 + the signal: 130 or 143); a
//! second one exits at once with that status. Built on `signal-hook`'s `flag` functions, whose
//! handlers only store to atomics, so ztrain itself has no `unsafe`.
//!
//! Before training starts (opening the data, a named pipe waiting for its writer, the secret,
//! the rendezvous, the plan) there is no step to finish and nothing to save: the first signal
//! ends the process at once with 128 + the signal, whatever call the main thread is blocked in
//! ([`StopSignal::exit_at_once_until_training`]).
//!
//! In a data-parallel job the ranks stop together: a signal reaches them at slightly different
//! moments (or one rank alone), so they all-reduce who received what ([`Agreement`]) and all stop
//! after that same step; rank 0 writes the checkpoint, every rank exits 128 + the signal. With
//! the training set on the device the run asks only where every step has been read back (every
//! `--readback-every` steps, and at checkpoints, `--stop-after` and epoch ends: the same steps
//! on every rank, since they follow from the options alone), and reads each exchange at the
//! next such point ([`Agreement`]), so it never waits for the steps just queued; the stop is
//! still after one step every rank names. The read-back window is sized by the device's time
//! ([`Agreement::next_window`]): the ranks exchange their step times in the same all-reduce and
//! all take the window that asks about once a second (at most `--readback-every` steps),
//! while fast steps keep the whole window. A job of one sizes its window the same way from its
//! own device time: a stop finishes the steps already queued, which are then about a second of
//! device time and a step or two, not a window or two. Steps of [`LOCK_STEP_FROM`] (500 ms)
//! and more go lock-step ([`Agreement::lock_step`]): each step is read back, and the stop asked
//! with the flags as of then, before the next is queued, so a signal stops the run after the
//! step the device is running (a job of 5 s steps writes its checkpoint within that step's
//! remaining time of the signal). A wait for the other ranks (the rendezvous) ends at once.

use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use zcompute::{CopyMark, PinnedHost};

pub use signal_hook::consts::{SIGINT, SIGTERM};

/// Whether a stop was asked for, and by which signal.
#[derive(Clone, Debug, Default)]
pub struct StopSignal {
    which: Arc<AtomicUsize>,
    /// Training has started: a signal now waits for the end of a step.
    training: Arc<AtomicBool>,
}

impl StopSignal {
    /// A stop nobody can ask for (library callers, tests).
    #[must_use]
    pub fn never() -> StopSignal {
        StopSignal::default()
    }

    /// Installs the handlers for SIGINT and SIGTERM.
    pub fn install() -> std::io::Result<StopSignal> {
        let stop = StopSignal::default();
        let asked = Arc::new(AtomicBool::new(false));
        for sig in [SIGINT, SIGTERM] {
            // Registered first, so it sees the flag as the earlier signal left it: set means
            // this is the second signal, and the process exits at once.
            signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, Arc::clone(&asked))?;
            signal_hook::flag::register(sig, Arc::clone(&asked))?;
            signal_hook::flag::register_usize(sig, Arc::clone(&stop.which), sig as usize)?;
        }
        Ok(stop)
    }

    /// Until [`StopSignal::training_starts`], a signal ends the process at once with 128 + the
    /// signal, saying so on stderr as `program`: a watcher thread does it (polling every 20 ms), so the
    /// main thread may be blocked anywhere (open(2) on a named pipe without a writer).
    pub fn exit_at_once_until_training(&self, program: &str) -> std::io::Result<()> {
        let (which, training) = (Arc::clone(&self.which), Arc::clone(&self.training));
        let program = program.to_string();
        std::thread::Builder::new()
            .name("ztrain-early-stop".into())
            .spawn(move || {
                while !training.load(Ordering::SeqCst) {
                    let sig = which.load(Ordering::SeqCst);
                    if sig != 0 {
                        let sig = i32::try_from(sig).unwrap_or(SIGINT);
                        #[allow(clippy::print_stderr)]
                        {
                            eprintln!(
                                "{program}: stopped by {} before training started; nothing was trained",
                                name(sig)
                            );
                        }
                        std::process::exit(128 + sig);
                    }
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            })
            .map(|_| ())
    }

    /// The first step is about to run: from now on a signal stops the run after a step.
    pub fn training_starts(&self) {
        self.training.store(true, Ordering::SeqCst);
    }

    /// Asks for a stop as `signal` would (tests).
    pub fn raise(&self, signal: i32) {
        self.which.store(signal as usize, Ordering::SeqCst);
    }

    /// A stop request for zcomm's waits (the rendezvous): true once a signal came.
    #[must_use]
    pub fn as_cancel(&self) -> zcomm::rendezvous::Cancel {
        let which = Arc::clone(&self.which);
        Arc::new(move || which.load(Ordering::SeqCst) != 0)
    }

    /// The signal that asked for a stop, if one did.
    #[must_use]
    pub fn received(&self) -> Option<i32> {
        match self.which.load(Ordering::SeqCst) {
            0 => None,
            s => i32::try_from(s).ok(),
        }
    }
}

/// `SIGINT` / `SIGTERM` / `signal N`.
#[must_use]
pub fn name(signal: i32) -> String {
    match signal {
        SIGINT => "SIGINT".into(),
        SIGTERM => "SIGTERM".into(),
        s => format!("signal {s}"),
    }
}

/// The device time between two asks of the ranks' agreement that the read-back window aims
/// at ([`Agreement::next_window`]): a stop comes within about this much of the device's time
/// plus a step, and a window of fast steps asks no more often than this.
pub const ASK_EVERY: Duration = Duration::from_secs(1);

/// The slowest rank's device time a step from which the run goes lock-step
/// ([`Agreement::lock_step`]): the host reads each step back, and asks about a stop, before it
/// queues the next, so a signal stops the run after the running step instead of after the one
/// queued behind it (or, in a job of several, the one queued behind the agreement's collective).
///
/// Why 500 ms: lock-step costs one host turn-around a step with the device idle (the step's
/// read-back seen by the host, in a job of several the agreement's all-reduce of two floats a
/// rank and its read, the next step's first launch), which is less than a whole step of a
/// small model: `ztrain --gpus 2` at a global batch of 256 queues, runs and reads back a step
/// in about 0.4 ms. At 500 ms a step that is under 0.1%, below what a rate measurement
/// resolves; queueing ahead is what makes short steps fast, and they keep it. Below 500 ms the
/// steps a stop still finishes without lock-step (the window of about [`ASK_EVERY`] of device
/// time and the step or window queued behind it) are about two seconds of device time, so a
/// stop comes within a few seconds either way; from 500 ms on two queued steps alone would
/// take a second or more (10 s and more at 5 s a step, past `docker stop`'s SIGKILL).
pub const LOCK_STEP_FROM: Duration = Duration::from_millis(500);

/// The ranks' agreement on a stop, asked where every step has been read back: the signal of
/// the lowest rank that received one, if any did (each rank's own, at once, in a job of one).
/// Each ask reads the exchange the ask before queued, whose collective ran behind a window of
/// steps long done, and queues its own: the host never waits there for the steps it has just
/// queued. (Waiting for the current exchange drained the stream once a window, which cost two
/// H100s 1.9% of their rate at a global batch of 256.) So a signal is acted on at the ask after
/// the one where it was seen, after a step every rank names; where nothing is queued (an
/// epoch's end, the run's last included) the ask reads its own exchange at once. A rank that
/// received a signal itself reads its own exchange at once too (it is stopping: the wait costs
/// nothing it would keep), and when every rank received one (a signal to the launcher, passed
/// on to all: `docker stop`) the job stops at this ask, a window sooner; a rank without a
/// signal knows that cannot be so without reading. Rank 0 says which ranks the signal reached
/// when not all did (SIGINT to one rank names that rank).
///
/// The same exchange carries each rank's time a step (its device's clock between two asks,
/// [`Pace`]), and every rank takes the next read-back window from the slowest, read at the same
/// ask: the windows, and so the asks, stay on the same steps on every rank.
///
/// From [`LOCK_STEP_FROM`] a step the run goes lock-step ([`Agreement::lock_step`], decided at
/// an ask from the same numbers on every rank, so on the same step everywhere): the caller
/// reads back the step it has just queued before asking (`drained`), and each ask reads its
/// own exchange at once, so the host queues no step until the one before has finished on
/// the device and every rank's flag as of then is known. A signal then stops the run after
/// the running step (any rank's signal in the exchange counts at once); one that lands
/// during the ask itself, after every rank has put in its flag, stops it a step later.
pub struct Agreement<B: zcompute::Backend<f32>> {
    comm: Option<Rc<dyn zcomm::Collective<B, f32>>>,
    /// The exchange of the last ask, read at the next (or already read by a rank that had a
    /// signal).
    pending: Option<Exchange>,
    pace: Pace,
}

/// One ask's exchange: queued, or already read.
#[derive(Debug)]
enum Exchange {
    Queued(zcompute::Readback<f32>),
    Read(Vec<f32>),
}

impl<B: zcompute::Backend<f32>> std::fmt::Debug for Agreement<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agreement")
            .field("ranks", &self.comm.as_ref().map(|c| c.info().world))
            .field("pending", &self.pending)
            .field("window", &self.pace.window)
            .finish_non_exhaustive()
    }
}

/// Where an ask was: a timing mark recorded on the engine stream before its exchange, the
/// host's clock then, and the step.
struct Mark {
    at: CopyMark,
    host: Instant,
    step: u64,
}

/// The read-back window (of a job of several, and of a job of one from its own marks:
/// `Agreement::pace_alone`): `--readback-every` (`bound`) for the first step a
/// process queues (the trainer makes the window's device history that long, so no later window
/// makes it anew), then one step until the ranks have a step time, then the steps that take
/// [`ASK_EVERY`] of the slowest rank's device time, from 1 to `bound`. A rank's step time is
/// the device time between the timing marks of its two asks before (both passed once the
/// exchange of the later one is read), over the steps between them; the host's clock where the
/// backend keeps no device time (the CPU, whose work runs as it is queued). An interval that
/// holds an epoch's validation counts it: the window is smaller for an ask, never larger.
struct Pace {
    bound: usize,
    window: usize,
    /// Whether a step was queued in this process (the first one takes `bound`).
    queued: bool,
    /// The marks of the ask before the last and of the last.
    before: Option<Mark>,
    last: Option<Mark>,
    /// The slowest rank's step takes [`LOCK_STEP_FROM`] or more, or no step time is known
    /// yet: read back every step before the next is queued.
    lock_step: bool,
}

impl Pace {
    /// This rank's milliseconds a step between its two asks before, if known (both marks
    /// passed: the caller has read the later one's exchange).
    fn step_ms<B: PinnedHost<f32>>(&self, b: &B) -> Option<f64> {
        let (before, last) = (self.before.as_ref()?, self.last.as_ref()?);
        let steps = last.step.checked_sub(before.step).filter(|n| *n > 0)?;
        let ms = match b.elapsed_ms(&before.at, &last.at) {
            Ok(Some(ms)) => ms,
            Ok(None) => last.host.duration_since(before.host).as_secs_f64() * 1e3,
            Err(e) => {
                // Not a step time: the window stays as it is (a device error surfaces at the
                // next step's own call).
                tracing::debug!(target: "ztrain.signals.pace", error = %e, "no step time");
                return None;
            }
        };
        Some(ms / steps as f64)
    }

    /// Records this ask's mark (before its exchange), reusing the oldest one's event.
    fn mark<B: PinnedHost<f32>>(&mut self, b: &B, step: u64) -> zcompute::Result<()> {
        let at = match self.before.take() {
            Some(m) => m.at,
            None => b.timing_mark()?,
        };
        b.mark_engine(&at)?;
        self.before = self.last.take();
        self.last = Some(Mark {
            at,
            host: Instant::now(),
            step,
        });
        Ok(())
    }

    /// The window from the slowest rank's milliseconds a step (`times`, 0 where unknown).
    fn agree(&mut self, times: &[f32]) {
        let slowest = times.iter().copied().fold(0f32, f32::max);
        if slowest > 0.0 {
            let lock_step = f64::from(slowest) >= LOCK_STEP_FROM.as_secs_f64() * 1e3;
            let fit = (ASK_EVERY.as_secs_f64() * 1e3 / f64::from(slowest)).floor();
            let window = if lock_step {
                1
            } else {
                (fit as usize).clamp(1, self.bound)
            };
            if window != self.window || lock_step != self.lock_step {
                tracing::debug!(
                    target: "ztrain.signals.pace",
                    window,
                    lock_step,
                    slowest_ms = f64::from(slowest),
                    "read-back window"
                );
            }
            self.window = window;
            self.lock_step = lock_step;
        }
    }
}

impl<B: zcompute::ReadbackOps<f32> + PinnedHost<f32>> Agreement<B> {
    /// The agreement of the ranks of `comm` (none, or a job of one: each process's own), whose
    /// read-back windows are at most `bound` steps (`--readback-every`).
    #[must_use]
    pub fn new(comm: Option<Rc<dyn zcomm::Collective<B, f32>>>, bound: usize) -> Self {
        Agreement {
            comm,
            pending: None,
            pace: Pace {
                bound: bound.max(1),
                window: 1,
                queued: false,
                before: None,
                last: None,
                // Lock-step until a step time is known: a run's first steps may be its
                // longest (5 s steps and a signal in the first seconds would otherwise stop
                // two or three steps later), and reading back a few fast steps one at a time
                // costs milliseconds once.
                lock_step: true,
            },
        }
    }

    /// Whether the run is lock-step (the slowest rank's step takes [`LOCK_STEP_FROM`] or
    /// more): the caller reads back every step queued before asking [`Agreement::after_step`]
    /// (and says so, `drained`), so a signal stops the run after the running step. It changes
    /// only at asks, from what every rank reads there: the same steps on every rank.
    #[must_use]
    pub fn lock_step(&self) -> bool {
        self.pace.lock_step
    }

    /// The ranks' collective (none in a job of one).
    #[must_use]
    pub fn comm(&self) -> Option<&dyn zcomm::Collective<B, f32>> {
        self.comm.as_deref()
    }

    /// The read-back window of the step about to be queued: `--readback-every` for a
    /// process's first step; then as [`Pace`] says. In a job of several it changes only at
    /// asks (where nothing is left in a window), the same on every rank; in a job of one at any
    /// step (its own device time, [`Agreement::after_step`]).
    pub fn next_window(&mut self) -> usize {
        if !self.pace.queued {
            self.pace.queued = true;
            return self.pace.bound;
        }
        self.pace.window
    }

    /// A job of one: its window from its own device time, read from its marks once the
    /// device has passed them (asked without waiting; a mark not passed yet is asked again
    /// at the next step). Its stop flag is read every step, but the host queues up to about
    /// two windows ahead of the device (the window read back is the one before), and a stop
    /// finishes every queued step: with whole windows of 5 s steps a stop came 20 steps and
    /// more after the signal. Sized to about [`ASK_EVERY`] of device time, the queued steps
    /// are a few seconds of it; from [`LOCK_STEP_FROM`] a step none are queued ahead
    /// (lock-step: the caller reads each step back before asking, so its marks have passed).
    fn pace_alone(&mut self, b: &B, step: u64) -> crate::Result<()> {
        let passed = match self.pace.last.as_ref() {
            Some(m) => b.mark_passed(&m.at),
            None => Ok(true),
        };
        let failed = |e: zcompute::ComputeError| {
            zgrad::GradError::from(e).at_step(step, zgrad::Applied::Yes)
        };
        if !passed.map_err(failed)? {
            return Ok(());
        }
        if let Some(ms) = self.pace.step_ms(b) {
            self.pace.agree(&[ms as f32]);
        }
        self.pace.mark(b, step).map_err(failed)?;
        Ok(())
    }

    /// The stop the ranks agreed on, asked after step `step` (see [`Agreement`]); `drained`:
    /// nothing of the run is queued, so this ask's exchange is read at once too. A peer lost
    /// in the exchange fails step `step`, whose update was applied, as one lost inside the
    /// step does.
    pub fn after_step(
        &mut self,
        stop: &StopSignal,
        b: &B,
        step: u64,
        drained: bool,
    ) -> crate::Result<Option<i32>> {
        let mine = stop.received();
        let Some(comm) = self.comm.clone().filter(|c| c.info().world > 1) else {
            self.pace_alone(b, step)?;
            return Ok(mine);
        };
        let info = comm.info();
        let world = info.world;
        // A failed exchange is the peer's failure that caused it when the collective has one
        // (a device error of the read-back otherwise: exit 1, not the peer-failure status),
        // and the communicator is aborted either way, as zgrad does for a step's collective.
        let applied = |e: zgrad::GradError| {
            let e = match comm.take_failure() {
                Some(c) => {
                    comm.abort(&c.to_string());
                    zgrad::GradError::from(c)
                }
                None => {
                    comm.abort(&e.to_string());
                    e
                }
            };
            e.at_step(step, zgrad::Applied::Yes)
        };
        let read = |x: Exchange| match x {
            Exchange::Queued(r) => r.wait().map_err(|e| applied(e.into())),
            Exchange::Read(v) => Ok(v),
        };
        // The earlier exchange first: a signal seen there was seen first, and once it is read
        // the marks before it have passed, so this rank's step time is known.
        let mut all = match self.pending.take() {
            Some(x) => read(x)?,
            None => vec![0.0; 2 * world],
        };
        let mut slots = vec![0f32; 2 * world];
        // Signal numbers are small (< 65): exact in an f32, and a sum of one.
        slots[info.rank] = mine.unwrap_or(0) as f32;
        slots[world + info.rank] = self.pace.step_ms(b).unwrap_or(0.0) as f32;
        let pace = &mut self.pace;
        let mut exchange = || -> Result<zcompute::Readback<f32>, zgrad::GradError> {
            pace.mark(b, step)?;
            let t = b.upload(&slots, &[2 * world])?;
            comm.all_reduce_sum(b, &t, step)?;
            Ok(b.queue_download(&t)?)
        };
        let current = exchange().map_err(applied)?;
        let set = |v: &[f32]| v[..world].iter().filter(|s| **s >= 0.5).count();
        if set(&all) == 0 && (drained || mine.is_some()) {
            // Every rank reads this exchange now when drained; otherwise only the ranks with a
            // signal do, so it counts now only if every rank had one (each reads it at the
            // next ask anyway).
            let now = read(Exchange::Queued(current))?;
            if drained || set(&now) == world {
                all = now;
            } else {
                self.pending = Some(Exchange::Read(now));
            }
        } else {
            self.pending = Some(Exchange::Queued(current));
        }
        // Every rank reads the same `all` at this ask: the same window on every rank.
        self.pace.agree(&all[world..]);
        let got: Vec<(usize, i32)> = all[..world]
            .iter()
            .enumerate()
            .filter(|(_, s)| **s >= 0.5)
            .map(|(r, s)| (r, s.round() as i32))
            .collect();
        let Some(&(_, sig)) = got.first() else {
            return Ok(None);
        };
        if info.rank == 0 && got.len() < world {
            let ranks: Vec<String> = got.iter().map(|(r, _)| r.to_string()).collect();
            tracing::warn!(
                target: "ztrain.signals",
                step,
                "{} reached rank {} only (not the launcher): every rank stops after step {step}",
                name(sig),
                ranks.join(", ")
            );
        }
        Ok(Some(sig))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zcompute::{BTensor, CpuBackend};

    /// Rank 0 of two whose peer (rank 1) received `peer` and takes `ms` a step: the all-reduce
    /// adds its slots, or, with `lost`, fails as a stalled peer does. Counts the waits for the
    /// whole stream (the agreement must not make any).
    #[derive(Default)]
    struct Peer {
        peer: std::cell::Cell<f32>,
        ms: std::cell::Cell<f32>,
        lost: bool,
        synchronized: std::cell::Cell<u32>,
    }

    impl zcomm::Collective<CpuBackend, f32> for Peer {
        fn info(&self) -> zcomm::RankInfo {
            zcomm::RankInfo {
                rank: 0,
                world: 2,
                local_rank: 0,
            }
        }
        fn all_reduce_sum(
            &self,
            b: &CpuBackend,
            x: &BTensor<CpuBackend, f32>,
            step: u64,
        ) -> zcomm::Result<()> {
            if self.lost {
                return Err(zcomm::CommError::PeerFailed {
                    rank: 0,
                    op: "all_reduce",
                    step,
                    detail: "rank 1 answered no one".into(),
                });
            }
            let mut v = zcompute::Backend::download(b, x).expect("download");
            v[1] += self.peer.get();
            v[3] += self.ms.get();
            zcompute::Backend::upload_into(b, &v, x).expect("upload");
            Ok(())
        }
        fn broadcast(
            &self,
            _: &CpuBackend,
            _: &BTensor<CpuBackend, f32>,
            _: usize,
            _: u64,
        ) -> zcomm::Result<()> {
            Ok(())
        }
        fn synchronize(&self, _: &CpuBackend) -> zcomm::Result<()> {
            self.synchronized.set(self.synchronized.get() + 1);
            Ok(())
        }
    }

    /// A signal the peer received before the ask after step 4 is acted on at the next ask
    /// (after step 8, on every rank alike), and no ask waits for the whole stream: each reads
    /// the exchange queued by the ask before.
    #[test]
    fn the_ranks_agree_one_ask_later_without_draining_the_stream() {
        let peer = Rc::new(Peer::default());
        let comm: Rc<dyn zcomm::Collective<CpuBackend, f32>> = peer.clone();
        let mut agreement = Agreement::new(Some(comm), 32);
        let stop = StopSignal::never();
        assert_eq!(
            agreement.after_step(&stop, &CpuBackend, 2, false).unwrap(),
            None
        );
        peer.peer.set(SIGTERM as f32);
        assert_eq!(
            agreement.after_step(&stop, &CpuBackend, 4, false).unwrap(),
            None
        );
        assert_eq!(
            agreement.after_step(&stop, &CpuBackend, 8, false).unwrap(),
            Some(SIGTERM)
        );
        assert_eq!(peer.synchronized.get(), 0, "a wait for the whole stream");
        // This rank's own signal goes the same way.
        peer.peer.set(0.0);
        stop.raise(SIGINT);
        assert_eq!(
            agreement.after_step(&stop, &CpuBackend, 12, false).unwrap(),
            Some(SIGTERM),
            "the exchange of step 8"
        );
        assert_eq!(
            agreement.after_step(&stop, &CpuBackend, 16, false).unwrap(),
            Some(SIGINT)
        );
    }

    /// Issue 45: a signal every rank received (one to the launcher, passed on) stops the job
    /// at the ask that sees it, not a window later; a signal this rank alone received is read
    /// at once but acted on at the next ask, as its peer (which has none, so reads nothing
    /// now) will.
    #[test]
    fn a_signal_every_rank_received_stops_at_the_ask_that_sees_it() {
        let peer = Rc::new(Peer::default());
        let comm: Rc<dyn zcomm::Collective<CpuBackend, f32>> = peer.clone();
        let mut agreement = Agreement::new(Some(comm), 32);
        let stop = StopSignal::never();
        stop.raise(SIGINT);
        assert_eq!(
            agreement.after_step(&stop, &CpuBackend, 4, false).unwrap(),
            None,
            "rank 1 had none at this ask: it goes on, so this rank must too"
        );
        assert_eq!(
            agreement.after_step(&stop, &CpuBackend, 8, false).unwrap(),
            Some(SIGINT)
        );
        let mut agreement = Agreement::new(
            Some(peer.clone() as Rc<dyn zcomm::Collective<CpuBackend, f32>>),
            32,
        );
        peer.peer.set(SIGINT as f32);
        assert_eq!(
            agreement.after_step(&stop, &CpuBackend, 12, false).unwrap(),
            Some(SIGINT),
            "both ranks had it: the job stops after step 12"
        );
        assert_eq!(peer.synchronized.get(), 0);
    }

    /// Where nothing is queued (an epoch's end, the run's last among them) the ask reads its
    /// own exchange at once: a signal seen there is acted on there, not left to an ask that
    /// may never come; an earlier exchange's signal still comes first.
    #[test]
    fn a_drained_ask_reads_its_own_exchange() {
        let peer = Rc::new(Peer::default());
        let comm: Rc<dyn zcomm::Collective<CpuBackend, f32>> = peer.clone();
        let mut agreement = Agreement::new(Some(comm), 32);
        let stop = StopSignal::never();
        assert_eq!(
            agreement.after_step(&stop, &CpuBackend, 10, true).unwrap(),
            None
        );
        peer.peer.set(SIGINT as f32);
        assert_eq!(
            agreement.after_step(&stop, &CpuBackend, 20, true).unwrap(),
            Some(SIGINT)
        );
        // Mid-epoch the peer's SIGINT is queued; the drained ask after it reads that one first.
        assert_eq!(
            agreement.after_step(&stop, &CpuBackend, 24, false).unwrap(),
            None
        );
        peer.peer.set(SIGTERM as f32);
        assert_eq!(
            agreement.after_step(&stop, &CpuBackend, 30, true).unwrap(),
            Some(SIGINT)
        );
        assert_eq!(peer.synchronized.get(), 0);
    }

    /// Issue 45: the read-back window of several ranks is the whole `--readback-every` for
    /// the first step, one step until a step time is known, then what takes about a second of
    /// the slowest rank's time (its milliseconds a step come in the exchange, read an ask
    /// later): a 5 s step asks after every step, a 200 ms one every 5, a fast one (this
    /// rank's own, on the host's clock over a thousand steps) the whole window. A job of one
    /// always takes the whole window.
    #[test]
    fn the_window_is_sized_by_the_slowest_ranks_step_time() {
        let peer = Rc::new(Peer::default());
        let comm: Rc<dyn zcomm::Collective<CpuBackend, f32>> = peer.clone();
        let mut agreement = Agreement::new(Some(comm), 32);
        let stop = StopSignal::never();
        let ask = |a: &mut Agreement<CpuBackend>, step| {
            assert_eq!(a.after_step(&stop, &CpuBackend, step, false).unwrap(), None);
            a.next_window()
        };
        assert_eq!(
            agreement.next_window(),
            32,
            "the first step makes the history"
        );
        assert_eq!(agreement.next_window(), 1, "no step time yet");
        // Asks a thousand steps apart: this rank's own time a step, on the host's clock, is
        // then far below any the peer reports, whatever the load.
        peer.ms.set(5000.0);
        assert_eq!(ask(&mut agreement, 1000), 1);
        assert_eq!(
            ask(&mut agreement, 2000),
            1,
            "5 s a step: one step a window"
        );
        peer.ms.set(200.0);
        assert_eq!(
            ask(&mut agreement, 3000),
            1,
            "the exchange of step 2000 said 5 s"
        );
        peer.ms.set(0.0);
        assert_eq!(ask(&mut agreement, 4000), 5, "200 ms a step");
        assert_eq!(ask(&mut agreement, 5000), 32, "this rank's own time, fast");
        assert_eq!(peer.synchronized.get(), 0);
    }

    /// Issue 45 item 6: the run goes lock-step from [`LOCK_STEP_FROM`] of the slowest rank's
    /// step and not below it. Fast steps (0.4 ms, `ztrain --gpus 2` at batch 256) keep the
    /// whole window and queue ahead; 5 s steps read back and ask every step, each ask reading
    /// its own exchange (the caller drained the step first), so the peer's signal stops the
    /// job at the ask that sees it; back to fast steps, the window comes back. The asks are a
    /// million steps apart: this rank's own time a step, on the host's clock, is far below
    /// any the peer reports, whatever the load.
    #[test]
    fn short_steps_keep_their_window_and_long_ones_go_lock_step() {
        let peer = Rc::new(Peer::default());
        let comm: Rc<dyn zcomm::Collective<CpuBackend, f32>> = peer.clone();
        let mut agreement = Agreement::new(Some(comm), 32);
        let stop = StopSignal::never();
        let ask = |a: &mut Agreement<CpuBackend>, step, drained| {
            assert_eq!(
                a.after_step(&stop, &CpuBackend, step, drained).unwrap(),
                None
            );
            (a.next_window(), a.lock_step())
        };
        assert_eq!(agreement.next_window(), 32);
        assert!(agreement.lock_step(), "no step time yet: lock-step");
        peer.ms.set(0.4);
        assert_eq!(
            ask(&mut agreement, 1_000_000, true),
            (32, false),
            "the first ask reads its own exchange (drained): 0.4 ms a step, not lock-step"
        );
        assert_eq!(
            ask(&mut agreement, 2_000_000, false),
            (32, false),
            "0.4 ms a step: the whole window, queued ahead"
        );
        peer.ms.set(5000.0);
        assert_eq!(ask(&mut agreement, 3_000_000, false), (32, false));
        assert_eq!(
            ask(&mut agreement, 4_000_000, false),
            (1, true),
            "5 s a step: lock-step"
        );
        peer.ms.set(499.0);
        assert_eq!(
            ask(&mut agreement, 5_000_000, true),
            (2, false),
            "just under the threshold (the drained ask reads its own exchange)"
        );
        peer.ms.set(500.0);
        assert_eq!(ask(&mut agreement, 6_000_000, true), (1, true));
        peer.peer.set(SIGTERM as f32);
        assert_eq!(
            agreement
                .after_step(&stop, &CpuBackend, 6_500_000, true)
                .unwrap(),
            Some(SIGTERM),
            "lock-step: the peer's signal stops the job at the ask that sees it"
        );
        peer.peer.set(0.0);
        peer.ms.set(0.4);
        assert_eq!(
            ask(&mut agreement, 7_000_000, true),
            (32, false),
            "fast again: the window is back"
        );
        assert_eq!(peer.synchronized.get(), 0);
    }

    /// Issue 45: a job of one sizes its window by its own time a step too (here the host's
    /// clock, the CPU keeping no device time): the whole `--readback-every` while its steps
    /// are fast, one step once a step takes a second or more (a sleep: the clock is
    /// monotonic, so the step is at least that long whatever the load). Before, a job of one
    /// always took the whole window, and with steps of seconds its stop came a window or two
    /// of steps after the signal.
    #[test]
    fn a_job_of_one_sizes_its_window_by_its_own_step_time() {
        let mut one = Agreement::<CpuBackend>::new(None, 8);
        let stop = StopSignal::never();
        let ask = |a: &mut Agreement<CpuBackend>, step| {
            assert_eq!(a.after_step(&stop, &CpuBackend, step, false).unwrap(), None);
            a.next_window()
        };
        assert_eq!(one.next_window(), 8, "the first step makes the history");
        assert_eq!(one.next_window(), 1, "no step time yet");
        assert!(one.lock_step(), "no step time yet: lock-step");
        assert_eq!(ask(&mut one, 1), 1);
        assert_eq!(ask(&mut one, 1001), 1, "one mark is no time yet");
        assert!(one.lock_step(), "one mark is no time yet: still lock-step");
        assert_eq!(ask(&mut one, 2001), 8, "a thousand steps at once: fast");
        assert!(!one.lock_step(), "fast steps leave lock-step");
        std::thread::sleep(ASK_EVERY + Duration::from_millis(50));
        assert_eq!(
            ask(&mut one, 2002),
            8,
            "the marks of steps 1001 and 2001: fast"
        );
        assert!(!one.lock_step());
        assert_eq!(ask(&mut one, 2003), 1, "step 2002 took a second and more");
        assert!(one.lock_step(), "a second a step: lock-step");
        stop.raise(SIGTERM);
        assert_eq!(
            one.after_step(&stop, &CpuBackend, 2004, false).unwrap(),
            Some(SIGTERM),
            "its own flag, at once"
        );
    }

    /// A peer lost in the agreement after step 12 fails step 12, whose update was applied,
    /// exactly as one lost inside the step does (the launcher and the user read "step N").
    #[test]
    fn a_peer_lost_in_the_stop_agreement_fails_that_step_with_its_update_applied() {
        let comm: Rc<dyn zcomm::Collective<CpuBackend, f32>> = Rc::new(Peer {
            lost: true,
            ..Peer::default()
        });
        let e = Agreement::new(Some(comm), 32)
            .after_step(&StopSignal::never(), &CpuBackend, 12, false)
            .unwrap_err();
        let crate::error::TrainError::Grad(g) = &e else {
            panic!("not a step failure: {e:?}");
        };
        assert!(matches!(
            g,
            zgrad::GradError::Step {
                step: 12,
                applied: zgrad::Applied::Yes,
                ..
            }
        ));
        assert!(e.to_string().starts_with("step 12 failed"), "{e}");
        assert!(e.is_peer_failure());
    }
}
