//! Losses, each a rank-0 variable built from tape ops (so each has its backward, in both
//! schedules and under capture): BCE with logits, softmax cross-entropy with class indices or
//! soft targets, mean squared error and Huber, each with an optional weight per target value.
//!
//! Every loss refuses targets (and weights) of any shape but the one it needs with a
//! [`GradError::Target`] naming both shapes: none broadcasts a target it was not given the
//! shape for. Reductions are PyTorch's `reduction="mean"`: unweighted, the mean over every
//! target value; weighted, the mean of `weight · loss` over every target value (as
//! `BCEWithLogitsLoss(weight=w)`), so a missing target (weight 0) adds nothing and the
//! per-sample schedule's sum of per-sample means divided by B is the batched mean.

use crate::error::{GradError, Result};
use crate::tape::Tape;
use crate::task::{Target, Task};
use crate::var::Var;
use zcompute::{BTensor, BinaryOp, Element, ScalarSide, UnaryOp, prelude::*};

/// Refuses `given` unless it is `want`, naming both.
fn same(what: &str, want: &[usize], given: &[usize], task: Task) -> Result<()> {
    if want == given {
        return Ok(());
    }
    Err(GradError::Target {
        what: what.to_string(),
        expected: want.to_vec(),
        given: given.to_vec(),
        task,
    })
}

