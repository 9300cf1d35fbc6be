//! The fused ops' types and their composite bodies. A fused op (bias + activation after a
//! product, the residual add with LayerNorm, mean-pool + head + BCE) is one kernel on the
//! device; every `Backend` gets the composite body written here from the op set as its
//! provided method, so a backend without a fused kernel (a test backend) still runs them, and
//! the CPU backend's own implementations (`cpu/fused.rs`) are checked against the same formulas.

use crate::backend::{Backend, BinaryOp, LayerNormOut, MatmulOpts, ScalarSide, UnaryOp};
use crate::element::Element;
use crate::error::Result;
use crate::storage::Storage;
use crate::tensor::Tensor;
use crate::validate;

/// The activation of a bias epilogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Activation {
    /// `x + bias`.
    Identity,
    /// `tanh(x + bias)`.
    Tanh,
}

/// What [`Backend::add_layer_norm`] returns: the sum `h = a + b` (the residual stream) and
/// LayerNorm of it with its saved statistics.
#[derive(Clone, Debug)]
pub struct AddLayerNormOut<S: Storage> {
    pub sum: Tensor<S>,
    pub norm: LayerNormOut<S>,
}

/// What [`Backend::pool_head_bce`] returns: the mean BCE-with-logits (rank 0) and the logits
/// `[B]`.
#[derive(Clone, Debug)]
pub struct PoolHeadBceOut<S: Storage> {
    pub loss: Tensor<S>,
    pub logits: Tensor<S>,
}

/// The gradients of [`Backend::pool_head_bce_backward`]: of `h` `[B, S, D]`, of the head
/// weight `[1, D]` and of its bias `[1]`.
#[derive(Clone, Debug)]
pub struct PoolHeadBceGrads<S: Storage> {
    pub h: Tensor<S>,
    pub weight: Tensor<S>,
    pub bias: Tensor<S>,
}

/// `act(x + bias)` from the op set.
pub(crate) fn bias_act<B: Backend<T> + ?Sized, T: Element>(
    b: &B,
    x: &Tensor<B::Storage>,
    bias: &Tensor<B::Storage>,
    act: Activation,
) -> Result<Tensor<B::Storage>> {
    validate::bias_act(x, bias)?;
    let y = b.add(x, bias)?;
    match act {
        Activation::Identity => Ok(y),
        Activation::Tanh => b.unary(UnaryOp::Tanh, &y),
    }
}

/// `g * (1 - y²)` from the op set.
pub(crate) fn tanh_backward<B: Backend<T> + ?Sized, T: Element>(
    b: &B,
    g: &Tensor<B::Storage>,
    y: &Tensor<B::Storage>,
) -> Result<Tensor<B::Storage>> {
    validate::tanh_backward(g, y)?;
    let y2 = b.mul(y, y)?;
    let d = b.binary_scalar(BinaryOp::Sub, &y2, T::ONE, ScalarSide::Lhs)?;
    b.mul(g, &d)
}

/// `h = a + b; LN(h)` from the op set.
pub(crate) fn add_layer_norm<B: Backend<T> + ?Sized, T: Element>(
    be: &B,
    a: &Tensor<B::Storage>,
    b: &Tensor<B::Storage>,
    weight: Option<&Tensor<B::Storage>>,
    bias: Option<&Tensor<B::Storage>>,
    eps: T,
) -> Result<AddLayerNormOut<B::Storage>> {
    validate::add_layer_norm(a, b, weight, bias, eps)?;
    let sum = be.add(a, b)?;
    let norm = be.layer_norm(&sum, weight, bias, eps)?;
    Ok(AddLayerNormOut { sum, norm })
}

