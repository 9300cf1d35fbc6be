//! The launcher: one process per rank on this host. Starts `program` N times with the
//! launcher variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR=127.0.0.1`,
//! `MASTER_PORT` = a free port) and `NCCL_NVLS_ENABLE=0` added to the rest of the environment,
//! watches them, and takes every rank down as soon as one fails (or the caller asks it to
//! stop, on SIGINT/SIGTERM). The outcome says which rank failed and how, and gives the exit
//! code that names it ([`Launched::exit_code`]).

use crate::error::{CommError, Result};
use std::ffi::OsString;
use std::net::TcpListener;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// Exit codes of a launcher whose rank failed: `RANK_EXIT_BASE + rank` (ranks up to 99).
pub const RANK_EXIT_BASE: u8 = 100;

/// What to start.
#[derive(Clone, Debug)]
pub struct LaunchSpec {
    pub program: OsString,
    pub args: Vec<OsString>,
    pub ranks: usize,
    /// After one rank failed (or a stop was asked), how long the others get to exit before
    /// they are killed.
    pub grace: Duration,
}

/// How one rank ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RankEnd {
    /// Exited with this status code.
    Exited(i32),
    /// Ended by a signal (Unix) the launcher did not send.
    Signalled(Option<i32>),
    /// Still running when the grace after another rank's failure (or a stop) ran out: the
    /// launcher killed it. A rank that reports its own error in time never ends this way.
    TakenDown,
}

impl std::fmt::Display for RankEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RankEnd::Exited(c) => write!(f, "exited with status {c}"),
            RankEnd::Signalled(Some(s)) => write!(f, "was killed by signal {s}"),
            RankEnd::Signalled(None) => write!(f, "was killed"),
            RankEnd::TakenDown => write!(f, "was killed by the launcher when the grace ran out"),
        }
    }
}

/// The outcome of a launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launched {
    /// The first rank that failed and how, if one did.
    pub failed: Option<(usize, RankEnd)>,
    /// Whether the caller asked to stop (every rank was taken down).
    pub stopped: bool,
    /// How every rank ended, by rank.
    pub ends: Vec<Option<RankEnd>>,
}

impl Launched {
    /// 0 when every rank succeeded; `RANK_EXIT_BASE + rank` for the first failed rank (1 past
    /// rank 99); 1 when stopped with no rank failed first.
    #[must_use]
    pub fn exit_code(&self) -> u8 {
        match &self.failed {
            Some((r, _)) => u8::try_from(*r)
                .ok()
                .filter(|r| *r < 100)
                .map_or(1, |r| RANK_EXIT_BASE + r),
            None if self.stopped => 1,
            None => 0,
        }
    }

    /// A line saying what happened, for the user: the rank that failed first, then how each
    /// other rank ended (on its own with its error, or killed when the grace ran out).
    #[must_use]
    pub fn message(&self) -> String {
        match &self.failed {
            Some((r, end)) => {
                let others: Vec<String> = self
                    .ends
                    .iter()
                    .enumerate()
                    .filter(|(o, _)| o != r)
                    .map(|(o, e)| match e {
                        Some(e) => format!("rank {o} {e}"),
                        None => format!("rank {o} did not report how it ended"),
                    })
                    .collect();
                let mut line = format!(
                    "rank {r} of {} {end}; every other rank was taken down (exit code {})",
                    self.ends.len(),
                    self.exit_code()
                );
                if !others.is_empty() {
                    line += &format!(": {}", others.join(", "));
                }
                line
            }
            None if self.stopped => "stopped: every rank was taken down".into(),
            None => format!("all {} ranks finished", self.ends.len()),
        }
    }
}

/// A free TCP port on 127.0.0.1 for rank 0's rendezvous.
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| spawn_err("finding a free port", e))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| spawn_err("finding a free port", e))
}

/// Starts the ranks and watches them until all ended, one failed, or `stop()` says so.
pub fn launch(spec: &LaunchSpec, stop: &dyn Fn() -> bool) -> Result<Launched> {
    let port = free_port()?;
    let mut children: Vec<Child> = Vec::with_capacity(spec.ranks);
    for rank in 0..spec.ranks {
        let child = Command::new(&spec.program)
            .args(&spec.args)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", spec.ranks.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("NCCL_NVLS_ENABLE", "0")
            .spawn();
        match child {
            Ok(c) => children.push(c),
            Err(e) => {
                let _ = take_down(&mut children, Duration::ZERO);
                return Err(spawn_err(&format!("starting rank {rank}"), e));
            }
        }
    }
    tracing::debug!(target: "zcomm.launch", ranks = spec.ranks, port, "ranks started");
    let mut ends: Vec<Option<RankEnd>> = vec![None; spec.ranks];
    let mut failed = None;
    let mut stopped = false;
    while ends.iter().any(Option::is_none) {
        let mut now_failed = Vec::new();
        for (r, c) in children.iter_mut().enumerate() {
            if ends[r].is_some() {
                continue;
            }
            if let Some(status) = c
                .try_wait()
                .map_err(|e| spawn_err("watching the ranks", e))?
            {
                let end = end_of(status);
                if end != RankEnd::Exited(0) {
                    now_failed.push((r, end.clone()));
                }
                ends[r] = Some(end);
            }
        }
        if failed.is_none() {
            // Ranks seen failing in the same poll: the peers of a dead rank exit with their
            // errors moments after it, so a rank a signal ended is the cause, else the lowest.
            failed = now_failed
                .iter()
                .find(|(_, e)| matches!(e, RankEnd::Signalled(_)))
                .or(now_failed.first())
                .cloned();
            if let Some((r, end)) = &failed {
                tracing::error!(target: "zcomm.launch", rank = r, %end, "rank failed; taking every rank down");
            }
        }
        if failed.is_some() || (!stopped && stop()) {
            stopped |= failed.is_none();
            let killed = take_down(&mut children, spec.grace);
            for (r, c) in children.iter_mut().enumerate() {
                if ends[r].is_none() {
                    let end = c.wait().ok().map(end_of);
                    ends[r] = if killed[r] {
                        Some(RankEnd::TakenDown)
                    } else {
                        end
                    };
                }
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(Launched {
        failed,
        stopped,
        ends,
    })
}

/// Gives running children `grace` to exit on their own (the failed rank's peers end with their
/// typed errors), then kills the rest; says which it killed.
fn take_down(children: &mut [Child], grace: Duration) -> Vec<bool> {
    let deadline = Instant::now() + grace;
    loop {
        let mut running = 0;
        for c in children.iter_mut() {
            if matches!(c.try_wait(), Ok(None)) {
                running += 1;
            }
        }
        if running == 0 || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    children
        .iter_mut()
        .map(|c| matches!(c.try_wait(), Ok(None)) && c.kill().is_ok())
        .collect()
}

fn end_of(status: ExitStatus) -> RankEnd {
    match status.code() {
        Some(c) => RankEnd::Exited(c),
        None => {
            #[cfg(unix)]
            {
                use std::os::unix::process::ExitStatusExt;
                RankEnd::Signalled(status.signal())
            }
            #[cfg(not(unix))]
            {
                RankEnd::Signalled(None)
            }
        }
    }
}

fn spawn_err(what: &str, e: std::io::Error) -> CommError {
    CommError::Launch {
        detail: format!("{what}: {e}"),
        source: e,
    }
}
