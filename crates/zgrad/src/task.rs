//! The target contract: what a model outputs per sample and what its targets are
//! ([`Model::task`](crate::Model::task)). The trainer, `evaluate`, `predict` and the data
//! path check every shape and length against it before anything runs, so a model whose
//! outputs and targets do not fit is a [`GradError::Target`] naming both shapes, never a
//! broadcast that trains on wrong numbers.
//!
//! Per sample (the batch axis comes first everywhere):
//!
//! | target | output | targets | loss ([`Tape::task_loss`](crate::Tape::task_loss)) |
//! |---|---|---|---|
//! | `Binary` | `[]` (one logit) | `[]` in {0, 1} | BCE with logits |
//! | `ClassIndex { classes: C }` | `[C]` logits | `[]` a class index 0..C | softmax cross-entropy |
//! | `Distribution { classes: C }` | `[C]` logits | `[C]` a distribution | softmax cross-entropy |
//! | `Regression { outputs: K }` | `[K]` values | `[K]` values | mean squared error |
//!
//! A weighted task ([`Task::weighted`]) carries one weight per target value after the values
//! (targets `[2, ..]`: row 0 the values, row 1 the weights; a weight of 0 marks a missing
//! target): the loss is the mean of `weight · loss` over every target value, PyTorch's
//! `reduction="mean"` with `weight=` (`loss.rs` says why: a missing target adds nothing, and the
//! per-sample schedule's sum of per-sample means over B stays the batched mean), not a mean over
//! the values of weight > 0 only; evaluation counts only those.

mod target;
pub use target::{Target, Task};

use crate::error::{GradError, Result};
use crate::var::Var;
use zcompute::{Element, prelude::*};

/// A batch's target values and, for a weighted task, their weights (`Task::split`).
pub type ValuesAndWeights<B, T> = (Var<B, T>, Option<Var<B, T>>);

impl Task {
    /// One logit per sample against a label in {0, 1}.
    #[must_use]
    pub fn binary() -> Self {
        Target::Binary.into()
    }

    /// `classes` logits per sample against a class index.
    #[must_use]
    pub fn class_index(classes: usize) -> Self {
        Target::ClassIndex { classes }.into()
    }

    /// `classes` logits per sample against a distribution (soft targets).
    #[must_use]
    pub fn distribution(classes: usize) -> Self {
        Target::Distribution { classes }.into()
    }

    /// `outputs` regression values per sample.
    #[must_use]
    pub fn regression(outputs: usize) -> Self {
        Target::Regression { outputs }.into()
    }

    /// The same task with a weight per target value (0 marks a missing target).
    #[must_use]
    pub fn weighted(self) -> Self {
        Task {
            weighted: true,
            ..self
        }
    }

    /// One sample's output shape.
    #[must_use]
    pub fn output_shape(&self) -> Vec<usize> {
        match self.target {
            Target::Binary => vec![],
            Target::ClassIndex { classes } | Target::Distribution { classes } => vec![classes],
            Target::Regression { outputs } => vec![outputs],
        }
    }

    /// Values of one sample's output.
    #[must_use]
    pub fn output_len(&self) -> usize {
        self.output_shape().iter().product()
    }

    /// One sample's target values' shape (without the weights).
    #[must_use]
    pub fn value_shape(&self) -> Vec<usize> {
        match self.target {
            Target::Binary | Target::ClassIndex { .. } => vec![],
            Target::Distribution { classes } => vec![classes],
            Target::Regression { outputs } => vec![outputs],
        }
    }

    /// One sample's targets' shape as the model's loss gets them: the values, or `[2, ..]`
    /// (values, then weights) when weighted.
    #[must_use]
    pub fn target_shape(&self) -> Vec<usize> {
        let v = self.value_shape();
        if self.weighted {
            std::iter::once(2).chain(v).collect()
        } else {
            v
        }
    }

    /// Values of one sample's targets (weights included).
    #[must_use]
    pub fn target_len(&self) -> usize {
        self.target_shape().iter().product()
    }

    /// `[rows, ..shape]`.
    #[must_use]
    pub fn batched(rows: usize, shape: &[usize]) -> Vec<usize> {
        std::iter::once(rows).chain(shape.iter().copied()).collect()
    }

    /// Checks a model's output `[rows, ..]` against the contract.
    pub fn check_output(&self, shape: &[usize], rows: usize) -> Result<()> {
        let want = Self::batched(rows, &self.output_shape());
        if shape == want.as_slice() {
            return Ok(());
        }
        Err(GradError::Target {
            what: "the model's output".into(),
            expected: want,
            given: shape.to_vec(),
            task: *self,
        })
    }

    /// Checks a loss: rank 0 (a mean), not a per-sample vector that would broadcast.
    pub fn check_loss(&self, shape: &[usize]) -> Result<()> {
        if shape.is_empty() {
            return Ok(());
        }
        Err(GradError::Target {
            what: "the model's loss (a mean over the batch)".into(),
            expected: vec![],
            given: shape.to_vec(),
            task: *self,
        })
    }

