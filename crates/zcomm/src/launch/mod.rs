//! The launcher: one process per rank on this host. Starts `program` N times with the
//! launcher variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, and instead of a TCP address
//! `ZCOMM_RENDEZVOUS_SOCKET`: a Unix socket in a directory made fresh for the job that only
//! this user may enter, removed when the launch ends; see [`PrivateDir`]: the job opens no
//! port), a fresh job secret (`ZCOMM_SECRET`, in the environment, never
//! on the command line), its own pid (`ZCOMM_LAUNCHER_PID`, for [`die_with_launcher`]) and
//! `NCCL_NVLS_ENABLE=0` added to the rest of the environment, `NCCL_GRAPH_MIXING_SUPPORT=0`
//! unless the environment already says (see [`nccl_graph_mixing_setting`]), and, where the spec
//! asks and the environment does not already say, `NCCL_MAX_NCHANNELS` (see
//! [`LaunchSpec::nccl_max_channels`]); watches them, and takes every rank down as soon as one
//! fails.
//!
//! Each rank runs in a process group of its own, so a terminal's Ctrl-C reaches the launcher
//! alone, and the launcher passes each SIGINT/SIGTERM it gets on to every rank exactly once
//! (the ranks finish their step, rank 0 writes its checkpoint, all exit 128 + the signal).
//! A rank calls [`die_with_launcher`] first thing, so none outlives a launcher that is killed.
//!
//! The outcome says which rank failed and how ([`Launched::exit_code`] names it): a rank that
//! exits with its peer-failure status ([`LaunchSpec::peer_failure_code`]) is a victim, never
//! the cause; the cause is a rank that failed otherwise, left on a signal, or is found
//! stopped (SIGSTOP) when its peers gave up on it.

mod outcome;

pub use outcome::{Launched, RankEnd, signal_name, stop_signal_of};

use crate::env::RENDEZVOUS_SOCKET_VAR;
use crate::error::{CommError, Result};
use crate::secret::{JobSecret, SECRET_FILE_VAR, SECRET_VAR};
use std::ffi::OsString;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// Exit codes of a launcher whose rank failed: `RANK_EXIT_BASE + rank` (ranks up to 99).
pub const RANK_EXIT_BASE: u8 = 100;

/// The launcher's pid, for its ranks ([`die_with_launcher`]).
pub const LAUNCHER_PID_VAR: &str = "ZCOMM_LAUNCHER_PID";

/// What to start.
#[derive(Clone, Debug)]
pub struct LaunchSpec {
    pub program: OsString,
    pub args: Vec<OsString>,
    pub ranks: usize,
    /// After one rank failed (or a stop was asked), how long the others get to exit before
    /// they are killed.
    pub grace: Duration,
    /// The status a rank exits with when it stops because a peer failed (ztrain's 3): such a
    /// rank is never blamed while another can be.
    pub peer_failure_code: Option<i32>,
    /// The most channels (thread blocks, each on an SM) an NCCL collective of the ranks takes,
    /// given to them as `NCCL_MAX_NCHANNELS` unless the launcher's environment already sets
    /// `NCCL_MAX_NCHANNELS` or `NCCL_MAX_CTAS` (the user's word wins); `None` leaves NCCL's
    /// own choice. A collective overlapped with backward takes its SMs from backward's kernels
    /// and waits for them to free one; fewer channels leave backward more and start sooner.
    pub nccl_max_channels: Option<u32>,
}

/// `NCCL_MAX_NCHANNELS`, and the variable that supersedes it, which a user sets to choose
/// NCCL's channels themselves.
const NCCL_CHANNEL_VARS: [&str; 2] = ["NCCL_MAX_NCHANNELS", "NCCL_MAX_CTAS"];

/// The `NCCL_MAX_NCHANNELS` value the ranks get: `wanted`, unless `env` (the launcher's
/// environment) already names a channel limit.
pub fn nccl_channel_setting(
    wanted: Option<u32>,
    env: &dyn Fn(&str) -> Option<OsString>,
) -> Option<(&'static str, String)> {
    let n = wanted?;
    if NCCL_CHANNEL_VARS.iter().any(|v| env(v).is_some()) {
        return None;
    }
    Some((NCCL_CHANNEL_VARS[0], n.to_string()))
}

/// NCCL's switch for captured collectives mixed with other work of the same communicator.
pub const NCCL_GRAPH_MIXING_VAR: &str = "NCCL_GRAPH_MIXING_SUPPORT";

