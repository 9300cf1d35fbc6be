//! A training step's tail after its loss and gradient norm, composed from the op set
//! (`Backend::step_tail`'s provided body; the CUDA backend runs it as one kernel).

use crate::backend::{Backend, HistoryRows};
use crate::element::Element;
use crate::error::Result;
use crate::tensor::Tensor;

/// `stats = [loss, norm]`, the finiteness gate, its fold into `sticky`, the history row: the
/// ops `Backend::step_tail` names, in its order.
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
