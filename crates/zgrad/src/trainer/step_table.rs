//! The queued batched step's inputs on the device data set (issue 21): a table with a row per
//! step of a read-back window, `[indices.., lr, t]` (this rank's shard of the step's rows,
//! padded to the table's stride, then the optimiser's learning rate and step number). The
//! step's gathers read its samples' indices in the row the window's history cursor picks
//! (which the step's tail advances; `StepOps::gather_rows_at_cursor`), the first also copying
//! the row's `[lr, t]` into the step's AdamW slot `[lr, t, gate]`: no launch of its own.
//!
//! A step on its own uploads its row: the indices, then `[lr, t]` (two copies of at most a
//! KiB at 256 rows a rank: the copy engine's short path). With a plan of the rows to come
//! (`Trainer::load(Load::Order)`) one copy puts up the rows of the rest of
//! the window at its first planned step, and the steps after it upload nothing, so the GPU
//! waits for no copy between two replays. A step takes a planned row only if its rows, step
//! number and learning rate are the planned ones; any other step uploads its own row and
//! drops the plan. A plan never changes what a step computes.

use crate::error::{GradError, Result};
use crate::memory::persistent_zeros;
use crate::shard;
use std::ops::Range;
use zcompute::{BTensor, Element, prelude::*};

/// Device bytes of the step table of windows of `every` steps of `rows_a_rank` rows a rank in
/// elements of `elem_bytes` bytes: a row of indices and `[lr, t]` a step of the window, and
/// the step's AdamW slot (made at the first queued batched step on the device data set, beside
/// what [`crate::device_data_bytes`] counts).
#[must_use]
pub fn step_table_bytes(every: usize, rows_a_rank: usize, elem_bytes: usize) -> u64 {
    let width = rows_a_rank as u64 + 2;
    (every.max(1) as u64)
        .saturating_mul(width)
        .saturating_add(3)
        .saturating_mul(elem_bytes as u64)
}

/// The rows the caller will queue next: `order` in chunks of `batch` (the last may be
/// shorter), from chunk `next` on.
#[derive(Debug)]
pub(super) struct RowPlan {
    order: Vec<usize>,
    batch: usize,
    next: usize,
}

impl RowPlan {
    /// A plan of `order` in chunks of `batch` rows (refused: `batch` 0).
    pub(super) fn new(order: &[usize], batch: usize) -> Result<Self> {
        if batch == 0 {
            return Err(GradError::BadInput(
                "a plan of steps of 0 rows (at least 1 a step)".into(),
            ));
        }
        Ok(RowPlan {
            order: order.to_vec(),
            batch,
            next: 0,
        })
    }

    fn chunks(&self) -> usize {
        self.order.len().div_ceil(self.batch)
    }

    fn chunk(&self, k: usize) -> &[usize] {
        let start = (k * self.batch).min(self.order.len());
        &self.order[start..(start + self.batch).min(self.order.len())]
    }
}

/// What a planned row of the table holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Planned {
    chunk: usize,
    step: u64,
    lr_bits: u64,
}

/// A step of the queue, as the table's row needs it.
pub(super) struct StepRow<'a> {
    /// The row of the window the step's history row and inputs take (the history cursor).
    pub window_row: usize,
    /// The step's rows (the global batch) and this rank's shard of them.
    pub rows: &'a [usize],
    pub local: Range<usize>,
    /// The optimiser's step number `t` and learning rate.
    pub step: u64,
    pub lr: f64,
    /// The window's length and this rank's place in the job.
    pub every: usize,
    pub rank: usize,
    pub world: usize,
}

/// The table of a window's step inputs and the step's AdamW slot (see the module's text).
pub(super) struct StepTable<B: Ops<T>, T: Element> {
    table: BTensor<B, T>,
    slot: BTensor<B, T>,
    stride: usize,
    /// What each row of the table holds from the plan in the current window (`None`: a row
    /// uploaded on its own, or not written in this window).
    planned: Vec<Option<Planned>>,
    staging: Vec<T>,
}

impl<B: Ops<T>, T: Element> StepTable<B, T> {
    /// A table of `rows` windows' rows of `stride` indices (persistent memory).
    pub(super) fn new(b: &B, rows: usize, stride: usize) -> Result<Self> {
        Ok(StepTable {
            table: persistent_zeros(b, &[rows.max(1), stride + 2])?,
            slot: persistent_zeros(b, &[3])?,
            stride,
            planned: vec![None; rows.max(1)],
            staging: Vec::new(),
        })
    }

    /// Forgets which rows came from a plan (a new plan numbers its chunks from 0 again).
    pub(super) fn forget_plan(&mut self) {
        self.planned.fill(None);
    }

    /// Whether it holds windows of `every` steps of `local` rows a rank.
    pub(super) fn fits(&self, every: usize, local: usize) -> bool {
        self.planned.len() >= every && self.stride >= local
    }

    /// The table, the AdamW slot `[lr, t, gate]` and its `[lr, t]` (what a step's first
    /// gather copies the row's end into).
    pub(super) fn views(&self) -> Result<StepViews<B, T>> {
        Ok(StepViews {
            table: self.table.clone(),
            lr_t: self.slot.narrow(0, 0, 2)?,
            slot: self.slot.clone(),
        })
    }