/// The `NCCL_GRAPH_MIXING_SUPPORT` value the ranks get: `0`, unless `env` (the launcher's
/// environment) already sets it (the user's word wins).
///
/// Why: by default NCCL orders every captured collective after the communicator's previous
/// one through an event of its own, which puts an event-wait root and an event-record node
/// into every graph per collective. Each replay of such a graph then starts its second node
/// 4-6 us late and every collective later (measured on 2x H100: docs/benchmarks.md, sixteenth
/// session). zcomm never needs that ordering: a communicator's work, eager or captured, is
/// queued on one engine stream or on the side stream forked from it and joined back to it
/// before the step ends ([`crate::nccl`]), so the stream already orders it.
pub fn nccl_graph_mixing_setting(
    env: &dyn Fn(&str) -> Option<OsString>,
) -> Option<(&'static str, &'static str)> {
    if env(NCCL_GRAPH_MIXING_VAR).is_some() {
        return None;
    }
    Some((NCCL_GRAPH_MIXING_VAR, "0"))
}

/// A free TCP port on 127.0.0.1 for rank 0's rendezvous.
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| spawn_err("finding a free port", e))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| spawn_err("finding a free port", e))
}

/// Starts the ranks and watches them until all ended, or one failed (every rank is taken
/// down). `stop()` returns the signal the launcher got (SIGINT/SIGTERM), if any: it is passed
/// on to every rank, which get `spec.grace` to finish before they are killed.
pub fn launch(spec: &LaunchSpec, stop: &dyn Fn() -> Option<i32>) -> Result<Launched> {
    let dir = PrivateDir::create()?;
    let socket = dir.path().join("rendezvous.sock");
    let secret = JobSecret::generate()?;
    let mut children: Vec<Child> = Vec::with_capacity(spec.ranks);
    for rank in 0..spec.ranks {
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", spec.ranks.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env(RENDEZVOUS_SOCKET_VAR, &socket)
            .env_remove("MASTER_ADDR")
            .env_remove("MASTER_PORT")
            .env(SECRET_VAR, secret.as_env_value())
            .env_remove(SECRET_FILE_VAR)
            .env(LAUNCHER_PID_VAR, std::process::id().to_string())
            .env("NCCL_NVLS_ENABLE", "0");
        if let Some((var, value)) =
            nccl_channel_setting(spec.nccl_max_channels, &|v| std::env::var_os(v))
        {
            cmd.env(var, value);
        }
        if let Some((var, value)) = nccl_graph_mixing_setting(&|v| std::env::var_os(v)) {
            cmd.env(var, value);
        }
        #[cfg(unix)]
        {
            // A group of its own: the terminal's Ctrl-C goes to the launcher, which passes
            // it on once (a second copy would make the rank exit at once, unsaved).
            std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        }
        match cmd.spawn() {
            Ok(c) => children.push(c),
            Err(e) => {
                let _ = take_down(&mut children, Duration::ZERO, &|| None);
                return Err(spawn_err(&format!("starting rank {rank}"), e));
            }
        }
    }
    tracing::debug!(target: "zcomm.launch", ranks = spec.ranks, socket = %socket.display(), "ranks started");
    watch(spec, &mut children, stop)
}

/// A directory made fresh for one job's rendezvous socket, that only this user may enter
/// (mode 700, checked after it is made), removed with everything in it when dropped.
#[derive(Debug)]
pub struct PrivateDir(PathBuf);

impl PrivateDir {
    /// A new directory under the system's temporary directory, with a random name (a name
    /// that exists, another user's squatter included, is never reused: creating fails).
    pub fn create() -> Result<PrivateDir> {
        use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
        let mut name = [0u8; 16];
        getrandom::fill(&mut name).map_err(|e| CommError::Secret {
            detail: format!("the operating system's random generator failed: {e}"),
        })?;
        let hex: String = name.iter().map(|b| format!("{b:02x}")).collect();
        let path = std::env::temp_dir().join(format!("zcomm-{hex}"));
        let what = "making the private directory of the rendezvous socket";
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|e| spawn_err(&format!("{what} {}", path.display()), e))?;
        let dir = PrivateDir(path);
        // The umask may only have taken bits away; the owner needs all three.
        std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| spawn_err(what, e))?;
        crate::rendezvous::check_private_dir(&dir.0.join("x"), nix::unistd::geteuid().as_raw())?;
        Ok(dir)
    }

    #[must_use]
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What the watch knows so far.
struct Watch {
    ends: Vec<Option<RankEnd>>,
    /// Ranks in the order their ends were seen.
    order: Vec<usize>,
    /// When the first rank exited with the peer-failure status.
    first_victim: Option<Instant>,
}

