//! Evaluation in no-grad mode: loss and accuracy over a data set, in chunks, each in its own
//! step scope (nothing is recorded, nothing saved).

use super::{Trainer, in_step};
use crate::error::Result;
use crate::model::Model;
use crate::tape::Tape;
use crate::var::Var;
use zcompute::{Capture, Element};

/// Loss and accuracy over a data set.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EvalReport {
    /// Mean BCE-with-logits of the model's logits over every sample.
    pub loss: f64,
    /// Fraction of samples whose logit has the label's sign (logit > 0 predicts 1).
    pub accuracy: f64,
    pub samples: usize,
}

impl<B: Capture<T> + 'static, T: Element, M: Model<B, T>> Trainer<B, T, M> {
    /// The model's logits for `n` samples `x` (`[n, ..sample shape]` row-major), in no-grad
    /// mode (`Model::logits`).
    pub fn predict(&self, x: &[T], n: usize) -> Result<Vec<T>> {
        let y = vec![T::ZERO; n];
        let sample = self.shape_of(x, &y, n)?;
        let b = &*self.backend;
        let chunk = self.config.eval_batch.max(1);
        let per: usize = sample.iter().product();
        let mut out = Vec::with_capacity(n);
        for start in (0..n).step_by(chunk) {
            let len = chunk.min(n - start);
            let logits = in_step(b, || {
                let shape: Vec<usize> =
                    std::iter::once(len).chain(sample.iter().copied()).collect();
                let xs = Var::constant(b.upload(&x[start * per..(start + len) * per], &shape)?);
                let tape = Tape::no_grad(b);
                self.parts.model.logits(&tape, &xs)?.to_vec(b)
            })?;
            out.extend(logits);
        }
        Ok(out)
    }

    /// Mean loss and accuracy over `y.len()` samples.
    pub fn evaluate(&self, x: &[T], y: &[T]) -> Result<EvalReport> {
        if !self.parts.dist.single() {
            return self.evaluate_sharded(x, y);
        }
        let logits = self.predict(x, y.len())?;
        Ok(report_of(&logits, y))
    }
}

/// Mean BCE-with-logits and accuracy of `logits` against labels `y`, summed in sample order
/// in `f64` (one formula for `evaluate` and `evaluate_loaded`, so their reports agree bitwise).
pub(super) fn report_of<T: Element>(logits: &[T], y: &[T]) -> EvalReport {
    let n = y.len();
    let (mut loss, mut correct) = (0.0, 0usize);
    for (&l, &t) in logits.iter().zip(y) {
        let (l, t) = (l.to_f64(), t.to_f64());
        loss += l.max(0.0) - l * t + (-l.abs()).exp().ln_1p();
        if (l > 0.0) == (t > 0.5) {
            correct += 1;
        }
    }
    let denom = n.max(1) as f64;
    EvalReport {
        loss: loss / denom,
        accuracy: correct as f64 / denom,
        samples: n,
    }
}
