//! The trainer's optimiser, AdamW or SGD, behind one type: [`Optimizer`] (the host side: step
//! count, slot, export and import) and [`OptimizerTensors`] (the device side a step body
//! holds: `apply`, the gate). Both optimisers keep their learning rate, step count and gate in
//! the same `[lr, t, gate]` slot layout, so the trainer's paths (batched, per-sample, queued,
//! captured, data parallel) and the step table's per-step slot are the same for both.

use super::adamw::{AdamW, AdamWState, AdamWTensors};
use super::sgd::{Sgd, SgdState, SgdTensors};
use crate::error::{Applied, GradError, Result};
use crate::var::Var;
use zcompute::{ADAMW_SLOT_GATE, BTensor, Element, prelude::*};

/// Which optimiser, as a checkpoint records it (`zgrad.optimizer`) and a load checks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptimizerKind {
    AdamW,
    /// SGD, with momentum buffers or without.
    Sgd {
        momentum: bool,
    },
}

impl OptimizerKind {
    /// The name a checkpoint's metadata holds.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            OptimizerKind::AdamW => "adamw",
            OptimizerKind::Sgd { .. } => "sgd",
        }
    }

    /// The state slots a checkpoint stores per parameter (`optim.<slot>.<name>`).
    #[must_use]
    pub fn slots(self) -> &'static [&'static str] {
        match self {
            OptimizerKind::AdamW => &["m", "v"],
            OptimizerKind::Sgd { momentum: true } => &["momentum_buffer"],
            OptimizerKind::Sgd { momentum: false } => &[],
        }
    }
}

/// An optimiser's state on the host, for checkpoints.
#[derive(Clone, Debug, PartialEq)]
pub enum OptimizerState<T> {
    AdamW(AdamWState<T>),
    Sgd(SgdState<T>),
}

impl<T> OptimizerState<T> {
    /// The step count.
    #[must_use]
    pub fn step(&self) -> u64 {
        match self {
            OptimizerState::AdamW(s) => s.step,
            OptimizerState::Sgd(s) => s.step,
        }
    }

    /// Which optimiser it belongs to.
    #[must_use]
    pub fn kind(&self) -> OptimizerKind {
        match self {
            OptimizerState::AdamW(_) => OptimizerKind::AdamW,
            OptimizerState::Sgd(s) => OptimizerKind::Sgd {
                momentum: !s.buffers.is_empty(),
            },
        }
    }
}

impl<T> From<AdamWState<T>> for OptimizerState<T> {
    fn from(s: AdamWState<T>) -> Self {
        OptimizerState::AdamW(s)
    }
}

impl<T> From<SgdState<T>> for OptimizerState<T> {
    fn from(s: SgdState<T>) -> Self {
        OptimizerState::Sgd(s)
    }
}

/// The device side of the trainer's optimiser. Cloning shares the tensors.
pub enum OptimizerTensors<B: Ops<T>, T: Element> {
    AdamW(AdamWTensors<B, T>),
    Sgd(SgdTensors<B, T>),
}

impl<B: Ops<T>, T: Element> Clone for OptimizerTensors<B, T> {
    fn clone(&self) -> Self {
        match self {
            OptimizerTensors::AdamW(t) => OptimizerTensors::AdamW(t.clone()),
            OptimizerTensors::Sgd(t) => OptimizerTensors::Sgd(t.clone()),
        }
    }
}

impl<B: Ops<T>, T: Element> std::fmt::Debug for OptimizerTensors<B, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OptimizerTensors::AdamW(t) => t.fmt(f),
            OptimizerTensors::Sgd(t) => t.fmt(f),
        }
    }
}

impl<B: Ops<T>, T: Element> OptimizerTensors<B, T> {
    /// The `[lr, t, gate]` slot the update reads.
    #[must_use]
    pub fn slot(&self) -> &BTensor<B, T> {
        match self {
            OptimizerTensors::AdamW(t) => &t.slot,
            OptimizerTensors::Sgd(t) => &t.slot,
        }
    }

    /// The same state reading its slot from `slot` (a queued step's, in the step table).
    pub(crate) fn with_slot(&self, slot: BTensor<B, T>) -> Self {
        match self {
            OptimizerTensors::AdamW(t) => OptimizerTensors::AdamW(t.with_slot(slot)),
            OptimizerTensors::Sgd(t) => OptimizerTensors::Sgd(t.with_slot(slot)),
        }
    }

    /// One fused update of every parameter: kernels only, legal inside a capture.
    pub fn apply(&self, b: &B, params: &[Var<B, T>]) -> Result<()> {
        self.apply_tracked(b, params).map_err(|(_, e)| e)
    }

    /// `apply`, saying on failure whether any update may have reached the model.
    #[allow(clippy::result_large_err)]
    pub fn apply_tracked(
        &self,
        b: &B,
        params: &[Var<B, T>],
    ) -> std::result::Result<(), (Applied, GradError)> {
        match self {
            OptimizerTensors::AdamW(t) => t.apply_tracked(b, params),
            OptimizerTensors::Sgd(t) => t.apply_tracked(b, params),
        }
    }

