//! Non-finite losses and gradients: detected from the values the step reads back anyway, then
//! traced to the first offending sample by re-running the samples one at a time (only on this
//! error path, so it costs nothing in a healthy run).

use super::{Trainer, in_step};
use crate::error::{GradError, NonFiniteKind, Result};
use crate::optim::{grad_norm, zero_grad};
use crate::tape::Tape;
use zcompute::{Capture, Element};

/// Refuses a non-finite loss (first) or gradient norm.
pub(crate) fn finite(step: u64, loss: f64, norm: f64) -> Result<()> {
    let kind = if !loss.is_finite() {
        NonFiniteKind::Loss
    } else if !norm.is_finite() {
        NonFiniteKind::Gradient
    } else {
        return Ok(());
    };
    Err(GradError::NonFinite {
        step,
        sample: None,
        kind,
    })
}

/// Fills in the sample of a `NonFinite` error that lacks one, using `find`.
pub(crate) fn locate<R>(
    result: Result<R>,
    find: impl FnOnce(NonFiniteKind) -> Result<Option<usize>>,
) -> Result<R> {
    match result {
        Err(GradError::NonFinite {
            step,
            sample: None,
            kind,
        }) => {
            let sample = find(kind).unwrap_or_else(|e| {
                tracing::warn!(target: "zgrad.trainer.nonfinite", error = %e, "could not locate the sample");
                None
            });
            Err(GradError::NonFinite { step, sample, kind })
        }
        other => other,
    }
}

/// The first sample with a non-finite input value (feature or label), if any.
pub(crate) fn bad_input<T: Element>(x: &[T], y: &[T], batch: usize) -> Option<usize> {
    let per = x.len() / batch.max(1);
    (0..batch).find(|&i| {
        x[i * per..(i + 1) * per]
            .iter()
            .chain(&y[i..=i])
            .any(|v| !v.to_f64().is_finite())
    })
}

impl<B: Capture<T> + 'static, T: Element> Trainer<B, T> {
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
        if let Some(i) = bad_input(x, y, shape[0]) {
            return Ok(Some(i));
        }
        let b = &*self.backend;
        let per: usize = shape[1..].iter().product();
        let sample_shape = [1, shape[1], shape[2]];
        let mut found = None;
        for i in 0..shape[0] {
            let bad = in_step(b, || {
                let (xs, ys) =
                    self.upload_batch(&x[i * per..(i + 1) * per], &y[i..=i], &sample_shape)?;
                let value = match kind {
                    NonFiniteKind::Loss => {
                        let tape = Tape::no_grad(b);
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
