//! Adding a node's parameter gradients into the parameters' buffers. A model's gradient
//! buffers are views of one flat buffer, and an op that computes several small parameter
//! gradients at once may return them as views of one result (attention's four QK-norm
//! gradients, the head's weight and bias): where consecutive contributions are adjacent in
//! their source buffer and their destinations adjacent in theirs, in the same order, one
//! `add_into` over the spanned range adds them all (one launch instead of one each; the same
//! element-wise additions, so the same bits).

use crate::error::Result;
use zcompute::{BTensor, Element, Layout, Storage, Tensor, prelude::*};

/// A parameter's gradient buffer and a contribution to add into it.
pub(crate) type LeafGrad<'a, S> = (&'a Tensor<S>, Tensor<S>);

/// Adds each `(buffer, contribution)` pair's contribution into its buffer, in order; runs of
/// adjacent pairs (see the module's docs) as one `add_into`.
pub(crate) fn accumulate_leaves<B: Ops<T>, T: Element>(
    b: &B,
    pairs: &[LeafGrad<'_, B::Storage>],
) -> Result<()> {
    let mut start = 0;
    while start < pairs.len() {
        let mut end = start + 1;
        if dense_pair(&pairs[start]) {
            while end < pairs.len() && follows(&pairs[end - 1], &pairs[end]) {
                end += 1;
            }
        }
        match &pairs[start..end] {
            [(buf, g)] => accumulate_leaf(b, buf, g)?,
            run => add_run(b, run)?,
        }
        start = end;
    }
    Ok(())
}

/// A contribution shaped as its buffer, both dense and non-empty, in different memory.
fn dense_pair<S: Storage>((buf, g): &LeafGrad<'_, S>) -> bool {
    buf.shape() == g.shape()
        && buf.numel() > 0
        && buf.is_contiguous()
        && g.is_contiguous()
        && !g.shares_storage(buf)
}

/// Whether `next` continues `prev` in both buffers: its contribution starts where `prev`'s
/// ends in the same source, its buffer where `prev`'s ends in the same gradient buffer.
fn follows<S: Storage>(prev: &LeafGrad<'_, S>, next: &LeafGrad<'_, S>) -> bool {
    let end = |t: &Tensor<S>| t.layout().offset() + t.numel();
    dense_pair(next)
        && next.1.shares_storage(&prev.1)
        && next.0.shares_storage(prev.0)
        && next.1.layout().offset() == end(&prev.1)
        && next.0.layout().offset() == end(prev.0)
}

/// One `add_into` over the range a run of adjacent pairs spans.
fn add_run<B: Ops<T>, T: Element>(b: &B, run: &[LeafGrad<'_, B::Storage>]) -> Result<()> {
    let total: usize = run.iter().map(|(buf, _)| buf.numel()).sum();
    let span = |t: &BTensor<B, T>| -> Result<BTensor<B, T>> {
        let layout = Layout::new(&[total], &[1], t.layout().offset())?;
        Ok(Tensor::from_parts(t.storage().clone(), layout)?)
    };
    let (buf, g) = &run[0];
    b.add_into(&span(g)?, &span(buf)?)?;
    Ok(())
}

/// Adds `g` into a parameter's persistent gradient buffer, in place.
pub(crate) fn accumulate_leaf<B: Ops<T>, T: Element>(
    b: &B,
    buf: &BTensor<B, T>,
    g: &BTensor<B, T>,
) -> Result<()> {
    // The usual case: a contribution shaped as the buffer adds in place (one launch on the
    // device). A broadcastable one goes through a sum shaped as the buffer.
    if g.shape() == buf.shape() && !g.shares_storage(buf) {
        b.add_into(g, buf)?;
        return Ok(());
    }
    let sum = b.add(buf, g)?;
    if sum.shape() != buf.shape() {
        return Err(zcompute::ComputeError::ShapeMismatch {
            op: "gradient accumulation",
            lhs: buf.shape().into(),
            rhs: g.shape().into(),
        }
        .into());
    }
    b.copy_into(&sum, buf)?;
    Ok(())
}
