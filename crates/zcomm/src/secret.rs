//! The job secret: what a process must hold to join a job's rendezvous, and what rank 0 must
//! prove it holds before a rank believes anything it says.
//!
//! `ztrain --gpus N` (zcomm's [`crate::launch::launch`]) makes one per job from the operating
//! system's generator and hands it to its ranks in [`SECRET_VAR`] (the environment, never the
//! command line, so `ps` does not show it). Ranks started by another launcher (torchrun,
//! SLURM, mpirun) read the same variable, or [`SECRET_FILE_VAR`]: a file only its owner may
//! read (a file the group or others can read is refused). A job without a secret is refused
//! when its rendezvous address is not a loopback one, unless [`ALLOW_UNAUTHENTICATED_VAR`]`=1`
//! says the user accepts that anyone who can reach the port may join.

use crate::env::Master;
use crate::error::{CommError, Result};
use std::net::IpAddr;

/// The job secret itself (any text of [`MIN_SECRET_BYTES`] to [`MAX_SECRET_BYTES`] bytes).
pub const SECRET_VAR: &str = "ZCOMM_SECRET";
/// A file holding the job secret (mode 0600 or stricter); trailing whitespace is ignored.
pub const SECRET_FILE_VAR: &str = "ZCOMM_SECRET_FILE";
/// `1`: run a job without a secret even across hosts (anyone reaching the port may join).
pub const ALLOW_UNAUTHENTICATED_VAR: &str = "ZCOMM_ALLOW_UNAUTHENTICATED";
/// Shortest secret accepted: 128 bits of a random hex string.
pub const MIN_SECRET_BYTES: usize = 16;
/// Longest secret accepted (a file of more is not a secret file).
pub const MAX_SECRET_BYTES: usize = 4096;

/// A job secret. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct JobSecret(Vec<u8>);

impl std::fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "JobSecret({} bytes, redacted)", self.0.len())
    }
}

impl JobSecret {
    /// 32 bytes from the operating system's generator, as 64 hex digits (so that it travels
    /// in an environment variable).
    pub fn generate() -> Result<JobSecret> {
        let mut raw = [0u8; 32];
        getrandom::fill(&mut raw).map_err(|e| CommError::Secret {
            detail: format!("the operating system's random generator failed: {e}"),
        })?;
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        Ok(JobSecret(hex.into_bytes()))
    }

    /// A secret given as text (`from`: where it came from, for the error).
    pub fn from_text(text: &str, from: &str) -> Result<JobSecret> {
        let text = text.trim_end();
        let n = text.len();
        if !(MIN_SECRET_BYTES..=MAX_SECRET_BYTES).contains(&n) {
            return Err(CommError::Secret {
                detail: format!(
                    "{from}: a job secret has {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes, this one {n} (make one with `openssl rand -hex 32`)"
                ),
            });
        }
        Ok(JobSecret(text.as_bytes().to_vec()))
    }

    /// The text to put in [`SECRET_VAR`] for a rank.
    #[must_use]
    pub fn as_env_value(&self) -> String {
        String::from_utf8_lossy(&self.0).into_owned()
    }

    pub(crate) fn key(&self) -> &[u8] {
        &self.0
    }
}

/// How a rendezvous proves its members.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Auth {
    /// Every member proves it holds this secret; no one else gets anything.
    Secret(JobSecret),
    /// The user opted out (or the job stays on loopback with no secret given): the same
    /// protocol under a key everyone knows, so anyone who reaches the port may join.
    Unauthenticated,
}

/// The key of the unauthenticated protocol (public: it proves nothing).
const PUBLIC_KEY: &[u8] = b"zcomm: no job secret";

impl Auth {
    pub(crate) fn key(&self) -> &[u8] {
        match self {
            Auth::Secret(s) => s.key(),
            Auth::Unauthenticated => PUBLIC_KEY,
        }
    }

    /// The process environment's secret for a rendezvous at `master`; see the module docs.
    pub fn from_env(master: &Master) -> Result<Auth> {
        Self::from_vars(master, |v| {
            std::env::var_os(v).map(|s| s.to_string_lossy().into_owned())
        })
    }

    /// As [`Auth::from_env`], reading the variables through `get` (tests).
    pub fn from_vars(master: &Master, get: impl Fn(&str) -> Option<String>) -> Result<Auth> {
        if let Some(text) = get(SECRET_VAR) {
            return JobSecret::from_text(&text, SECRET_VAR).map(Auth::Secret);
        }
        if let Some(path) = get(SECRET_FILE_VAR) {
            return read_secret_file(std::path::Path::new(&path)).map(Auth::Secret);
        }
        let opted_out = match get(ALLOW_UNAUTHENTICATED_VAR).as_deref().map(str::trim) {
            None | Some("" | "0") => false,
            Some("1") => true,
            Some(other) => {
                return Err(CommError::BadEnv {
                    var: ALLOW_UNAUTHENTICATED_VAR,
                    value: other.to_string(),
                    problem: "expected 1 (run without a job secret) or 0".into(),
                });
            }
        };
        if opted_out {
            tracing::warn!(target: "zcomm.secret", addr = %master.address(), "no job secret ({ALLOW_UNAUTHENTICATED_VAR}=1): anyone who reaches the rendezvous port can join this job");
            return Ok(Auth::Unauthenticated);
        }
        if is_loopback(&master.host) {
            tracing::warn!(target: "zcomm.secret", addr = %master.address(), "no job secret: any process of this host can join this job; set {SECRET_VAR} or {SECRET_FILE_VAR}");
            return Ok(Auth::Unauthenticated);
        }
        Err(CommError::NoSecret {
            addr: master.address(),
        })
    }
}

/// Whether `host` can only be reached from this machine (a loopback literal or `localhost`).
fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost")
        || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Reads a secret file, refusing one that others than its owner may read.
pub fn read_secret_file(path: &std::path::Path) -> Result<JobSecret> {
    let shown = path.display().to_string();
    let io = |what: &str, e: std::io::Error| CommError::Secret {
        detail: format!("{SECRET_FILE_VAR}={shown}: {what}: {e}"),
    };
    // The open file's own metadata: what is checked is what is read.
    let mut file = std::fs::File::open(path).map_err(|e| io("cannot open it", e))?;
    let meta = file.metadata().map_err(|e| io("cannot read it", e))?;
    if !meta.is_file() {
        return Err(CommError::Secret {
            detail: format!("{SECRET_FILE_VAR}={shown}: not a regular file"),
        });
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(CommError::Secret {
                detail: format!(
                    "{SECRET_FILE_VAR}={shown}: mode {mode:03o} lets other users read the job secret; `chmod 600 {shown}`"
                ),
            });
        }
    }
    if meta.len() > MAX_SECRET_BYTES as u64 + 2 {
        return Err(CommError::Secret {
            detail: format!(
                "{SECRET_FILE_VAR}={shown}: {} bytes; a job secret has at most {MAX_SECRET_BYTES}",
                meta.len()
            ),
        });
    }
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut std::io::Read::take(&mut file, MAX_SECRET_BYTES as u64 + 3),
        &mut text,
    )
    .map_err(|e| io("cannot read it as text", e))?;
    JobSecret::from_text(&text, &format!("{SECRET_FILE_VAR}={shown}"))
}
