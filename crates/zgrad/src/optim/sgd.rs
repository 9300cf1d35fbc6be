//! Plain SGD with optional (coupled) weight decay: `p <- p - lr (g + wd p)`.

use crate::error::Result;
use crate::var::Var;
use zcompute::{BinaryOp, Element, ScalarSide, prelude::*};

/// Stochastic gradient descent.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sgd {
    pub weight_decay: f64,
}

impl Sgd {
    /// One update of every parameter with rate `lr`, in place (bumps their versions).
    pub fn step<B: Ops<T>, T: Element>(&self, b: &B, params: &[Var<B, T>], lr: f64) -> Result<()> {
        for p in params {
            let Some(g) = p.grad() else { continue };
            let g = if self.weight_decay == 0.0 {
                g.clone()
            } else {
                let decay = b.binary_scalar(
                    BinaryOp::Mul,
                    p.value(),
                    T::from_f64(self.weight_decay),
                    ScalarSide::Rhs,
                )?;
                b.add(g, &decay)?
            };
            let delta = b.binary_scalar(BinaryOp::Mul, &g, T::from_f64(lr), ScalarSide::Rhs)?;
            let next = b.sub(p.value(), &delta)?;
            p.copy_from(b, &next)?;
        }
        Ok(())
    }
}
