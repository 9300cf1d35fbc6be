//! The training-step family: [`StepOps`], the ops a training step is made of beyond its
//! model's layers: finding its rows in a step table by a cursor in device memory, writing a
//! result into a slot of a larger buffer, and its tail after the loss and gradient norm (the
//! stats, AdamW's finiteness gate, its sticky fold and the history row). Each is provided as
//! the composite of the primitives; the CUDA backend runs each in one launch
//! (`kernels/indexed.cu`, `kernels/elementwise.cu`, `kernels/flat.cu`).

use crate::backend::{BTensor, Backend, BinaryOp};
use crate::element::Element;
use crate::error::Result;
use crate::select::SelectOps;
use crate::tensor::Tensor;

/// A history table and its cursor ([`StepOps::step_tail`]): rows to write, and the one-element
/// index of the next one.
pub type HistoryRows<'a, S> = (&'a Tensor<S>, &'a Tensor<S>);

/// A training step's own ops. A backend implements what it fuses (the CPU backend: nothing,
/// the composites are its reference; the CUDA backend: each in one launch).
pub trait StepOps<T: Element>: SelectOps<T> {
    /// Copies the rows of `src` (dense `[rows, ...]`) named by the first `n` elements of row
    /// `cursor[0]` of `steps` (dense `[k, width]`) into `dst` (dense, `n = dst.shape()[0]`
    /// rows), and with `tail` (`m` elements, `n + m <= width`) the row's last `m` elements
    /// into `tail`; the cursor and the indices are read from memory when the op runs (on
    /// every replay of a captured graph). How a queued training step finds its samples and its
    /// `[lr, t]` in the row of a step table that its graph's cursor picks, with no upload
    /// between replays. A cursor or an index naming no row ([`Backend::gather_row`]'s rule)
    /// gives NaN. No two operands may share storage. The provided body is `gather_row` of the
    /// picked row into a temporary, then [`SelectOps::gather_rows`] and `copy_into` from it; a
    /// device backend does it in one launch.
    fn gather_rows_at_cursor(
        &self,
        src: &BTensor<Self, T>,
        steps: &BTensor<Self, T>,
        cursor: &BTensor<Self, T>,
        dst: &BTensor<Self, T>,
        tail: Option<&BTensor<Self, T>>,
    ) -> Result<()> {
        let at = crate::validate::indexed_rows_at_cursor(src, steps, cursor, dst, tail)?;
        let width = at.steps.row_len;
        let row = self.zeros(&[width])?;
        self.gather_row(steps, cursor, &row)?;
        self.gather_rows(src, &row.narrow(0, 0, at.n)?, dst)?;
        if let Some(tail) = tail {
            let part = row.narrow(0, width - at.tail, at.tail)?;
            self.copy_into(&part.reshape(tail.shape())?, tail)?;
        }
        Ok(())
    }

    /// A training step's tail after its loss and gradient norm (each one element): `stats =
    /// [loss, norm]` (dense, two elements), then [`Backend::finite_gate`] into `gate`; with
    /// `sticky` (one element), the gate folded into it (`gate += sticky`, then `sticky = gate`:
    /// once a step was not finite every later gate is NaN); with `history` (`(rows, cursor)`),
    /// `stats` written to row `cursor` of `rows` and the cursor advanced
    /// ([`Backend::scatter_row`]). The provided body runs those ops in that order; a device
    /// backend may do it all in one launch (the same values).
    fn step_tail(
        &self,
        [loss, norm]: [&BTensor<Self, T>; 2],
        stats: &BTensor<Self, T>,
        gate: &BTensor<Self, T>,
        sticky: Option<&BTensor<Self, T>>,
        history: Option<HistoryRows<'_, Self::Storage>>,
    ) -> Result<()> {
        step_tail(self, [loss, norm], stats, gate, sticky, history)
    }

    /// `dst = a op b` written into the view `dst` (shaped as the broadcast of `a` and `b`,
    /// other memory than both): a result straight into a slot of a larger buffer, as the
    /// data-parallel step's scaled loss into the gradient buffer's loss slot. The provided body
    /// is [`Backend::binary`] then [`Backend::copy_into`]; a device backend may write `dst` in
    /// the one launch.
    fn binary_into(
        &self,
        op: BinaryOp,
        a: &BTensor<Self, T>,
        b: &BTensor<Self, T>,
        dst: &BTensor<Self, T>,
    ) -> Result<()> {
        crate::validate::binary_into(op, a, b, dst)?;
        let out = self.binary(op, a, b)?;
        self.copy_into(&out, dst)
    }
}

/// `stats = [loss, norm]`, the finiteness gate, its fold into `sticky`, the history row: the
/// ops [`StepOps::step_tail`] names, in its order (its provided body, and the CUDA backend's
/// path for views its kernel cannot address).
pub(crate) fn step_tail<B: Backend<T> + ?Sized, T: Element>(
    b: &B,
    [loss, norm]: [&Tensor<B::Storage>; 2],
    stats: &Tensor<B::Storage>,
    gate: &Tensor<B::Storage>,
    sticky: Option<&Tensor<B::Storage>>,
    history: Option<HistoryRows<'_, B::Storage>>,
) -> Result<()> {
    crate::validate::step_tail([loss, norm], stats, gate, sticky, history)?;
    b.copy_into(&loss.reshape(&[1])?, &stats.narrow(0, 0, 1)?)?;
    b.copy_into(&norm.reshape(&[1])?, &stats.narrow(0, 1, 1)?)?;
    b.finite_gate(loss, norm, gate)?;
    if let Some(sticky) = sticky {
        // gate + sticky is NaN once any step was: later steps are gated off too.
        b.add_into(sticky, gate)?;
        b.copy_into(gate, sticky)?;
    }
    if let Some((rows, cursor)) = history {
        b.scatter_row(stats, cursor, rows, true)?;
    }
    Ok(())
}
