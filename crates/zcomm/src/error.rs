//! `CommError`: what went wrong with a collective, a rendezvous or the launch environment, and
//! what the caller can do about it.

use crate::secret::MIN_SECRET_HEX_DIGITS;
use std::time::Duration;

/// Errors of this crate. Operations name the collective (`"all_reduce"`, `"broadcast"`,
/// `"init"`) and the optimiser step they belong to.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommError {
    /// The collective library (NCCL) could not be opened or lacks a symbol: install it or point
    /// `ZGPU_NCCL_LIB_DIR` at it.
    #[error("the NCCL library could not be loaded")]
    Library(#[source] cuda_sys::LoadError),

    /// The loaded library is older than the bindings need.
    #[error("NCCL {found} is loaded but {needed} or newer is needed")]
    VersionTooOld { found: String, needed: String },

    /// A wait passed its deadline: a peer is stalled or gone (`silent`: the peer that did not
    /// answer, or the ranks it may be when the transport cannot tell). The communicator was
    /// aborted; the job cannot go on.
    #[error(
        "rank {rank}: {silent} did not answer within {waited_for:?} in {op} at step {step} (stopped, stalled or dead); the communicator was aborted"
    )]
    Timeout {
        rank: usize,
        op: &'static str,
        step: u64,
        waited_for: Duration,
        silent: Silent,
    },

    /// A wait of this rank on its device (a read-back, a drain) passed its deadline
    /// (`--comm-timeout`) in a job of several ranks with no failure from the collectives: the
    /// device waits behind a collective whose peer stopped or died, which nothing tells the
    /// host of on a GPU (NCCL's kernel spins on the device until aborted). `silent`: that peer,
    /// or the ranks it may be. The communicator was aborted; the job cannot go on.
    #[error(
        "rank {rank}: a wait on the device passed its deadline behind the job's collectives: {silent} did not answer (stopped, stalled or dead); the communicator was aborted"
    )]
    DeviceWait {
        rank: usize,
        silent: Silent,
        /// (Boxed: it keeps `CommError` small.)
        #[source]
        source: Box<zcompute::ComputeError>,
    },

    /// A peer reported a failure or vanished (connection closed, asynchronous error).
    #[error("rank {rank}: {op} of step {step} failed: {detail}")]
    PeerFailed {
        rank: usize,
        op: &'static str,
        step: u64,
        detail: String,
    },

    /// The collective library returned an error code.
    #[error("rank {rank}: {op} of step {step}: NCCL returned {name} ({code})")]
    Nccl {
        rank: usize,
        op: &'static str,
        step: u64,
        code: i32,
        name: String,
    },

    /// Creating or registering a communicator (or anything else that is not a plain
    /// collective) while the device captures: do it before capture.
    #[error(
        "{call} is not allowed while the device captures a graph; create communicators before capture"
    )]
    CaptureIllegal { call: &'static str },

    /// A rank outside `0..world`.
    #[error("rank {rank} is outside a world of {world} ({op}, step {step})")]
    BadRank {
        rank: usize,
        world: usize,
        op: &'static str,
        step: u64,
    },

    /// A launcher variable is missing or malformed (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
    /// `MASTER_ADDR`, `MASTER_PORT`).
    #[error("launch environment: {var}={value:?}: {problem}")]
    BadEnv {
        var: &'static str,
        value: String,
        problem: String,
    },

    /// An environment variable this crate reads holds bytes that are not UTF-8 (its value is
    /// never shown: it may be the job secret).
    #[error("environment: {var} is not valid UTF-8 (its value is not shown); set it to plain text")]
    EnvNotUtf8 { var: &'static str },

    /// The rendezvous (rank 0 handing out the unique id over TCP) failed or passed its deadline.
    #[error("rendezvous at {addr} (rank {rank}): {detail}")]
    Rendezvous {
        addr: String,
        rank: usize,
        detail: String,
        #[source]
        source: Option<std::io::Error>,
    },

    /// A process of another user (root included) connected to the rendezvous's Unix socket,
    /// or listens on it: refused, whatever it would say. Only the user's own processes take
    /// part in a job of one host.
    #[error(
        "rendezvous socket {socket}: the process at the other end belongs to uid {peer_uid}, not to this user (uid {own_uid}); refused"
    )]
    ForeignPeer {
        socket: String,
        peer_uid: u32,
        own_uid: u32,
    },

    /// The job secret could not be made or read (a secret file others can read, one too
    /// short or too long): fix it as the detail says.
    #[error("job secret: {detail}")]
    Secret { detail: String },

    /// The job secret is not a key: fewer than 128 bits, or not hex digits. A phrase a person
    /// chose can be guessed offline from one recorded handshake; a random key cannot.
    #[error(
        "{from}: the job secret is not a key ({problem}); a job secret is a random key of at least 128 bits written as {MIN_SECRET_HEX_DIGITS} or more hex digits: make one with `ztrain --make-secret FILE` (or `openssl rand -hex 32`)"
    )]
    WeakSecret { from: String, problem: String },

    /// No job secret for a rendezvous other hosts can reach: set `ZCOMM_SECRET` (or
    /// `ZCOMM_SECRET_FILE`) to the same secret on every rank, or `ZCOMM_ALLOW_UNAUTHENTICATED=1`
    /// to accept that anyone who reaches the port may join the job.
    #[error(
        "no job secret for the rendezvous at {addr}: anyone who reaches it could join the job and feed it gradients; set ZCOMM_SECRET (or ZCOMM_SECRET_FILE, a file only you can read) to the same secret on every rank, or ZCOMM_ALLOW_UNAUTHENTICATED=1 to run without one"
    )]
    NoSecret { addr: String },

    /// The caller asked to stop (SIGINT/SIGTERM) while this waited for other ranks.
    #[error("{during}: interrupted (a stop was asked for)")]
    Interrupted { during: &'static str },

    /// This rank's launcher was gone when the rank started: it would run as an orphan.
    #[error(
        "the launcher (pid {pid}) that started this rank is gone; the rank does not run without it"
    )]
    LauncherGone { pid: i32 },

    /// The launcher could not start or watch its ranks.
    #[error("launcher: {detail}")]
    Launch {
        detail: String,
        #[source]
        source: std::io::Error,
    },

    /// The device failed under a collective.
    #[error("{op}: the device failed")]
    Device {
        op: &'static str,
        #[source]
        source: zdevice::DeviceError,
    },

    /// An argument was rejected before reaching the collective library (a strided view, a
    /// tensor on another device, a unique id of the wrong length).
    #[error("{op}: invalid argument: {reason}")]
    InvalidArgument { op: &'static str, reason: String },

    /// The collective library needs the real CUDA driver; this backend's driver (the
    /// simulator) has none of its streams or memory. Use the simulated communicator there.
    #[error("NCCL needs the real CUDA driver; {driver} cannot run it")]
    NotCuda { driver: String },

    /// Nothing moved on this rank for `waited_for` (`--comm-timeout`): its training thread
    /// was stuck in `op` (a peer stopped, or the device waits for one), so its watchdog
    /// aborted the communicators from a thread of its own (issue 44). `detail` is the error
    /// the stuck wait then returned, naming the silent peer where the transport knows it. The
    /// job cannot go on; raise `--comm-timeout` if a step or the work between two steps
    /// legitimately takes longer. `silent`: the peer waited for, or the ranks it may be.
    #[error(
        "rank {rank}: no progress for {waited_for:.1?} in {op} at step {step} ({silent} did not answer); the watchdog aborted the communicators: {detail}"
    )]
    NoProgress {
        rank: usize,
        op: &'static str,
        step: u64,
        waited_for: Duration,
        silent: Silent,
        detail: String,
    },

    /// This rank gave the job up (`cause`: why its communicators were aborted) but the process
    /// did not end within `within` after that: a thread stayed blocked on the device (a launch
    /// behind work that waits for a dead peer, a teardown behind an abort that does not
    /// return), as measured on 2 H200s with a peer killed in a captured run. The application's
    /// last resort ([`crate::Watched::with_last_resort`]) ends the process with this error,
    /// running no teardown. `silent`: the rank that stopped answering, or the ranks it may be.
    #[error(
        "rank {rank}: {silent} stopped answering; gave up the job ({cause}) and did not end within {within:.1?} after that (a thread stayed blocked on the device); the process ends without its teardown"
    )]
    TeardownStuck {
        rank: usize,
        silent: Silent,
        within: Duration,
        cause: String,
    },

    /// A thread of this crate could not be started.
    #[error("{op}: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },

    /// The backend refused or failed an operation around a collective.
    #[error("{op}: the backend failed")]
    Compute {
        op: &'static str,
        #[source]
        source: zcompute::ComputeError,
    },
}

