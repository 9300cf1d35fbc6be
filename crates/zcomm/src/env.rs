//! The launcher convention: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`
//! (what torchrun, SLURM wrappers, mpirun scripts and `ztrain --gpus N` set). None of them set
//! means a single-process job; a job of several ranks needs all five, each well formed.

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

/// Rank 0's rendezvous address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Master {
    pub host: String,
    pub port: u16,
}

impl Master {
    /// `host:port`, bracketing an IPv6 literal.
    #[must_use]
    pub fn address(&self) -> String {
        if self.host.contains(':') && !self.host.starts_with('[') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
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
        for var in VARS {
            text_var(&get, var)?;
        }
        Self::from_vars(|name| get(name).and_then(|v| v.into_string().ok()))
    }

    /// Reads the variables through `get` (the environment, or a table in tests).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<LaunchEnv> {
        if VARS.iter().all(|v| get(v).is_none()) {
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
        let master = if world == 1 && get("MASTER_ADDR").is_none() && get("MASTER_PORT").is_none() {
            None
        } else {
            Some(master(&get)?)
        };
        Ok(LaunchEnv { info, master })
    }
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
    Ok(Master {
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
