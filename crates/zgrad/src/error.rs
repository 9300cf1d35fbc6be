//! The one error type of zgrad. Variants say what went wrong and what the caller can do.

use thiserror::Error;
use zcompute::ComputeError;

/// Result alias used throughout the crate.
pub type Result<T> = std::result::Result<T, GradError>;

/// Which value stopped training.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NonFiniteKind {
    Loss,
    Gradient,
}

impl std::fmt::Display for NonFiniteKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NonFiniteKind::Loss => "loss",
            NonFiniteKind::Gradient => "gradient",
        })
    }
}

/// Why a tape, an optimiser, a file or the trainer refused.
#[derive(Debug, Error)]
pub enum GradError {
    /// An op of the backend refused its inputs (shapes, axes, aliasing, device errors).
    #[error(transparent)]
    Compute(#[from] ComputeError),
    /// A tensor saved for backward was written in place after it was saved (as PyTorch's
    /// "modified by an inplace operation"): recompute the forward, or write into a copy.
    #[error(
        "{op} backward: saved tensor `{saved}` was modified by an in-place operation \
         (version {now}, saved at version {then})"
    )]
    ModifiedInPlace {
        op: &'static str,
        saved: &'static str,
        then: u64,
        now: u64,
    },
    /// Backward reached a node whose saved tensors were already consumed by an earlier
    /// backward through the same tape: run the forward again.
    #[error("{op} backward: the node was already consumed by an earlier backward")]
    BackwardTwice { op: &'static str },
    /// A variable recorded on one tape was passed to another (or to a dropped tape's successor).
    #[error("{op}: variable belongs to tape {var_tape}, not to this tape {tape}")]
    ForeignVar {
        op: &'static str,
        var_tape: u64,
        tape: u64,
    },
    /// Backward was asked from a variable that no recorded op produced (a constant, or the
    /// result of a no-grad tape).
    #[error(
        "backward: the root does not require grad (computed in no-grad mode or from constants only)"
    )]
    RootNotRecorded,
    /// The seed gradient's shape differs from the root's.
    #[error("backward: seed shape {seed:?} differs from root shape {root:?}")]
    SeedShape { seed: Vec<usize>, root: Vec<usize> },
    /// A parameter file or checkpoint lacks a tensor, or has it with another shape or dtype.
    #[error("{file}: tensor `{name}`: {problem}")]
    BadTensorFile {
        file: String,
        name: String,
        problem: String,
    },
    /// A model configuration that cannot be built (say, width not divisible by heads).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The safetensors encoding refused the data.
    #[error("{path}: safetensors: {message}")]
    SafeTensors { path: String, message: String },
    /// The loss or a gradient is NaN or infinite: training stops before the optimiser step
    /// (except inside a captured batched step, whose update already ran; reload a checkpoint).
    #[error("step {step}: non-finite {kind}{}", sample.map(|s| format!(" (sample {s} of the batch)")).unwrap_or_default())]
    NonFinite {
        step: u64,
        sample: Option<usize>,
        kind: NonFiniteKind,
    },
    /// The training inputs do not match the model (lengths, batch size, labels).
    #[error("bad training input: {0}")]
    BadInput(String),
}
