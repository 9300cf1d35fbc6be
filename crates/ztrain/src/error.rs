//! ztrain's one error type. Each variant says what went wrong and what to do about it; `main`
//! prints it and exits with status 1 (2 for bad command-line usage, from clap), or
//! [`EXIT_PEER_FAILED`] (3) in a rank of a job that stopped because another rank failed.

use std::fmt;
use std::path::PathBuf;

/// What is wrong with a CSV cell or row.
#[derive(Clone, Debug, PartialEq)]
pub enum CsvProblem {
    /// No header row.
    Empty,
    /// A header and no sample rows.
    NoSamples,
    /// An empty line between rows.
    BlankRow,
    /// The row (or header) does not have `S·F + 1` columns.
    ColumnCount {
        expected: usize,
        found: usize,
        /// Label columns (the model's task's target values a sample).
        labels: usize,
    },
    /// The cell does not parse as a number.
    NotANumber { cell: String },
    /// NaN or infinity (or a value too large for float32).
    NotFinite { cell: String },
    /// The label column holds something other than 0 or 1.
    BadLabel { cell: String },
    /// A label that is not a class index of the model's `classes`.
    BadClass { cell: String, classes: usize },
}

/// How a column-count message names the label columns: `the label`, `the 3 label columns`.
fn label_columns(labels: usize) -> String {
    if labels == 1 {
        "the label".into()
    } else {
        format!("the {labels} label columns of the model's {labels} target values")
    }
}

impl fmt::Display for CsvProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CsvProblem::Empty => {
                f.write_str("the file is empty; expected a header row, then one row per sample")
            }
            CsvProblem::NoSamples => f.write_str("a header row but no samples"),
            CsvProblem::BlankRow => f.write_str("blank row (remove it; rows are never skipped)"),
            CsvProblem::ColumnCount {
                expected,
                found,
                labels,
            } => write!(
                f,
                "expected {expected} columns (scales × features, then {}), found {found}; check --scales and --features",
                label_columns(*labels)
            ),
            CsvProblem::NotANumber { cell } => write!(f, "`{cell}` is not a number"),
            CsvProblem::NotFinite { cell } => write!(f, "`{cell}` is not a finite float32"),
            CsvProblem::BadLabel { cell } => write!(f, "label `{cell}` must be 0 or 1"),
            CsvProblem::BadClass { cell, classes } => write!(
                f,
                "label `{cell}` must be a class index of the model's {classes} classes: an integer in 0..{classes}"
            ),
        }
    }
}

/// Where in a data file (other than a CSV: [`CsvProblem`] has lines) a problem is. Rows and
/// columns count from 1, as a CSV's lines do; array indices are NumPy's (from 0).
#[derive(Clone, Debug, PartialEq)]
pub enum DataPlace {
    /// The file as a whole.
    File,
    /// A data row (the header, where there is one, is not counted).
    Row(usize),
    /// A column, by position and name.
    Column { index: usize, name: String },
    /// One cell.
    Cell {
        row: usize,
        column: usize,
        name: String,
    },
    /// A named array or tensor (`x`, `y`).
    Array(String),
    /// One element of an array, by its index.
    Element { array: String, index: Vec<usize> },
    /// A Parquet row group (numbered from 0, as Parquet's tools number them), as a whole.
    RowGroup { group: usize },
    /// An Arrow IPC record batch (numbered from 0, in the file's order), as a whole.
    RecordBatch { batch: usize },
    /// One column (from 1, by name) of a Parquet row group (from 0).
    RowGroupColumn {
        group: usize,
        index: usize,
        name: String,
    },
}

impl fmt::Display for DataPlace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataPlace::File => Ok(()),
            DataPlace::Row(r) => write!(f, ", row {r}"),
            DataPlace::Column { index, name } => write!(f, ", column {index} (`{name}`)"),
            DataPlace::Cell { row, column, name } => {
                write!(f, ", row {row}, column {column} (`{name}`)")
            }
            DataPlace::Array(a) => write!(f, ", array `{a}`"),
            DataPlace::Element { array, index } => write!(f, ", array `{array}` at {index:?}"),
            DataPlace::RowGroup { group } => write!(f, ", row group {group}"),
            DataPlace::RecordBatch { batch } => write!(f, ", record batch {batch}"),
            DataPlace::RowGroupColumn { group, index, name } => {
                write!(f, ", row group {group}, column {index} (`{name}`)")
            }
        }
    }
}

