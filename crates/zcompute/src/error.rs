//! The one error type of zcompute. Every bad input (shapes, axes, aliasing) is a typed variant,
//! never a panic, so callers (the tape, the training loop) can report which op rejected what.

use thiserror::Error;

/// A shape or stride vector inside an error: boxed, so the error (and every `Result` of the
/// crate) stays two words wide instead of carrying inline vectors.
pub type ErrDims = Box<[usize]>;

/// Result alias used throughout the crate.
pub type Result<T> = std::result::Result<T, ComputeError>;

/// Why an op or a view refused its inputs.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum ComputeError {
    /// Two operands must have the same shape (or matching inner dimensions) and do not.
    #[error("{op}: shape mismatch, lhs {lhs:?} vs rhs {rhs:?}")]
    ShapeMismatch {
        op: &'static str,
        lhs: ErrDims,
        rhs: ErrDims,
    },
    /// NumPy broadcasting rules cannot reconcile the two shapes.
    #[error("{op}: shapes {lhs:?} and {rhs:?} are not broadcastable")]
    NotBroadcastable {
        op: &'static str,
        lhs: ErrDims,
        rhs: ErrDims,
    },
    /// An axis index is not below the tensor's rank.
    #[error("{op}: axis {axis} out of range for rank {rank}")]
    AxisOutOfRange {
        op: &'static str,
        axis: usize,
        rank: usize,
    },
    /// The op needs a contiguous (row-major, dense) layout, e.g. reshape of a permuted view.
    #[error("{op}: layout with shape {shape:?} and strides {strides:?} is not contiguous")]
    NotContiguous {
        op: &'static str,
        shape: ErrDims,
        strides: ErrDims,
    },
    /// A permutation does not name every axis exactly once.
    #[error("permute: {perm:?} is not a permutation of 0..{rank}")]
    InvalidPermutation { perm: ErrDims, rank: usize },
    /// A narrow (or split) reaches past the end of its axis.
    #[error("narrow: start {start} + len {len} exceeds axis {axis} of size {size}")]
    NarrowOutOfRange {
        axis: usize,
        start: usize,
        len: usize,
        size: usize,
    },
    /// A reshape that changes the number of elements.
    #[error("reshape: {from:?} ({from_numel} elements) cannot become {to:?} ({to_numel} elements)")]
    ReshapeNumel {
        from: ErrDims,
        to: ErrDims,
        from_numel: usize,
        to_numel: usize,
    },
    /// The op needs at least `min` axes.
    #[error("{op}: needs rank >= {min}, got shape {shape:?}")]
    RankTooLow {
        op: &'static str,
        min: usize,
        shape: ErrDims,
    },
    /// A buffer's length does not match what the shape (or layout) needs.
    #[error("{op}: expected {expected} elements, got {got}")]
    LengthMismatch {
        op: &'static str,
        expected: usize,
        got: usize,
    },
    /// A layout would read or write past the end of its storage.
    #[error("layout reaches element {needed} but storage holds {len}")]
    OutOfStorage { needed: usize, len: usize },
    /// An in-place op was given operands that share storage where they must not.
    #[error("{op}: operands `{lhs}` and `{rhs}` share storage")]
    Aliased {
        op: &'static str,
        lhs: &'static str,
        rhs: &'static str,
    },
    /// A destination view reaches one storage element through two indices (a broadcast view),
    /// so writing into it would be order-dependent.
    #[error("{op}: destination {shape:?} with strides {strides:?} overlaps itself")]
    OverlappingDestination {
        op: &'static str,
        shape: ErrDims,
        strides: ErrDims,
    },
    /// A reduction with no identity (max) over an axis of size zero.
    #[error("{op}: reduction over empty axis {axis}")]
    EmptyReduction { op: &'static str, axis: usize },
    /// An index names no row of its table (the CPU backend reads indices when the op runs
    /// and refuses one that is not a whole number in `[0, rows)`): fix the index data, or
    /// grow the table.
    #[error("{op}: index {value} at position {position} names no row of a table of {rows} rows")]
    IndexOutOfRange {
        op: &'static str,
        position: usize,
        value: String,
        rows: usize,
    },
    /// A size computation overflowed usize (absurd shapes from untrusted input).
    #[error("{op}: size overflow for shape {shape:?}")]
    SizeOverflow { op: &'static str, shape: ErrDims },
    /// A scalar argument the op cannot compute with (NaN, infinite, or out of its range, such
    /// as an AdamW beta of 1): `value` is the argument as given, `expected` its valid range.
    #[error("{op}: {arg} = {value} is invalid; expected {expected}")]
    InvalidScalar {
        op: &'static str,
        arg: &'static str,
        value: String,
        expected: &'static str,
    },
    // Device backends: memory, capture and the device itself. Each keeps the lower layer's
    // error (zmem's `MemError`, zdevice's `DeviceError`) as its `source()`, fields and all;
    // the messages here say what failed and what to do, the sources say why. `MemError` is
    // boxed to keep every `Result` of the crate small; `mem_error()` gives it typed.
    /// A tensor's memory was reclaimed by a step end while the tensor was still used (or the
    /// block belongs to another arena): keep the step open while it is needed, or allocate it
    /// as `Saved`/`Persistent`.
    #[error(
        "{op}: a tensor's memory was reclaimed under it; allocate it as saved or persistent, or use it within its step"
    )]
    UseAfterReclaim {
        op: &'static str,
        #[source]
        source: Box<zmem::MemError>,
    },
    /// The device (or the arena's cap) has no room for the request now, though it fits the
    /// device: end steps, drop tensors or raise the arena cap, then retry.
    #[error("{op}: out of device memory now; end steps, drop tensors or raise the arena cap")]
    OutOfMemory {
        op: &'static str,
        #[source]
        source: Box<zmem::MemError>,
    },
    /// The request can never fit, whatever is freed (it exceeds the device's memory): split it.
    #[error("{op}: the request can never fit on this device; split it into smaller tensors")]
    TooLarge {
        op: &'static str,
        #[source]
        source: Box<zmem::MemError>,
    },
    /// A request inside a capture did not fit the graph's reservation: the capture was
    /// abandoned (eager execution still works); capture again with a body that allocates as its
    /// warm-up did, or with more headroom.
    #[error(
        "{op}: the capture reservation is exhausted; the capture was abandoned and eager execution still works"
    )]
    CaptureReservationExhausted {
        op: &'static str,
        #[source]
        source: Box<zmem::MemError>,
    },
    /// The allocation class is `Scratch` but no step is open: call `begin_step` first, or
    /// `set_alloc_class(Saved | Persistent)`.
    #[error(
        "{op}: scratch allocation with no step open; call begin_step first or switch the allocation class to saved or persistent"
    )]
    NoOpenStep { op: &'static str },
    /// A step operation out of order (`begin_step` with one open, `end_step` with none, either
    /// during capture).
    #[error("{op}: {why}")]
    StepState { op: &'static str, why: &'static str },
    /// The call cannot be expressed inside a capture (uploads, downloads, syncs, step changes):
    /// do it before the capture or between replays.
    #[error("{op} is not allowed while capturing: {why}")]
    CaptureIllegal { op: &'static str, why: String },
    /// The driver invalidated the capture (a call it cannot record was made during it): the
    /// capture has ended, the device is usable and eager execution still works; remove the call
    /// from the captured body.
    #[error("{op}: the driver invalidated the capture; eager execution still works")]
    CaptureInvalidated {
        op: &'static str,
        #[source]
        source: zdevice::DeviceError,
    },
    /// A capture could not be completed at `stage`; it has ended and the backend still runs
    /// eagerly. The source says what failed.
    #[error(
        "capture failed while {stage}; the capture was abandoned and eager execution still works"
    )]
    CaptureFailed {
        stage: &'static str,
        #[source]
        source: Box<ComputeError>,
    },
    /// A captured body allocated differently in its warm-up and its captured run, so the
    /// tensors it stores outside cannot be paired: a captured body must allocate the same
    /// tensors on every run.
    #[error("the captured run allocated unlike its warm-up: {detail}")]
    CaptureRunsDiffer { detail: String },
    /// A body captured into a graph pool (`Capture::capture_in_pool`) stored `tensors` it
    /// allocated outside the capture: they would live in the pool's memory, which its other
    /// members' replays overwrite. Allocate what must outlast a replay before the capture and
    /// write into it (`copy_into`), or capture the body alone (`capture`).
    #[error(
        "the body stores {tensors} tensor(s) it allocated; in a graph pool they would be overwritten by the other members: write results into tensors allocated before the capture, or capture it alone"
    )]
    CaptureOutputInPool { tensors: usize },
    /// A capture body failed with an error of the layer that wrote it (that layer keeps the
    /// typed error and reports it instead).
    #[error("{detail}")]
    BodyFailed { detail: String },
    /// A bounded wait on the device ran out; the source names what was waited for. The
    /// device is lost if the wait was inside the driver (`is_device_lost`).
    #[error("{op}: timed out waiting for the device")]
    Timeout {
        op: &'static str,
        #[source]
        source: zdevice::DeviceError,
    },
    /// The arena failed in a way not listed above (an allocation during a capture without
    /// reservation, a capture already active, a stalled overflow pool): the source says what.
    #[error("{op}: device memory failed")]
    Memory {
        op: &'static str,
        #[source]
        source: Box<zmem::MemError>,
    },
    /// The device refused or failed a call. If it is lost (`is_device_lost`), the process must
    /// recreate it; otherwise fix the input and retry.
    #[error("{op}: device error{}", if .source.is_fatal() { " (device lost)" } else { "" })]
    Device {
        op: &'static str,
        #[source]
        source: zdevice::DeviceError,
    },
    /// An engine's arena setting the arena would not honour exactly, or a malformed `ZMEM_*`
    /// variable: `name` is how the caller spelled it (its variable, or the override's label),
    /// `reason` the valid range. Nothing was opened; change the setting.
    #[error("{name} {value}: {reason}")]
    ArenaSetting {
        setting: zmem::ArenaSetting,
        name: &'static str,
        value: String,
        reason: String,
    },
    /// `Engine::cuda`: the driver library does not load or the device does not open (no GPU,
    /// no such ordinal, a driver too old). Use another ordinal, `Engine::sim` or the CPU.
    #[error("GPU {ordinal} is not usable: {reason}")]
    DeviceUnavailable { ordinal: u32, reason: String },
    /// The backend cannot run this input (for example a view of more than 6 non-mergeable
    /// axes, or a matrix product whose sizes exceed cuBLAS's 32-bit dimensions).
    #[error("{op}: unsupported on this backend: {reason}")]
    Unsupported { op: &'static str, reason: String },
    /// A matrix product under a math mode (`PrecisionOps`: TF32, bf16) that this backend, or
    /// these elements, cannot compute as the mode says. Nothing ran, and nothing ran in float32
    /// instead. Use `MathMode::F32`, or a backend that has the mode (the CPU backend in f32
    /// emulates TF32 and bf16; the CUDA backend and the simulated device run both).
    #[error("{op}: math mode {mode} is not available on the {backend} backend: {reason}")]
    MathModeUnsupported {
        op: &'static str,
        mode: &'static str,
        backend: &'static str,
        reason: String,
    },
}

