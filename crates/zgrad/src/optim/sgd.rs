//! SGD with momentum, dampening, Nesterov and coupled weight decay: PyTorch's
//! `torch.optim.SGD` exactly (the buffer is the first step's direction, undampened; Nesterov
//! needs momentum and no dampening). The update is the backend's fused `OptimOps::sgd_step`,
//! one launch over the flat parameter, gradient and momentum buffers of a [`ParameterSet`]
//! (one per run of one parameter group with [`DecayGroups::Matrices`]), one per parameter
//! otherwise. As AdamW's, the learning rate, step count and gate live in a `[lr, t, gate]`
//! slot the kernel reads from device memory (`prepare` writes it, `apply` only launches), so a
//! captured step follows a schedule on every replay and can skip itself with its gate; the
//! step count also tells the kernel the first step (`t = 1`: the buffer starts as `d`).
//!
//! The step bookkeeping is AdamW's (`book::StepBook`): the count moves only once an update was queued
//! (`commit`), and a failure after the first update kernel leaves the state unknown until
//! `import` restores it.

use super::adamw::DecayGroups;
use super::book::{StepBook, step_book_methods};
use super::flat::ParameterSet;
use crate::error::{Applied, GradError, Result};
use crate::memory::ClassGuard;
use crate::var::Var;
use zcompute::{AllocClass, BTensor, Element, SgdConfig, prelude::*};

/// SGD's hyper-parameters (PyTorch's names; the learning rate is the trainer's).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdHyper {
    pub momentum: f64,
    pub dampening: f64,
    pub nesterov: bool,
    pub weight_decay: f64,
    /// Which parameters the weight decay applies to (AdamW's groups).
    pub decay: DecayGroups,
}

impl Default for SgdHyper {
    /// PyTorch's defaults: plain SGD (no momentum, no dampening, no weight decay).
    fn default() -> Self {
        SgdHyper {
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
            decay: DecayGroups::All,
        }
    }
}

impl SgdHyper {
    /// Refuses what `torch.optim.SGD` refuses (a negative momentum, dampening or weight decay;
    /// Nesterov without momentum or with dampening) and non-finite values, as `Config`.
    pub fn check(&self) -> Result<()> {
        let named = [
            ("momentum", self.momentum),
            ("dampening", self.dampening),
            ("weight_decay", self.weight_decay),
        ];
        if let Some((name, v)) = named.iter().find(|(_, v)| !(v.is_finite() && *v >= 0.0)) {
            return Err(GradError::Config(format!(
                "SGD: {name} {v} is invalid (a finite value >= 0)"
            )));
        }
        if self.nesterov && (self.momentum <= 0.0 || self.dampening != 0.0) {
            return Err(GradError::Config(format!(
                "SGD: Nesterov momentum requires a momentum and zero dampening (momentum {}, dampening {})",
                self.momentum, self.dampening
            )));
        }
        Ok(())
    }

    fn config<T: Element>(&self, decay: bool) -> SgdConfig<T> {
        SgdConfig {
            momentum: T::from_f64(self.momentum),
            dampening: T::from_f64(self.dampening),
            weight_decay: T::from_f64(if decay { self.weight_decay } else { 0.0 }),
            nesterov: self.nesterov,
        }
    }
}

/// The device side of SGD: the momentum buffers (none without momentum), the `[lr, t, gate]`
/// slot and the constants. Cloning shares the tensors (a capture body holds a clone).
pub struct SgdTensors<B: Ops<T>, T: Element> {
    /// Each parameter's momentum buffer, in parameter order (empty without momentum).
    pub buf: Vec<BTensor<B, T>>,
    pub slot: BTensor<B, T>,
    hyper: SgdHyper,
    /// The set the parameters are views of, when they are.
    flat: Option<FlatBuffer<B, T>>,
    /// Whether each parameter gets the weight decay (`DecayGroups`), in order.
    decays: Vec<bool>,
    params: usize,
}

/// A [`ParameterSet`] and the flat momentum buffer laid out as it (`None` without momentum).
struct FlatBuffer<B: Ops<T>, T: Element> {
    set: ParameterSet<B, T>,
    buf: Option<BTensor<B, T>>,
}

impl<B: Ops<T>, T: Element> Clone for FlatBuffer<B, T> {
    fn clone(&self) -> Self {
        FlatBuffer {
            set: self.set.clone(),
            buf: self.buf.clone(),
        }
    }
}

