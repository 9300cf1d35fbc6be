//! The Linear family: [`LinearOps`], a Linear layer's fusions (the bias and activation
//! epilogue, the forward with an optional residual, the parameter gradients added into their
//! buffers, the whole backward, tanh's backward), each provided as the composite of
//! [`Backend`]'s primitives written below, which a device backend replaces by fewer kernels
//! where the shapes allow (the CUDA backend: one kernel each for few rows).

use crate::backend::{BTensor, Backend, BinaryOp, MatmulOpts, ScalarSide, UnaryOp};
pub use crate::descriptors::Activation;
use crate::element::Element;
use crate::error::Result;
use crate::tensor::Tensor;
use crate::validate;

/// A Linear layer's fused ops (PyTorch's `[out, in]` weight layout). Every method is provided
/// as the composite of [`Backend`]'s primitives; a backend overrides a method with its fused
/// kernel (the CPU backend: `bias_act` and `tanh_backward` as plain loops; the CUDA backend:
/// every method, one kernel each for few rows, cuBLAS and the epilogue kernel otherwise).
pub trait LinearOps<T: Element>: Backend<T> {
    /// `act(x + bias)` for `x` `[..., n]` and `bias` `[n]` (the epilogue of a product).
    fn bias_act(
        &self,
        x: &BTensor<Self, T>,
        bias: &BTensor<Self, T>,
        act: Activation,
    ) -> Result<BTensor<Self, T>> {
        bias_act(self, x, bias, act)
    }

    /// A Linear layer's forward, `act(x · wᵀ + bias)` for `x [rows, in]`, `w [out, in]` and
    /// `bias [out]`. The provided body is [`Backend::matmul`] then [`LinearOps::bias_act`];
    /// the CUDA backend runs few rows (up to 32: one short sequence) as one kernel with the
    /// epilogue inside.
    fn linear(
        &self,
        x: &BTensor<Self, T>,
        w: &BTensor<Self, T>,
        bias: &BTensor<Self, T>,
        act: Activation,
    ) -> Result<BTensor<Self, T>> {
        linear(self, x, w, bias, act)
    }

    /// A Linear layer with a residual added after the activation (a skip connection),
    /// `act(x · wᵀ + bias) + residual` for `residual [rows, out]`. The provided body is
    /// [`LinearOps::linear`] then [`Backend::add`]; the CUDA backend adds a dense residual in
    /// the small-row kernel's epilogue.
    fn linear_add(
        &self,
        x: &BTensor<Self, T>,
        w: &BTensor<Self, T>,
        bias: &BTensor<Self, T>,
        act: Activation,
        residual: &BTensor<Self, T>,
    ) -> Result<BTensor<Self, T>> {
        linear_add(self, x, w, bias, act, residual)
    }

    /// A Linear layer's parameter gradients added into their buffers, from the gradient of its
    /// output before the activation `g [rows, out]` and its input `x [rows, in]`:
    /// `dw += gᵀ · x` (`dw [out, in]`) and, when given, `db += Σ_rows g` (`db [out]`). The
    /// buffers must be writable and share no memory with `g` or `x`; they may be disjoint views
    /// of one buffer (a model's flat gradient buffer), not overlapping ones. The provided
    /// body is [`Backend::matmul_into`] then [`Backend::sum_rows_into`]; the CUDA backend does
    /// both in one kernel when the rows are few.
    fn linear_param_grads_into(
        &self,
        g: &BTensor<Self, T>,
        x: &BTensor<Self, T>,
        dw: &BTensor<Self, T>,
        db: Option<&BTensor<Self, T>>,
    ) -> Result<()> {
        linear_param_grads_into(self, g, x, dw, db)
    }

    /// A Linear layer's backward, `y = act(x · wᵀ + bias)`: from the output's gradient
    /// `gy [rows, out]`, `gz = gy` (identity) or `gy * (1 - y²)` (tanh, from its saved output
    /// `y`, given exactly then); `dw += gzᵀ · x` and, when given, `db += Σ_rows gz` into their
    /// buffers (as [`LinearOps::linear_param_grads_into`], whose checks apply, and sharing no
    /// memory with any input); returns the input's gradient `gz · w` when the weight
    /// `w [out, in]` is given (`None` otherwise). The provided body is
    /// [`LinearOps::tanh_backward`], [`Backend::matmul`] and
    /// [`LinearOps::linear_param_grads_into`]; the CUDA backend runs few rows as one kernel.
    fn linear_backward_into(
        &self,
        gy: &BTensor<Self, T>,
        x: &BTensor<Self, T>,
        w: Option<&BTensor<Self, T>>,
        (act, y): (Activation, Option<&BTensor<Self, T>>),
        (dw, db): (&BTensor<Self, T>, Option<&BTensor<Self, T>>),
    ) -> Result<Option<BTensor<Self, T>>> {
        linear_backward_into(self, gy, x, w, (act, y), (dw, db))
    }

    /// Tanh's backward from its output: `g * (1 - y²)`.
    fn tanh_backward(
        &self,
        g: &BTensor<Self, T>,
        y: &BTensor<Self, T>,
    ) -> Result<BTensor<Self, T>> {
        tanh_backward(self, g, y)
    }
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

/// `act(x · wᵀ + bias)`: the product, then the bias epilogue.
pub(crate) fn linear<B: LinearOps<T> + ?Sized, T: Element>(
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
pub(crate) fn linear_add<B: LinearOps<T> + ?Sized, T: Element>(
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
pub(crate) fn linear_backward_into<B: LinearOps<T> + ?Sized, T: Element>(
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
    linear_backward_from_gz(b, &gz, x, w, dw, db)
}

/// The rest of a Linear layer's backward once `gz` (the gradient before the activation) is
/// known: `gz · w` when `w` is given, and the weight (and bias) gradients added into `dw`
/// (`db`).
pub(crate) fn linear_backward_from_gz<B: LinearOps<T> + ?Sized, T: Element>(
    b: &B,
    gz: &Tensor<B::Storage>,
    x: &Tensor<B::Storage>,
    w: Option<&Tensor<B::Storage>>,
    dw: &Tensor<B::Storage>,
    db: Option<&Tensor<B::Storage>>,
) -> Result<Option<Tensor<B::Storage>>> {
    let gx = w
        .map(|w| b.matmul(gz, w, MatmulOpts::default()))
        .transpose()?;
    b.linear_param_grads_into(gz, x, dw, db)?;
    Ok(gx)
}