fn watch(
    spec: &LaunchSpec,
    children: &mut [Child],
    stop: &dyn Fn() -> Option<i32>,
) -> Result<Launched> {
    let mut w = Watch {
        ends: vec![None; spec.ranks],
        order: Vec::new(),
        first_victim: None,
    };
    let mut failed = None;
    let mut stopped_by = None;
    while w.ends.iter().any(Option::is_none) {
        for (r, c) in children.iter_mut().enumerate() {
            if w.ends[r].is_some() {
                continue;
            }
            if let Some(status) = c
                .try_wait()
                .map_err(|e| spawn_err("watching the ranks", e))?
            {
                let end = end_of(status);
                if is_victim(spec, &end) {
                    w.first_victim.get_or_insert_with(Instant::now);
                }
                w.ends[r] = Some(end);
                w.order.push(r);
            }
        }
        if let Some(sig) = stop() {
            // Passed on once; the ranks finish their step and exit 128 + sig.
            stopped_by = Some(sig);
            tracing::warn!(target: "zcomm.launch", signal = sig, "stop asked; passing it on to every rank");
            forward(children, &w.ends, sig);
            finish(children, &mut w.ends, spec.grace, &|| None);
            return Ok(Launched {
                failed: blame(spec, children, &mut w, true),
                stopped: true,
                stopped_by,
                ends: w.ends,
            });
        }
        failed = blame(spec, children, &mut w, false);
        if let Some((r, end)) = &failed {
            tracing::error!(target: "zcomm.launch", rank = r, %end, "rank failed; taking every rank down");
            finish(children, &mut w.ends, spec.grace, stop);
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    if failed.is_none() {
        // Every rank ended on its own: did they all stop on one signal (sent to a rank)?
        let stops: Vec<i32> = w.ends.iter().flatten().filter_map(stop_signal_of).collect();
        let all_stopped_or_done = w
            .ends
            .iter()
            .flatten()
            .all(|e| stop_signal_of(e).is_some() || *e == RankEnd::Exited(0));
        if !stops.is_empty() && all_stopped_or_done {
            stopped_by = stops.first().copied();
        }
    }
    Ok(Launched {
        failed,
        stopped: false,
        stopped_by,
        ends: w.ends,
    })
}

/// Whether `end` is a rank stopping because a peer failed.
fn is_victim(spec: &LaunchSpec, end: &RankEnd) -> bool {
    spec.peer_failure_code
        .is_some_and(|c| *end == RankEnd::Exited(c))
}

/// The rank to blame, if one can be named yet (see the module documentation). `last`: no
/// rank will end on its own any more.
fn blame(
    spec: &LaunchSpec,
    children: &mut [Child],
    w: &mut Watch,
    last: bool,
) -> Option<(usize, RankEnd)> {
    let end = |r: usize| w.ends[r].clone().unwrap_or(RankEnd::TakenDown);
    // A rank that failed on its own: one a signal ended first, else the first seen.
    let own: Vec<usize> = w
        .order
        .iter()
        .copied()
        .filter(|&r| {
            let e = end(r);
            e != RankEnd::Exited(0) && !is_victim(spec, &e) && stop_signal_of(&e).is_none()
        })
        .collect();
    let first = own
        .iter()
        .find(|&&r| matches!(end(r), RankEnd::Signalled(_)))
        .or(own.first());
    if let Some(&r) = first {
        return Some((r, end(r)));
    }
    let since = w.first_victim?;
    // Victims only: a rank that left alone on a signal, one found stopped, or (once every
    // rank ended, or its peers gave up on it a grace ago) the first victim / a silent rank.
    if let Some(&r) = w.order.iter().find(|&&r| stop_signal_of(&end(r)).is_some()) {
        return Some((r, end(r)));
    }
    for (r, c) in children.iter_mut().enumerate() {
        if w.ends[r].is_none() && is_stopped(c.id()) {
            kill_rank(c);
            let _ = c.wait();
            w.ends[r] = Some(RankEnd::Stalled);
            return Some((r, RankEnd::Stalled));
        }
    }
    if last || w.ends.iter().all(Option::is_some) {
        let r = w
            .order
            .iter()
            .copied()
            .find(|&r| is_victim(spec, &end(r)))?;
        return Some((r, end(r)));
    }
    if since.elapsed() > spec.grace {
        let r = w.ends.iter().position(Option::is_none)?;
        return Some((r, RankEnd::TakenDown));
    }
    None
}

/// Passes `sig` on to every rank still running: to its process group (the rank and whatever
/// it started), as a terminal would.
fn forward(children: &[Child], ends: &[Option<RankEnd>], sig: i32) {
    for (c, e) in children.iter().zip(ends) {
        if e.is_none() {
            signal_group(c, sig);
        }
    }
}

/// Sends `sig` to `c`'s process group (its own: see `launch`); false if it could not.
fn signal_group(c: &Child, sig: i32) -> bool {
    #[cfg(unix)]
    {
        let pid = i32::try_from(c.id()).map(nix::unistd::Pid::from_raw);
        let signal = nix::sys::signal::Signal::try_from(sig);
        if let (Ok(pid), Ok(signal)) = (pid, signal) {
            match nix::sys::signal::killpg(pid, signal) {
                Ok(()) => return true,
                Err(e) => {
                    tracing::warn!(target: "zcomm.launch", pid = c.id(), signal = sig, error = %e, "could not signal the rank");
                }
            }
        }
        false
    }
    #[cfg(not(unix))]
    {
        let _ = (c, sig);
        false
    }
}

/// Kills `c` and everything in its process group (nothing it started is left behind).
fn kill_rank(c: &mut Child) -> bool {
    let group = signal_group(c, 9);
    c.kill().is_ok() || group
}

/// Gives the ranks still running `grace` to exit on their own, kills the rest, and records
/// how each ended.
fn finish(
    children: &mut [Child],
    ends: &mut [Option<RankEnd>],
    grace: Duration,
    stop: &dyn Fn() -> Option<i32>,
) {
    let killed = take_down(children, grace, stop);
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
}

/// Gives running children `grace` to exit on their own (the failed rank's peers end with their
/// typed errors), passing a stop signal on if one comes meanwhile, then kills the rest; says
/// which it killed.
fn take_down(children: &mut [Child], grace: Duration, stop: &dyn Fn() -> Option<i32>) -> Vec<bool> {
    let deadline = Instant::now() + grace;
    let mut passed_on = false;
    loop {
        let running: Vec<Option<RankEnd>> = children
            .iter_mut()
            .map(|c| match c.try_wait() {
                Ok(None) => None,
                _ => Some(RankEnd::TakenDown),
            })
            .collect();
        if running.iter().all(Option::is_some) || Instant::now() >= deadline {
            break;
        }
        if let (false, Some(sig)) = (passed_on, stop()) {
            forward(children, &running, sig);
            passed_on = true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    children
        .iter_mut()
        .map(|c| matches!(c.try_wait(), Ok(None)) && kill_rank(c))
        .collect()
}

/// Whether process `pid` is stopped (SIGSTOP, a debugger): Linux's `/proc/<pid>/stat`.
fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let after = stat.rsplit_once(')')?.1;
            after.trim_start().chars().next()
        })
        .is_some_and(|state| matches!(state, 'T' | 't'))
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

/// Called by a rank first thing: if a zcomm launcher started it ([`LAUNCHER_PID_VAR`] set),
/// the kernel kills it (SIGKILL) when the launcher dies, however it dies; and if the launcher
/// is already gone (it died before this call), [`CommError::LauncherGone`]. Returns the
/// launcher's pid, or None when no zcomm launcher started this process.
pub fn die_with_launcher() -> Result<Option<i32>> {
    let Some(raw) = std::env::var_os(LAUNCHER_PID_VAR) else {
        return Ok(None);
    };
    let raw = raw.to_string_lossy();
    let pid = raw
        .trim()
        .parse::<i32>()
        .ok()
        .filter(|p| *p > 1)
        .ok_or_else(|| CommError::BadEnv {
            var: LAUNCHER_PID_VAR,
            value: raw.to_string(),
            problem: "expected the launcher's process id".into(),
        })?;
    #[cfg(target_os = "linux")]
    {
        nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).map_err(|e| {
            CommError::Launch {
                detail: format!("asking to die with the launcher: {e}"),
                source: std::io::Error::from(e),
            }
        })?;
        // The launcher may have died before the call above: then this rank was handed to
        // another parent, and no signal will ever come.
        if nix::unistd::getppid().as_raw() != pid {
            return Err(CommError::LauncherGone { pid });
        }
    }
    Ok(Some(pid))
}
