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
}