    /// Checks `n` samples' targets `y` (row-major, `target_shape` per sample): their length,
    /// class indices whole and in range, weights non-negative. Non-finite values pass (the
    /// trainer reports them as `NonFinite`, naming the sample), except class indices.
    pub fn check_targets<T: Element>(&self, y: &[T], n: usize) -> Result<()> {
        let per = self.target_len();
        if y.len() != n * per {
            return Err(GradError::Target {
                what: format!("the targets of {n} samples ({} values)", y.len()),
                expected: Self::batched(n, &self.target_shape()),
                given: if per > 0 && y.len().is_multiple_of(per) {
                    Self::batched(y.len() / per, &self.target_shape())
                } else {
                    vec![y.len()]
                },
                task: *self,
            });
        }
        let values = self.value_shape().iter().product::<usize>();
        for (i, row) in y.chunks_exact(per.max(1)).enumerate() {
            let (vals, weights) = row.split_at(values);
            if let Target::ClassIndex { classes } = self.target
                && let Some(&c) = vals.first()
            {
                let c = c.to_f64();
                if !c.is_finite() || c < 0.0 || c.fract() != 0.0 || c >= classes as f64 {
                    return Err(GradError::BadInput(format!(
                        "sample {i}: class index {c} is not a whole number in 0..{classes} (the model's task is {self})"
                    )));
                }
            }
            if let Some(w) = weights.iter().find(|w| w.to_f64() < 0.0) {
                return Err(GradError::BadInput(format!(
                    "sample {i}: weight {} is negative (weights are >= 0; 0 marks a missing target)",
                    w.to_f64()
                )));
            }
        }
        Ok(())
    }

    /// The target values and (weighted) the weights of a batch's targets `y` as the loss gets
    /// them (`[rows, ..target_shape]`), both `[rows, ..value_shape]`, as constants.
    pub fn split<B: Ops<T>, T: Element>(
        &self,
        b: &B,
        y: &Var<B, T>,
    ) -> Result<ValuesAndWeights<B, T>> {
        let rows = y.shape().first().copied().unwrap_or(0);
        let want = Self::batched(rows, &self.target_shape());
        if y.shape() != want.as_slice() {
            return Err(GradError::Target {
                what: "the targets the loss got".into(),
                expected: want,
                given: y.shape().to_vec(),
                task: *self,
            });
        }
        if !self.weighted {
            return Ok((y.clone(), None));
        }
        let shape = Self::batched(rows, &self.value_shape());
        let part = |i: usize| -> Result<Var<B, T>> {
            // A strided view of the rows: copied (on the device) to reshape it.
            let part = b.contiguous(&y.value().narrow(1, i, 1)?)?;
            Ok(Var::constant(part.reshape(&shape)?))
        };
        Ok((part(0)?, Some(part(1)?)))
    }
}

impl From<Target> for Task {
    fn from(target: Target) -> Self {
        Task {
            target,
            weighted: false,
        }
    }
}

impl std::fmt::Display for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.target {
            Target::Binary => write!(f, "binary (one logit, a label in {{0, 1}})")?,
            Target::ClassIndex { classes } => {
                write!(f, "{classes} classes (logits [{classes}], a class index)")?;
            }
            Target::Distribution { classes } => write!(
                f,
                "{classes} classes (logits [{classes}], a distribution [{classes}])"
            )?,
            Target::Regression { outputs } => {
                write!(f, "regression ({outputs} values, as many targets)")?;
            }
        }
        if self.weighted {
            f.write_str(", weighted")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Task;
    use crate::error::GradError;

    #[test]
    fn shapes_of_each_task() {
        assert_eq!(Task::binary().target_shape(), Vec::<usize>::new());
        assert_eq!(Task::class_index(10).output_shape(), [10]);
        assert_eq!(Task::class_index(10).target_len(), 1);
        assert_eq!(Task::distribution(4).target_shape(), [4]);
        assert_eq!(Task::regression(3).weighted().target_shape(), [2, 3]);
        assert_eq!(Task::binary().weighted().target_shape(), [2]);
    }

    #[test]
    fn outputs_and_targets_are_checked_naming_both_shapes() {
        let e = Task::binary().check_output(&[64, 10], 64).unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(&e, GradError::Target { expected, given, .. } if expected == &[64] && given == &[64, 10]),
            "{msg}"
        );
        assert!(msg.contains("[64]") && msg.contains("[64, 10]"), "{msg}");
        assert!(Task::class_index(10).check_output(&[64, 10], 64).is_ok());
        assert!(
            Task::class_index(10)
                .check_targets(&[1.0f32, 9.0], 2)
                .is_ok()
        );
        assert!(
            Task::class_index(10)
                .check_targets(&[1.0f32, 10.0], 2)
                .is_err()
        );
        assert!(
            Task::class_index(10)
                .check_targets(&[1.5f32, 1.0], 2)
                .is_err()
        );
        assert!(matches!(
            Task::distribution(3).check_targets(&[0.0f32; 3], 2),
            Err(GradError::Target { .. })
        ));
        assert!(
            Task::regression(2)
                .weighted()
                .check_targets(&[1.0f32, 2.0, 1.0, -1.0], 1)
                .is_err()
        );
        assert!(Task::regression(1).check_loss(&[4]).is_err());
    }
}
