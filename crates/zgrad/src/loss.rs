//! Losses, each a rank-0 variable: BCE-with-logits (the fused op), mean squared error and
//! cross-entropy over class logits. All are means over the batch.

use crate::error::Result;
use crate::tape::Tape;
use crate::var::Var;
use zcompute::{Element, prelude::*};

impl<B: Ops<T>, T: Element> Tape<'_, B, T> {
    /// Mean of `(pred - target)²` over every element.
    pub fn mse(&self, pred: &Var<B, T>, target: &Var<B, T>) -> Result<Var<B, T>> {
        let d = self.sub(pred, target)?;
        let sq = self.mul(&d, &d)?;
        self.mean_all(&sq)
    }

    /// Cross-entropy of `logits` `[N, C]` against target distributions `targets` `[N, C]`
    /// (one-hot rows for class labels, see `one_hot`): `-mean_n sum_c t log softmax(x)`. The
    /// log-softmax is shifted by the (detached) row maximum, so it never overflows.
    pub fn cross_entropy(&self, logits: &Var<B, T>, targets: &Var<B, T>) -> Result<Var<B, T>> {
        let last = logits.shape().len().saturating_sub(1);
        let shift = Var::constant(self.backend().max(&logits.value, last, true)?);
        let z = self.sub(logits, &shift)?;
        let lse = self.log(&self.sum(&self.exp(&z)?, last, true)?)?;
        let logp = self.sub(&z, &lse)?;
        let per_row = self.sum(&self.mul(targets, &logp)?, last, false)?;
        let mean = self.mean_all(&per_row)?;
        self.neg(&mean)
    }

    /// Mean BCE-with-logits over every element (alias of `bce_with_logits`).
    pub fn bce(&self, logits: &Var<B, T>, targets: &Var<B, T>) -> Result<Var<B, T>> {
        self.bce_with_logits(logits, targets)
    }
}

/// One-hot rows `[labels.len(), classes]` for `cross_entropy`; a label out of range is refused.
pub fn one_hot<T: Element>(labels: &[usize], classes: usize) -> Result<Vec<T>> {
    let mut out = vec![T::ZERO; labels.len() * classes];
    for (row, &l) in labels.iter().enumerate() {
        if l >= classes {
            return Err(crate::GradError::BadInput(format!(
                "label {l} of row {row} is not below {classes} classes"
            )));
        }
        out[row * classes + l] = T::ONE;
    }
    Ok(out)
}
