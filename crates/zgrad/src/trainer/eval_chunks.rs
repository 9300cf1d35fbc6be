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

impl<T: Element> ChunkedEval<T> {
    /// Starts the evaluation by `trainer` of a set of `total` samples given a chunk at a time
    /// ([`ChunkedEval::add`] of each [`ChunkedEval::next_chunk`], then
    /// [`ChunkedEval::finish`], which every rank of a job calls). An empty set is `BadInput`,
    /// as `evaluate`'s is.
    pub fn new<B: Capture<T> + 'static, M: Model<B, T>>(
        trainer: &Trainer<B, T, M>,
        total: usize,
    ) -> Result<Self> {
        if total == 0 {
            return Err(GradError::BadInput(
                "an evaluation of no samples (give at least one)".into(),
            ));
        }
        let info = trainer.parts.dist.info();
        let rows = shard(info.rank, info.world, total);
        let binary = stats_len(&trainer.parts.model.task())
            .is_none()
            .then(BinarySums::default);
        Ok(ChunkedEval {
            total,
            next: rows.start,
            rows,
            chunk: trainer.config.eval_batch.max(1),
            binary,
            stats: Vec::new(),
        })
    }

    /// Evaluates the next chunk by `trainer` (the one that started the evaluation): `x` and
    /// `y` hold the samples of its `next_chunk` (their inputs and their targets,
    /// `Task::target_len` values each), checked as `evaluate` checks a set.
    pub fn add<B: Capture<T> + 'static, M: Model<B, T>>(
        &mut self,
        trainer: &Trainer<B, T, M>,
        x: &[T],
        y: &[T],
    ) -> Result<()> {
        let Some(rows) = self.next_chunk() else {
            return Err(GradError::BadInput(format!(
                "every chunk of this rank's rows {:?} is evaluated already: finish the evaluation",
                self.rows
            )));
        };
        let (len, task) = (rows.len(), trainer.parts.model.task());
        let sample = trainer.sample_of(x, len)?;
        task.check_targets(y, len).map_err(|e| in_chunk(e, &rows))?;
        let b = &*trainer.backend;
        let kept = trainer.chunk_outputs(x, len, &sample, |o| match self.binary {
            Some(_) => Ok(b.download(o)?),
            None => {
                let ys = b.upload(y, &Task::batched(len, &task.target_shape()))?;
                Ok(b.download(&chunk_stats(b, &task, o, &ys)?)?)
            }
        })?;
        match self.binary.as_mut() {
            Some(sums) => sums.add(&kept, y),
            None => self.stats.extend(kept),
        }
        self.next = rows.end;
        Ok(())
    }

    /// The report of the set by `trainer`, once every chunk of it is given: `evaluate`'s of
    /// the whole set, bit for bit (in a job, every rank calls it: the sums are all-reduced).
    pub fn finish<B: Capture<T> + 'static, M: Model<B, T>>(
        self,
        trainer: &Trainer<B, T, M>,
    ) -> Result<EvalReport> {
        if let Some(rows) = self.next_chunk() {
            return Err(GradError::BadInput(format!(
                "rows {rows:?} of this rank's {:?} are not evaluated yet (add each next_chunk first)",
                self.rows
            )));
        }
        match self.binary {
            Some(sums) if trainer.parts.dist.single() => Ok(sums.report()),
            Some(sums) => trainer.all_reduce_binary(&sums, self.total),
            None => trainer.report_of_local_stats(&self.stats, self.total),
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
