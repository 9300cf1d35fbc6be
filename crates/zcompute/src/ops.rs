//! The whole op set in one bound. [`Backend`] holds the primitives; each fusion family
//! ([`LinearOps`], [`NormOps`], [`AttentionOps`], [`PooledLossOps`]) holds a layer's fused ops
//! and the model-level families ([`SelectOps`], [`RandomOps`]) the ops models reach for
//! (and [`OptimOps`] the optimisers' fused updates beside `Backend::adamw_step`, [`StepOps`] a
//! training step's own ops, [`ReadbackOps`] downloads queued for later, [`PrecisionOps`] the
//! products under a math mode the trainer's precision policy runs),
//! every one provided as the composite of the primitives, which a backend overrides with its
//! fused kernel. Code that runs models bounds its backend by [`Ops`] and calls anything;
//! `use zcompute::prelude::*` brings every trait into scope for calls on a concrete backend.
//!
//! A backend of your own implements [`Backend`] and then each family, with an empty `impl`
//! block where it has no fused kernel (it gets the composites), and is [`Ops`] at once.

use crate::attention::AttentionOps;
use crate::backend::Backend;
use crate::element::Element;
use crate::linear::LinearOps;
use crate::norm::NormOps;
use crate::optim::OptimOps;
use crate::pooled_loss::PooledLossOps;
use crate::precision::PrecisionOps;
use crate::random::RandomOps;
use crate::readback::ReadbackOps;
use crate::select::SelectOps;
use crate::step::StepOps;

/// The primitives and every fusion family: the one bound for code that runs models.
/// Implemented for every backend that implements them all (blanket impl).
pub trait Ops<T: Element>:
    Backend<T>
    + LinearOps<T>
    + NormOps<T>
    + AttentionOps<T>
    + PooledLossOps<T>
    + SelectOps<T>
    + RandomOps<T>
    + OptimOps<T>
    + StepOps<T>
    + ReadbackOps<T>
    + PrecisionOps<T>
{
}

impl<T: Element, B> Ops<T> for B where
    B: Backend<T>
        + LinearOps<T>
        + NormOps<T>
        + AttentionOps<T>
        + PooledLossOps<T>
        + SelectOps<T>
        + RandomOps<T>
        + OptimOps<T>
        + StepOps<T>
        + ReadbackOps<T>
        + PrecisionOps<T>
        + ?Sized
{
}
