//! LayerNorm's backward with its weight's and bias's gradients added into their buffers
//! (`Backend::layer_norm_backward_into`): the composite every backend gets, which is the
//! sequence the autograd ran before the op existed (LayerNorm's backward, with the residual
//! stream's gradient when there is one, then one column sum per parameter into its buffer).

use crate::backend::Backend;
use crate::element::Element;
use crate::error::Result;
use crate::tensor::Tensor;
use crate::validate;

/// The input gradient (when `want_input`) of `layer_norm_backward_add`, then
/// `dw += Σ_rows g * xhat` and `db += Σ_rows g` for the buffers given. Validated whole
/// first, so a bad `db` leaves `dw` untouched.
#[allow(clippy::too_many_arguments)]
pub(crate) fn layer_norm_backward_into<B: Backend<T> + ?Sized, T: Element>(
    b: &B,
    g: &Tensor<B::Storage>,
    residual: Option<&Tensor<B::Storage>>,
    x: &Tensor<B::Storage>,
    mean: &Tensor<B::Storage>,
    rstd: &Tensor<B::Storage>,
    weight: Option<&Tensor<B::Storage>>,
    want_input: bool,
    dw: Option<&Tensor<B::Storage>>,
    db: Option<&Tensor<B::Storage>>,
) -> Result<Option<Tensor<B::Storage>>> {
    validate::layer_norm_backward_into(g, residual, x, mean, rstd, weight, dw, db)?;
    let want = [want_input, dw.is_some()];
    let grads = match residual {
        Some(_) => b.layer_norm_backward_add(g, residual, x, mean, rstd, weight, want)?,
        None => b.layer_norm_backward(g, x, mean, rstd, weight, want)?,
    };
    if let (Some(dw), Some(g_xhat)) = (dw, grads.g_xhat.as_ref()) {
        b.sum_rows_into(g_xhat, dw)?;
    }
    if let Some(db) = db {
        b.sum_rows_into(g, db)?;
    }
    Ok(grads.input)
}
