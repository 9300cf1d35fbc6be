//! AdamW through the backend's fused `adamw_step`: one launch over the flat parameter,
//! gradient and moment buffers when the parameters are a [`ParameterSet`]'s views (every
//! `XAsset`'s), one per parameter otherwise (the CPU backend's loop is the reference). The
//! weight decay applies to every parameter, as docs/xasset.md's AdamW does; the flat buffers'
//! padding stays zero under it (zero gradient, zero moments, zero parameter). The learning rate, step count and gate live in a
//! persistent `[lr, t, gate]` slot tensor that the kernel reads from memory: `prepare` writes
//! it before a step, `apply` only launches kernels, so a captured `apply` stays correct on
//! every replay, and a captured step can skip its own update by writing a non-zero gate.
//!
//! The step count moves only once a step's update was queued without error (`commit`): a step
//! that fails before any update kernel leaves `t`, the moments and the parameters as they were,
//! so retrying it matches a run that never failed. A failure after the first update kernel was
//! queued leaves the state unknown; the optimiser then refuses to step until `import` restores
//! it.

use super::book::{StepBook, step_book_methods};
use super::flat::ParameterSet;
use crate::error::{Applied, GradError, Result};
use crate::memory::ClassGuard;
use crate::var::Var;
use zcompute::{ADAMW_SLOT_GATE, AdamWConfig, AllocClass, BTensor, Element, prelude::*};

/// AdamW's constant hyper-parameters (docs/xasset.md's values by default).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWHyper {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// Which parameters the weight decay applies to (every one by default, as XASSET.md's).
    pub decay: DecayGroups,
}

/// AdamW's parameter groups: which parameters get the weight decay (the others get 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DecayGroups {
    /// Every parameter (XASSET.md's AdamW).
    #[default]
    All,
    /// Parameters of rank 2 or more only (linear layers' weights, embeddings): biases and
    /// norms' scales and shifts (rank 1 or 0) get none, the common choice (as PyTorch users
    /// group parameters by `p.ndim < 2`).
    Matrices,
}

impl DecayGroups {
    /// Whether a parameter of `shape` gets the weight decay.
    #[must_use]
    pub fn decays(self, shape: &[usize]) -> bool {
        match self {
            DecayGroups::All => true,
            DecayGroups::Matrices => shape.len() >= 2,
        }
    }
}

impl Default for AdamWHyper {
    fn default() -> Self {
        AdamWHyper {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            decay: DecayGroups::All,
        }
    }
}

/// The device side of AdamW: moments, the `[lr, t]` slot and the constants. Cloning shares the
/// tensors (a capture body holds a clone). Over a [`ParameterSet`] the moments are views of two
/// flat buffers laid out as the set's (`flat`).
pub struct AdamWTensors<B: Ops<T>, T: Element> {
    /// First moment of each parameter, in parameter order.
    pub m: Vec<BTensor<B, T>>,
    /// Second moment of each parameter, in parameter order.
    pub v: Vec<BTensor<B, T>>,
    pub slot: BTensor<B, T>,
    pub config: AdamWConfig<T>,
    flat: Option<FlatMoments<B, T>>,
    /// Parameter groups (`DecayGroups`), when some parameters get no weight decay: whether
    /// each parameter does, in order (`None`: every one does).
    decays: Option<Vec<bool>>,
}

/// The flat moment buffers beside the set they follow.
struct FlatMoments<B: Ops<T>, T: Element> {
    set: ParameterSet<B, T>,
    m: BTensor<B, T>,
    v: BTensor<B, T>,
}

impl<B: Ops<T>, T: Element> Clone for FlatMoments<B, T> {
    fn clone(&self) -> Self {
        FlatMoments {
            set: self.set.clone(),
            m: self.m.clone(),
            v: self.v.clone(),
        }
    }
}

