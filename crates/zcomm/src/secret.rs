//! The job secret: what a process must hold to join a job's rendezvous, and what rank 0 must
//! prove it holds before a rank believes anything it says.
//!
//! `ztrain --gpus N` (zcomm's [`crate::launch::launch`]) makes one per job from the operating
//! system's generator and hands it to its ranks in [`SECRET_VAR`] (the environment, never the
//! command line, so `ps` does not show it). Ranks started by another launcher (torchrun,
//! SLURM, mpirun) read the same variable, or [`SECRET_FILE_VAR`]: a regular file owned by the
//! running user that only its owner may read (`ztrain secret-new FILE` writes one).
//!
//! A secret is a key, never a phrase: at least 128 random bits written as hex digits. One
//! recorded handshake lets anyone test guesses offline against its tags; against a random key
//! of 128 bits that is hopeless, against a phrase a person chose it is not.
//!
//! A job without a secret is refused, loopback or not (any local user reaches a loopback
//! port), unless [`ALLOW_UNAUTHENTICATED_VAR`]`=1` says the user accepts that anyone who can
//! reach the port may join. No message or log ever shows a secret.

use crate::env::{Master, text_var};
use crate::error::{CommError, Result};
use std::ffi::OsString;

/// The job secret itself (at least [`MIN_SECRET_HEX_DIGITS`] hex digits).
pub const SECRET_VAR: &str = "ZCOMM_SECRET";
/// A file holding the job secret (a regular file of the running user, mode 0600 or stricter);
/// trailing whitespace is ignored.
pub const SECRET_FILE_VAR: &str = "ZCOMM_SECRET_FILE";
/// `1`: run a job without a secret (anyone reaching the port may join).
pub const ALLOW_UNAUTHENTICATED_VAR: &str = "ZCOMM_ALLOW_UNAUTHENTICATED";
/// Shortest secret accepted: 128 bits as hex digits.
pub const MIN_SECRET_HEX_DIGITS: usize = 32;
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

    /// A secret given as text (`from`: where it came from, for the error): at least
    /// [`MIN_SECRET_HEX_DIGITS`] hex digits, at most [`MAX_SECRET_BYTES`] bytes. Anything else
    /// is [`CommError::WeakSecret`], which says what is wrong without showing the secret.
    pub fn from_text(text: &str, from: &str) -> Result<JobSecret> {
        let text = text.trim_end();
        let n = text.len();
        let weak = |problem: String| CommError::WeakSecret {
            from: from.to_string(),
            problem,
        };
        if n > MAX_SECRET_BYTES {
            return Err(weak(format!(
                "{n} bytes, at most {MAX_SECRET_BYTES} are read"
            )));
        }
        if let Some(at) = text.find(|c: char| !c.is_ascii_hexdigit()) {
            return Err(weak(format!(
                "character {} of {n} is not a hex digit",
                text[..at].chars().count() + 1
            )));
        }
        if n < MIN_SECRET_HEX_DIGITS {
            return Err(weak(format!("{} bits", n * 4)));
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
    /// The user opted out ([`ALLOW_UNAUTHENTICATED_VAR`], or a test of one process): the same
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
        Self::from_os_vars(master, |v| std::env::var_os(v))
    }

    /// As [`Auth::from_env`], reading the variables as the operating system holds them: a
    /// value that is not UTF-8 is [`CommError::EnvNotUtf8`] (the value never shown).
    pub fn from_os_vars(master: &Master, get: impl Fn(&str) -> Option<OsString>) -> Result<Auth> {
        for var in [SECRET_VAR, SECRET_FILE_VAR, ALLOW_UNAUTHENTICATED_VAR] {
            if var != SECRET_FILE_VAR {
                text_var(&get, var)?;
            }
        }
        if get(SECRET_VAR).is_none()
            && let Some(path) = get(SECRET_FILE_VAR)
        {
            // A path need not be UTF-8.
            return read_secret_file(std::path::Path::new(&path)).map(Auth::Secret);
        }
        Self::from_vars(master, |v| get(v).and_then(|s| s.into_string().ok()))
    }

    /// As [`Auth::from_env`], reading the variables through `get` (tests).
    pub fn from_vars(master: &Master, get: impl Fn(&str) -> Option<String>) -> Result<Auth> {
        if let Some(text) = get(SECRET_VAR) {
            return JobSecret::from_text(&text, SECRET_VAR).map(Auth::Secret);
        }
        if let Some(path) = get(SECRET_FILE_VAR) {
            return read_secret_file(std::path::Path::new(&path)).map(Auth::Secret);
        }
        match get(ALLOW_UNAUTHENTICATED_VAR).as_deref().map(str::trim) {
            None | Some("" | "0") => Err(CommError::NoSecret {
                addr: master.address(),
            }),
            Some("1") => {
                tracing::warn!(target: "zcomm.secret", addr = %master.address(), "no job secret ({ALLOW_UNAUTHENTICATED_VAR}=1): anyone who reaches the rendezvous port can join this job");
                Ok(Auth::Unauthenticated)
            }
            Some(other) => Err(CommError::BadEnv {
                var: ALLOW_UNAUTHENTICATED_VAR,
                value: other.to_string(),
                problem: "expected 1 (run without a job secret) or 0".into(),
            }),
        }
    }
}