impl<B: Ops<T>, T: Element> Tape<'_, B, T> {
    /// The loss of the model's `task`: its output `[rows, ..output]` against the targets
    /// `y` `[rows, ..target]` as the trainer gives them (`Task::target_shape`; weighted:
    /// values then weights). BCE with logits, cross-entropy (class indices or soft targets),
    /// or MSE; every shape checked against the task first.
    pub fn task_loss(&self, task: &Task, output: &Var<B, T>, y: &Var<B, T>) -> Result<Var<B, T>> {
        let rows = y.shape().first().copied().unwrap_or(0);
        task.check_output(output.shape(), rows)?;
        let (values, weights) = task.split(self.backend(), y)?;
        let w = weights.as_ref();
        match task.target {
            Target::Binary => self.bce_weighted(output, &values, w),
            Target::ClassIndex { .. } => self.cross_entropy_indices(output, &values, w),
            Target::Distribution { .. } => self.cross_entropy_weighted(output, &values, w),
            Target::Regression { .. } => self.mse_weighted(output, &values, w),
        }
    }

    /// Mean of `(pred - target)²` over every element; `target` must have `pred`'s shape.
    pub fn mse(&self, pred: &Var<B, T>, target: &Var<B, T>) -> Result<Var<B, T>> {
        self.mse_weighted(pred, target, None)
    }

    /// `mse` with a weight per value (`pred`'s shape; 0 marks a missing target): the mean of
    /// `w (pred - target)²`.
    pub fn mse_weighted(
        &self,
        pred: &Var<B, T>,
        target: &Var<B, T>,
        weights: Option<&Var<B, T>>,
    ) -> Result<Var<B, T>> {
        let task = Task::regression(pred.shape().iter().skip(1).product());
        same("mse: the target", pred.shape(), target.shape(), task)?;
        let d = self.sub(pred, target)?;
        let sq = self.mul(&d, &d)?;
        self.weighted_mean(&sq, weights, task)
    }

    /// Huber loss (PyTorch's `HuberLoss(delta)`): `d²/2` for `|d| < delta`, else
    /// `delta (|d| - delta/2)`, `d = pred - target`; mean (weighted as `mse_weighted`).
    pub fn huber(
        &self,
        pred: &Var<B, T>,
        target: &Var<B, T>,
        delta: f64,
        weights: Option<&Var<B, T>>,
    ) -> Result<Var<B, T>> {
        let task = Task::regression(pred.shape().iter().skip(1).product());
        if !(delta.is_finite() && delta > 0.0) {
            return Err(GradError::BadInput(format!(
                "huber: delta {delta} must be finite and > 0"
            )));
        }
        same("huber: the target", pred.shape(), target.shape(), task)?;
        let d = self.sub(pred, target)?;
        let a = self.abs_composite(&d)?;
        // m = min(|d|, delta); loss = m (|d| - m/2): |d|²/2 below delta, delta(|d| - delta/2) above.
        let neg_a = self.neg(&a)?;
        let m = self.neg(&self.binary_scalar(
            BinaryOp::Maximum,
            &neg_a,
            T::from_f64(-delta),
            ScalarSide::Rhs,
        )?)?;
        let half_m = self.scale(&m, T::from_f64(0.5))?;
        let per = self.mul(&m, &self.sub(&a, &half_m)?)?;
        self.weighted_mean(&per, weights, task)
    }

    /// Mean BCE-with-logits over every element (alias of `bce_with_logits`).
    pub fn bce(&self, logits: &Var<B, T>, targets: &Var<B, T>) -> Result<Var<B, T>> {
        self.bce_with_logits(logits, targets)
    }

    /// BCE with logits with an optional weight per value (`logits`' shape), the mean of
    /// `w · (max(x, 0) - x t + log(1 + exp(-|x|)))`. Unweighted it is the fused
    /// `bce_with_logits`.
    pub fn bce_weighted(
        &self,
        logits: &Var<B, T>,
        targets: &Var<B, T>,
        weights: Option<&Var<B, T>>,
    ) -> Result<Var<B, T>> {
        let task = Task::binary();
        same("bce: the target", logits.shape(), targets.shape(), task)?;
        let Some(w) = weights else {
            return self.bce_with_logits(logits, targets);
        };
        let pos = self.binary_scalar(BinaryOp::Maximum, logits, T::ZERO, ScalarSide::Rhs)?;
        let xt = self.mul(logits, targets)?;
        let a = self.abs_composite(logits)?;
        let e = self.exp(&self.neg(&a)?)?;
        let soft = self.log(&self.add_scalar(&e, T::ONE)?)?;
        let per = self.add(&self.sub(&pos, &xt)?, &soft)?;
        self.weighted_mean(&per, Some(w), task)
    }

    /// Cross-entropy of `logits` `[N, C]` against target distributions `targets` `[N, C]`
    /// (one-hot rows for class labels, see `one_hot`; class indices: `cross_entropy_indices`):
    /// `-mean_n sum_c t log softmax(x)`. The log-softmax is shifted by the (detached) row
    /// maximum, so it never overflows. Targets of any other shape are refused.
    pub fn cross_entropy(&self, logits: &Var<B, T>, targets: &Var<B, T>) -> Result<Var<B, T>> {
        self.cross_entropy_weighted(logits, targets, None)
    }

    /// `cross_entropy` with a weight per sample (`[N]`): the mean of `w_n · loss_n`.
    pub fn cross_entropy_weighted(
        &self,
        logits: &Var<B, T>,
        targets: &Var<B, T>,
        weights: Option<&Var<B, T>>,
    ) -> Result<Var<B, T>> {
        let task = Task::distribution(logits.shape().last().copied().unwrap_or(0));
        if logits.shape().len() != 2 {
            return Err(GradError::Target {
                what: "cross_entropy: the logits".into(),
                expected: vec![
                    logits.shape().first().copied().unwrap_or(0),
                    task.output_len(),
                ],
                given: logits.shape().to_vec(),
                task,
            });
        }
        same(
            "cross_entropy: the target",
            logits.shape(),
            targets.shape(),
            task,
        )?;
        let logp = self.log_softmax_rows(logits)?;
        let per_row = self.neg(&self.sum(&self.mul(targets, &logp)?, 1, false)?)?;
        self.weighted_mean(&per_row, weights, task)
    }

    /// Softmax cross-entropy of `logits` `[N, C]` against class indices `classes` `[N]`
    /// (whole numbers in 0..C, as PyTorch's `cross_entropy(logits, target)`), optionally
    /// weighted per sample (`[N]`). The one-hot rows are made on the device (no host read:
    /// legal under capture).
    pub fn cross_entropy_indices(
        &self,
        logits: &Var<B, T>,
        classes: &Var<B, T>,
        weights: Option<&Var<B, T>>,
    ) -> Result<Var<B, T>> {
        let c = logits.shape().last().copied().unwrap_or(0);
        let n = logits.shape().first().copied().unwrap_or(0);
        let task = Task::class_index(c);
        if logits.shape().len() != 2 {
            return Err(GradError::Target {
                what: "cross_entropy_indices: the logits".into(),
                expected: vec![n, c],
                given: logits.shape().to_vec(),
                task,
            });
        }
        same(
            "cross_entropy_indices: the class indices",
            &[n],
            classes.shape(),
            task,
        )?;
        let hot = Var::constant(one_hot_on_device(self.backend(), classes.value(), c)?);
        let logp = self.log_softmax_rows(logits)?;
        let per_row = self.neg(&self.sum(&self.mul(&hot, &logp)?, 1, false)?)?;
        self.weighted_mean(&per_row, weights, task)
    }

    /// `log softmax` over the last axis of `[N, C]`, shifted by the detached row maximum.
    fn log_softmax_rows(&self, logits: &Var<B, T>) -> Result<Var<B, T>> {
        let last = logits.shape().len().saturating_sub(1);
        let shift = Var::constant(self.backend().max(&logits.value, last, true)?);
        let z = self.sub(logits, &shift)?;
        let lse = self.log(&self.sum(&self.exp(&z)?, last, true)?)?;
        self.sub(&z, &lse)
    }

    /// `|x|` as `max(x, -x)` (a NaN stays NaN).
    fn abs_composite(&self, x: &Var<B, T>) -> Result<Var<B, T>> {
        self.maximum(x, &self.neg(x)?)
    }

    /// The mean of `per` (weighted: of `w · per`, `w` of `per`'s shape).
    fn weighted_mean(
        &self,
        per: &Var<B, T>,
        w: Option<&Var<B, T>>,
        task: Task,
    ) -> Result<Var<B, T>> {
        match w {
            None => self.mean_all(per),
            Some(w) => {
                same("the weights", per.shape(), w.shape(), task)?;
                self.mean_all(&self.mul(per, w)?)
            }
        }
    }
}