impl<B: Ops<T>, T: Element> Clone for AdamWTensors<B, T> {
    fn clone(&self) -> Self {
        AdamWTensors {
            m: self.m.clone(),
            v: self.v.clone(),
            slot: self.slot.clone(),
            config: self.config,
            flat: self.flat.clone(),
            decays: self.decays.clone(),
        }
    }
}

impl<B: Ops<T>, T: Element> std::fmt::Debug for AdamWTensors<B, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdamWTensors")
            .field("params", &self.m.len())
            .field("flat", &self.flat.is_some())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<B: Ops<T>, T: Element> AdamWTensors<B, T> {
    /// The same moments reading `[lr, t, gate]` from `slot` (three elements) instead: a step
    /// whose slot is written with its other inputs (the step table's slot of a queued step on
    /// the device data set).
    pub(crate) fn with_slot(&self, slot: BTensor<B, T>) -> Self {
        AdamWTensors {
            slot,
            ..self.clone()
        }
    }

    /// One fused update of every parameter from its gradient, reading lr, t and the gate from
    /// the slot. Launches kernels only (no host transfer): legal inside a capture.
    pub fn apply(&self, b: &B, params: &[Var<B, T>]) -> Result<()> {
        self.apply_tracked(b, params).map_err(|(_, e)| e)
    }

    /// `apply`, saying on failure whether any update may have reached the model: `No` when the
    /// error came before the first update kernel was queued (bad input, or the first launch
    /// refused before it was queued), `Maybe` otherwise. Over the flat buffers of the set the
    /// moments were made for, one launch; otherwise one per parameter.
    // The pair is the whole failure report of one optimiser step, built only on the error path
    // (once per failed step); boxing it would cost every caller an allocation to read it.
    #[allow(clippy::result_large_err)]
    pub fn apply_tracked(
        &self,
        b: &B,
        params: &[Var<B, T>],
    ) -> std::result::Result<(), (Applied, GradError)> {
        if params.len() != self.m.len() {
            return Err((
                Applied::No,
                GradError::BadInput(format!(
                    "AdamW holds state for {} parameters, got {}",
                    self.m.len(),
                    params.len()
                )),
            ));
        }
        if let (Some(flat), Some(decays)) = (self.flat.as_ref(), self.decays.as_ref())
            && flat.set.holds(params)
        {
            return self.apply_groups(b, flat, decays, params);
        }
        if let Some(flat) = self.flat.as_ref().filter(|f| f.set.holds(params)) {
            let (set, cfg) = (&flat.set, &self.config);
            if let Err(e) =
                b.adamw_step(set.values(), &flat.m, &flat.v, set.grads(), &self.slot, cfg)
            {
                // A device error may come from work already queued: only a refusal of the
                // launch's inputs proves that nothing ran.
                let applied = if e.is_device_failure() {
                    Applied::Maybe
                } else {
                    Applied::No
                };
                return Err((applied, e.into()));
            }
            for p in params {
                p.bump_version();
            }
            return Ok(());
        }
        let mut queued = false;
        for (i, ((p, m), v)) in params.iter().zip(&self.m).zip(&self.v).enumerate() {
            let Some(g) = p.grad() else { continue };
            let cfg = self.config_of(self.decays.as_ref().is_none_or(|d| d[i]));
            if let Err(e) = b.adamw_step(p.value(), m, v, g, &self.slot, &cfg) {
                // A device error may come from work already queued (this kernel's included,
                // for a parameter view copied back after it): only a refusal of the first
                // launch's inputs proves that nothing ran.
                let device = e.is_device_failure();
                let applied = if queued || device {
                    Applied::Maybe
                } else {
                    Applied::No
                };
                return Err((applied, e.into()));
            }
            queued = true;
            p.bump_version();
        }
        Ok(())
    }

    /// The constants of a parameter with (`decay`) or without weight decay.
    fn config_of(&self, decay: bool) -> AdamWConfig<T> {
        if decay {
            self.config
        } else {
            AdamWConfig {
                weight_decay: T::ZERO,
                ..self.config
            }
        }
    }

    /// The update over the flat buffers in parameter groups: one launch per run of
    /// consecutive parameters of one group (views of the flat buffers, padding included).
    #[allow(clippy::result_large_err)]
    fn apply_groups(
        &self,
        b: &B,
        flat: &FlatMoments<B, T>,
        decays: &[bool],
        params: &[Var<B, T>],
    ) -> std::result::Result<(), (Applied, GradError)> {
        let set = &flat.set;
        let offsets = set.offsets();
        let mut queued = false;
        let mut start = 0;
        while start < decays.len() {
            let mut end = start + 1;
            while end < decays.len() && decays[end] == decays[start] {
                end += 1;
            }
            let from = offsets[start];
            let to = offsets.get(end).copied().unwrap_or(set.len());
            let run = |x: &BTensor<B, T>| x.narrow(0, from, to - from);
            let launched = (|| -> zcompute::Result<()> {
                let grads = set.grads().narrow(0, 0, set.len())?;
                b.adamw_step(
                    &run(set.values())?,
                    &run(&flat.m)?,
                    &run(&flat.v)?,
                    &run(&grads)?,
                    &self.slot,
                    &self.config_of(decays[start]),
                )
            })();
            if let Err(e) = launched {
                let applied = if queued || e.is_device_failure() {
                    Applied::Maybe
                } else {
                    Applied::No
                };
                return Err((applied, e.into()));
            }
            queued = true;
            start = end;
        }
        for p in params {
            p.bump_version();
        }
        Ok(())
    }

    /// The slot's gate element (`ADAMW_SLOT_GATE`), as a one-element view.
    pub fn gate(&self) -> Result<BTensor<B, T>> {
        Ok(self.slot.narrow(0, ADAMW_SLOT_GATE, 1)?)
    }

    /// Writes the gate of a captured step: `0 * loss + 0 * norm`, which is 0 when both are
    /// finite and NaN otherwise, so the update kernels skip a non-finite step on the device.
    /// One launch (`Backend::finite_gate`): legal inside a capture.
    pub fn write_gate(&self, b: &B, loss: &BTensor<B, T>, norm: &BTensor<B, T>) -> Result<()> {
        b.finite_gate(loss, norm, &self.slot.narrow(0, ADAMW_SLOT_GATE, 1)?)?;
        Ok(())
    }
}

