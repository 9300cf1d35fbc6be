//! The bf16 weight copy read by the tape's Linear products (a file of its own: it names the
//! tape, which names the copy).

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
