//! Evaluation of a set the caller holds nowhere whole (rows read from a file, windows cut as
//! they are evaluated): the caller gives this rank's samples a chunk at a time, in the chunks
//! `evaluate` itself takes, and gets `evaluate`'s report of the set, bit for bit: the same
//! chunk boundaries (`eval_batch` samples from the first row of the rank's shard), each chunk
//! through the same call (`Trainer::chunk_outputs`), the sums combined as `evaluate` combines
//! them (the unweighted binary task's in sample order on the host; every other task's
//! statistics rows, `chunk_stats`). In data parallel each rank gives its shard only (`shard`
//! of the set) and the ranks' sums are all-reduced at the end.

use std::ops::Range;

use super::chunked_eval::ChunkedEval;
use super::{Trainer, shard};
use crate::error::{GradError, Result};
use crate::metrics::{BinarySums, EvalReport, chunk_stats, stats_len};
use crate::model::Model;
use crate::task::Task;
use zcompute::{Capture, Element};

impl<B: Capture<T> + 'static, T: Element, M: Model<B, T>> Trainer<B, T, M> {
    /// Starts the evaluation of a set of `total` samples given a chunk at a time
    /// ([`Trainer::evaluate_chunk`] of each `next_chunk`, then [`Trainer::finish_evaluation`],
    /// which every rank of a job calls). An empty set is `BadInput`, as `evaluate`'s is.
    pub fn chunked_evaluation(&self, total: usize) -> Result<ChunkedEval<T>> {
        if total == 0 {
            return Err(GradError::BadInput(
                "an evaluation of no samples (give at least one)".into(),
            ));
        }
        let info = self.parts.dist.info();
        let rows = shard(info.rank, info.world, total);
        let binary = stats_len(&self.parts.model.task())
            .is_none()
            .then(BinarySums::default);
        Ok(ChunkedEval {
            total,
            next: rows.start,
            rows,
            chunk: self.config.eval_batch.max(1),
            binary,
            stats: Vec::new(),
        })
    }

    /// Evaluates the next chunk of `eval`: `x` and `y` hold the samples of its `next_chunk`
    /// (their inputs and their targets, `Task::target_len` values each), checked as
    /// `evaluate` checks a set.
    pub fn evaluate_chunk(&self, eval: &mut ChunkedEval<T>, x: &[T], y: &[T]) -> Result<()> {
        let Some(rows) = eval.next_chunk() else {
            return Err(GradError::BadInput(format!(
                "every chunk of this rank's rows {:?} is evaluated already: finish the evaluation",
                eval.rows
            )));
        };
        let (len, task) = (rows.len(), self.parts.model.task());
        let sample = self.sample_of(x, len)?;
        task.check_targets(y, len).map_err(|e| in_chunk(e, &rows))?;
        let b = &*self.backend;
        let kept = self.chunk_outputs(x, len, &sample, |o| match eval.binary {
            Some(_) => Ok(b.download(o)?),
            None => {
                let ys = b.upload(y, &Task::batched(len, &task.target_shape()))?;
                Ok(b.download(&chunk_stats(b, &task, o, &ys)?)?)
            }
        })?;
        match eval.binary.as_mut() {
            Some(sums) => sums.add(&kept, y),
            None => eval.stats.extend(kept),
        }
        eval.next = rows.end;
        Ok(())
    }

    /// The report of `eval`'s set, once every chunk of it is given: `evaluate`'s of the
    /// whole set, bit for bit (in a job, every rank calls it: the sums are all-reduced).
    pub fn finish_evaluation(&self, eval: ChunkedEval<T>) -> Result<EvalReport> {
        if let Some(rows) = eval.next_chunk() {
            return Err(GradError::BadInput(format!(
                "rows {rows:?} of this rank's {:?} are not evaluated yet (evaluate_chunk each next_chunk first)",
                eval.rows
            )));
        }
        match eval.binary {
            Some(sums) if self.parts.dist.single() => Ok(sums.report()),
            Some(sums) => self.all_reduce_binary(&sums, eval.total),
            None => self.report_of_local_stats(&eval.stats, eval.total),
        }
    }
}

/// A targets error of a chunk's sample, renamed to the sample's row in the set.
fn in_chunk(e: GradError, rows: &Range<usize>) -> GradError {
    match e {
        GradError::BadInput(m) => GradError::BadInput(format!("chunk of rows {rows:?}: {m}")),
        other => other,
    }
}
