//! A Linear layer's fused ops as composites of the op set: the provided bodies of
//! [`Backend::linear`], [`Backend::linear_param_grads_into`] and
//! [`Backend::linear_backward_into`], which a device backend replaces by fewer kernels where
//! the shapes allow (the CUDA backend, for few rows).

use crate::backend::{Backend, MatmulOpts};
use crate::element::Element;
use crate::error::Result;
use crate::fused::Activation;
use crate::tensor::Tensor;
use crate::validate;

/// `act(x · wᵀ + bias)`: the product, then the bias epilogue.
pub(crate) fn linear<B: Backend<T> + ?Sized, T: Element>(
    b: &B,
    x: &Tensor<B::Storage>,
    w: &Tensor<B::Storage>,
    bias: &Tensor<B::Storage>,
    act: Activation,
) -> Result<Tensor<B::Storage>> {
    validate::linear(x, w, bias)?;
    let opts = MatmulOpts {
        trans_a: false,
        trans_b: true,
    };
    b.bias_act(&b.matmul(x, w, opts)?, bias, act)
}

/// `act(x · wᵀ + bias) + residual`: [`linear`], then the add.
pub(crate) fn linear_add<B: Backend<T> + ?Sized, T: Element>(
    b: &B,
    x: &Tensor<B::Storage>,
    w: &Tensor<B::Storage>,
    bias: &Tensor<B::Storage>,
    act: Activation,
    residual: &Tensor<B::Storage>,
) -> Result<Tensor<B::Storage>> {
    validate::linear_add(x, w, bias, residual)?;
    b.add(&b.linear(x, w, bias, act)?, residual)
}

/// `dw += gᵀ · x`, then `db += Σ_rows g` when a bias buffer is given. Validated whole first,
/// so a bad `db` leaves `dw` untouched.
pub(crate) fn linear_param_grads_into<B: Backend<T> + ?Sized, T: Element>(
    b: &B,
    g: &Tensor<B::Storage>,
    x: &Tensor<B::Storage>,
    dw: &Tensor<B::Storage>,
    db: Option<&Tensor<B::Storage>>,
) -> Result<()> {
    validate::linear_param_grads_into(g, x, dw, db)?;
    let opts = MatmulOpts {
        trans_a: true,
        trans_b: false,
    };
    b.matmul_into(g, x, opts, dw)?;
    if let Some(db) = db {
        b.sum_rows_into(g, db)?;
    }
    Ok(())
}

/// A Linear layer's backward: `gz = gy` (identity) or `tanh_backward(gy, y)`, then
/// `gx = gz · w` when `w` is given, then `dw += gzᵀ · x` and `db += Σ_rows gz`. Validated
/// whole first, so bad input leaves `dw` and `db` untouched.
pub(crate) fn linear_backward_into<B: Backend<T> + ?Sized, T: Element>(
    b: &B,
    gy: &Tensor<B::Storage>,
    x: &Tensor<B::Storage>,
    w: Option<&Tensor<B::Storage>>,
    (act, y): (Activation, Option<&Tensor<B::Storage>>),
    (dw, db): (&Tensor<B::Storage>, Option<&Tensor<B::Storage>>),
) -> Result<Option<Tensor<B::Storage>>> {
    validate::linear_backward_into(gy, x, w, (act, y), dw, db)?;
    let gz = match y {
        Some(y) => b.tanh_backward(gy, y)?,
        None => gy.clone(),
    };
    let gx = w
        .map(|w| b.matmul(&gz, w, MatmulOpts::default()))
        .transpose()?;
    b.linear_param_grads_into(&gz, x, dw, db)?;
    Ok(gx)
}
