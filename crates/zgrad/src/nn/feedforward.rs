//! The feed-forward block: `f2(tanh(f1(x)))` (the residual add is the model's); the bias and
//! tanh of `f1` run as the product's epilogue.

use super::Linear;
use crate::error::Result;
use crate::rng::SplitMix64;
use crate::tape::Tape;
use crate::var::Var;
use zcompute::{Activation, Backend, Element};

pub struct FeedForward<B: Backend<T>, T: Element> {
    pub f1: Linear<B, T>,
    pub f2: Linear<B, T>,
}

impl<B: Backend<T>, T: Element> Clone for FeedForward<B, T> {
    fn clone(&self) -> Self {
        FeedForward {
            f1: self.f1.clone(),
            f2: self.f2.clone(),
        }
    }
}

impl<B: Backend<T>, T: Element> std::fmt::Debug for FeedForward<B, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeedForward")
            .field("f1", &self.f1)
            .field("f2", &self.f2)
            .finish()
    }
}

impl<B: Backend<T>, T: Element> FeedForward<B, T> {
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
}