/// What is wrong with a data file that is not a CSV (and, for `--window`, with any table).
#[derive(Clone, Debug, PartialEq)]
pub enum DataProblem {
    /// The bytes are not of the format the extension names.
    NotThisFormat { expected: &'static str },
    /// The file ends before the size its header announces.
    Truncated { expected: u64, found: u64 },
    /// The format's reader refused the file (a corrupt page, a bad header: the cause says).
    Corrupt { detail: String },
    /// The table does not have the columns the options ask for.
    ColumnCount {
        expected: usize,
        found: usize,
        /// Label columns (the model's task's target values a sample).
        labels: usize,
    },
    /// One column fewer than the options ask for: the label (last column) is missing.
    MissingLabel { features: usize },
    /// A column or array of a type that is not a number.
    NotNumeric { found: String },
    /// A missing value (null) or NaN/infinity: never turned into a number.
    Missing { value: String },
    /// A label other than 0 or 1.
    BadLabel { value: String },
    /// A label that is not a class index of the model's `classes`.
    BadClass { value: String, classes: usize },
    /// An array or tensor the format needs is not in the file.
    MissingArray { name: String, found: Vec<String> },
    /// An array of another shape than the options ask for.
    Shape { expected: String, found: Vec<usize> },
    /// Features and labels for different numbers of samples.
    SampleCounts { x: usize, y: usize },
    /// No samples.
    NoSamples,
    /// `--window` longer than the series.
    WindowTooLong { window: usize, rows: usize },
    /// A file streamed from (`--stream`) changed under the run: another length or time of
    /// last modification than when the run opened it.
    Changed { detail: String },
    /// A file streamed from could not be read (the system's error is the source).
    Unreadable,
}

impl fmt::Display for DataProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataProblem::NotThisFormat { expected } => write!(
                f,
                "not a {expected} file (its first bytes are not {expected}'s); check the file or rename it to its format's extension"
            ),
            DataProblem::Truncated { expected, found } => write!(
                f,
                "truncated: the header announces {expected} bytes of data, the file has {found}; write the file again"
            ),
            DataProblem::Corrupt { detail } => {
                write!(f, "corrupt ({detail}); write the file again")
            }
            DataProblem::ColumnCount {
                expected,
                found,
                labels,
            } => write!(
                f,
                "expected {expected} columns (the features, then {}), found {found}; check --scales, --features and --window",
                label_columns(*labels)
            ),
            DataProblem::MissingLabel { features } => write!(
                f,
                "the label column is missing: {features} columns are all features; add the label (0 or 1) as the last column"
            ),
            DataProblem::NotNumeric { found } => {
                write!(f, "expected numbers (float or integer), found {found}")
            }
            DataProblem::Missing { value } => write!(
                f,
                "{value} where a finite number is expected; missing values are refused, never turned into numbers: fill or drop them first"
            ),
            DataProblem::BadLabel { value } => write!(f, "label {value} must be 0 or 1"),
            DataProblem::BadClass { value, classes } => write!(
                f,
                "label {value} must be a class index of the model's {classes} classes: an integer in 0..{classes}"
            ),
            DataProblem::MissingArray { name, found } => write!(
                f,
                "no array `{name}` (the file has {found:?}); name the features `x` [N, S, F] and the labels `y` [N]"
            ),
            DataProblem::Shape { expected, found } => {
                write!(f, "expected shape {expected}, found {found:?}")
            }
            DataProblem::SampleCounts { x, y } => write!(
                f,
                "{x} samples of features but {y} labels; both must have one per sample"
            ),
            DataProblem::NoSamples => f.write_str("no samples"),
            DataProblem::WindowTooLong { window, rows } => write!(
                f,
                "--window {window} is longer than the series ({rows} rows); use a shorter window or a longer series"
            ),
            DataProblem::Changed { detail } => write!(
                f,
                "changed while the run streamed it ({detail}); leave the file as it is while training (or drop --stream to read it once), then run again"
            ),
            DataProblem::Unreadable => f.write_str(
                "could not be read while the run streamed it; check the file and its disk, then run again",
            ),
        }
    }
}

/// A data file that is not what the options ask for: the file, its format, the place and
/// the problem, with the format reader's own error where it refused the file.
#[derive(Debug, thiserror::Error)]
#[error("{}: {format}{place}: {problem}", path.display())]
pub struct DataError {
    pub path: PathBuf,
    pub format: &'static str,
    pub place: DataPlace,
    pub problem: DataProblem,
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl From<DataError> for TrainError {
    fn from(e: DataError) -> Self {
        TrainError::Data(Box::new(e))
    }
}

/// Everything that can stop a run.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The data file is malformed at a known place.
    #[error("{}: line {line}, column {column}: {problem}", path.display())]
    Csv {
        path: PathBuf,
        line: usize,
        column: usize,
        problem: CsvProblem,
    },