impl<B: Ops<T>, T: Element> Clone for SgdTensors<B, T> {
    fn clone(&self) -> Self {
        SgdTensors {
            buf: self.buf.clone(),
            slot: self.slot.clone(),
            hyper: self.hyper,
            flat: self.flat.clone(),
            decays: self.decays.clone(),
            params: self.params,
        }
    }
}

impl<B: Ops<T>, T: Element> std::fmt::Debug for SgdTensors<B, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SgdTensors")
            .field("params", &self.params)
            .field("flat", &self.flat.is_some())
            .field("hyper", &self.hyper)
            .finish_non_exhaustive()
    }
}

/// Whether a failed launch may have changed anything (see `AdamWTensors::apply_tracked`).
fn verdict(queued: bool, e: &zcompute::ComputeError) -> Applied {
    if queued || e.is_device_failure() {
        Applied::Maybe
    } else {
        Applied::No
    }
}

impl<B: Ops<T>, T: Element> SgdTensors<B, T> {
    /// The same buffers reading `[lr, t, gate]` from `slot` instead (a queued step's).
    pub(crate) fn with_slot(&self, slot: BTensor<B, T>) -> Self {
        SgdTensors {
            slot,
            ..self.clone()
        }
    }

    /// One fused update of every parameter, reading lr, t and the gate from the slot.
    /// Launches kernels only: legal inside a capture.
    pub fn apply(&self, b: &B, params: &[Var<B, T>]) -> Result<()> {
        self.apply_tracked(b, params).map_err(|(_, e)| e)
    }

    /// `apply`, saying on failure whether any update may have reached the model (as
    /// `AdamWTensors::apply_tracked`).
    #[allow(clippy::result_large_err)]
    pub fn apply_tracked(
        &self,
        b: &B,
        params: &[Var<B, T>],
    ) -> std::result::Result<(), (Applied, GradError)> {
        if params.len() != self.params {
            return Err((
                Applied::No,
                GradError::BadInput(format!(
                    "SGD holds state for {} parameters, got {}",
                    self.params,
                    params.len()
                )),
            ));
        }
        if let Some(flat) = self.flat.as_ref().filter(|f| f.set.holds(params)) {
            self.apply_flat(b, &flat.set, flat.buf.as_ref())?;
            for p in params {
                p.bump_version();
            }
            return Ok(());
        }
        let mut queued = false;
        for (i, p) in params.iter().enumerate() {
            let Some(g) = p.grad() else { continue };
            let cfg = self.hyper.config(self.decays[i]);
            b.sgd_step(p.value(), self.buf.get(i), g, &self.slot, &cfg)
                .map_err(|e| (verdict(queued, &e), e.into()))?;
            queued = true;
            p.bump_version();
        }
        Ok(())
    }

    /// The update over the flat buffers: one launch per run of consecutive parameters of one
    /// group (one launch in all when every parameter decays alike), padding included (zero
    /// gradient, zero parameter and zero buffer stay zero).
    #[allow(clippy::result_large_err)]
    fn apply_flat(
        &self,
        b: &B,
        set: &ParameterSet<B, T>,
        buf: Option<&BTensor<B, T>>,
    ) -> std::result::Result<(), (Applied, GradError)> {
        let offsets = set.offsets();
        let (mut queued, mut start) = (false, 0);
        while start < self.decays.len() {
            let decay = self.decays[start];
            let mut end = start + 1;
            while end < self.decays.len() && self.decays[end] == decay {
                end += 1;
            }
            let from = offsets[start];
            let to = offsets.get(end).copied().unwrap_or(set.len());
            let run = |x: &BTensor<B, T>| x.narrow(0, from, to - from);
            let launched = (|| -> zcompute::Result<()> {
                let buf = buf.map(run).transpose()?;
                let cfg = self.hyper.config(decay);
                b.sgd_step(
                    &run(set.values())?,
                    buf.as_ref(),
                    &run(set.grads())?,
                    &self.slot,
                    &cfg,
                )
            })();
            launched.map_err(|e| (verdict(queued, &e), e.into()))?;
            queued = true;
            start = end;
        }
        Ok(())
    }
}

/// SGD's state on the host, for checkpoints: the step count and each parameter's momentum
/// buffer (none without momentum), in parameter order with the parameter's name.
#[derive(Clone, Debug, PartialEq)]
pub struct SgdState<T> {
    pub step: u64,
    pub buffers: Vec<MomentumBuffer<T>>,
}

/// One parameter's momentum buffer (`torch.optim.SGD`'s `momentum_buffer`).
#[derive(Clone, Debug, PartialEq)]
pub struct MomentumBuffer<T> {
    pub name: String,
    pub shape: Vec<usize>,
    pub buf: Vec<T>,
}

