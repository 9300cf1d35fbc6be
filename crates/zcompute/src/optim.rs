//! The optimiser family: [`OptimOps`], fused updates over a parameter buffer beside AdamW's
//! (`Backend::adamw_step`, a primitive since the first trainer). Today: SGD with momentum,
//! dampening, Nesterov and coupled weight decay, exactly `torch.optim.SGD`'s update.
//!
//! As AdamW's, the update reads its learning rate, step count and gate from a slot tensor in
//! device memory (`[lr, t]` or `[lr, t, gate]`, indexed by [`ADAMW_SLOT_LR`],
//! [`ADAMW_SLOT_STEP`] and [`ADAMW_SLOT_GATE`]): a captured step replays with the rate a
//! schedule wrote, and a closed gate (non-zero: a non-finite loss or norm) skips the update.
//!
//! [`ADAMW_SLOT_LR`]: crate::backend::ADAMW_SLOT_LR
//! [`ADAMW_SLOT_STEP`]: crate::backend::ADAMW_SLOT_STEP
//! [`ADAMW_SLOT_GATE`]: crate::backend::ADAMW_SLOT_GATE

use crate::backend::{BTensor, Backend};
pub use crate::descriptors::SgdConfig;
use crate::element::Element;
use crate::error::Result;

/// Fused optimiser updates. A backend implements `sgd_step` (the CPU backend as a loop, the
/// CUDA backend with one launch, `kernels/train.cu`).
pub trait OptimOps<T: Element>: Backend<T> {
    /// One SGD update in place, PyTorch's `torch.optim.SGD` step for one tensor:
    /// `d = g + weight_decay * p`; with momentum, `buf = d` at step `t = 1` (no dampening on
    /// it) and `buf = momentum * buf + (1 - dampening) * d` after, then `d = d + momentum *
    /// buf` (Nesterov) or `d = buf`; finally `p = p - lr * d`. `lr` and `t` are read from
    /// `slot` when the op runs (a 3-element slot's gate must be exactly 0, else nothing is
    /// written). `buf` (shaped as `p`) is required when momentum is non-zero and not read
    /// otherwise; `g` and `buf` are `p`'s shape, no two operands share storage. Refused: a
    /// negative or non-finite momentum, dampening or weight decay, and Nesterov without
    /// momentum or with dampening (as PyTorch refuses it).
    fn sgd_step(
        &self,
        p: &BTensor<Self, T>,
        buf: Option<&BTensor<Self, T>>,
        g: &BTensor<Self, T>,
        slot: &BTensor<Self, T>,
        cfg: &SgdConfig<T>,
    ) -> Result<()>;
}
