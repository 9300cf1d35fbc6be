//! The state of an evaluation the caller feeds a chunk at a time ([`ChunkedEval`]): a plain
//! value whose methods taking the trainer (`eval_chunks.rs`: `ChunkedEval::new`, `add`,
//! `finish`) create and advance it.

use crate::metrics::BinarySums;
use std::ops::Range;
use zcompute::Element;

/// An evaluation under way (`ChunkedEval::new`): the rows the caller gives next,
/// and the sums of the chunks given so far.
#[derive(Debug)]
pub struct ChunkedEval<T: Element> {
    /// Samples of the whole set (every rank's).
    pub(super) total: usize,
    /// This rank's shard of the set.
    pub(super) rows: Range<usize>,
    /// The first row of the next chunk.
    pub(super) next: usize,
    pub(super) chunk: usize,
    /// The unweighted binary task's sums (`None`: the task is reported from statistics).
    pub(super) binary: Option<BinarySums>,
    /// Every other task's chunks' statistics rows, in order.
    pub(super) stats: Vec<T>,
}

impl<T: Element> ChunkedEval<T> {
    /// This rank's rows of the set (all of them in one process).
    #[must_use]
    pub fn rows(&self) -> Range<usize> {
        self.rows.clone()
    }

    /// The rows of the set the next chunk holds (`None`: every chunk is given; finish it).
    #[must_use]
    pub fn next_chunk(&self) -> Option<Range<usize>> {
        (self.next < self.rows.end).then(|| self.next..(self.next + self.chunk).min(self.rows.end))
    }
}