/// Optimiser state on the host, for checkpoints: step count and both moments per parameter
/// (in parameter order, with the parameter's name).
#[derive(Clone, Debug, PartialEq)]
pub struct AdamWState<T> {
    pub step: u64,
    pub moments: Vec<Moments<T>>,
}

/// Both AdamW moments of one parameter.
#[derive(Clone, Debug, PartialEq)]
pub struct Moments<T> {
    pub name: String,
    pub shape: Vec<usize>,
    pub m: Vec<T>,
    pub v: Vec<T>,
}

/// AdamW over a fixed list of parameters.
pub struct AdamW<B: Ops<T>, T: Element> {
    tensors: AdamWTensors<B, T>,
    book: StepBook,
}

impl<B: Ops<T>, T: Element> std::fmt::Debug for AdamW<B, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdamW")
            .field("step", &self.book.count())
            .field("unknown", &self.book.unknown())
            .field("tensors", &self.tensors)
            .finish()
    }
}

impl<B: Ops<T>, T: Element> AdamW<B, T> {
    /// Zero moments (persistent) for each parameter and a slot tensor. When `params` are a
    /// [`ParameterSet`]'s views, the moments are two flat buffers laid out as the set's, so
    /// each step is one launch.
    pub fn new(b: &B, params: &[Var<B, T>], hyper: AdamWHyper) -> Result<Self> {
        let _class = ClassGuard::new(b, AllocClass::Persistent);
        let (m, v, flat) = match ParameterSet::of(params) {
            Some(set) => {
                let (fm, fv) = (b.zeros(&[set.len()])?, b.zeros(&[set.len()])?);
                let (m, v) = (set.views_of(&fm)?, set.views_of(&fv)?);
                (m, v, Some(FlatMoments { set, m: fm, v: fv }))
            }
            None => {
                let mut m = Vec::with_capacity(params.len());
                let mut v = Vec::with_capacity(params.len());
                for p in params {
                    m.push(b.zeros(p.shape())?);
                    v.push(b.zeros(p.shape())?);
                }
                (m, v, None)
            }
        };
        let slot = b.zeros(&[3])?;
        let flags: Vec<bool> = params
            .iter()
            .map(|p| hyper.decay.decays(p.shape()))
            .collect();
        let decays = (hyper.weight_decay != 0.0 && flags.iter().any(|d| !d)).then_some(flags);
        let config = AdamWConfig {
            beta1: T::from_f64(hyper.beta1),
            beta2: T::from_f64(hyper.beta2),
            eps: T::from_f64(hyper.eps),
            weight_decay: T::from_f64(hyper.weight_decay),
        };
        Ok(AdamW {
            tensors: AdamWTensors {
                m,
                v,
                slot,
                config,
                flat,
                decays,
            },
            book: StepBook::default(),
        })
    }