/// This crate's result.
pub type Result<T> = std::result::Result<T, CommError>;

impl CommError {
    /// The peer this error names as the one that did not answer, where it names one.
    #[must_use]
    pub fn silent_peer(&self) -> Option<usize> {
        match self {
            CommError::Timeout { silent, .. }
            | CommError::DeviceWait { silent, .. }
            | CommError::NoProgress { silent, .. }
            | CommError::TeardownStuck { silent, .. } => silent.rank(),
            _ => None,
        }
    }
}

/// Which peer a rank waited for in vain, as far as it can tell: every error of a wait that
/// passed its deadline names one (issue 44).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Silent {
    /// This rank did not answer (the transport saw it, or the job has no other peer).
    Rank(usize),
    /// One of `ranks` did not answer; this rank cannot tell which, for the reason `why`.
    OneOf {
        ranks: Vec<usize>,
        why: &'static str,
    },
}

impl Silent {
    /// The peer `known` where the transport found one silent; else what the job's shape tells
    /// rank `info.rank`: of two ranks, the other one; of more, one of the others (`why`: what
    /// kept the transport from saying which).
    #[must_use]
    pub fn of(info: crate::RankInfo, known: Option<usize>, why: &'static str) -> Silent {
        if let Some(peer) = known {
            return Silent::Rank(peer);
        }
        let ranks: Vec<usize> = (0..info.world).filter(|r| *r != info.rank).collect();
        match ranks[..] {
            [only] => Silent::Rank(only),
            _ => Silent::OneOf { ranks, why },
        }
    }

