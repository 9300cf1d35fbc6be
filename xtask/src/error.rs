//! The xtask's one error type: every failure says what was being done.

use std::path::PathBuf;

/// Why an xtask command failed.
#[derive(Debug, thiserror::Error)]
pub enum XtaskError {
    /// A filesystem operation failed.
    #[error("{context} {}: {source}", path.display())]
    Io {
        /// What was being done.
        context: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// An external command could not be started or exited unsuccessfully.
    #[error("`{command}` failed: {reason}")]
    Command {
        /// The command line, for the reader to re-run.
        command: String,
        /// Exit status or spawn error.
        reason: String,
    },
    /// A `--check` found committed output that differs from a fresh build.
    #[error("{0}")]
    Stale(String),
    /// Anything else, with a message for the person running the command.
    #[error("{0}")]
    Other(String),
}

/// Result of an xtask step.
pub type Result<T> = std::result::Result<T, XtaskError>;

/// Wraps an `io::Error` with what was being done and where.
pub fn io(
    context: &'static str,
    path: impl Into<PathBuf>,
) -> impl FnOnce(std::io::Error) -> XtaskError {
    let path = path.into();
    move |source| XtaskError::Io {
        context,
        path,
        source,
    }
}
