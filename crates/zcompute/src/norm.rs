//! The LayerNorm family: [`NormOps`], LayerNorm's fusions over a residual stream (the
//! residual add with LayerNorm, its backward with the stream's gradient added, and that
//! backward with the parameters' gradients added into their buffers), each provided as the
//! composite of [`Backend`]'s primitives written below. `layer_norm_backward_into`'s
//! composite is the sequence the autograd ran before the op existed (LayerNorm's backward,
//! with the residual stream's gradient when there is one, then one column sum per parameter
//! into its buffer).

use crate::backend::{BTensor, Backend, LayerNormBackward, LayerNormGrads, LayerNormOut};
use crate::element::Element;
use crate::error::Result;
use crate::storage::Storage;
use crate::tensor::Tensor;
use crate::validate;

/// What [`NormOps::add_layer_norm`] returns: the sum `h = a + b` (the residual stream) and
/// LayerNorm of it with its saved statistics.
#[derive(Clone, Debug)]
pub struct AddLayerNormOut<S: Storage> {
    pub sum: Tensor<S>,
    pub norm: LayerNormOut<S>,
}

/// LayerNorm's fused ops over a residual stream `h = a + b`. Every method is provided as the
/// composite of [`Backend`]'s primitives; a backend overrides a method with its fused kernel
/// (the CPU backend: `add_layer_norm` as plain loops; the CUDA backend: one launch each, the
/// parameter-gradient form for up to 32 rows into dense buffers).
pub trait NormOps<T: Element>: Backend<T> {
    /// The residual add and LayerNorm: `h = a + b` and `layer_norm(h, weight, bias, eps)`.
    fn add_layer_norm(
        &self,
        a: &BTensor<Self, T>,
        b: &BTensor<Self, T>,
        weight: Option<&BTensor<Self, T>>,
        bias: Option<&BTensor<Self, T>>,
        eps: T,
    ) -> Result<AddLayerNormOut<Self::Storage>> {
        add_layer_norm(self, a, b, weight, bias, eps)
    }

    /// [`Backend::layer_norm_backward`] with the residual stream's gradient added to the
    /// input's: `input = LN'(g) + residual` (the gradient of `h` in `h = a + b; y = LN(h)`
    /// when `h` is used again).
    fn layer_norm_backward_add(
        &self,
        ln: &LayerNormBackward<'_, Self::Storage>,
        want: [bool; 2],
    ) -> Result<LayerNormGrads<Self::Storage>> {
        layer_norm_backward_add(self, ln, want)
    }

    /// LayerNorm's backward (with the residual stream's gradient added to the input's, as
    /// [`NormOps::layer_norm_backward_add`]) and its parameters' gradients added into their
    /// buffers: `dw += Σ_rows g * xhat`, `db += Σ_rows g` (each `[n]`, where given: a model's
    /// flat gradient buffer, whose disjoint views they may be). Returns the input gradient when
    /// `want_input`. The provided body is `layer_norm_backward(_add)` then one
    /// [`Backend::sum_rows_into`] per buffer; the CUDA backend does it in one launch for few
    /// rows.
    fn layer_norm_backward_into(
        &self,
        ln: &LayerNormBackward<'_, Self::Storage>,
        want_input: bool,
        dw: Option<&BTensor<Self, T>>,
        db: Option<&BTensor<Self, T>>,
    ) -> Result<Option<BTensor<Self, T>>> {
        layer_norm_backward_into(self, ln, want_input, dw, db)
    }
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

/// LayerNorm's backward, then the residual stream's gradient added to the input's.
pub(crate) fn layer_norm_backward_add<B: Backend<T> + ?Sized, T: Element>(
    b: &B,
    ln: &LayerNormBackward<'_, B::Storage>,
    want: [bool; 2],
) -> Result<LayerNormGrads<B::Storage>> {
    let LayerNormBackward {
        g,
        residual,
        x,
        mean,
        rstd,
        weight,
    } = *ln;
    validate::layer_norm_backward_add(g, residual, x, mean, rstd, weight)?;
    let mut grads = b.layer_norm_backward(g, x, mean, rstd, weight, want)?;
    if let (Some(gx), Some(res)) = (grads.input.as_ref(), residual) {
        grads.input = Some(b.add(gx, res)?);
    }
    Ok(grads)
}

/// The input gradient (when `want_input`) of `layer_norm_backward_add`, then
/// `dw += Σ_rows g * xhat` and `db += Σ_rows g` for the buffers given. Validated whole
/// first, so a bad `db` leaves `dw` untouched.
pub(crate) fn layer_norm_backward_into<B: NormOps<T> + ?Sized, T: Element>(
    b: &B,
    ln: &LayerNormBackward<'_, B::Storage>,
    want_input: bool,
    dw: Option<&Tensor<B::Storage>>,
    db: Option<&Tensor<B::Storage>>,
) -> Result<Option<Tensor<B::Storage>>> {
    validate::layer_norm_backward_into(ln, dw, db)?;
    let LayerNormBackward {
        g,
        residual,
        x,
        mean,
        rstd,
        weight,
    } = *ln;
    let want = [want_input, dw.is_some()];
    let grads = match residual {
        Some(_) => b.layer_norm_backward_add(ln, want)?,
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
