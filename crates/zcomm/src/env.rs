//! The launcher convention: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`
//! (what torchrun, SLURM wrappers and mpirun scripts set). None of them set means a
//! single-process job; a job of several ranks needs all five, each well formed, or, instead of
//! `MASTER_ADDR`/`MASTER_PORT`, [`RENDEZVOUS_SOCKET_VAR`]: the Unix socket `ztrain --gpus N`
//! gives the ranks of one host, so that the job opens no port.

use crate::RankInfo;
use crate::error::{CommError, Result};
use std::ffi::OsString;

/// `var` through `get` as text: None when unset, [`CommError::EnvNotUtf8`] when not UTF-8 (the
/// value is never shown: it may be a secret).
pub(crate) fn text_var(
    get: &impl Fn(&str) -> Option<OsString>,
    var: &'static str,
) -> Result<Option<String>> {
    get(var)
        .map(|v| v.into_string().map_err(|_| CommError::EnvNotUtf8 { var }))
        .transpose()
}

/// The variables, in the order they are checked.
pub const VARS: [&str; 5] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
];

/// The most ranks a job may have: far above any real job, far below what would overflow a
/// buffer of one value per rank or an exit code's arithmetic.
pub const MAX_WORLD_SIZE: usize = 1 << 16;

/// Where this process stands, and where rank 0 listens (none for a single process).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchEnv {
    pub info: RankInfo,
    /// `MASTER_ADDR:MASTER_PORT`, the rendezvous address.
    pub master: Option<Master>,
}

/// The path of rank 0's rendezvous socket on this host, in a directory only the user may
/// enter (the launcher of `ztrain --gpus N` makes it): replaces `MASTER_ADDR`/`MASTER_PORT`.
pub const RENDEZVOUS_SOCKET_VAR: &str = "ZCOMM_RENDEZVOUS_SOCKET";

/// Rank 0's rendezvous address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Master {
    /// `MASTER_ADDR:MASTER_PORT`.
    Tcp { host: String, port: u16 },
    /// [`RENDEZVOUS_SOCKET_VAR`]: a Unix socket, ranks of one host.
    Local { socket: std::path::PathBuf },
}

impl Master {
    /// `host:port`, bracketing an IPv6 literal; `unix:PATH` for a Unix socket (what
    /// `rendezvous::Server::bind` and `rendezvous::join` take).
    #[must_use]
    pub fn address(&self) -> String {
        match self {
            Master::Tcp { host, port } if host.contains(':') && !host.starts_with('[') => {
                format!("[{host}]:{port}")
            }
            Master::Tcp { host, port } => format!("{host}:{port}"),
            Master::Local { socket } => {
                format!("{}{}", crate::rendezvous::UNIX_PREFIX, socket.display())
            }
        }
    }
}

impl LaunchEnv {
    /// A single-process job.
    pub const SINGLE: LaunchEnv = LaunchEnv {
        info: RankInfo::SINGLE,
        master: None,
    };

    /// Reads the process environment.
    pub fn from_env() -> Result<LaunchEnv> {
        Self::from_os_vars(|v| std::env::var_os(v))
    }

    /// Reads the variables through `get` as the operating system holds them: a value that is
    /// not UTF-8 is [`CommError::EnvNotUtf8`], naming the variable, never showing the value.
    pub fn from_os_vars(get: impl Fn(&str) -> Option<OsString>) -> Result<LaunchEnv> {
        for var in VARS.into_iter().chain([RENDEZVOUS_SOCKET_VAR]) {
            text_var(&get, var)?;
        }
        Self::from_vars(|name| get(name).and_then(|v| v.into_string().ok()))
    }

