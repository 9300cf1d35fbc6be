//! `LinearOps::linear_backward_into`'s checks: the weight's and bias's gradient buffers may be
//! adjacent views of one flat buffer. Bad arguments (overlapping views, a buffer in an input's
//! memory, wrong shapes) are rows of the validation table (`validation_table.rs`); the results
//! are checked by `linear_backward.rs`.

use zcompute::prelude::*;
use zcompute::{Activation, Backend, CpuBackend};

const CPU: CpuBackend = CpuBackend;

/// The weight's and bias's gradient buffers may be adjacent views of one flat buffer on both
/// backends (bad arguments, overlapping views and buffers in an input's memory included, are
/// rows of the validation table, `validation_table.rs`).
#[test]
fn adjacent_gradient_views_of_one_buffer_are_accepted_on_both_backends() {
    let gpu = super::mock();
    let dev = |shape: &[usize]| gpu.zeros(shape).unwrap();
    let host = |shape: &[usize]| Backend::<f32>::zeros(&CPU, shape).unwrap();
    let (flat, hflat) = (dev(&[40]), host(&[40]));
    let dw = flat.narrow(0, 0, 28).unwrap().reshape(&[7, 4]).unwrap();
    let db = flat.narrow(0, 28, 7).unwrap();
    let hdw = hflat.narrow(0, 0, 28).unwrap().reshape(&[7, 4]).unwrap();
    let hdb = hflat.narrow(0, 28, 7).unwrap();
    let (g, x, w, y) = (dev(&[3, 7]), dev(&[3, 4]), dev(&[7, 4]), dev(&[3, 7]));
    let d = gpu
        .linear_backward_into(
            &g,
            &x,
            Some(&w),
            (Activation::Tanh, Some(&y)),
            (&dw, Some(&db)),
        )
        .map(|gx| gx.map(|t| t.shape().to_vec()));
    let (hg, hx, hw, hy) = (host(&[3, 7]), host(&[3, 4]), host(&[7, 4]), host(&[3, 7]));
    let c = CPU
        .linear_backward_into(
            &hg,
            &hx,
            Some(&hw),
            (Activation::Tanh, Some(&hy)),
            (&hdw, Some(&hdb)),
        )
        .map(|gx| gx.map(|t| t.shape().to_vec()));
    assert_eq!(d, Ok(Some(vec![3, 4])));
    assert_eq!(c, Ok(Some(vec![3, 4])));
}
