//! Data-parallel collectives for the engine. One process per GPU; each process holds one
//! [`Collective`] joined to the others, and sums gradients or broadcasts parameters through it on
//! the backend's engine stream, so a captured step can contain the collective.
//!
//! Every wait has a deadline: a peer that dies or stalls makes the others return a typed
//! [`CommError`] naming the rank, the operation and the step, never a hang. Creating or
//! registering anything while the device captures is refused.
#![forbid(unsafe_code)]

pub mod env;
mod error;
pub mod launch;
pub mod nccl;
pub mod rendezvous;
pub mod secret;
pub mod sim;
pub mod watchdog;

pub use env::{LaunchEnv, Master};
pub use error::{CommError, Result, Silent};
pub use nccl::{JoinOptions, NcclCollective};
pub use secret::{Auth, JobSecret};
pub use sim::SimCollective;
pub use watchdog::{Watchdog, Watched};

use zcompute::{BTensor, Backend, Element};

/// Where this process stands among the ranks of one job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankInfo {
    /// 0-based global rank.
    pub rank: usize,
    /// Number of ranks in the job.
    pub world: usize,
    /// Rank within this host: the device ordinal this rank opens.
    pub local_rank: usize,
}

impl RankInfo {
    /// The one rank of a single-process job.
    pub const SINGLE: RankInfo = RankInfo {
        rank: 0,
        world: 1,
        local_rank: 0,
    };
}

/// Collectives over a backend's tensors. Operations are queued on the backend's engine stream
/// (legal inside a capture: a captured step may contain them) and complete in stream order;
/// [`Collective::synchronize`] waits, with the device's deadline, for all of them and reports
/// a peer's failure.
pub trait Collective<B: Backend<T>, T: Element> {
    /// This rank.
    fn info(&self) -> RankInfo;

    /// Replaces `x` (dense) by the sum of every rank's `x`. `step` names the optimiser step in
    /// errors.
    fn all_reduce_sum(&self, b: &B, x: &BTensor<B, T>, step: u64) -> Result<()>;

    /// As [`Collective::all_reduce_sum`], queued on the collective's second stream after all
    /// the work queued so far on the backend's engine stream, so that it runs while the engine
    /// stream goes on (the data-parallel step's buckets during backward). Overlapped calls run
    /// in the order they are queued; every rank must queue the same sequence. Nothing may read
    /// `x` on the engine stream before [`Collective::join_overlapped`]. Legal inside a capture
    /// (the graph then holds both streams' work). The default queues `all_reduce_sum` on the
    /// engine stream: correct, not overlapped.
    fn all_reduce_sum_overlapped(&self, b: &B, x: &BTensor<B, T>, step: u64) -> Result<()> {
        self.all_reduce_sum(b, x, step)
    }

    /// Orders the engine stream after every overlapped collective queued so far. A captured
    /// body that queued overlapped collectives must call it before it ends (else the capture
    /// fails: its second stream was not joined back). The default has nothing to join.
    fn join_overlapped(&self, _b: &B) -> Result<()> {
        Ok(())
    }

    /// Prepares [`Collective::all_reduce_last_and_norm`] for a flat gradient buffer of `len`
    /// elements whose last bucket (summed after backward) is its first `last` elements. A
    /// collective: every rank calls it with the same sizes, outside a capture, before the
    /// steps that use it. Returns whether the fused path is on (every rank gets the same
    /// answer). The default has none: `false`.
    ///
    /// # Errors
    /// `CaptureIllegal` while capturing; the collectives' errors.
    fn prepare_last_and_norm(&self, _b: &B, _len: usize, _last: usize, _step: u64) -> Result<bool> {
        Ok(false)
    }