/// The longest a secret file may be: the longest secret, a line end, some slack.
const MAX_SECRET_FILE_BYTES: u64 = MAX_SECRET_BYTES as u64 + 2;

/// Reads a secret file. Refused: a link (not followed), anything but a regular file (a FIFO is
/// refused, never waited on: it is opened without blocking), a file of another owner (even
/// for root: its owner could rewrite the secret), one the group or others may read, one
/// longer than a secret.
pub fn read_secret_file(path: &std::path::Path) -> Result<JobSecret> {
    use nix::fcntl::OFlag;
    use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
    let shown = path.display().to_string();
    let refused = |why: String| CommError::Secret {
        detail: format!("{SECRET_FILE_VAR}={shown}: {why}"),
    };
    let io = |what: &str, e: std::io::Error| refused(format!("{what}: {e}"));
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC).bits())
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(nix::errno::Errno::ELOOP as i32) {
                refused("a symbolic link; give the file itself".into())
            } else {
                io("cannot open it", e)
            }
        })?;
    // The open file's own metadata: what is checked is what is read.
    let meta = file.metadata().map_err(|e| io("cannot read it", e))?;
    if !meta.is_file() {
        return Err(refused(
            "not a regular file (a pipe, a device or a folder is not a secret file)".into(),
        ));
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(refused(format!(
            "owned by uid {}, not by this user (uid {me}): its owner could change the job secret; use a file of your own",
            meta.uid()
        )));
    }
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(refused(format!(
            "mode {mode:03o} lets other users read the job secret; `chmod 600 {shown}`"
        )));
    }
    if meta.len() > MAX_SECRET_FILE_BYTES {
        return Err(refused(format!(
            "{} bytes; a job secret has at most {MAX_SECRET_BYTES}",
            meta.len()
        )));
    }
    let mut raw = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(&mut file, MAX_SECRET_FILE_BYTES + 1),
        &mut raw,
    )
    .map_err(|e| io("cannot read it", e))?;
    if raw.len() as u64 > MAX_SECRET_FILE_BYTES {
        return Err(refused("it grew while being read".into()));
    }
    let text = String::from_utf8(raw).map_err(|_| {
        refused("not text (a job secret is hex digits; its bytes are not shown)".into())
    })?;
    JobSecret::from_text(&text, &format!("{SECRET_FILE_VAR}={shown}"))
}

/// Writes a new job secret to `path` (created, never overwritten: `O_EXCL`, mode 0600, not
/// following a link) and returns it: the file [`SECRET_FILE_VAR`] names on every rank.
pub fn write_new_secret_file(path: &std::path::Path) -> Result<JobSecret> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let secret = JobSecret::generate()?;
    let shown = path.display().to_string();
    let io = |what: &str, e: std::io::Error| CommError::Secret {
        detail: format!("{shown}: {what}: {e}"),
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)
        .map_err(|e| io("cannot create it (it must not exist yet)", e))?;
    file.write_all(&secret.0)
        .and_then(|()| file.write_all(b"\n"))
        .and_then(|()| file.sync_all())
        .map_err(|e| io("cannot write it", e))?;
    Ok(secret)
}
