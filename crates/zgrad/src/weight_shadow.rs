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
mod tests {
    use super::WeightShadow;
    use crate::optim::ParameterSet;
    use crate::tape::Tape;
    use crate::var::Var;
    use zcompute::{Activation, CpuBackend, MathMode, prelude::*};

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    fn ramp(n: usize, step: f32) -> Vec<f32> {
        (0..n).map(|i| (i as f32 - 7.0) * step + 0.001).collect()
    }

    /// The Linear product reads the copy, not the parameters: a copy left stale after the
    /// weight changed gives the old weight's output; refreshed, it gives converting per call's
    /// bits. An activation is not a parameter of the buffer: it has no copy.
    #[test]
    fn linear_products_read_the_copy() {
        let b = CpuBackend;
        let shapes = [vec![3, 5], vec![3]];
        let values = [ramp(15, 0.1237), ramp(3, 0.5)];
        let (set, params) = ParameterSet::allocate(&b, &shapes, Some(&values)).unwrap();
        let shadow = WeightShadow::new(&b, set.values()).unwrap();
        let x = Var::constant(b.upload(&ramp(20, 0.0917), &[4, 5]).unwrap());
        let out = |shadow: Option<WeightShadow<CpuBackend, f32>>| {
            let tape = Tape::new(&b)
                .with_math_mode(MathMode::Bf16)
                .with_weight_shadow(shadow);
            let y = tape
                .linear(&x, &params[0], &params[1], Activation::Tanh)
                .unwrap();
            bits(&b.download(y.value()).unwrap())
        };
        let before = out(None);
        assert_eq!(out(Some(shadow.clone())), before);
        assert!(shadow.of(x.value()).is_none());

        let changed = b.upload(&ramp(15, -0.0771), &[3, 5]).unwrap();
        b.copy_into(&changed, params[0].value()).unwrap();
        let per_call = out(None);
        assert_ne!(per_call, before);
        assert_eq!(out(Some(shadow.clone())), before, "a stale copy is read");
        shadow.refresh(&b).unwrap();
        assert_eq!(out(Some(shadow)), per_call);
    }
}
