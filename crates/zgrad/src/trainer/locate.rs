//! Tracing a non-finite loss or gradient to the first offending sample
//! ([`Trainer::find_sample`]): the samples re-run one at a time, only on that error path, so
//! it costs nothing in a healthy run. The checks that detect it are `checks.rs`'s.

use super::checks::{bad_input, one_sample};
use super::{Trainer, in_step};
use crate::error::{NonFiniteKind, Result};
use crate::model::Model;
use crate::optim::{grad_norm, zero_grad};
use zcompute::{Capture, Element};

impl<B: Capture<T> + 'static, T: Element, M: Model<B, T>> Trainer<B, T, M> {
    /// The first sample with a non-finite input, else the first whose own loss (or gradient)
    /// is not finite, each in its own step. Leaves the gradients zeroed; the parameters are
    /// not touched.
    pub(crate) fn find_sample(
        &self,
        x: &[T],
        y: &[T],
        shape: &[usize],
        kind: NonFiniteKind,
    ) -> Result<Option<usize>> {
        if !self.parts.dist.single() {
            // Ranks would name different samples (or none): every rank reports the same error.
            return Ok(None);
        }
        if let Some(i) = bad_input(x, y, shape[0]) {
            return Ok(Some(i));
        }
        let b = &*self.backend;
        let per: usize = shape[1..].iter().product();
        let ty = self.target_len();
        let sample_shape = one_sample(shape);
        let mut found = None;
        for i in 0..shape[0] {
            let bad = in_step(b, || {
                let (xs, ys) = self.upload_batch(
                    &x[i * per..(i + 1) * per],
                    &y[i * ty..(i + 1) * ty],
                    &sample_shape,
                )?;
                let value = match kind {
                    NonFiniteKind::Loss => {
                        let tape = self.parts.eval_tape(b);
                        let (loss, _) = self.parts.model.loss(&tape, &xs, &ys)?;
                        loss.to_vec(b)?
                    }
                    NonFiniteKind::Gradient => {
                        zero_grad(b, &self.parts.params)?;
                        self.parts.forward_backward(b, &xs, &ys, None)?;
                        b.download(&grad_norm(b, &self.parts.params)?)?
                    }
                };
                Ok(value.iter().any(|v| !v.to_f64().is_finite()))
            })?;
            if bad {
                found = Some(i);
                break;
            }
        }
        zero_grad(b, &self.parts.params)?;
        Ok(found)
    }
}
