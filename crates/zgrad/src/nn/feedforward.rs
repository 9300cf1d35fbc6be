//! The feed-forward block: `f2(tanh(f1(x)))`, or `residual + f2(tanh(f1(x)))` with the skip
//! connection (`forward_add`); the bias and tanh of `f1`, and the bias and residual of `f2`,
//! run as the products' epilogues.

use super::Linear;
use crate::error::Result;
use crate::rng::SplitMix64;
use crate::tape::Tape;
use crate::var::Var;
use zcompute::{Activation, Element, prelude::*};

pub struct FeedForward<B: Ops<T>, T: Element> {
    pub f1: Linear<B, T>,
    pub f2: Linear<B, T>,
}

impl<B: Ops<T>, T: Element> Clone for FeedForward<B, T> {
    fn clone(&self) -> Self {
        FeedForward {
            f1: self.f1.clone(),
            f2: self.f2.clone(),
        }
    }
}

impl<B: Ops<T>, T: Element> std::fmt::Debug for FeedForward<B, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeedForward")
            .field("f1", &self.f1)
            .field("f2", &self.f2)
            .finish()
    }
}

impl<B: Ops<T>, T: Element> FeedForward<B, T> {
    pub fn init(b: &B, width: usize, hidden: usize, rng: &mut SplitMix64) -> Result<Self> {
        Ok(FeedForward {
            f1: Linear::init(b, width, hidden, rng)?,
            f2: Linear::init(b, hidden, width, rng)?,
        })
    }

    pub fn forward(&self, tape: &Tape<'_, B, T>, x: &Var<B, T>) -> Result<Var<B, T>> {
        // tanh(x · W1ᵀ + b1) in the product's epilogue (one kernel, and one for its backward).
        let hidden = self.f1.forward_act(tape, x, Activation::Tanh)?;
        self.f2.forward(tape, &hidden)
    }

    /// `residual + f2(tanh(f1(x)))`: the add is `f2`'s epilogue (`Tape::linear_add`), so one
    /// node fewer than `forward` and an add.
    pub fn forward_add(
        &self,
        tape: &Tape<'_, B, T>,
        x: &Var<B, T>,
        residual: &Var<B, T>,
    ) -> Result<Var<B, T>> {
        let hidden = self.f1.forward_act(tape, x, Activation::Tanh)?;
        self.f2.forward_add(tape, &hidden, residual)
    }
}