    /// Once prepared for `grads`' size and `last`: queues `grads[..last]` summed over the
    /// ranks and returns the Euclidean norm of all of `grads` (rank 0; the rest of `grads`
    /// already summed on every rank and joined), in one launch on the engine stream. `None`
    /// when not prepared for these sizes: the caller sums the bucket and takes the norm itself.
    /// Legal inside a capture.
    ///
    /// # Errors
    /// The launch's errors.
    fn all_reduce_last_and_norm(
        &self,
        _b: &B,
        _grads: &BTensor<B, T>,
        _last: usize,
        _step: u64,
    ) -> Result<Option<BTensor<B, T>>> {
        Ok(None)
    }

    /// Replaces `x` (dense) on every rank by rank `root`'s `x`.
    fn broadcast(&self, b: &B, x: &BTensor<B, T>, root: usize, step: u64) -> Result<()>;

    /// Waits until every operation queued so far has completed on this rank, bounded by the
    /// device's deadline, polling the communicator's asynchronous error.
    fn synchronize(&self, b: &B) -> Result<()>;

    /// The optimiser step the collectives queued from now on belong to, for their errors
    /// (a captured graph replays its collectives without calling this trait; the trainer says
    /// which step each replay is).
    fn set_step(&self, _step: u64) {}

    /// The training thread enters (`Some(what)`) or leaves (`None`) a phase of its own, with
    /// no step and no collective in it (the checkpoint written, an evaluation on the host):
    /// a watchdog does not take it for a stall however long it lasts ([`Watched`]), though a
    /// collective called inside it is watched as anywhere. The caller drains its collectives
    /// first, so nothing of another rank is left on its streams while the phase runs.
    fn set_local_phase(&self, _phase: Option<&'static str>) {}

    /// The first failure of an asynchronous collective (a peer stalled, gave up or vanished),
    /// handed out once: the typed error to report instead of the device error it caused.
    fn take_failure(&self) -> Option<CommError> {
        None
    }

    /// Tells the other ranks this one gives up (after an error of its own), so they stop at
    /// their next collective instead of waiting for the deadline. Best effort.
    fn abort(&self, _why: &str) {}

    /// The peer this rank waits for in vain, as far as the collective can tell: the one its
    /// transport found silent, else what the job's shape says ([`Silent::of`]: of two ranks,
    /// the other one). Never waits.
    fn silent(&self) -> Silent {
        Silent::of(
            self.info(),
            None,
            "the transport does not say which peer its collectives wait for",
        )
    }

    /// `source`, a wait of this rank on its device that passed its deadline, as the job's
    /// error when it is one of several ranks: [`CommError::DeviceWait`] naming the peer the
    /// device waits behind ([`Collective::silent`], issue 44). `None` for a job of one rank, or
    /// an error that is not a wait past its deadline (`source` comes back).
    ///
    /// # Errors
    /// `source` itself, when it is not the peers' doing.
    fn device_wait_error(
        &self,
        source: zcompute::ComputeError,
    ) -> std::result::Result<CommError, zcompute::ComputeError> {
        if self.info().world <= 1 || !source.is_timeout() {
            return Err(source);
        }
        Ok(CommError::DeviceWait {
            rank: self.info().rank,
            silent: self.silent(),
            source: Box::new(source),
        })
    }
}

/// The collective of a single-process job: world 1, every operation leaves `x` as it is.
#[derive(Clone, Copy, Debug, Default)]
pub struct SingleProcess;

impl<B: Backend<T>, T: Element> Collective<B, T> for SingleProcess {
    fn info(&self) -> RankInfo {
        RankInfo::SINGLE
    }

    fn all_reduce_sum(&self, _b: &B, _x: &BTensor<B, T>, _step: u64) -> Result<()> {
        Ok(())
    }

    fn broadcast(&self, _b: &B, _x: &BTensor<B, T>, root: usize, step: u64) -> Result<()> {
        if root != 0 {
            return Err(CommError::BadRank {
                rank: root,
                world: 1,
                op: "broadcast",
                step,
            });
        }
        Ok(())
    }

    fn synchronize(&self, b: &B) -> Result<()> {
        b.synchronize().map_err(|source| CommError::Compute {
            op: "synchronize",
            source,
        })
    }
}
