//! Optimisers and the gradient utilities around them: zero_grad, the global gradient norm and
//! clipping by it (computed on the device, so they can sit inside a captured step), SGD and
//! AdamW (the backend's fused kernel, with the learning rate and step count in device memory).

mod adamw;
mod sgd;

pub use adamw::{AdamW, AdamWHyper, AdamWState, AdamWTensors, Moments};
pub use sgd::Sgd;

use crate::error::Result;
use crate::var::Var;
use zcompute::{BTensor, Backend, BinaryOp, Element, ScalarSide, UnaryOp};

/// Sets every parameter's gradient to zero, in place.
pub fn zero_grad<B: Backend<T>, T: Element>(b: &B, params: &[Var<B, T>]) -> Result<()> {
    for p in params {
        p.zero_grad(b)?;
    }
    Ok(())
}

/// `sqrt(sum of g² over every gradient)` as a rank-0 tensor (stays on the device).
pub fn grad_norm<B: Backend<T>, T: Element>(b: &B, params: &[Var<B, T>]) -> Result<BTensor<B, T>> {
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

/// Scales every gradient by `min(1, max_norm / (norm + 1e-6))` (PyTorch's `clip_grad_norm_`)
/// and returns the norm before clipping. No host round trip: capturable.
pub fn clip_grad_norm<B: Backend<T>, T: Element>(
    b: &B,
    params: &[Var<B, T>],
    max_norm: T,
) -> Result<BTensor<B, T>> {
    let norm = grad_norm(b, params)?;
    let rhs = ScalarSide::Rhs;
    let den = b.binary_scalar(BinaryOp::Add, &norm, T::from_f64(1e-6), rhs)?;
    let coef = b.binary_scalar(BinaryOp::Div, &den, max_norm, ScalarSide::Lhs)?;
    // min(coef, 1) = -max(-coef, -1)
    let neg = b.unary(UnaryOp::Neg, &coef)?;
    let clamped = b.binary_scalar(BinaryOp::Maximum, &neg, -T::ONE, rhs)?;
    let coef = b.unary(UnaryOp::Neg, &clamped)?;
    for g in params.iter().filter_map(Var::grad) {
        let scaled = b.mul(g, &coef)?;
        b.copy_into(&scaled, g)?;
    }
    Ok(norm)
}
