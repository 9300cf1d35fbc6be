//! The classification head: the mean over the sequence axis, a linear map to one logit, and
//! the mean BCE-with-logits over the batch (docs/xasset.md steps 8-9). With labels that need no
//! gradient the three run as one fused op (`Tape::pool_head_bce`).

use super::Linear;
use crate::error::{GradError, Result};
use crate::rng::SplitMix64;
use crate::tape::Tape;
use crate::var::Var;
use zcompute::{Element, prelude::*};

pub struct PoolHead<B: Ops<T>, T: Element> {
    /// `[1, D]` weight and `[1]` bias.
    pub linear: Linear<B, T>,
}

impl<B: Ops<T>, T: Element> Clone for PoolHead<B, T> {
    fn clone(&self) -> Self {
        PoolHead {
            linear: self.linear.clone(),
        }
    }
}

impl<B: Ops<T>, T: Element> std::fmt::Debug for PoolHead<B, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolHead")
            .field("linear", &self.linear)
            .finish()
    }
}

impl<B: Ops<T>, T: Element> PoolHead<B, T> {
    /// PyTorch's default Linear init (one draw of the weight, then the bias, from `rng`).
    pub fn init(b: &B, width: usize, rng: &mut SplitMix64) -> Result<Self> {
        Ok(PoolHead {
            linear: Linear::init(b, width, 1, rng)?,
        })
    }

    fn check(&self, h: &Var<B, T>) -> Result<usize> {
        match *h.shape() {
            [batch, _, width] if width == self.linear.in_features() => Ok(batch),
            _ => Err(GradError::BadInput(format!(
                "the head takes [B, S, {}], got {:?}",
                self.linear.in_features(),
                h.shape()
            ))),
        }
    }

    /// `h [B, S, D] -> logits [B]`.
    pub fn forward(&self, tape: &Tape<'_, B, T>, h: &Var<B, T>) -> Result<Var<B, T>> {
        let batch = self.check(h)?;
        let pooled = tape.mean(h, 1, false)?;
        let logit = self.linear.forward(tape, &pooled)?;
        tape.reshape(&logit, &[batch])
    }

    /// The mean BCE-with-logits over the batch for labels `y [B]`, and the logits (detached
    /// on the fused path, for reporting). Labels that need a gradient take the unfused path.
    pub fn loss(
        &self,
        tape: &Tape<'_, B, T>,
        h: &Var<B, T>,
        y: &Var<B, T>,
    ) -> Result<(Var<B, T>, Var<B, T>)> {
        if y.requires_grad() {
            let logits = self.forward(tape, h)?;
            return Ok((tape.bce_with_logits(&logits, y)?, logits));
        }
        self.check(h)?;
        tape.pool_head_bce(h, &self.linear.weight, &self.linear.bias, y)
    }
}
