//! Optimisers and the gradient utilities around them: zero_grad, the global gradient norm and
//! clipping by it (computed on the device, so they can sit inside a captured step), and AdamW
//! and SGD with momentum (each a fused kernel, with the learning rate and step count in device
//! memory), behind the trainer's one [`Optimizer`].
//!
//! Parameters made by a [`ParameterSet`] (every `XAsset`'s) live in one flat buffer and their
//! gradients in another; given exactly such a list, each utility here works on the flat buffers
//! in a fixed number of launches (zero_grad 1, grad_norm 2, clip_grad_norm 3, AdamW 1, SGD 1), and on
//! any other list per tensor.

mod adamw;
mod book;
mod choice;
mod flat;
mod sgd;

pub use adamw::{AdamW, AdamWHyper, AdamWState, AdamWTensors, DecayGroups, Moments};
pub use choice::{Optimizer, OptimizerKind, OptimizerState, OptimizerTensors};
pub use flat::{FLAT_ALIGN, GRAD_TAIL, ParameterSet, flat_layout, padded};
pub use sgd::{MomentumBuffer, Sgd, SgdHyper, SgdState, SgdTensors};

use crate::error::Result;
use crate::var::Var;
use zcompute::{BTensor, Element, UnaryOp, prelude::*};

/// Sets every parameter's gradient to zero, in place (one fill of a flat gradient buffer).
pub fn zero_grad<B: Ops<T>, T: Element>(b: &B, params: &[Var<B, T>]) -> Result<()> {
    if let Some(set) = ParameterSet::of(params) {
        return set.zero_grad(b);
    }
    for p in params {
        p.zero_grad(b)?;
    }
    Ok(())
}

/// `sqrt(sum of g² over every gradient)` as a rank-0 tensor (stays on the device).
pub fn grad_norm<B: Ops<T>, T: Element>(b: &B, params: &[Var<B, T>]) -> Result<BTensor<B, T>> {
    if let Some(set) = ParameterSet::of(params) {
        return set.grad_norm(b);
    }
    let mut total: Option<BTensor<B, T>> = None;
    for g in params.iter().filter_map(Var::grad) {
        let flat = g.reshape(&[g.numel()])?;
        let sq = b.sum(&b.mul(&flat, &flat)?, 0, false)?;
        total = Some(match total {
            Some(t) => b.add(&t, &sq)?,
            None => sq,
        });
    }
    let total = match total {
        Some(t) => t,
        None => b.zeros(&[])?,
    };
    Ok(b.unary(UnaryOp::Sqrt, &total)?)
}

/// Scales every gradient by `min(1, max_norm / (norm + 1e-6))` for a `norm` already taken
/// (rank 0; the data-parallel step's, taken with its last bucket): `clip_grad_norm` without
/// the norm's launches. No host round trip: capturable.
pub fn clip_by_norm<B: Ops<T>, T: Element>(
    b: &B,
    params: &[Var<B, T>],
    norm: &BTensor<B, T>,
    max_norm: T,
) -> Result<()> {
    if let Some(set) = ParameterSet::of(params) {
        return Ok(b.clip_scale(set.grads(), norm, max_norm)?);
    }
    for g in params.iter().filter_map(Var::grad) {
        b.clip_scale(g, norm, max_norm)?;
    }
    Ok(())
}

/// Scales every gradient by `min(1, max_norm / (norm + 1e-6))` (PyTorch's `clip_grad_norm_`)
/// and returns the norm before clipping. No host round trip: capturable.
pub fn clip_grad_norm<B: Ops<T>, T: Element>(
    b: &B,
    params: &[Var<B, T>],
    max_norm: T,
) -> Result<BTensor<B, T>> {
    let norm = grad_norm(b, params)?;
    clip_by_norm(b, params, &norm, max_norm)?;
    Ok(norm)
}