    /// Reads the variables through `get` (the environment, or a table in tests).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<LaunchEnv> {
        if VARS.iter().all(|v| get(v).is_none()) && get(RENDEZVOUS_SOCKET_VAR).is_none() {
            return Ok(LaunchEnv::SINGLE);
        }
        let world = number(&get, "WORLD_SIZE")?;
        if world == 0 {
            return Err(bad("WORLD_SIZE", "0", "a job has at least one rank"));
        }
        if world > MAX_WORLD_SIZE {
            return Err(bad(
                "WORLD_SIZE",
                &world.to_string(),
                &format!("at most {MAX_WORLD_SIZE} ranks"),
            ));
        }
        let rank = number(&get, "RANK")?;
        if rank >= world {
            return Err(bad(
                "RANK",
                &rank.to_string(),
                &format!("must be below WORLD_SIZE={world}"),
            ));
        }
        let local_rank = match get("LOCAL_RANK") {
            // One rank alone may leave LOCAL_RANK out: it opens device 0.
            None if world == 1 => 0,
            _ => number(&get, "LOCAL_RANK")?,
        };
        if local_rank > rank && world > 1 {
            // A rank's place on its host cannot exceed its place in the job.
            return Err(bad(
                "LOCAL_RANK",
                &local_rank.to_string(),
                &format!("must not exceed RANK={rank}"),
            ));
        }
        let info = RankInfo {
            rank,
            world,
            local_rank,
        };
        let master = if let Some(socket) = get(RENDEZVOUS_SOCKET_VAR) {
            Some(local_master(&get, &socket)?)
        } else if world == 1 && get("MASTER_ADDR").is_none() && get("MASTER_PORT").is_none() {
            None
        } else {
            Some(master(&get)?)
        };
        Ok(LaunchEnv { info, master })
    }
}

/// The Unix socket the launcher named; a job given both it and a TCP address is refused (which
/// one was meant cannot be told).
fn local_master(get: &impl Fn(&str) -> Option<String>, socket: &str) -> Result<Master> {
    for var in ["MASTER_ADDR", "MASTER_PORT"] {
        if get(var).is_some() {
            return Err(bad(
                var,
                &get(var).unwrap_or_default(),
                &format!(
                    "set together with {RENDEZVOUS_SOCKET_VAR}: give the ranks one rendezvous, a TCP address or the Unix socket"
                ),
            ));
        }
    }
    if !socket.starts_with('/') {
        return Err(bad(
            RENDEZVOUS_SOCKET_VAR,
            socket,
            "expected the absolute path of a Unix socket",
        ));
    }
    Ok(Master::Local {
        socket: socket.into(),
    })
}

fn master(get: &impl Fn(&str) -> Option<String>) -> Result<Master> {
    let host = required(get, "MASTER_ADDR")?;
    let host = host.trim();
    if host.is_empty() || host.chars().any(char::is_whitespace) {
        return Err(bad(
            "MASTER_ADDR",
            host,
            "expected a host name or an IP address",
        ));
    }
    let raw = required(get, "MASTER_PORT")?;
    let port: u16 = raw
        .trim()
        .parse()
        .map_err(|_| bad("MASTER_PORT", &raw, "expected a TCP port, 1 to 65535"))?;
    if port == 0 {
        return Err(bad("MASTER_PORT", &raw, "expected a TCP port, 1 to 65535"));
    }
    Ok(Master::Tcp {
        host: host.to_string(),
        port,
    })
}

fn required(get: &impl Fn(&str) -> Option<String>, var: &'static str) -> Result<String> {
    get(var).ok_or_else(|| {
        bad(
            var,
            "",
            "not set, but other launcher variables are: set all of RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (or none)",
        )
    })
}

fn number(get: &impl Fn(&str) -> Option<String>, var: &'static str) -> Result<usize> {
    let raw = required(get, var)?;
    // Parsed as u64 then checked: a value too large for this machine's usize is refused,
    // never cut.
    raw.trim()
        .parse::<u64>()
        .ok()
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| bad(var, &raw, "expected a non-negative whole number"))
}

fn bad(var: &'static str, value: &str, problem: &str) -> CommError {
    CommError::BadEnv {
        var,
        value: value.to_string(),
        problem: problem.to_string(),
    }
}
