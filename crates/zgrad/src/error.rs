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

/// Whether a failed optimiser step changed the model (`GradError::Step`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// Nothing changed: parameters, moments and the step count are bitwise as before the
    /// call. Retrying the same batch is safe.
    No,
    /// The update was applied and counted (the step count moved); what failed came after it.
    /// Do not retry the batch: go on with the next one.
    Yes,
    /// The update may have been applied, in full or in part. The optimiser refuses to step
    /// (`GradError::StateUnknown`) until its state is restored (`Trainer::load_checkpoint`,
    /// or `AdamW::import` together with the parameters).
    Maybe,
}

impl std::fmt::Display for Applied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Applied::No => "the update was not applied; the model is unchanged",
            Applied::Yes => "the update was applied and counted; do not retry this batch",
            Applied::Maybe => {
                "the update may have been applied in part; load a checkpoint before training on"
            }
        })
    }
}

/// Why a tape, an optimiser, a file or the trainer refused.
#[derive(Debug, Error)]
pub enum GradError {
    /// An op of the backend refused its inputs (shapes, axes, aliasing, device errors).
    #[error(transparent)]
    Compute(#[from] ComputeError),
    /// A collective of a data-parallel job failed: a peer stalled, gave up or vanished (the
    /// job cannot go on; restart it from the last checkpoint).
    /// (Boxed: it keeps `GradError` small.)
    #[error(transparent)]
    Comm(Box<zcomm::CommError>),
    /// A memory plan could not open its accounting-only simulated device (through the
    /// engine: the source says why).
    #[error("memory plan: the accounting device did not open")]
    PlanDevice(#[source] ComputeError),
    /// A memory plan's arena could not be made (a setting the arena refuses: the source names
    /// it).
    #[error("memory plan: the arena could not be made")]
    PlanArena(#[source] ComputeError),
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
    /// A file holds a tensor in a dtype zgrad does not read as a float (it reads F32, F64, BF16
    /// and F16; a checkpoint's counters are U64): convert it to one of those, or leave it out.
    #[error(
        "{file}: tensor `{name}` is {dtype:?}; tensors are read from F32, F64, BF16 or F16 only \
         (convert it, or leave it out of the file)"
    )]
    UnsupportedDtype {
        file: String,
        name: String,
        dtype: safetensors::Dtype,
    },
    /// A bf16 or f16 tensor of a file holds a NaN or an infinity (in f16 usually a value that
    /// overflowed when the file was written): a model cannot start from it; write the file
    /// again from finite values (f16 ends at 65,504: use bf16 or float32 for larger ones).
    #[error(
        "{file}: tensor `{name}` ({dtype:?}) holds {value} at element {index}; its values must be finite"
    )]
    NonFiniteInFile {
        file: String,
        name: String,
        dtype: safetensors::Dtype,
        index: usize,
        value: f32,
    },
    /// Writing a tensor in a 16-bit format: a value is NaN or infinite, or too large for the
    /// format (f16 ends at 65,504), so the file would not read back. Nothing was written; keep
    /// float32, or bf16 for values beyond f16's range.
    #[error(
        "{file}: tensor `{name}`: element {index} ({value}) is not finite in {dtype:?}; nothing was written"
    )]
    NotRepresentable {
        file: String,
        name: String,
        dtype: safetensors::Dtype,
        index: usize,
        value: f64,
    },
    /// Resuming from a file whose parameters or optimiser moments are bf16 or f16: resuming
    /// needs the float32 master parameters and moments, which such a file does not hold. Start
    /// from it as parameters instead (`XAsset::load`, `ztrain --init-from`: moments zero, step 0).
    #[error(
        "{file}: tensor `{name}` is {dtype:?}: resuming needs float32 master parameters and \
         optimiser moments, which a {dtype:?} file does not hold; start from it as parameters \
         instead (fresh moments, step 0)"
    )]
    ReducedPrecisionResume {
        file: String,
        name: String,
        dtype: safetensors::Dtype,
    },
    /// A precision policy that this backend cannot run as the policy says (TF32's input
    /// rounding on the CPU): it is refused rather than run in float32 under the policy's name.
    /// Use `Precision::F32` or `Precision::Bf16` there.
    #[error("precision {precision}: {what} cannot run it (its rounding is not emulated there)")]
    PrecisionNotEmulated {
        precision: &'static str,
        what: &'static str,
    },
    /// The trainer's precision policy (`TrainerConfig::precision`) needs matrix products this
    /// backend cannot run (float64 elements, a backend without reduced-precision products): the
    /// trainer refuses it when made rather than train in float32 under the policy's name. Use
    /// `Precision::F32` on this backend, or a float32 CPU or CUDA backend.
    #[error("precision {precision} cannot run on this backend: {source}")]
    PrecisionUnsupported {
        precision: &'static str,
        /// (Boxed: it keeps `GradError` small.)
        #[source]
        source: Box<ComputeError>,
    },
    /// A checkpoint written under one precision policy resumed under another: resuming
    /// bitwise needs the same products, so it is refused. Resume with the checkpoint's
    /// precision (`ztrain --precision`), or start a new run from its parameters
    /// (`ztrain --init-from`).
    #[error(
        "the checkpoint was trained with precision {saved}, this run asks for {requested}: resume with --precision {saved}, or start a new run from its parameters (--init-from)"
    )]
    PrecisionMismatch {
        saved: &'static str,
        requested: &'static str,
    },
    /// A parameter file's tensors do not match the model: every tensor the model has and the
    /// file lacks, every tensor the file has and no parameter is named (beside `x`, `y` and
    /// `optim.*`), and every one of another shape, all named.
    #[error(
        "{file}: the tensors do not match the model's parameters:{}",
        mismatch_list(missing, extra, misshapen)
    )]
    ParameterMismatch {
        file: String,
        missing: Vec<String>,
        extra: Vec<String>,
        misshapen: Vec<String>,
    },
    /// A parameter file holds a model of other sizes than the ones asked for: each difference
    /// named (`layers: file 3, asked 2`). Ask for the file's sizes, or use another file.
    #[error("{file}: the file's model differs from the one asked for ({})", differences.join("; "))]
    ModelMismatch {
        file: String,
        differences: Vec<String>,
    },
    /// A checkpoint (or an exported state) of one optimiser loaded into a trainer of another
    /// (`saved` and `now` are `adamw` or `sgd`): train with the optimiser that wrote it, or
    /// start from its parameters alone (`XAsset::load`, `ztrain --init-from`).
    #[error("{file}: holds the optimiser state of {saved}, this trainer's optimiser is {now}")]
    OptimizerMismatch {
        file: String,
        saved: String,
        now: String,
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
    /// The loss or a gradient is NaN or infinite: the optimiser step is skipped (in a captured
    /// batched step, on the device, by the update kernels' gate), so the model is unchanged.
    #[error("step {step}: non-finite {kind}{}", sample.map(|s| format!(" (sample {s} of the batch)")).unwrap_or_default())]
    NonFinite {
        step: u64,
        sample: Option<usize>,
        kind: NonFiniteKind,
    },
    /// The training inputs do not match the model (lengths, batch size, labels).
    #[error("bad training input: {0}")]
    BadInput(String),
    /// A shape does not fit the model's target contract (`Model::task`): its outputs, its
    /// targets or its loss. Make the model's `task` say what it outputs, or give targets of
    /// the shape it names.
    #[error("{what} has shape {given:?}, the model's task ({task}) needs {expected:?}")]
    Target {
        what: String,
        expected: Vec<usize>,
        given: Vec<usize>,
        task: crate::task::Task,
    },
    /// An optimiser step (`AdamW::step`, a host `step`) failed; `applied` says whether
    /// its update reached the model, and so whether the batch may be retried. What failed is
    /// the `source()` (and [`GradError::cause`]).
    #[error("step {step} failed ({applied})")]
    Step {
        step: u64,
        applied: Applied,
        #[source]
        source: Box<GradError>,
    },
    /// An earlier step failed after its update may have started (`Applied::Maybe`): the
    /// parameters and moments are of unknown step. Restore them (`Trainer::load_checkpoint`,
    /// or `AdamW::import` with the parameters) before stepping again.
    #[error(
        "step {step} may have been partly applied: the model's state is unknown; load a \
         checkpoint (or import the optimiser state and the parameters) before stepping again"
    )]
    StateUnknown { step: u64 },
}