/// One-hot rows `[N, classes]` of class indices `[N]` on the device: `relu(1 - |c - y|)`,
/// exact for whole numbers (an index outside 0..classes gives a zero row, a NaN a NaN row;
/// the trainer refuses both before they get here).
fn one_hot_on_device<B: Ops<T>, T: Element>(
    b: &B,
    classes: &BTensor<B, T>,
    count: usize,
) -> Result<BTensor<B, T>> {
    let n = classes.shape().first().copied().unwrap_or(0);
    // 0..count by doubling: log2(count) small launches, no upload (legal under capture).
    let iota = b.zeros(&[count])?;
    let mut len = 1;
    while len < count {
        let k = len.min(count - len);
        let shifted = b.binary_scalar(
            BinaryOp::Add,
            &iota.narrow(0, 0, k)?,
            T::from_f64(len as f64),
            ScalarSide::Rhs,
        )?;
        b.copy_into(&shifted, &iota.narrow(0, len, k)?)?;
        len *= 2;
    }
    let d = b.sub(&iota.reshape(&[1, count])?, &classes.reshape(&[n, 1])?)?;
    let dist = b.maximum(&d, &b.unary(UnaryOp::Neg, &d)?)?;
    let near = b.binary_scalar(BinaryOp::Sub, &dist, T::ONE, ScalarSide::Lhs)?;
    Ok(b.binary_scalar(BinaryOp::Maximum, &near, T::ZERO, ScalarSide::Rhs)?)
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