    /// The one rank named, if one is.
    #[must_use]
    pub fn rank(&self) -> Option<usize> {
        match self {
            Silent::Rank(r) => Some(*r),
            Silent::OneOf { .. } => None,
        }
    }
}

impl std::fmt::Display for Silent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Silent::Rank(r) => write!(f, "rank {r}"),
            Silent::OneOf { ranks, why } if ranks.is_empty() => write!(f, "a peer ({why})"),
            Silent::OneOf { ranks, why } => {
                let list: Vec<String> = ranks.iter().map(usize::to_string).collect();
                write!(f, "a peer of ranks {} ({why})", list.join(", "))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RankInfo;
    use rstest::rstest;

    fn info(rank: usize, world: usize) -> RankInfo {
        RankInfo {
            rank,
            world,
            local_rank: rank,
        }
    }

    /// Issue 44: a wait past its deadline always says who did not answer: the peer the
    /// transport saw, else the only other rank of two, else the candidates and why.
    #[rstest]
    #[case::known(info(0, 4), Some(2), "rank 2")]
    #[case::the_only_peer_of_rank_0(info(0, 2), None, "rank 1")]
    #[case::the_only_peer_of_rank_1(info(1, 2), None, "rank 0")]
    #[case::one_of_three(
        info(1, 4),
        None,
        "a peer of ranks 0, 2, 3 (the transport does not say)"
    )]
    #[case::no_world_known(info(0, 0), None, "a peer (the transport does not say)")]
    fn a_silent_peer_is_named_or_its_candidates_are(
        #[case] who: RankInfo,
        #[case] known: Option<usize>,
        #[case] want: &str,
    ) {
        let silent = Silent::of(who, known, "the transport does not say");
        assert_eq!(silent.to_string(), want);
        let e = CommError::Timeout {
            rank: who.rank,
            op: "synchronize",
            step: 4,
            waited_for: Duration::from_secs(3),
            silent,
        };
        assert!(
            e.to_string().contains(&format!(
                "{want} did not answer within 3s in synchronize at step 4"
            )),
            "{e}"
        );
        assert_eq!(
            e.silent_peer(),
            known.or((who.world == 2).then(|| 1 - who.rank))
        );
    }
}
