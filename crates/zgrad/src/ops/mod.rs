//! The differentiable op set: one `impl Tape` block per family, each op with its backward.
//! Every op of zcompute's `Backend` that computes a value has a tape method here; the in-place
//! ones (`fill`, `copy_into`, `upload_into`, `adamw_step`) are methods of `Var` and the
//! optimisers, which bump versions instead of recording.

mod attention;
mod custom;
mod elementwise;
mod fused;
mod grads;
mod linalg;
mod linear;
mod reduce;
mod select;
mod view;

pub use custom::CustomOp;
pub(crate) use grads::only;

use crate::error::Result;
use zcompute::{BTensor, BinaryOp, Element, ScalarSide, UnaryOp, prelude::*};

/// Sums `g` down to `shape` (the inverse of NumPy broadcasting): extra leading axes are summed
/// away, axes where `shape` has 1 are summed with keepdim.
pub(crate) fn sum_to_shape<B: Ops<T>, T: Element>(
    b: &B,
    g: BTensor<B, T>,
    shape: &[usize],
) -> Result<BTensor<B, T>> {
    let mut g = g;
    let extra = g.rank().saturating_sub(shape.len());
    if extra > 1 && g.is_contiguous() {
        // Leading axes of a dense gradient merge into one, summed by a single reduction.
        let lead: usize = g.shape()[..extra].iter().product();
        let mut merged = vec![lead];
        merged.extend_from_slice(&g.shape()[extra..]);
        g = g.reshape(&merged)?;
    }
    while g.rank() > shape.len() {
        g = b.sum(&g, 0, false)?;
    }
    for (axis, &size) in shape.iter().enumerate() {
        if size == 1 && g.shape()[axis] != 1 {
            g = b.sum(&g, axis, true)?;
        }
    }
    Ok(g)
}

/// 1 where `x > 0`, else 0 (NaN stays NaN), exactly: `relu(x) / max(relu(x), tiny)` is `r/r = 1`
/// for every positive normal `x` and `0/tiny = 0` otherwise. The backend has no comparison op,
/// and this keeps the masks on the device (and inside a captured graph).
pub(crate) fn positive_mask<B: Ops<T>, T: Element>(
    b: &B,
    x: &BTensor<B, T>,
) -> Result<BTensor<B, T>> {
    let r = b.unary(UnaryOp::Relu, x)?;
    let tiny = T::from_f64(f64::from(f32::MIN_POSITIVE));
    let den = b.binary_scalar(BinaryOp::Maximum, &r, tiny, ScalarSide::Rhs)?;
    Ok(b.div(&r, &den)?)
}

/// The gradient share of `a` in `maximum(a, b)`: 1 where `a > b`, 1/2 on ties (as PyTorch),
/// 0 where `a < b`. `a_minus_b` is `a - b`.
pub(crate) fn max_share<B: Ops<T>, T: Element>(
    b: &B,
    a_minus_b: &BTensor<B, T>,
) -> Result<BTensor<B, T>> {
    let above = positive_mask(b, a_minus_b)?;
    let neg = b.unary(UnaryOp::Neg, a_minus_b)?;
    let below = positive_mask(b, &neg)?;
    // share = above + (1 - above - below) / 2 = (1 + above - below) / 2
    let d = b.sub(&above, &below)?;
    let d1 = b.binary_scalar(BinaryOp::Add, &d, T::ONE, ScalarSide::Rhs)?;
    Ok(b.binary_scalar(BinaryOp::Mul, &d1, T::from_f64(0.5), ScalarSide::Rhs)?)
}

/// `x` with a new shape, copying first if its layout cannot be reshaped as a view.
pub(crate) fn reshape_any<B: Ops<T>, T: Element>(
    b: &B,
    x: &BTensor<B, T>,
    shape: &[usize],
) -> Result<BTensor<B, T>> {
    if x.is_contiguous() {
        Ok(x.reshape(shape)?)
    } else {
        Ok(b.contiguous(x)?.reshape(shape)?)
    }
}
