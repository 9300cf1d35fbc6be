//! The selection family: [`SelectOps`], the ops a model reaches for beyond a layer's fused
//! kernels: choosing elementwise between two tensors by a mask (`where`, masked fill),
//! joining tensors along an axis, the index of each row's maximum, and an embedding table's
//! rows gathered by index with the deterministic scatter-add of their gradient.
//!
//! Indices are elements of the tensors' own type (as [`SelectOps::gather_rows`]'s): an index
//! names a row only if it is a whole number in `[0, rows)`, exact in f32 below 2^24.
//! `concat` is provided as the composite of the primitives (one strided copy per part);
//! `select`, `argmax` and `index_add_rows` need a kernel of their own (`kernels/select.cu`).

use crate::backend::{BTensor, Backend};
use crate::element::Element;
use crate::error::Result;
use crate::validate;

/// Selection, joining and indexed rows. `gather_rows`, `concat` and `embedding` are provided
/// composites; a
/// backend implements `select`, `argmax` and `index_add_rows` (the CPU backend as loops, the
/// CUDA backend with one launch each).
pub trait SelectOps<T: Element>: Backend<T> {
    /// `cond != 0 ? a : b` elementwise, the three broadcast together (NumPy's rules): torch's
    /// `where(cond, a, b)` with a float mask. A NaN in `cond` gives NaN (a mask that is not a
    /// mask is visible, never read as either side). Infinite `a` or `b` pass through exactly
    /// (`masked_fill` with `-inf`).
    fn select(
        &self,
        cond: &BTensor<Self, T>,
        a: &BTensor<Self, T>,
        b: &BTensor<Self, T>,
    ) -> Result<BTensor<Self, T>>;

    /// The index of the first maximum along the last axis (a NaN counts as the maximum, as
    /// `torch.argmax`), as a whole number of the element type: shape `x.shape()[..rank-1]`.
    /// Refused over an empty last axis. No gradient flows through it.
    fn argmax(&self, x: &BTensor<Self, T>) -> Result<BTensor<Self, T>>;

    /// `dst[index[i]] += src[i]` for `i = 0, 1, .., n - 1` in that order (`dst` dense
    /// `[rows, ...]`, `src` dense with `n` rows of `dst`'s row length, `index` `n` elements,
    /// no two sharing storage): the backward of [`SelectOps::embedding`], deterministic on every
    /// backend (the CUDA kernel gives each element of `dst` to one thread, which adds its rows
    /// in index order: no atomics). An index naming no row: the CPU backend refuses it with
    /// `IndexOutOfRange` before writing anything; a device backend, which reads the indices
    /// only when the op runs, adds nothing for it (the forward gathered a row of NaN there, so
    /// the loss is already NaN).
    fn index_add_rows(
        &self,
        src: &BTensor<Self, T>,
        index: &BTensor<Self, T>,
        dst: &BTensor<Self, T>,
    ) -> Result<()>;

    /// Copies rows `index[0], index[1], ..` of `src` (dense `[rows, ...]`) into `dst` (dense,
    /// `index.numel()` rows' elements, any shape), the indices read from memory when the op
    /// runs (on every replay of a captured graph): how a trainer gathers a step's shuffled
    /// samples from a device-resident data set, and [`SelectOps::embedding`]'s gather. Each
    /// index follows [`Backend::gather_row`]'s rule (a value naming no row gives a row of
    /// NaN). No two operands may share storage. The provided body is one `gather_row` per row;
    /// a device backend does it in one launch.
    fn gather_rows(
        &self,
        src: &BTensor<Self, T>,
        index: &BTensor<Self, T>,
        dst: &BTensor<Self, T>,
    ) -> Result<()> {
        let (table, n) = validate::indexed_rows("gather_rows", src, dst, index)?;
        let dst = dst.reshape(&[n, table.row_len])?;
        let index = index.reshape(&[n])?;
        for i in 0..n {
            self.gather_row(src, &index.narrow(0, i, 1)?, &dst.narrow(0, i, 1)?)?;
        }
        Ok(())
    }

    /// Rows of `table` (`[rows, ...]`, dense) picked by `index` (any shape): the result has
    /// shape `index.shape() ++ table.shape()[1..]`. An index naming no row gives a row of NaN
    /// on a device backend ([`SelectOps::gather_rows`]' rule: never a silent read of another
    /// row); the CPU backend refuses it with `IndexOutOfRange`.
    fn embedding(
        &self,
        table: &BTensor<Self, T>,
        index: &BTensor<Self, T>,
    ) -> Result<BTensor<Self, T>> {
        let shape = validate::embedding(table, index)?;
        let out = self.zeros(&shape)?;
        let index = if index.is_contiguous() {
            index.clone()
        } else {
            self.contiguous(index)?
        };
        self.gather_rows(table, &index, &out)?;
        Ok(out)
    }

    /// `parts` joined along `axis` (every part of the same rank, equal sizes on the other
    /// axes): torch's `cat`. Provided as one strided copy of each part into its window of the
    /// result.
    fn concat(&self, parts: &[&BTensor<Self, T>], axis: usize) -> Result<BTensor<Self, T>> {
        let shape = validate::concat(parts, axis)?;
        let out = self.zeros(&shape)?;
        let mut start = 0;
        for p in parts {
            let len = p.shape()[axis];
            if len > 0 {
                self.copy_into(p, &out.narrow(axis, start, len)?)?;
            }
            start += len;
        }
        Ok(out)
    }
}