    /// A data file (Parquet, Arrow, NumPy, safetensors; or a bar table for `--window`) is
    /// not what the options ask for, at a known place. Nothing was trained or written.
    /// (Boxed: it keeps `TrainError` small.)
    #[error(transparent)]
    Data(Box<DataError>),

    /// A file could not be read or written.
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// Options that do not fit together (or a value out of range).
    #[error("invalid options: {0}")]
    Options(String),

    /// The checkpoint cannot be read as one of ours.
    #[error("checkpoint {} is corrupt or not a ztrain checkpoint: {reason}", path.display())]
    CheckpointCorrupt { path: PathBuf, reason: String },

    /// `--resume` names a file whose tensors are bf16 or f16 (an exported or PyTorch bf16
    /// parameter file): a run resumes from float32 masters and moments only; the source names
    /// the tensor. Start from it with --init-from instead.
    #[error("--resume {}: a bf16/f16 file cannot resume a run; start from it with --init-from (optimiser moments zero, step 0)", path.display())]
    ResumeReducedPrecision {
        path: PathBuf,
        #[source]
        source: Box<zgrad::GradError>,
    },

    /// The checkpoint was written by a run with another configuration.
    #[error(
        "checkpoint {} was written with a different configuration ({differences}); resume with the options it was written with, or start a new run without --resume",
        path.display()
    )]
    CheckpointMismatch { path: PathBuf, differences: String },

    /// The checkpoint holds a model of another depth or size than the options ask for.
    #[error(
        "checkpoint {} holds another model: {differences}; resume with the model options it was written with (--layers, --width, ...), or start a new run without --resume",
        path.display()
    )]
    CheckpointModel { path: PathBuf, differences: String },

    /// `--init-from` names a file that is not a parameter file of the model the options ask
    /// for (unreadable, corrupt, or with missing, extra or misshapen tensors, or other sizes:
    /// the error under it names them all). (Boxed: it keeps `TrainError` small.)
    #[error("--init-from {}: cannot start from this file", path.display())]
    InitFrom {
        path: PathBuf,
        #[source]
        source: Box<zgrad::GradError>,
    },

    /// `--device cuda` and no usable GPU.
    #[error(
        "--device cuda: no usable GPU ({reason}); use --device cpu, or --device auto to fall back to the CPU"
    )]
    NoGpu { reason: String },

    /// The memory report needs a device arena.
    #[error("--memory-report: {0}")]
    MemoryReport(String),

    /// A tensor operation failed (the error and its causes say what and why).
    #[error(transparent)]
    Compute(#[from] zcompute::ComputeError),

    /// Autograd, the model or the optimiser failed (the error and its causes say what and
    /// why).
    #[error(transparent)]
    Grad(#[from] zgrad::GradError),

    /// Device memory failed.
    #[error(transparent)]
    Memory(#[from] zcompute::MemError),

    /// An output option names a file that must not be written (or cannot be).
    #[error("{option} {}: {reason}", path.display())]
    Output {
        option: &'static str,
        path: PathBuf,
        reason: String,
    },

    /// An input is larger than its format (or the memory available) allows.
    #[error("{what} {}: more than {limit} bytes ({reason})", path.display())]
    TooLarge {
        what: &'static str,
        path: PathBuf,
        limit: u64,
        reason: String,
    },

    /// The run would need more memory than there is (or a size that does not fit in 64 bits).
    #[error("the run needs {needed} but {available}; {advice}")]
    OutOfMemory {
        needed: String,
        available: String,
        advice: String,
    },

    /// A device-memory option (or its `ZMEM_*` variable) out of its valid range.
    #[error("{name} {value}: {reason}")]
    ArenaOption {
        name: String,
        value: String,
        reason: String,
    },

    /// `--epochs` below what the checkpoint's run was configured for or has already trained.
    #[error(
        "--epochs {asked} is below the checkpoint's {saved} epochs ({trained} already trained); resume with --epochs {saved} or more, or start a new run without --resume"
    )]
    EpochsBelowCheckpoint {
        asked: u64,
        saved: u64,
        trained: u64,
    },

    /// A data-parallel job could not start or lost a rank (the launcher variables, the
    /// rendezvous, a collective): the error names the rank, the operation and the step.
    /// (Boxed: it keeps `TrainError` small.)
    #[error(transparent)]
    Comm(Box<zcomm::CommError>),

    /// The checkpoint was written by a job of another number of ranks: the data order and
    /// the shards would differ, so the run would not continue bitwise.
    #[error(
        "checkpoint {} was written by a job of {saved} rank(s), this job has {now}; resume with --gpus {saved} (or WORLD_SIZE={saved})",
        path.display()
    )]
    WorldMismatch {
        path: PathBuf,
        saved: usize,
        now: usize,
    },

    /// Training diverged.
    #[error("training diverged at step {step}: the loss is {loss}; lower --lr or set --clip-grad")]
    Diverged { step: u64, loss: f32 },
}

