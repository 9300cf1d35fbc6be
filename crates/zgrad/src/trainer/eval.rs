//! Evaluation in no-grad mode: the model's task loss and metrics over a data set, in chunks,
//! each in its own step scope (nothing is recorded, nothing saved). Every chunk's outputs are
//! checked against the model's task (`Model::task`) before they are used.

use super::{EvalSource, Trainer, in_step, shard};
use crate::error::{GradError, Result};
use crate::model::Model;
use crate::task::Task;
use crate::var::Var;
use zcompute::{BTensor, Capture, Element};

use crate::metrics::{
    EvalReport, chunk_stats, global_chunks, report_of, report_of_stats, stats_len,
};

impl<B: Capture<T> + 'static, T: Element, M: Model<B, T>> Trainer<B, T, M> {
    /// The model's outputs for `n` samples `x` (`[n, ..sample shape]` row-major), in no-grad
    /// mode (`Model::logits`): `n · Task::output_len` values, `[n, ..Task::output_shape]`
    /// row-major. Outputs of another shape than the task's are a `Target` error naming both.
    pub fn predict(&self, x: &[T], n: usize) -> Result<Vec<T>> {
        let sample = self.sample_of(x, n)?;
        let b = &*self.backend;
        self.host_chunks(x, 0..n, &sample, |_, _, o| Ok(b.download(o)?))
    }

    /// The model's outputs over rows `rows` of `x` (samples of `sample`) in chunks of
    /// `eval_batch`, in no-grad mode, each chunk in its own step scope, checked against the
    /// task: `keep(start, len, outputs)` of every chunk, concatenated.
    fn host_chunks(
        &self,
        x: &[T],
        rows: std::ops::Range<usize>,
        sample: &[usize],
        mut keep: impl FnMut(usize, usize, &BTensor<B, T>) -> Result<Vec<T>>,
    ) -> Result<Vec<T>> {
        let chunk = self.config.eval_batch.max(1);
        let per: usize = sample.iter().product();
        let mut out = Vec::with_capacity(rows.len() * self.parts.model.task().output_len());
        for start in rows.clone().step_by(chunk) {
            let len = chunk.min(rows.end - start);
            let xs = &x[start * per..(start + len) * per];
            out.extend(self.chunk_outputs(xs, len, sample, |o| keep(start, len, o))?);
        }
        Ok(out)
    }

    /// One chunk of an evaluation: the model's outputs for the `len` samples `x` (of
    /// `sample`) in no-grad mode in a step scope of their own, checked against the task, and
    /// `keep` of them. Every host evaluation's chunk is this call, whoever holds the set
    /// (`host_chunks`, `eval_chunks.rs`).
    pub(super) fn chunk_outputs(
        &self,
        x: &[T],
        len: usize,
        sample: &[usize],
        keep: impl FnOnce(&BTensor<B, T>) -> Result<Vec<T>>,
    ) -> Result<Vec<T>> {
        let (b, task) = (&*self.backend, self.parts.model.task());
        in_step(b, || {
            let shape = Task::batched(len, sample);
            let xs = Var::constant(b.upload(x, &shape)?);
            let tape = self.parts.eval_tape(b);
            let o = self.parts.model.logits(&tape, &xs)?;
            task.check_output(o.shape(), len)?;
            keep(o.value())
        })
    }

    /// The task's mean loss and metrics (`EvalReport`) over the samples of `src`, in no-grad
    /// mode, in chunks of `eval_batch`. Every source gives the same report on the same values,
    /// bit for bit (in data parallel, each rank evaluates its shard and the sums are
    /// all-reduced): host rows are uploaded chunk by chunk; the sets on the device are
    /// evaluated where they lie, the results read back once (the logits of the unweighted
    /// binary task, XAsset's, against the labels kept on the host at load time; each chunk's
    /// statistics otherwise). A set on the device not loaded yet is `BadInput`, as is a
    /// validation set sharded over another number of ranks than the job's now.
    pub fn evaluate(&mut self, src: EvalSource<'_, T>) -> Result<EvalReport> {
        match src {
            EvalSource::Host(x, y) => self.evaluate_host(x, y),
            EvalSource::Validation => self.evaluate_validation(),
            EvalSource::Loaded => self.evaluate_loaded(),
        }
    }

    /// `evaluate` of samples `x` and `y` in host memory.
    pub(crate) fn evaluate_host(&self, x: &[T], y: &[T]) -> Result<EvalReport> {
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
        if stats_len(&task).is_some() {
            return self.evaluate_by_stats(x, y, n);
        }
        if !self.parts.dist.single() {
            return self.evaluate_sharded(x, y);
        }
        let outputs = self.predict(x, n)?;
        Ok(report_of(&task, &outputs, y))
    }

    /// `evaluate` of a task reported from statistics (`metrics::chunk_stats`): this rank's shard (all
    /// of `n` samples in one process) in chunks of `eval_batch`, each chunk's statistics
    /// computed on the device by the work a device evaluation captures and read back (a row
    /// of a few values per chunk), every rank's rows summed over the ranks, the report
    /// combined in `f64`: bitwise the device sets' (`evaluate(EvalSource::Validation)`, `evaluate(EvalSource::Loaded)`).
    fn evaluate_by_stats(&self, x: &[T], y: &[T], n: usize) -> Result<EvalReport> {
        let task = self.parts.model.task();
        let sample = self.sample_of(x, n)?;
        let per_target = task.target_len();
        let info = self.parts.dist.info();
        let b = &*self.backend;
        let rows = shard(info.rank, info.world, n);
        let local = self.host_chunks(x, rows, &sample, |start, len, o| {
            let ys = b.upload(
                &y[start * per_target..(start + len) * per_target],
                &Task::batched(len, &task.target_shape()),
            )?;
            Ok(b.download(&chunk_stats(b, &task, o, &ys)?)?)
        })?;
        self.report_of_local_stats(&local, n)
    }

    /// The report of a set of `n` samples from this rank's chunks' statistics rows `local`
    /// (its shard's, in chunks of `eval_batch`): in one process of them alone; in a job every
    /// rank's rows in rank order, each rank writing its own (the others' zero), summed over
    /// the ranks. The report is combined in `f64`.
    pub(super) fn report_of_local_stats(&self, local: &[T], n: usize) -> Result<EvalReport> {
        let task = self.parts.model.task();
        if self.parts.dist.single() {
            return Ok(report_of_stats(&task, local, n));
        }
        let (b, info) = (&*self.backend, self.parts.dist.info());
        let chunk = self.config.eval_batch.max(1);
        let (_, before, all) = global_chunks(info.rank, info.world, n, chunk);
        let len = stats_len(&task).unwrap_or(0);
        let mut rows_all = vec![T::ZERO; all.max(1) * len];
        rows_all[before * len..before * len + local.len()].copy_from_slice(local);
        let dist = &self.parts.dist;
        let sums = b.upload(&rows_all, &[rows_all.len()])?;
        dist.reduce(b, &sums)?;
        dist.comm.synchronize(b)?;
        Ok(report_of_stats(&task, &b.download(&sums)?, n))
    }
}