    /// Puts step `s`'s row in the table: nothing when the plan put it up already; the rows
    /// of the rest of the window from the plan when `s` is the plan's next step; else its own
    /// (and the plan is dropped). Host-to-device copies: outside a capture.
    pub(super) fn stage(
        &mut self,
        b: &B,
        s: &StepRow<'_>,
        plan: &mut Option<RowPlan>,
        lr_at: impl Fn(u64) -> f64,
    ) -> Result<()> {
        let r = s.window_row;
        if r >= self.planned.len() || s.local.len() > self.stride {
            return Err(GradError::BadInput(format!(
                "internal: window row {r} of {}, {} rows a rank of {}",
                self.planned.len(),
                s.local.len(),
                self.stride
            )));
        }
        if r == 0 {
            // A new window: what the rows held belongs to the one before.
            self.planned.fill(None);
        }
        let want = |chunk| Planned {
            chunk,
            step: s.step,
            lr_bits: s.lr.to_bits(),
        };
        if let Some(p) = plan.as_mut()
            && p.next < p.chunks()
            && p.chunk(p.next) == s.rows
        {
            let k = p.next;
            if self.planned[r] != Some(want(k)) {
                self.put_planned(b, s, p, &lr_at)?;
            }
            if self.planned[r] == Some(want(k)) {
                p.next += 1;
                return Ok(());
            }
        }
        *plan = None;
        self.planned.fill(None);
        self.put_own(b, s)
    }

    /// Uploads rows `r..` of the window (to its end or the plan's) from the plan's chunks
    /// from its next one, in one copy.
    fn put_planned(
        &mut self,
        b: &B,
        s: &StepRow<'_>,
        p: &RowPlan,
        lr_at: &impl Fn(u64) -> f64,
    ) -> Result<()> {
        let r = s.window_row;
        let m = (s.every.min(self.planned.len()).saturating_sub(r)).min(p.chunks() - p.next);
        self.staging.clear();
        let mut rows = Vec::with_capacity(m);
        for j in 0..m {
            let chunk = p.chunk(p.next + j);
            let mine = &chunk[shard(s.rank, s.world, chunk.len())];
            if mine.len() > self.stride {
                // Not after the step's own chunk (a plan's chunks shrink at most), but a row
                // that does not fit is left to its step, which uploads its own.
                break;
            }
            let step = s.step + j as u64;
            let lr = lr_at(step);
            self.staging
                .extend(mine.iter().map(|&i| T::from_f64(i as f64)));
            // Never read: a step reads its shard's indices only.
            let pad = self.stride - mine.len();
            self.staging
                .extend(std::iter::repeat_n(T::from_f64(f64::NAN), pad));
            self.staging.push(T::from_f64(lr));
            self.staging.push(T::from_f64(step as f64));
            rows.push(Planned {
                chunk: p.next + j,
                step,
                lr_bits: lr.to_bits(),
            });
        }
        let m = rows.len();
        if m == 0 {
            return Ok(());
        }
        self.planned[r..r + m].fill(None);
        b.upload_into(&self.staging, &self.table.narrow(0, r, m)?)?;
        for (j, row) in rows.into_iter().enumerate() {
            self.planned[r + j] = Some(row);
        }
        Ok(())
    }

    /// Uploads step `s`'s own row: its shard's indices, then `[lr, t]`.
    fn put_own(&mut self, b: &B, s: &StepRow<'_>) -> Result<()> {
        let row = self
            .table
            .narrow(0, s.window_row, 1)?
            .reshape(&[self.stride + 2])?;
        let Some(mine) = s.rows.get(s.local.clone()) else {
            return Err(GradError::BadInput(format!(
                "internal: shard {:?} of a step of {} rows",
                s.local,
                s.rows.len()
            )));
        };
        if !mine.is_empty() {
            self.staging.clear();
            self.staging
                .extend(mine.iter().map(|&i| T::from_f64(i as f64)));
            b.upload_into(&self.staging, &row.narrow(0, 0, mine.len())?)?;
        }
        let slot = [T::from_f64(s.lr), T::from_f64(s.step as f64)];
        b.upload_into(&slot, &row.narrow(0, self.stride, 2)?)?;
        Ok(())
    }
}

/// A step's views of the table (see [`StepTable::views`]).
pub(super) struct StepViews<B: Ops<T>, T: Element> {
    pub table: BTensor<B, T>,
    pub lr_t: BTensor<B, T>,
    pub slot: BTensor<B, T>,
}

#[cfg(test)]
mod tests {
    use super::{StepTable, step_table_bytes};
    use zcompute::CpuBackend;

    /// What `step_table_bytes` counts is what the table holds.
    #[test]
    fn the_table_holds_what_its_bytes_count() {
        for (every, stride) in [(1, 0), (1, 256), (32, 128), (7, 3)] {
            let t = StepTable::<CpuBackend, f32>::new(&CpuBackend, every, stride).expect("table");
            let elems = t.table.numel() + t.slot.numel();
            assert_eq!(
                step_table_bytes(every, stride, 4),
                elems as u64 * 4,
                "{every} x {stride}"
            );
        }
    }
}
