//! What a gated step is made of as the executor's door runs it (`batched.rs`, `queued.rs`,
//! `resident.rs`): the request ([`GatedStep`]), where its rows come from ([`GatedRows`]), and
//! the read-back of its `[loss, norm]` stats. Plain values and one function over the step's
//! parts, below the trainer that builds and runs them.

use super::body::{Gather, StepParts};
use super::checks;
use super::executor::GraphKey;
use super::queued::Track;
use super::source::ReplayMark;
use crate::batch::Shard;
use crate::error::Result;
use crate::model::Model;
use zcompute::{BTensor, Element, prelude::*};

/// A gated step as the door runs it.
pub(super) struct GatedStep<'a, 'm, B: Ops<T>, T: Element> {
    pub key: GraphKey,
    /// Names the step in the fallback's warning.
    pub what: &'static str,
    pub step: u64,
    /// `Some(lr)`: the optimiser's slot `[lr, t]` is written first; `None`: the rows' gather
    /// writes it (a step on the device data set).
    pub lr: Option<f64>,
    pub rows: GatedRows<'a, B, T>,
    /// Called just before and just after the replay is queued (`StepSource::held`).
    pub mark: Mark<'m>,
    /// A queued step's window (the history row and the sticky gate); `None`: read back at once.
    pub track: Option<&'a Track<B, T>>,
    /// `[rows, ..sample]` and the targets' shape.
    pub shape: &'a [usize],
    pub target: &'a [usize],
}

/// Called just before and just after a held step's replay is queued (`StepSource::held`).
pub(super) type Mark<'m> = Option<&'m mut dyn FnMut(ReplayMark)>;

/// Where a gated step's rows come from.
pub(super) enum GatedRows<'a, B: Ops<T>, T: Element> {
    /// This rank's rows of a batch (host slices, pinned memory, a landing buffer), uploaded
    /// into the step's inputs.
    Shard(&'a Shard<'a, B, T>),
    /// Gathered on the device by the body itself.
    Gathered(&'a GatheredRows<B, T>),
    /// The static inputs as the last step filled them (`StepSource::held`): replayed only.
    Held,
}

/// Rows gathered from the device data set, and the step table's `[lr, t, gate]` slot.
pub(super) struct GatheredRows<B: Ops<T>, T: Element> {
    pub gather: Gather<B, T>,
    pub slot: BTensor<B, T>,
}

/// Reads `[loss, norm]` back and refuses non-finite values.
pub(super) fn read_stats<B: Ops<T>, T: Element, M: Model<B, T>>(
    b: &B,
    parts: &StepParts<B, T, M>,
    step: u64,
) -> Result<(f64, f64)> {
    let s = b.download(&parts.stats)?;
    let (loss, norm) = (s[0].to_f64(), s[1].to_f64());
    checks::finite(step, loss, norm)?;
    Ok((loss, norm))
}
