//! Evaluation on the device (issue 21 item 3): a validation set uploaded once
//! (`Trainer::load(Load::Validation)`) and evaluated every epoch with nothing moved per chunk, and
//! the resident training set evaluated where it lies (`evaluate(EvalSource::Loaded)`).
//!
//! A pass walks the set in chunks of `eval_batch` samples, the chunk shapes `evaluate` uses
//! (full chunks, then the last, shorter one), so every logit is bitwise `evaluate`'s. Each
//! group of equal chunks has a device cursor: one chunk's work copies row `cursor` of the
//! chunked features (`[chunks, chunk · sample]`) into the group's input, runs the model in
//! no-grad mode and scatters its result into row `cursor` of the pass's results buffer,
//! advancing the cursor. So the same work, captured once per chunk shape, replays chunk after
//! chunk reading its offset from device memory; eagerly (capture off, or its capture failed)
//! it is the same body. The chunk graphs of one set replay one after another on the engine
//! stream and write only into the set's persistent tensors (inputs, results, cursor), so they
//! are captured into the trainer's graph pool, sharing one reservation with each other and
//! with the training step's graph: each chunk goes through the executor's door
//! (`executor.rs`, [`GraphKey::EvalChunk`]).
//!
//! A chunk's result (issue 40 item 2, `metrics::chunk_stats`): for every task but XAsset's unweighted
//! binary one, the chunk's targets are gathered too (kept on the device beside the features)
//! and the chunk's statistics row (the task's loss sum, right count, error sums, centred
//! moments) is computed by device ops inside the same work; the rows of the pass come back in
//! one download and are merged in `f64`. In data parallel each rank writes its rows into its
//! place among every rank's (`metrics::global_chunks`) and the buffer is all-reduced before
//! the download: every rank merges the same rows. The unweighted binary task (XAsset's) keeps
//! its report bitwise as it was: the logits (one per sample) come back in one download and the
//! loss and accuracy are `evaluate`'s sums in sample order in `f64` over the labels kept on the
//! host, all-reduced in data parallel as `evaluate` does from the host.

use super::executor::GraphKey;
use super::{Trainer, checks, shard};
use crate::error::{GradError, Result};
use crate::memory::ClassGuard;
use crate::metrics::{EvalReport, report_of, report_of_stats, stats_len};
use crate::model::Model;
use crate::task::Task;
use zcompute::{AllocClass, BTensor, Capture, Element};

mod set;
pub(super) use set::EvalSet;
use set::{Rows, eval_pass};

