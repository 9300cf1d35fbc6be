//! Non-finite losses and gradients: detected from the values the step reads back anyway, then
//! traced to the first offending sample by re-running the samples one at a time (only on this
//! error path, so it costs nothing in a healthy run; `locate.rs`). The checks here are plain
//! functions of values, below the trainer.

use crate::error::{GradError, NonFiniteKind, Result};
use zcompute::Element;

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

/// A per-sample step's loss on one rank: its samples' losses summed on the host in `f64`, in
/// sample order, over the global batch `global`; the first non-finite one is refused, named.
pub(crate) fn sample_losses<T: Element>(step: u64, losses: &[T], global: usize) -> Result<f64> {
    if let Some(bad) = losses.iter().position(|l| !l.to_f64().is_finite()) {
        return Err(GradError::NonFinite {
            step,
            sample: Some(bad),
            kind: NonFiniteKind::Loss,
        });
    }
    Ok(losses.iter().map(|l| l.to_f64()).sum::<f64>() / global as f64)
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

/// `[1, ..sample shape]` of a batch's shape `[batch, ..sample shape]`.
pub(crate) fn one_sample(shape: &[usize]) -> Vec<usize> {
    std::iter::once(1)
        .chain(shape.iter().skip(1).copied())
        .collect()
}

/// The first sample with a non-finite input value (feature or target), if any.
pub(crate) fn bad_input<T: Element>(x: &[T], y: &[T], batch: usize) -> Option<usize> {
    let per = x.len() / batch.max(1);
    let ty = y.len() / batch.max(1);
    (0..batch).find(|&i| {
        x[i * per..(i + 1) * per]
            .iter()
            .chain(&y[i * ty..(i + 1) * ty])
            .any(|v| !v.to_f64().is_finite())
    })
}

#[cfg(test)]
mod tests {
    use super::{bad_input, finite, locate};
    use crate::error::{GradError, NonFiniteKind};

    #[test]
    fn loss_is_reported_before_gradient() {
        assert!(finite(3, 0.5, 1.0).is_ok());
        let kind = |r: crate::Result<()>| match r {
            Err(GradError::NonFinite {
                step: 3,
                sample: None,
                kind,
            }) => Some(kind),
            _ => None,
        };
        assert_eq!(
            kind(finite(3, f64::NAN, f64::INFINITY)),
            Some(NonFiniteKind::Loss)
        );
        assert_eq!(
            kind(finite(3, 0.5, f64::INFINITY)),
            Some(NonFiniteKind::Gradient)
        );
    }

    #[test]
    fn locate_fills_in_the_sample_and_keeps_other_errors() {
        let err = || -> crate::Result<()> { finite(7, 0.1, f64::NAN) };
        match locate(err(), |k| Ok((k == NonFiniteKind::Gradient).then_some(5))) {
            Err(GradError::NonFinite {
                step: 7,
                sample: Some(5),
                kind: NonFiniteKind::Gradient,
            }) => {}
            other => panic!("{other:?}"),
        }
        // A failing search leaves the sample unknown rather than hiding the error.
        match locate(err(), |_| Err(GradError::BadInput("x".into()))) {
            Err(GradError::NonFinite { sample: None, .. }) => {}
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            locate::<()>(Err(GradError::Config("c".into())), |_| Ok(Some(1))),
            Err(GradError::Config(_))
        ));
    }

    #[test]
    fn bad_input_finds_the_first_sample_with_a_non_finite_value() {
        let x = [0.0f32, 1.0, 2.0, f32::INFINITY, 4.0, 5.0];
        assert_eq!(bad_input(&x, &[0.0, 1.0, 0.0], 3), Some(1));
        assert_eq!(bad_input(&[0.0f32; 6], &[0.0, f32::NAN, 0.0], 3), Some(1));
        assert_eq!(bad_input(&[0.0f32; 6], &[0.0; 3], 3), None);
    }
}
