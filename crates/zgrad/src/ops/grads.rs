//! What every op's backward shares: its output gradient (a leaf below `ops/mod.rs`, so that
//! an op's file names it without naming the module that re-exports the op).

use crate::error::Result;

/// The single output gradient of a one-output op (the engine calls backward only with one).
pub(crate) fn only<S: zcompute::Storage>(
    grads: &[Option<zcompute::Tensor<S>>],
) -> Result<&zcompute::Tensor<S>> {
    grads.first().and_then(Option::as_ref).ok_or_else(|| {
        zcompute::ComputeError::LengthMismatch {
            op: "backward (output gradient)",
            expected: 1,
            got: 0,
        }
        .into()
    })
}
