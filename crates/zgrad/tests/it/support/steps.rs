//! What the trainer tests that compare two ways of running the same steps share: a step's rows
//! picked from a data set, a report's and the parameters' bits, and CUDA device 0 with poison
//! on.

use zcompute::Capture;
use zgrad::{StepReport, Trainer, XAsset};

/// Rows `rows` of the data set `x` (`y.len()` samples) and their labels.
pub fn rows_of(x: &[f32], y: &[f32], rows: &[usize]) -> (Vec<f32>, Vec<f32>) {
    let per = x.len() / y.len();
    let xs = rows
        .iter()
        .flat_map(|&r| x[r * per..(r + 1) * per].to_vec())
        .collect();
    (xs, rows.iter().map(|&r| y[r]).collect())
}

/// A report as bits: step, loss, gradient norm, learning rate, samples, captured.
pub fn step_bits(r: &StepReport) -> (u64, u64, u64, u64, usize, bool) {
    (
        r.step,
        r.loss.to_bits(),
        r.grad_norm.to_bits(),
        r.lr.to_bits(),
        r.samples,
        r.captured,
    )
}

/// The trainer's parameters as bits.
pub fn param_bits<B: Capture<f32> + Clone + 'static>(
    b: &B,
    t: &Trainer<B, f32, XAsset<B>>,
) -> Vec<u32> {
    t.model()
        .flat_parameters()
        .and_then(|p| Ok(b.download(&p)?))
        .expect("parameters")
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// CUDA device 0 with poison on.
#[cfg(feature = "gpu")]
pub fn poisoned_gpu() -> zcompute::CudaBackend<zcompute::CudaDriver> {
    let b = zcompute::Engine::cuda(0).expect("CUDA device 0 opens");
    b.set_poison(true);
    b
}