/// SGD over a fixed list of parameters.
pub struct Sgd<B: Ops<T>, T: Element> {
    tensors: SgdTensors<B, T>,
    book: StepBook,
}

impl<B: Ops<T>, T: Element> std::fmt::Debug for Sgd<B, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sgd")
            .field("step", &self.book.count())
            .field("unknown", &self.book.unknown())
            .field("tensors", &self.tensors)
            .finish()
    }
}

impl<B: Ops<T>, T: Element> Sgd<B, T> {
    /// Zero momentum buffers (persistent; none without momentum) and a slot. When `params`
    /// are a [`ParameterSet`]'s views the buffers are views of one flat buffer laid out as the
    /// set's. Refuses what `torch.optim.SGD` refuses (`SgdHyper::check`).
    pub fn new(b: &B, params: &[Var<B, T>], hyper: SgdHyper) -> Result<Self> {
        hyper.check()?;
        let _class = ClassGuard::new(b, AllocClass::Persistent);
        let momentum = hyper.momentum != 0.0;
        let (buf, flat) = match ParameterSet::of(params) {
            Some(set) if momentum => {
                let fb = b.zeros(&[set.len()])?;
                let views = set.views_of(&fb)?;
                (views, Some(FlatBuffer { set, buf: Some(fb) }))
            }
            Some(set) => (Vec::new(), Some(FlatBuffer { set, buf: None })),
            None if momentum => (
                params
                    .iter()
                    .map(|p| b.zeros(p.shape()))
                    .collect::<zcompute::Result<Vec<_>>>()?,
                None,
            ),
            None => (Vec::new(), None),
        };
        let decays = params
            .iter()
            .map(|p| hyper.decay.decays(p.shape()))
            .collect();
        Ok(Sgd {
            tensors: SgdTensors {
                buf,
                slot: b.zeros(&[3])?,
                hyper,
                flat,
                decays,
                params: params.len(),
            },
            book: StepBook::default(),
        })
    }

    /// The hyper-parameters.
    #[must_use]
    pub fn hyper(&self) -> &SgdHyper {
        &self.tensors.hyper
    }

    /// The device tensors (a clone sharing them), for a capture body.
    #[must_use]
    pub fn tensors(&self) -> SgdTensors<B, T> {
        self.tensors.clone()
    }

    step_book_methods!();

    /// Copies the state to the host; `names` label the parameters in order.
    pub fn export(&self, b: &B, names: &[String]) -> Result<SgdState<T>> {
        let buffers = self
            .tensors
            .buf
            .iter()
            .enumerate()
            .map(|(i, buf)| {
                Ok(MomentumBuffer {
                    name: names.get(i).cloned().unwrap_or_else(|| format!("param{i}")),
                    shape: buf.shape().to_vec(),
                    buf: b.download(buf)?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(SgdState {
            step: self.book.count(),
            buffers,
        })
    }

    /// Whether `state` fits this optimiser (one buffer per parameter with momentum, none
    /// without; shapes in parameter order): `BadInput` naming the first that does not. Writes
    /// nothing.
    pub fn check(&self, state: &SgdState<T>) -> Result<()> {
        if state.buffers.len() != self.tensors.buf.len() {
            return Err(GradError::BadInput(format!(
                "SGD state has {} momentum buffers, this optimiser {} (momentum {})",
                state.buffers.len(),
                self.tensors.buf.len(),
                self.tensors.hyper.momentum
            )));
        }
        for (saved, buf) in state.buffers.iter().zip(&self.tensors.buf) {
            let numel = buf.shape().iter().product::<usize>();
            if saved.shape.as_slice() != buf.shape() || saved.buf.len() != numel {
                return Err(GradError::BadInput(format!(
                    "momentum buffer of `{}` has shape {:?} ({} values), the parameter {:?}",
                    saved.name,
                    saved.shape,
                    saved.buf.len(),
                    buf.shape()
                )));
            }
        }
        Ok(())
    }

    /// Restores a state exported by `export` (checked whole by `check` before anything is
    /// written). A failure while writing leaves the state unknown.
    pub fn import(&mut self, b: &B, state: &SgdState<T>) -> Result<()> {
        self.check(state)?;
        for (saved, buf) in state.buffers.iter().zip(&self.tensors.buf) {
            if let Err(e) = b.upload_into(&saved.buf, buf) {
                self.book.import_failed();
                return Err(e.into());
            }
        }
        self.book.imported(state.step);
        Ok(())
    }
}