impl<B: Capture<T> + 'static, T: Element, M: Model<B, T>> Trainer<B, T, M> {
    /// `load(Load::Validation)`: uploads a validation set to the device once, for
    /// `evaluate(EvalSource::Validation)`:
    /// `x` `[n, ..sample shape]` row-major, `y` `n` samples' targets (`Task::target_len`
    /// each: on the device beside the features; the unweighted binary task's labels on the
    /// host instead, where its report sums). In data parallel each rank keeps only its shard (load it after
    /// `with_collective`; `evaluate(EvalSource::Validation)` refuses a set sharded otherwise). Replaces a
    /// set loaded before. Refuses with `BadInput` shapes `evaluate` would refuse and a
    /// non-finite feature or label (naming the sample; the old set kept); out of device memory
    /// is the backend's error, nothing loaded.
    pub(super) fn load_validation(&mut self, x: &[T], y: &[T], n: usize) -> Result<()> {
        let sample = self.shape_of(x, y, n)?;
        let (per, ty) = (x.len() / n, self.target_len());
        if let Some(bad) = checks::bad_input(x, y, n) {
            return Err(GradError::BadInput(format!(
                "validation sample {bad} of {n}: a non-finite feature or label"
            )));
        }
        let info = self.parts.dist.info();
        let rows = shard(info.rank, info.world, n);
        let labels = y[rows.start * ty..rows.end * ty].to_vec();
        self.load_validation_with(n, rows.len(), labels, sample, |b, shape| {
            Ok(b.upload(&x[rows.start * per..rows.end * per], shape)?)
        })
    }

    /// A validation set of `n` samples of `sample` holding zeros, made on the device with no
    /// host copy of its features: what a memory plan counts ([`crate::plan`]).
    pub(crate) fn load_validation_zeroed(&mut self, n: usize, sample: Vec<usize>) -> Result<()> {
        let info = self.parts.dist.info();
        let rows = shard(info.rank, info.world, n).len();
        let zeros = vec![T::ZERO; rows * self.target_len()];
        self.load_validation_with(n, rows, zeros, sample, |b, shape| Ok(b.zeros(shape)?))
    }

    /// The set of `rows` of `total` samples (this rank's): the features made by `make` on the
    /// device, the targets `labels` uploaded beside them (kept on the host instead for the
    /// logits way, `metrics::stats_len`).
    fn load_validation_with(
        &mut self,
        total: usize,
        rows: usize,
        labels: Vec<T>,
        sample: Vec<usize>,
        make: impl FnOnce(&B, &[usize]) -> Result<BTensor<B, T>>,
    ) -> Result<()> {
        // The old set (and its graphs) go first, so the two never hold memory together.
        self.validation = None;
        self.exec.forget(|k| matches!(k, GraphKey::EvalChunk(_)));
        let b = &*self.backend;
        let task = self.parts.model.task();
        let (x, targets) = if rows == 0 {
            (None, None)
        } else {
            let _class = ClassGuard::new(b, AllocClass::Persistent);
            let x = make(b, &Task::batched(rows, &sample))?;
            let y = match stats_len(&task) {
                Some(_) => Some(b.upload(&labels, &Task::batched(rows, &task.target_shape()))?),
                None => None,
            };
            (Some(x), y)
        };
        let info = self.parts.dist.info();
        let set = EvalSet::over(
            b,
            Rows { x, targets },
            labels,
            (total, info.rank, info.world),
            (self.config.eval_batch, task),
        )?;
        self.validation = Some(set);
        Ok(())
    }

    /// The task's loss and metrics over the validation set on the device
    /// (`load(Load::Validation)`): every chunk captured once per chunk shape and replayed
    /// (eagerly with capture off or after a failed capture), the results read back once (the
    /// logits of the unweighted binary task, XAsset's; each chunk's statistics otherwise); the
    /// report is bitwise `evaluate`'s on the same values (in data parallel, `evaluate`'s
    /// all-reduced sums). Refuses with `BadInput` before `load_validation`.
    pub(super) fn evaluate_validation(&mut self) -> Result<EvalReport> {
        let Some(mut set) = self.validation.take() else {
            return Err(GradError::BadInput(
                "evaluate(EvalSource::Validation): no validation set on the device (Load::Validation first)"
                    .into(),
            ));
        };
        if set.world != self.parts.dist.info().world {
            let loaded = set.world;
            self.validation = Some(set);
            return Err(GradError::BadInput(format!(
                "evaluate(EvalSource::Validation): the set was sharded over {loaded} ranks and the job now has {} (Load::Validation after with_collective)",
                self.parts.dist.info().world
            )));
        }
        // comm.sh signals a peer on this line, to test a fault during evaluation.
        tracing::info!(target: "zgrad.trainer.eval", rank = self.parts.dist.info().rank, "evaluating the validation set");
        let pass = eval_pass(&self.backend, &self.parts, Some(&mut self.exec), &mut set);
        let report = pass.and_then(|l| self.report_over(&l, &set));
        self.validation = Some(set);
        report
    }

    /// The training set loaded by `Load::Training` evaluated where it lies: this rank's rows
    /// (all of them in one process) in chunks of `eval_batch`, eagerly (it runs once, at the
    /// end of a run: a capture would cost a recording and a graph's memory for one pass), the
    /// results read back once (the unweighted binary task, XAsset's: the logits, against the labels kept on
    /// the host at load time; other tasks: each chunk's statistics of its targets on the
    /// device). Bitwise `evaluate`'s report on the same values (in data parallel, its
    /// all-reduced sums). Refuses with `BadInput` before `Load::Training`.
    pub(super) fn evaluate_loaded(&self) -> Result<EvalReport> {
        let Some(data) = self.data.as_ref() else {
            return Err(GradError::BadInput(
                "evaluate(EvalSource::Loaded): no data set on the device (Load::Training first)"
                    .into(),
            ));
        };
        let n = data.rows();
        let info = self.parts.dist.info();
        let task = self.parts.model.task();
        let rows = shard(info.rank, info.world, n);
        let (x, targets) = if rows.is_empty() {
            (None, None)
        } else {
            let y = data.y.narrow(0, rows.start, rows.len())?;
            (
                Some(data.x.narrow(0, rows.start, rows.len())?),
                // Loaded as `[n, ..target_shape]` already: the reshape keeps it.
                Some(y.reshape(&Task::batched(rows.len(), &task.target_shape()))?),
            )
        };
        let labels = match stats_len(&task) {
            Some(_) => Vec::new(),
            None => data.labels[rows].to_vec(),
        };
        let shards = (n, info.rank, info.world);
        let chunks = (self.config.eval_batch, task);
        let mut set = EvalSet::over(&*self.backend, Rows { x, targets }, labels, shards, chunks)?;
        let results = eval_pass(&self.backend, &self.parts, None, &mut set)?;
        self.report_over(&results, &set)
    }

    /// The report of this rank's pass `results` over `set`: the statistics rows of every
    /// rank's chunks (`report_of_stats`), or this rank's logits against its labels
    /// (`evaluate`'s sums, all-reduced in data parallel).
    fn report_over(&self, results: &[T], set: &EvalSet<B, T>) -> Result<EvalReport> {
        let task = self.parts.model.task();
        if stats_len(&task).is_some() {
            return Ok(report_of_stats(&task, results, set.total));
        }
        if self.parts.dist.single() {
            return Ok(report_of(&task, results, &set.labels));
        }
        self.all_reduce_report(results, &set.labels, set.total)
    }
}