impl ComputeError {
    /// The error under any `CaptureFailed` wrappers: what actually went wrong.
    #[must_use]
    pub fn cause(&self) -> &ComputeError {
        match self {
            ComputeError::CaptureFailed { source, .. } => source.cause(),
            e => e,
        }
    }

    /// zmem's error under this one (looking through `CaptureFailed`), if the arena failed.
    #[must_use]
    pub fn mem_error(&self) -> Option<&zmem::MemError> {
        match self.cause() {
            ComputeError::UseAfterReclaim { source, .. }
            | ComputeError::OutOfMemory { source, .. }
            | ComputeError::TooLarge { source, .. }
            | ComputeError::CaptureReservationExhausted { source, .. }
            | ComputeError::Memory { source, .. } => Some(source.as_ref()),
            _ => None,
        }
    }

    /// zdevice's error at the bottom of this one (through zmem's, and through
    /// `CaptureFailed`), if the device reported one.
    #[must_use]
    pub fn device_error(&self) -> Option<&zdevice::DeviceError> {
        match self.cause() {
            ComputeError::CaptureInvalidated { source, .. }
            | ComputeError::Timeout { source, .. }
            | ComputeError::Device { source, .. } => Some(source),
            other => other.mem_error().and_then(zmem::MemError::device_error),
        }
    }