/// Logits `[B]` of `mean_s(h) · wᵀ + bias` from the op set.
fn pooled_logits<B: Backend<T> + ?Sized, T: Element>(
    be: &B,
    h: &Tensor<B::Storage>,
    weight: &Tensor<B::Storage>,
    bias: &Tensor<B::Storage>,
) -> Result<Tensor<B::Storage>> {
    let pooled = be.mean(h, 1, false)?;
    let opts = MatmulOpts {
        trans_a: false,
        trans_b: true,
    };
    let logit = be.add(&be.matmul(&pooled, weight, opts)?, bias)?;
    let batch = h.shape()[0];
    logit.reshape(&[batch])
}

/// Mean-pool over S, the head and the mean BCE from the op set.
pub(crate) fn pool_head_bce<B: Backend<T> + ?Sized, T: Element>(
    be: &B,
    h: &Tensor<B::Storage>,
    weight: &Tensor<B::Storage>,
    bias: &Tensor<B::Storage>,
    targets: &Tensor<B::Storage>,
) -> Result<PoolHeadBceOut<B::Storage>> {
    validate::pool_head_bce(h, weight, bias, targets)?;
    let logits = pooled_logits(be, h, weight, bias)?;
    let loss = be.bce_with_logits_mean(&logits, targets)?;
    Ok(PoolHeadBceOut { loss, logits })
}

/// The backward of `pool_head_bce` from the op set: with `d_b = g (sigmoid(l_b) - y_b) / B`,
/// `dh[b, s, :] = d_b w / S`, `dw = Σ_b d_b mean_s h[b]`, `dbias = Σ_b d_b`.
pub(crate) fn pool_head_bce_backward<B: Backend<T> + ?Sized, T: Element>(
    be: &B,
    g: &Tensor<B::Storage>,
    h: &Tensor<B::Storage>,
    weight: &Tensor<B::Storage>,
    logits: &Tensor<B::Storage>,
    targets: &Tensor<B::Storage>,
) -> Result<PoolHeadBceGrads<B::Storage>> {
    let dims = validate::pool_head_bce_backward(g, h, weight, logits, targets)?;
    let (batch, scales, width) = (dims.batch, dims.scales, dims.width);
    let sig = be.unary(UnaryOp::Sigmoid, logits)?;
    let diff = be.sub(&sig, targets)?;
    let scaled = be.mul(&diff, g)?;
    let d = be.binary_scalar(
        BinaryOp::Div,
        &scaled,
        T::from_f64(batch as f64),
        ScalarSide::Rhs,
    )?;
    let d_col = d.reshape(&[batch, 1])?;
    let w_row = weight.reshape(&[1, width])?;
    let per_b = be.binary_scalar(
        BinaryOp::Div,
        &be.mul(&d_col, &w_row)?,
        T::from_f64(scales as f64),
        ScalarSide::Rhs,
    )?;
    let gh = be.contiguous(&per_b.unsqueeze(1)?.broadcast_to(&[batch, scales, width])?)?;
    let pooled = be.mean(h, 1, false)?;
    let gw = be.sum(&be.mul(&pooled, &d_col)?, 0, true)?;
    let gb = be.sum(&d, 0, true)?;
    Ok(PoolHeadBceGrads {
        h: gh,
        weight: gw,
        bias: gb,
    })
}

/// The provided body of [`Backend::pool_head_bce_backward_into`]: the backward, then the head
/// weight's and bias's gradients added into `dw` and `db`; returns `h`'s gradient.
pub(crate) fn pool_head_bce_backward_into<B: Backend<T> + ?Sized, T: Element>(
    be: &B,
    g: &Tensor<B::Storage>,
    h: &Tensor<B::Storage>,
    weight: &Tensor<B::Storage>,
    logits: &Tensor<B::Storage>,
    targets: &Tensor<B::Storage>,
    [dw, db]: [&Tensor<B::Storage>; 2],
) -> Result<Tensor<B::Storage>> {
    validate::pool_head_bce_backward_into(g, h, weight, logits, targets, [dw, db])?;
    let r = be.pool_head_bce_backward(g, h, weight, logits, targets)?;
    be.add_into(&r.weight, dw)?;
    be.add_into(&r.bias, db)?;
    Ok(r.h)
}
