//! The pooled-loss family: [`PooledLossOps`], a sequence classifier's tail fused (the mean over
//! the sequence axis, a one-output linear head and the mean BCE-with-logits loss, forward and
//! backward), each provided as the composite of [`Backend`]'s primitives written below.

use crate::backend::{BTensor, Backend, BinaryOp, MatmulOpts, ScalarSide, UnaryOp};
use crate::element::Element;
use crate::error::Result;
use crate::storage::Storage;
use crate::tensor::Tensor;
use crate::validate;

/// What [`PooledLossOps::pool_head_bce`] returns: the mean BCE-with-logits (rank 0) and the logits
/// `[B]`.
#[derive(Clone, Debug)]
pub struct PoolHeadBceOut<S: Storage> {
    pub loss: Tensor<S>,
    pub logits: Tensor<S>,
}

/// The gradients of [`PooledLossOps::pool_head_bce_backward`]: of `h` `[B, S, D]`, of the head
/// weight `[1, D]` and of its bias `[1]`.
#[derive(Clone, Debug)]
pub struct PoolHeadBceGrads<S: Storage> {
    pub h: Tensor<S>,
    pub weight: Tensor<S>,
    pub bias: Tensor<S>,
}

/// Mean-pool over the sequence, a linear head to one logit and the mean BCE-with-logits, fused.
/// Every method is provided as the composite of [`Backend`]'s primitives; a backend overrides
/// a method with its fused kernel (the CPU backend: plain loops; the CUDA backend: a
/// deterministic two-launch reduction each way).
pub trait PooledLossOps<T: Element>: Backend<T> {
    /// Mean-pool of `h` `[B, S, D]` over S, the head `[1, D]` (+ bias `[1]`) and the mean
    /// BCE-with-logits against `targets` `[B]`: the loss (rank 0) and the logits `[B]`.
    fn pool_head_bce(
        &self,
        h: &BTensor<Self, T>,
        weight: &BTensor<Self, T>,
        bias: &BTensor<Self, T>,
        targets: &BTensor<Self, T>,
    ) -> Result<PoolHeadBceOut<Self::Storage>> {
        pool_head_bce(self, h, weight, bias, targets)
    }

    /// `pool_head_bce`'s backward from the loss gradient `g` (rank 0): the gradients of `h`,
    /// of the head weight and of its bias (the targets get none).
    fn pool_head_bce_backward(
        &self,
        g: &BTensor<Self, T>,
        h: &BTensor<Self, T>,
        weight: &BTensor<Self, T>,
        logits: &BTensor<Self, T>,
        targets: &BTensor<Self, T>,
    ) -> Result<PoolHeadBceGrads<Self::Storage>> {
        pool_head_bce_backward(self, g, h, weight, logits, targets)
    }

    /// [`PooledLossOps::pool_head_bce_backward`] with the head weight's and bias's gradients
    /// added into `param_grads` (`[dw [1, D], db [1]]`, the parameters' gradient buffers:
    /// `+=`); returns `h`'s gradient. The provided body adds after the backward; a device
    /// backend may have its kernel add into the buffers (no separate add).
    fn pool_head_bce_backward_into(
        &self,
        g: &BTensor<Self, T>,
        h: &BTensor<Self, T>,
        weight: &BTensor<Self, T>,
        logits: &BTensor<Self, T>,
        targets: &BTensor<Self, T>,
        param_grads: [&BTensor<Self, T>; 2],
    ) -> Result<BTensor<Self, T>> {
        pool_head_bce_backward_into(self, g, h, weight, logits, targets, param_grads)
    }
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

/// The provided body of [`PooledLossOps::pool_head_bce_backward_into`]: the backward, then the head
/// weight's and bias's gradients added into `dw` and `db`; returns `h`'s gradient.
pub(crate) fn pool_head_bce_backward_into<B: PooledLossOps<T> + ?Sized, T: Element>(
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