    /// The slot's gate element, as a one-element view.
    pub fn gate(&self) -> Result<BTensor<B, T>> {
        Ok(self.slot().narrow(0, ADAMW_SLOT_GATE, 1)?)
    }

    /// Writes the gate of a captured step: 0 when `loss` and `norm` are finite, NaN
    /// otherwise (the update then skips itself on the device). One launch.
    pub fn write_gate(&self, b: &B, loss: &BTensor<B, T>, norm: &BTensor<B, T>) -> Result<()> {
        b.finite_gate(loss, norm, &self.gate()?)?;
        Ok(())
    }
}

/// The trainer's optimiser: AdamW (the default) or SGD.
#[derive(Debug)]
pub enum Optimizer<B: Ops<T>, T: Element> {
    AdamW(AdamW<B, T>),
    Sgd(Sgd<B, T>),
}

/// The same call on whichever optimiser it is.
macro_rules! either {
    ($self:expr, $o:ident => $call:expr) => {
        match $self {
            Optimizer::AdamW($o) => $call,
            Optimizer::Sgd($o) => $call,
        }
    };
}

impl<B: Ops<T>, T: Element> Optimizer<B, T> {
    /// Which optimiser this is.
    #[must_use]
    pub fn kind(&self) -> OptimizerKind {
        match self {
            Optimizer::AdamW(_) => OptimizerKind::AdamW,
            Optimizer::Sgd(s) => OptimizerKind::Sgd {
                momentum: s.hyper().momentum != 0.0,
            },
        }
    }

    /// Steps taken so far.
    #[must_use]
    pub fn step_count(&self) -> u64 {
        either!(self, o => o.step_count())
    }

    /// The device tensors (a clone sharing them), for a step body.
    #[must_use]
    pub fn tensors(&self) -> OptimizerTensors<B, T> {
        match self {
            Optimizer::AdamW(o) => OptimizerTensors::AdamW(o.tensors()),
            Optimizer::Sgd(o) => OptimizerTensors::Sgd(o.tensors()),
        }
    }

    /// The step a failure left of unknown state, if any.
    #[must_use]
    pub fn unknown_step(&self) -> Option<u64> {
        either!(self, o => o.unknown_step())
    }

    /// Refuses with `StateUnknown` while a failed step left the state unknown.
    pub fn check_state(&self) -> Result<()> {
        either!(self, o => o.check_state())
    }

    /// Writes `[lr, t, 0]` for the next step into the slot (outside a capture).
    pub fn prepare(&mut self, b: &B, lr: f64) -> Result<()> {
        either!(self, o => o.prepare(b, lr))
    }

    /// Counts the prepared step.
    pub fn commit(&mut self) {
        either!(self, o => o.commit());
    }

    /// Records that the next step failed after its update may have started.
    pub fn mark_unknown(&mut self) {
        either!(self, o => o.mark_unknown());
    }

    pub(crate) fn mark_unknown_at(&mut self, step: u64) {
        either!(self, o => o.mark_unknown_at(step));
    }

    pub(crate) fn rewind(&mut self, step: u64) {
        either!(self, o => o.rewind(step));
    }

    /// One eager step (`prepare`, `apply`, `commit`).
    pub fn step(&mut self, b: &B, params: &[Var<B, T>], lr: f64) -> Result<()> {
        either!(self, o => o.step(b, params, lr))
    }

    /// Copies the state to the host for a checkpoint; `names` label the parameters.
    pub fn export(&self, b: &B, names: &[String]) -> Result<OptimizerState<T>> {
        Ok(match self {
            Optimizer::AdamW(o) => o.export(b, names)?.into(),
            Optimizer::Sgd(o) => o.export(b, names)?.into(),
        })
    }

    /// Whether `state` fits this optimiser (`import` would take it): another optimiser's state
    /// is an `OptimizerMismatch`, a buffer of another count or shape a `BadInput`. Writes
    /// nothing.
    pub fn check(&self, state: &OptimizerState<T>) -> Result<()> {
        match (self, state) {
            (Optimizer::AdamW(o), OptimizerState::AdamW(s)) => o.check(s),
            (Optimizer::Sgd(o), OptimizerState::Sgd(s)) => o.check(s),
            (me, _) => Err(GradError::OptimizerMismatch {
                file: "an optimiser state".to_string(),
                saved: state.kind().name().to_string(),
                now: me.kind().name().to_string(),
            }),
        }
    }

    /// Restores a state exported by `export` of the same optimiser; one that does not fit
    /// (`check`) changes nothing.
    pub fn import(&mut self, b: &B, state: &OptimizerState<T>) -> Result<()> {
        match (self, state) {
            (Optimizer::AdamW(o), OptimizerState::AdamW(s)) => o.import(b, s),
            (Optimizer::Sgd(o), OptimizerState::Sgd(s)) => o.import(b, s),
            (me, _) => me.check(state),
        }
    }
}
