//! The bf16 copy of a model's weights under the bf16 policy (issue 42): one conversion of the
//! flat parameter buffer a step, which every Linear product of the step reads its weight from,
//! forward and backward, instead of converting the weight on every call. The rounding is one
//! deterministic formula, so the products are bit for bit those of converting per call.
//!
//! The trainer refreshes the copy at the start of every step, before the first product (in the
//! batched step's body, so inside its captured graph; once before the samples of a per-sample
//! step): a step reads the parameters as they are then, whatever wrote them since the last
//! step (the optimiser, a checkpoint, a caller). Under float32 and TF32 there is none.

use crate::error::Result;
use crate::memory::ClassGuard;
use zcompute::{AllocClass, BBf16, BTensor, Element, prelude::*};

/// A flat parameter buffer and its bf16 copy. Cloning shares both.
pub(crate) struct WeightShadow<B: Ops<T>, T: Element> {
    /// The flat parameter buffer (`ParameterSet::values`: offset 0, dense).
    source: BTensor<B, T>,
    copy: BBf16<B, T>,
}

impl<B: Ops<T>, T: Element> Clone for WeightShadow<B, T> {
    fn clone(&self) -> Self {
        WeightShadow {
            source: self.source.clone(),
            copy: self.copy.clone(),
        }
    }
}

impl<B: Ops<T>, T: Element> WeightShadow<B, T> {
    /// The copy of `source` (a whole flat parameter buffer), allocated in the shadow class and
    /// filled once.
    pub(crate) fn new(b: &B, source: &BTensor<B, T>) -> Result<Self> {
        let copy = {
            let _class = ClassGuard::new(b, AllocClass::Shadow);
            b.bf16_copy_alloc(source.shape())?
        };
        let shadow = WeightShadow {
            source: source.clone(),
            copy,
        };
        shadow.refresh(b)?;
        Ok(shadow)
    }

    /// Converts the parameters into the copy (one launch; legal in a captured graph).
    pub(crate) fn refresh(&self, b: &B) -> Result<()> {
        Ok(b.bf16_copy_into(&self.source, &self.copy)?)
    }

    /// The copy of `w` when `w` is a dense view of the source buffer (a parameter of the
    /// set); `None` otherwise (an activation, a parameter made apart), which then converts
    /// per call.
    pub(crate) fn of(&self, w: &BTensor<B, T>) -> Option<BBf16<B, T>> {
        if !w.shares_storage(&self.source) || !w.is_contiguous() {
            return None;
        }
        self.copy.view(w.layout().offset(), w.shape()).ok()
    }
}

#[cfg(test)]
mod tests;