/// ` missing: a, b; extra: c; wrong shape: d [2] (the model's [3])`, leaving out empty lists.
fn mismatch_list(missing: &[String], extra: &[String], misshapen: &[String]) -> String {
    [
        ("missing", missing),
        ("extra", extra),
        ("wrong shape", misshapen),
    ]
    .into_iter()
    .filter(|(_, names)| !names.is_empty())
    .map(|(what, names)| format!(" {what}: {}", names.join(", ")))
    .collect::<Vec<_>>()
    .join(";")
}

impl From<zcomm::CommError> for GradError {
    fn from(e: zcomm::CommError) -> Self {
        GradError::Comm(Box::new(e))
    }
}

impl GradError {
    /// Wraps `self` as the failure of optimiser step `step` (an error that already is a
    /// `Step` is kept as it is).
    #[must_use]
    pub fn at_step(self, step: u64, applied: Applied) -> GradError {
        match self {
            e @ GradError::Step { .. } => e,
            e => GradError::Step {
                step,
                applied,
                source: Box::new(e),
            },
        }
    }

    /// For a failed step: whether its update was applied (`None` for other errors).
    #[must_use]
    pub fn applied(&self) -> Option<Applied> {
        match self {
            GradError::Step { applied, .. } => Some(*applied),
            GradError::StateUnknown { .. } => Some(Applied::No),
            _ => None,
        }
    }