/// Exit status of a rank of a data-parallel job that stopped because the job failed under it
/// ([`TrainError::is_peer_failure`]): another rank died, stalled or gave up. The rank printed
/// its own error naming itself, the operation and the step; resume every rank from the last
/// checkpoint. (Its own failures exit with 1, as a single process does.)
pub const EXIT_PEER_FAILED: u8 = 3;

impl TrainError {
    /// Whether a rank of a job failed because of another rank: a collective that timed out or
    /// whose peer failed, a rendezvous a peer never reached, or a wait on the device past its
    /// deadline (a rank's device deadline is `--comm-timeout`: a collective whose peer died
    /// keeps the stream busy, and the wait that ends first may be the device's own).
    #[must_use]
    pub fn is_peer_failure(&self) -> bool {
        fn comm(c: &zcomm::CommError) -> bool {
            matches!(
                c,
                zcomm::CommError::Timeout { .. }
                    | zcomm::CommError::DeviceWait { .. }
                    | zcomm::CommError::NoProgress { .. }
                    | zcomm::CommError::PeerFailed { .. }
                    | zcomm::CommError::Rendezvous { .. }
            )
        }
        fn device_wait(c: &zcompute::ComputeError) -> bool {
            c.is_timeout()
        }
        match self {
            TrainError::Comm(c) => comm(c),
            TrainError::Compute(c) => device_wait(c),
            TrainError::Grad(g) => match g.cause() {
                zgrad::GradError::Comm(c) => comm(c),
                _ => g.compute_error().is_some_and(device_wait),
            },
            _ => false,
        }
    }
}

impl TrainError {
    /// Whether a rank gave up a wait on the other ranks because a stop (SIGINT/SIGTERM) was
    /// asked for: it exits 128 + the signal, as after a step.
    #[must_use]
    pub fn is_interrupted(&self) -> bool {
        matches!(self, TrainError::Comm(c) if matches!(**c, zcomm::CommError::Interrupted { .. }))
    }
}

impl From<zcomm::CommError> for TrainError {
    fn from(e: zcomm::CommError) -> Self {
        TrainError::Comm(Box::new(e))
    }
}

/// ztrain's result.
pub type Result<T> = std::result::Result<T, TrainError>;

/// An error and every error under it (`source()`), as the command prints them: `error: …`,
/// then one `  caused by: …` line per cause, down to the device's own error. A cause whose
/// message its parent already shows in full is not repeated.
#[must_use]
pub fn report(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = format!("error: {e}");
    let mut shown = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !shown.contains(&text) {
            out.push_str("\n  caused by: ");
            out.push_str(&text);
        }
        shown = text;
        next = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn device_timeout() -> zdevice::DeviceError {
        zdevice::DeviceError::Timeout {
            waited_for: "stream to finish its work".into(),
            deadline: Duration::from_secs(10),
            elapsed: Duration::from_secs(10),
            device_lost: false,
        }
    }

    #[test]
    fn a_rank_stopped_by_its_peers_is_told_from_its_own_failures() {
        let peer = zcomm::CommError::PeerFailed {
            rank: 0,
            op: "all_reduce",
            step: 7,
            detail: "rank 1 closed the connection".into(),
        };
        let stalled = || zcompute::ComputeError::Timeout {
            op: "download",
            source: device_timeout(),
        };
        let in_step = zgrad::GradError::from(stalled()).at_step(7, zgrad::Applied::Maybe);
        assert!(TrainError::from(peer).is_peer_failure());
        assert!(TrainError::Compute(stalled()).is_peer_failure());
        assert!(TrainError::Grad(in_step).is_peer_failure());
        let bad_env = zcomm::CommError::BadEnv {
            var: "RANK",
            value: "x".into(),
            problem: "not a number".into(),
        };
        assert!(!TrainError::from(bad_env).is_peer_failure());
        assert!(!TrainError::Options("--lr -1".into()).is_peer_failure());
        assert!(
            !TrainError::Diverged {
                step: 3,
                loss: f32::NAN
            }
            .is_peer_failure()
        );
    }
}