    /// The device tensors (a clone sharing them), for a capture body.
    #[must_use]
    pub fn tensors(&self) -> AdamWTensors<B, T> {
        self.tensors.clone()
    }

    step_book_methods!();

    /// Copies the state to the host for a checkpoint; `names` label the parameters in order.
    pub fn export(&self, b: &B, names: &[String]) -> Result<AdamWState<T>> {
        let mut moments = Vec::with_capacity(self.tensors.m.len());
        for (i, (m, v)) in self.tensors.m.iter().zip(&self.tensors.v).enumerate() {
            let name = names.get(i).cloned().unwrap_or_else(|| format!("param{i}"));
            moments.push(Moments {
                name,
                shape: m.shape().to_vec(),
                m: b.download(m)?,
                v: b.download(v)?,
            });
        }
        Ok(AdamWState {
            step: self.book.count(),
            moments,
        })
    }

    /// Whether `state` fits this optimiser (one moment pair per parameter, shapes in parameter
    /// order): `BadInput` naming the first that does not. Writes nothing.
    pub fn check(&self, state: &AdamWState<T>) -> Result<()> {
        if state.moments.len() != self.tensors.m.len() {
            return Err(GradError::BadInput(format!(
                "optimiser state has {} parameters, the model {}",
                state.moments.len(),
                self.tensors.m.len()
            )));
        }
        for (Moments { name, shape, m, v }, dm) in state.moments.iter().zip(&self.tensors.m) {
            let numel = dm.shape().iter().product::<usize>();
            if shape.as_slice() != dm.shape() || m.len() != numel || v.len() != numel {
                return Err(GradError::BadInput(format!(
                    "optimiser state for `{name}` has shape {shape:?} ({} and {} values), the parameter {:?}",
                    m.len(),
                    v.len(),
                    dm.shape()
                )));
            }
        }
        Ok(())
    }

    /// Restores a state exported by `export` (shapes must match, in parameter order; checked
    /// whole before anything is written). Clears
    /// an unknown state left by a failed step once every moment is written (the caller
    /// restores the parameters; `Trainer::load_checkpoint` does both); a failure while writing
    /// leaves the state unknown.
    pub fn import(&mut self, b: &B, state: &AdamWState<T>) -> Result<()> {
        self.check(state)?;
        for (Moments { m, v, .. }, (dm, dv)) in state
            .moments
            .iter()
            .zip(self.tensors.m.iter().zip(&self.tensors.v))
        {
            if let Err(e) = b.upload_into(m, dm).and_then(|()| b.upload_into(v, dv)) {
                self.book.import_failed();
                return Err(e.into());
            }
        }
        self.book.imported(state.step);
        Ok(())
    }
}
