//! Evaluation in no-grad mode: the model's task loss and metrics over a data set, in chunks,
//! each in its own step scope (nothing is recorded, nothing saved). Every chunk's outputs are
//! checked against the model's task (`Model::task`) before they are used.

use super::metrics::report_of;
use super::{Trainer, in_step};
use crate::error::{GradError, Result};
use crate::model::Model;
use crate::tape::Tape;
use crate::task::Task;
use crate::var::Var;
use zcompute::{Capture, Element};

use super::metrics::EvalReport;

impl<B: Capture<T> + 'static, T: Element, M: Model<B, T>> Trainer<B, T, M> {
    /// The model's outputs for `n` samples `x` (`[n, ..sample shape]` row-major), in no-grad
    /// mode (`Model::logits`): `n · Task::output_len` values, `[n, ..Task::output_shape]`
    /// row-major. Outputs of another shape than the task's are a `Target` error naming both.
    pub fn predict(&self, x: &[T], n: usize) -> Result<Vec<T>> {
        let sample = self.sample_of(x, n)?;
        let task = self.parts.model.task();
        let b = &*self.backend;
        let chunk = self.config.eval_batch.max(1);
        let per: usize = sample.iter().product();
        let mut out = Vec::with_capacity(n * task.output_len());
        for start in (0..n).step_by(chunk) {
            let len = chunk.min(n - start);
            let outputs = in_step(b, || {
                let shape = Task::batched(len, &sample);
                let xs = Var::constant(b.upload(&x[start * per..(start + len) * per], &shape)?);
                let tape = Tape::no_grad(b);
                let o = self.parts.model.logits(&tape, &xs)?;
                task.check_output(o.shape(), len)?;
                o.to_vec(b)
            })?;
            out.extend(outputs);
        }
        Ok(out)
    }

    /// The task's mean loss and metrics (`EvalReport`) over the samples of `x` and `y`
    /// (`y`: `Task::target_len` values per sample; binary: one label per sample).
    pub fn evaluate(&self, x: &[T], y: &[T]) -> Result<EvalReport> {
        let task = self.parts.model.task();
        let per = task.target_len();
        if y.is_empty() || !y.len().is_multiple_of(per) {
            return Err(GradError::Target {
                what: format!("the evaluation targets ({} values)", y.len()),
                expected: task.target_shape(),
                given: vec![y.len()],
                task,
            });
        }
        let n = y.len() / per;
        self.sample_of(x, n)?;
        task.check_targets(y, n)?;
        if !self.parts.dist.single() {
            return self.evaluate_sharded(x, y);
        }
        let outputs = self.predict(x, n)?;
        Ok(report_of(&task, &outputs, y))
    }
}