    /// The error under any `Step` wrapper: what actually went wrong.
    #[must_use]
    pub fn cause(&self) -> &GradError {
        match self {
            GradError::Step { source, .. } => source.cause(),
            e => e,
        }
    }

    /// `self` with the error under any `Step` wrapper replaced by `f` of it (the wrappers,
    /// their step and whether the update was applied, kept).
    #[must_use]
    pub fn map_cause(self, f: impl FnOnce(GradError) -> GradError) -> GradError {
        match self {
            GradError::Step {
                step,
                applied,
                source,
            } => GradError::Step {
                step,
                applied,
                source: Box::new(source.map_cause(f)),
            },
            e => f(e),
        }
    }

    /// The backend's error under any `Step` wrapper, if an op or the device failed (its
    /// [`ComputeError::mem_error`] and [`ComputeError::device_error`] reach the layers below).
    #[must_use]
    pub fn compute_error(&self) -> Option<&ComputeError> {
        match self.cause() {
            GradError::Compute(c) => Some(c),
            _ => None,
        }
    }

    /// Whether device memory was short now for a request that fits: free memory (end steps,
    /// drop tensors) or raise the arena cap, then retry ([`ComputeError::is_out_of_memory`]).
    #[must_use]
    pub fn is_out_of_memory(&self) -> bool {
        self.compute_error()
            .is_some_and(ComputeError::is_out_of_memory)
    }

    /// Whether a request can never fit on the device: shrink the model or the batch
    /// ([`ComputeError::is_too_large`]).
    #[must_use]
    pub fn is_too_large(&self) -> bool {
        self.compute_error().is_some_and(ComputeError::is_too_large)
    }

    /// Whether a capture's reservation ran out ([`ComputeError::is_capture_reservation_exhausted`]).
    #[must_use]
    pub fn is_capture_reservation_exhausted(&self) -> bool {
        self.compute_error()
            .is_some_and(ComputeError::is_capture_reservation_exhausted)
    }

    /// Whether the driver invalidated a capture ([`ComputeError::is_capture_invalidated`]).
    #[must_use]
    pub fn is_capture_invalidated(&self) -> bool {
        self.compute_error()
            .is_some_and(ComputeError::is_capture_invalidated)
    }

    /// Whether the device is lost: recreate it ([`ComputeError::is_device_lost`]).
    #[must_use]
    pub fn is_device_lost(&self) -> bool {
        self.compute_error()
            .is_some_and(ComputeError::is_device_lost)
    }
}
