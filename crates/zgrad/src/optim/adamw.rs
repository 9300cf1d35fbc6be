//! AdamW through the backend's fused `adamw_step` (one kernel per parameter on the GPU; the CPU
//! backend's loop is the reference). The learning rate and step count live in a persistent
//! `[lr, t]` slot tensor that the kernel reads from memory: `prepare` writes it before a step,
//! `apply` only launches kernels, so a captured `apply` stays correct on every replay.

use crate::error::{GradError, Result};
use crate::memory::ClassGuard;
use crate::var::Var;
use zcompute::{
    ADAMW_SLOT_LR, ADAMW_SLOT_STEP, AdamWConfig, AllocClass, BTensor, Backend, Element,
};

/// AdamW's constant hyper-parameters (XASSET.md's values by default).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWHyper {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for AdamWHyper {
    fn default() -> Self {
        AdamWHyper {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

/// The device side of AdamW: moments, the `[lr, t]` slot and the constants. Cloning shares the
/// tensors (a capture body holds a clone).
pub struct AdamWTensors<B: Backend<T>, T: Element> {
    pub m: Vec<BTensor<B, T>>,
    pub v: Vec<BTensor<B, T>>,
    pub slot: BTensor<B, T>,
    pub config: AdamWConfig<T>,
}

impl<B: Backend<T>, T: Element> Clone for AdamWTensors<B, T> {
    fn clone(&self) -> Self {
        AdamWTensors {
            m: self.m.clone(),
            v: self.v.clone(),
            slot: self.slot.clone(),
            config: self.config,
        }
    }
}

impl<B: Backend<T>, T: Element> std::fmt::Debug for AdamWTensors<B, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdamWTensors")
            .field("params", &self.m.len())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<B: Backend<T>, T: Element> AdamWTensors<B, T> {
    /// One fused update of every parameter from its gradient, reading lr and t from the slot.
    /// Launches kernels only (no host transfer): legal inside a capture.
    pub fn apply(&self, b: &B, params: &[Var<B, T>]) -> Result<()> {
        if params.len() != self.m.len() {
            return Err(GradError::BadInput(format!(
                "AdamW holds state for {} parameters, got {}",
                self.m.len(),
                params.len()
            )));
        }
        for ((p, m), v) in params.iter().zip(&self.m).zip(&self.v) {
            let Some(g) = p.grad() else { continue };
            b.adamw_step(p.value(), m, v, g, &self.slot, &self.config)?;
            p.bump_version();
        }
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
pub struct AdamW<B: Backend<T>, T: Element> {
    tensors: AdamWTensors<B, T>,
    step: u64,
}

impl<B: Backend<T>, T: Element> std::fmt::Debug for AdamW<B, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdamW")
            .field("step", &self.step)
            .field("tensors", &self.tensors)
            .finish()
    }
}

impl<B: Backend<T>, T: Element> AdamW<B, T> {
    /// Zero moments (persistent) for each parameter and a slot tensor.
    pub fn new(b: &B, params: &[Var<B, T>], hyper: AdamWHyper) -> Result<Self> {
        let _class = ClassGuard::new(b, AllocClass::Persistent);
        let mut m = Vec::with_capacity(params.len());
        let mut v = Vec::with_capacity(params.len());
        for p in params {
            m.push(b.zeros(p.shape())?);
            v.push(b.zeros(p.shape())?);
        }
        let slot = b.zeros(&[2])?;
        let config = AdamWConfig {
            beta1: T::from_f64(hyper.beta1),
            beta2: T::from_f64(hyper.beta2),
            eps: T::from_f64(hyper.eps),
            weight_decay: T::from_f64(hyper.weight_decay),
        };
        Ok(AdamW {
            tensors: AdamWTensors { m, v, slot, config },
            step: 0,
        })
    }

    /// Steps taken so far (the next step is `step_count() + 1`).
    #[must_use]
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// The device tensors (a clone sharing them), for a capture body.
    #[must_use]
    pub fn tensors(&self) -> AdamWTensors<B, T> {
        self.tensors.clone()
    }

    /// Counts the next step and writes `[lr, t]` into the slot (a host-to-device copy: call it
    /// outside a capture, before `apply` or a replay).
    pub fn prepare(&mut self, b: &B, lr: f64) -> Result<()> {
        self.step += 1;
        let slot = [T::from_f64(lr), T::from_f64(self.step as f64)];
        debug_assert_eq!((ADAMW_SLOT_LR, ADAMW_SLOT_STEP), (0, 1));
        b.upload_into(&slot, &self.tensors.slot)?;
        Ok(())
    }

    /// `prepare` then `apply`: one eager optimiser step.
    pub fn step(&mut self, b: &B, params: &[Var<B, T>], lr: f64) -> Result<()> {
        self.prepare(b, lr)?;
        self.tensors.apply(b, params)
    }

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
            step: self.step,
            moments,
        })
    }

    /// Restores a state exported by `export` (shapes must match, in parameter order).
    pub fn import(&mut self, b: &B, state: &AdamWState<T>) -> Result<()> {
        if state.moments.len() != self.tensors.m.len() {
            return Err(GradError::BadInput(format!(
                "optimiser state has {} parameters, the model {}",
                state.moments.len(),
                self.tensors.m.len()
            )));
        }
        for (Moments { name, shape, m, v }, (dm, dv)) in state
            .moments
            .iter()
            .zip(self.tensors.m.iter().zip(&self.tensors.v))
        {
            if shape.as_slice() != dm.shape() {
                return Err(GradError::BadInput(format!(
                    "optimiser state for `{name}` has shape {shape:?}, the parameter {:?}",
                    dm.shape()
                )));
            }
            b.upload_into(m, dm)?;
            b.upload_into(v, dv)?;
        }
        self.step = state.step;
        Ok(())
    }
}
