//! The op set's plain argument types: the op kinds of [`crate::Backend`]'s families
//! ([`UnaryOp`], [`BinaryOp`], [`ScalarSide`], [`ReduceOp`]), a product's transpose flags
//! ([`MatmulOpts`]), the borrowed operands of LayerNorm's backward and QK-norm attention
//! ([`LayerNormBackward`], [`QkNorm`]), the optimisers' constant hyper-parameters
//! ([`AdamWConfig`] and its slot indices, [`SgdConfig`]) and a bias epilogue's
//! [`Activation`]. Data only, with no behaviour: the families (`backend`, `linear`,
//! `attention`, `optim`) take them in their signatures and `validate` checks them, so they sit
//! below both and each is re-exported at its family's path (`crate::backend::MatmulOpts`,
//! `crate::linear::Activation`, ...), the path callers use.

use crate::storage::Storage;
use crate::tensor::Tensor;

/// Elementwise functions of one tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Neg,
    Exp,
    Log,
    Sqrt,
    /// `1 / sqrt(x)`.
    Rsqrt,
    Tanh,
    /// `1 / (1 + exp(-x))`, evaluated without overflow for large `|x|`.
    Sigmoid,
    Relu,
    /// Exact GELU: `x/2 * (1 + erf(x / sqrt 2))` (PyTorch's default, not the tanh approximation).
    Gelu,
}

impl UnaryOp {
    pub const ALL: [UnaryOp; 9] = [
        UnaryOp::Neg,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
        UnaryOp::Gelu,
    ];
}

/// Elementwise functions of two tensors, broadcast as NumPy does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    /// Elementwise maximum; a NaN in either operand gives NaN (as `torch.maximum`).
    Maximum,
}

impl BinaryOp {
    pub const ALL: [BinaryOp; 5] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Maximum,
    ];
}

/// Which side of a binary op the scalar stands on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScalarSide {
    /// `x op s`
    Rhs,
    /// `s op x`
    Lhs,
}

/// Reductions over one axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Mean,
    /// Maximum; NaN propagates. Refused over an empty axis (no identity).
    Max,
}

/// Transpose flags of a matrix product: `trans_a` reads `a` as `[..., k, m]`, `trans_b` reads
/// `b` as `[..., n, k]` (so `x · Wᵀ` for a PyTorch `[out, in]` weight is `trans_b`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MatmulOpts {
    pub trans_a: bool,
    pub trans_b: bool,
}

/// What LayerNorm's backward reads, by name ([`crate::NormOps::layer_norm_backward_add`],
/// [`crate::NormOps::layer_norm_backward_into`]): the output gradient `g`, the residual
/// stream's gradient added to the input's (where given), the forward's input `x`, its `mean`
/// and `rstd` (the input's shape with the last axis 1) and the weight (where there is one).
#[derive(Debug)]
pub struct LayerNormBackward<'a, S: Storage> {
    pub g: &'a Tensor<S>,
    pub residual: Option<&'a Tensor<S>>,
    pub x: &'a Tensor<S>,
    pub mean: &'a Tensor<S>,
    pub rstd: &'a Tensor<S>,
    pub weight: Option<&'a Tensor<S>>,
}

// Borrows only: copied whatever the storage (a derive would ask `S: Copy`).
impl<S: Storage> Clone for LayerNormBackward<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<S: Storage> Copy for LayerNormBackward<'_, S> {}

/// The constant hyper-parameters of AdamW. The learning rate and step count are not here: they
/// change every step, so they travel in a slot tensor (`[lr, t]` or `[lr, t, gate]`) that the
/// op reads from memory, which keeps a captured optimiser step correct on replay.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWConfig<T> {
    pub beta1: T,
    pub beta2: T,
    pub eps: T,
    pub weight_decay: T,
}

/// Index of the learning rate in the AdamW slot tensor.
pub const ADAMW_SLOT_LR: usize = 0;
/// Index of the step count `t` (counted from 1) in the AdamW slot tensor.
pub const ADAMW_SLOT_STEP: usize = 1;
/// Index of the optional gate in a 3-element AdamW slot: the update runs only when the gate is
/// exactly zero (NaN or any other value skips it, leaving `p`, `m` and `v` untouched). A
/// captured step writes `0 * loss + 0 * grad_norm` there, so a non-finite loss or gradient
/// skips the update on the device, with no host round trip.
pub const ADAMW_SLOT_GATE: usize = 2;

/// The activation of a bias epilogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Activation {
    /// `x + bias`.
    Identity,
    /// `tanh(x + bias)`.
    Tanh,
}

/// SGD's constant hyper-parameters (PyTorch's names and meaning). The learning rate and the
/// step count travel in the slot.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdConfig<T> {
    /// Momentum factor (0: plain SGD, no buffer).
    pub momentum: T,
    /// Dampening of the gradient's share in the buffer, from the second step on.
    pub dampening: T,
    /// Coupled weight decay (L2): `d = g + weight_decay * p`.
    pub weight_decay: T,
    /// Nesterov momentum: the step is `d + momentum * buf` (needs momentum > 0 and dampening 0).
    pub nesterov: bool,
}

/// The QK-norm parameters and the head split of attention's core: LayerNorm weight and bias of
/// q and of k (each `[dh]`), the head count `H` (dividing the width `D`) and LayerNorm's eps.
#[derive(Debug)]
pub struct QkNorm<'a, S: Storage> {
    pub q_weight: &'a Tensor<S>,
    pub q_bias: &'a Tensor<S>,
    pub k_weight: &'a Tensor<S>,
    pub k_bias: &'a Tensor<S>,
    pub heads: usize,
    pub eps: S::Elem,
}

/// `a · bᵀ`, for the attention composites.
pub(crate) const NT: MatmulOpts = MatmulOpts {
    trans_a: false,
    trans_b: true,
};
/// `aᵀ · b`, for the attention composites.
pub(crate) const TN: MatmulOpts = MatmulOpts {
    trans_a: true,
    trans_b: false,
};
