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
    // Device backends: memory, capture and the device itself. Details are the lower layer's
    // message (zmem's diagnostics, the CUDA call and status), kept as text so this type stays
    // `Clone + Eq`.
    /// A tensor's memory was reclaimed by a step end while the tensor was still used: keep the
    /// step open while it is needed, or allocate it as `Saved`/`Persistent`.
    #[error(
        "{op}: a tensor's memory was reclaimed under it ({detail}); allocate it as saved or persistent, or use it within its step"
    )]
    UseAfterReclaim { op: &'static str, detail: String },
    /// The device (or the arena's cap) has no room for the request now; end steps, drop tensors
    /// or raise the arena cap.
    #[error("{op}: out of device memory: {detail}")]
    OutOfMemory { op: &'static str, detail: String },
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
    /// A capture could not be completed; it has ended and the backend still runs eagerly.
    #[error(
        "capture failed while {stage}: {detail}; the capture was abandoned and eager execution still works"
    )]
    CaptureFailed { stage: &'static str, detail: String },
    /// A bounded wait on the device ran out (the detail names what was waited for).
    #[error("{op}: timed out: {detail}")]
    Timeout { op: &'static str, detail: String },
    /// The device refused or failed a call. `lost`: the device is unusable from now on and the
    /// process must recreate it; otherwise fix the input and retry.
    #[error("{op}: device error: {detail}{}", if *.lost { " (device lost)" } else { "" })]
    DeviceFailed {
        op: &'static str,
        detail: String,
        lost: bool,
    },
    /// An engine's arena setting the arena would not honour exactly, or a malformed `ZMEM_*`
    /// variable: `name` is how the caller spelled it (its variable, or the override's label),
    /// `reason` the valid range. Nothing was opened; change the setting.
    #[error("{name} {value}: {reason}")]
    ArenaSetting {
        setting: crate::engine::ArenaSetting,
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
}