    /// Whether memory was short now for a request that fits the device: freeing memory
    /// (ending steps, dropping tensors) or raising the arena cap may let a retry succeed.
    #[must_use]
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self.cause(), ComputeError::OutOfMemory { .. })
            || self
                .device_error()
                .is_some_and(zdevice::DeviceError::is_out_of_memory)
    }

    /// Whether the request can never fit, whatever is freed: split it.
    #[must_use]
    pub fn is_too_large(&self) -> bool {
        matches!(self.cause(), ComputeError::TooLarge { .. })
            || self
                .device_error()
                .is_some_and(zdevice::DeviceError::is_too_large)
    }

    /// Whether a capture's reservation ran out (the capture was abandoned).
    #[must_use]
    pub fn is_capture_reservation_exhausted(&self) -> bool {
        matches!(
            self.cause(),
            ComputeError::CaptureReservationExhausted { .. }
        )
    }

    /// Whether the driver invalidated a capture (it ended; the device is usable).
    #[must_use]
    pub fn is_capture_invalidated(&self) -> bool {
        matches!(self.cause(), ComputeError::CaptureInvalidated { .. })
    }

    /// Whether a wait on the device passed its deadline (the device's `Timeout`, however deep
    /// in the chain): the work it waited for never finished in time (a peer of a collective
    /// that died keeps the stream busy, so a data-parallel rank reads this as a peer failure).
    #[must_use]
    pub fn is_timeout(&self) -> bool {
        self.device_error()
            .is_some_and(|d| matches!(d, zdevice::DeviceError::Timeout { .. }))
    }

    /// Whether the device is lost: nothing more runs on it; recreate it.
    #[must_use]
    pub fn is_device_lost(&self) -> bool {
        self.device_error()
            .is_some_and(zdevice::DeviceError::is_fatal)
    }

    /// Whether the device (not the op's inputs, nor a refusal before any call) failed, so work
    /// already queued may or may not have run: a failed or timed-out device call, or the arena
    /// failing other than by refusing an allocation during a capture.
    #[must_use]
    pub fn is_device_failure(&self) -> bool {
        use zdevice::DeviceError as D;
        use zmem::MemError as M;
        match self.cause() {
            ComputeError::Timeout { .. } => true,
            ComputeError::Device { source, .. } => !matches!(
                source,
                D::CaptureIllegal { .. } | D::OutOfMemory { .. } | D::TooLarge { .. }
            ),
            ComputeError::Memory { source, .. } => !matches!(
                **source,
                M::AllocationDuringCapture { .. } | M::CaptureActive { .. }
            ),
            _ => false,
        }
    }
}
