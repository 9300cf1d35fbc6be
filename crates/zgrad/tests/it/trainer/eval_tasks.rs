//! Evaluation of every task (issue 40 item 2): the model's own loss and metrics computed on
//! the device inside the chunk work (captured like the validation pass, read back once), on
//! the CPU backend and the simulated device, against the host's f64 report of the same
//! outputs (`support::tasks::reference`).
//!
//! Tolerance: the device sums one chunk (here 5 samples, at most 15 values) in f32, so a sum
//! is within `γ_15 ≈ 15 · 2⁻²⁴ ≈ 1e-6` of its terms' magnitude, and the log-softmax and BCE
//! terms within a few f32 ulps of the logits (|logit| < 4 here); the chunks are merged in
//! f64. 1e-5 relative (to `max(1, |value|)`) is that bound with a margin of about 10.
//! Accuracy counts whole numbers (times weights in {0, 0.5, 1, 2}): exact in f32, so it is
//! held to 1e-12.

use crate::support::tasks::{
    TASKS, assert_report_close, reference, report_bits, task_data, task_trainer,
};
use rstest::rstest;
use zcompute::{Capture, CpuBackend, CudaBackend, Engine};
use zdevice::SimDriver;
use zgrad::ChunkedEval;
use zgrad::EvalSource;
use zgrad::Load;

const N: usize = 23;
const CHUNK: usize = 5;
const TOL: f64 = 1e-5;

/// `task`'s report four ways: `evaluate` from the host against the f64 reference, then the
/// validation set on the device (twice: the second pass replays when captured) and, for a
/// task of one target value per sample, the resident training set, each bitwise `evaluate`'s.
/// Returns the report's bits (for captured against eager).
fn every_way<B: Capture<f32> + Clone + 'static>(b: &B, name: &str, capture: bool) -> Vec<u64> {
    let (task, outputs, x, y) = task_data(name, N, 41);
    let mut t = task_trainer(b.clone(), task, outputs, capture, CHUNK);
    let out = t.predict(&x, N).expect("predict");
    let want = reference(&task, &out, &y);
    let got = t.evaluate(EvalSource::Host(&x, &y)).expect("evaluate");
    let what = format!("{name} capture {capture}");
    assert_report_close(&what, &got, &want, TOL);
    assert!((got.accuracy - want.accuracy).abs() < 1e-12 || got.accuracy.is_nan());
    t.load(Load::Validation { x: &x, y: &y, n: N })
        .expect("validation set");
    for pass in 0..2 {
        let v = t
            .evaluate(EvalSource::Validation)
            .expect("device evaluation");
        assert_eq!(report_bits(&v), report_bits(&got), "{what} pass {pass}");
    }
    assert_eq!(
        t.graphs().validation.len(),
        if capture { 2 } else { 0 },
        "{what}"
    );
    if task.target_len() == 1 {
        t.load(Load::Training { x: &x, y: &y, n: N })
            .expect("training set");
        let l = t.evaluate(EvalSource::Loaded).expect("resident evaluation");
        assert_eq!(
            report_bits(&l),
            report_bits(&got),
            "{what}: evaluate_loaded"
        );
    }
    report_bits(&got)
}

#[rstest]
fn every_task_is_evaluated_on_the_simulated_device(#[values(0, 1, 2, 3, 4, 5, 6)] task: usize) {
    let name = TASKS[task];
    let runs: Vec<Vec<u64>> = [false, true]
        .map(|capture| {
            let b = Engine::sim(256 << 20).expect("sim");
            b.set_poison(true);
            every_way(&b, name, capture)
        })
        .to_vec();
    assert_eq!(runs[0], runs[1], "{name}: captured differs from eager");
}

#[rstest]
fn every_task_is_evaluated_on_the_cpu(#[values(0, 1, 2, 3, 4, 5, 6)] task: usize) {
    let name = TASKS[task];
    let eager = every_way(&CpuBackend, name, false);
    assert_eq!(every_way(&CpuBackend, name, true), eager, "{name}");
}

/// How many downloads `f` made on the simulated device.
fn downloads<R>(b: &CudaBackend<SimDriver>, f: impl FnOnce() -> R) -> (R, usize) {
    let driver = b.device().driver();
    driver.clear_op_log();
    let out = f();
    let n = driver
        .op_log()
        .iter()
        .filter(|op| ["cuMemcpyDtoHAsync_v2", "cuMemcpyDtoH_v2"].contains(&op.call))
        .count();
    (out, n)
}

/// A pass reads back one buffer of a few values per chunk (not the logits), once.
#[rstest]
fn a_pass_reads_back_its_statistics_once(#[values(false, true)] capture: bool) {
    let b = Engine::sim(256 << 20).expect("sim");
    let (task, outputs, x, y) = task_data("class_index", N, 43);
    let mut t = task_trainer(b.clone(), task, outputs, capture, CHUNK);
    t.load(Load::Validation { x: &x, y: &y, n: N })
        .expect("validation set");
    for pass in 0..2 {
        let (r, n) = downloads(&b, || t.evaluate(EvalSource::Validation).expect("device"));
        assert_eq!((r.samples, n), (N, 1), "pass {pass}");
    }
}

/// Pearson over many samples far from 0 relative to their spread (targets near 10⁴, spread
/// about 1: f32 raw moments `Σ t² − (Σ t)²/n` lose every digit there) agrees with the f64
/// two-pass reference, from centred statistics per chunk merged in f64.
#[test]
fn pearson_far_from_zero_keeps_its_digits() {
    const M: usize = 4000;
    let b = Engine::sim(256 << 20).expect("sim");
    let (task, outputs, x, y) = task_data("regression", M, 47);
    let y: Vec<f32> = y.iter().map(|v| v + 1e4).collect();
    let mut t = task_trainer(b, task, outputs, false, 256);
    let out = t.predict(&x, M).expect("predict");
    let want = reference(&task, &out, &y);
    let got = t.evaluate(EvalSource::Host(&x, &y)).expect("evaluate");
    let (g, w) = (got.regression.unwrap(), want.regression.unwrap());
    assert!(
        w.pearson.abs() > 0.01,
        "a correlation to measure: {}",
        w.pearson
    );
    assert!(
        (g.pearson - w.pearson).abs() < 1e-4,
        "pearson {} against {}",
        g.pearson,
        w.pearson
    );
    // γ_256 · (values near 10⁸) relative: the MSE's sum in f32 per chunk.
    assert!((g.mse - w.mse).abs() < 1e-4 * w.mse, "{} {}", g.mse, w.mse);
}

/// Targets that do not vary have no correlation: `NaN`, not a number made of rounding.
#[test]
fn constant_targets_have_no_pearson() {
    let b = Engine::sim(256 << 20).expect("sim");
    let (task, outputs, x, mut y) = task_data("regression", N, 53);
    y.iter_mut().for_each(|v| *v = 0.3);
    let mut t = task_trainer(b, task, outputs, false, CHUNK);
    let r = t.evaluate(EvalSource::Host(&x, &y)).expect("evaluate");
    let m = r.regression.expect("regression");
    assert!(m.pearson.is_nan() && m.mse.is_finite(), "{m:?}");
}

#[cfg(feature = "gpu")]
mod gpu {
    use super::*;

    /// The simulated twin is `every_task_is_evaluated_on_the_simulated_device`.
    #[rstest]
    fn gpu_every_task_is_evaluated_on_the_device(#[values(0, 1, 2, 3, 4, 5, 6)] task: usize) {
        let name = TASKS[task];
        let runs: Vec<Vec<u64>> = [false, true]
            .map(|capture| {
                let b = Engine::cuda(0).expect("CUDA device 0 opens");
                every_way(&b, name, capture)
            })
            .to_vec();
        assert_eq!(runs[0], runs[1], "{name}: captured differs from eager");
    }
}

/// Every task's set given a chunk at a time (`ChunkedEval`, as a caller that holds it
/// nowhere whole gives it: each `next_chunk`'s rows) is `evaluate`'s report of the set held
/// whole, bit for bit; a chunk too many, or a finish before the last, is `BadInput`.
#[rstest]
fn a_set_given_chunk_by_chunk_is_evaluated_as_the_set_held_whole(
    #[values(0, 1, 2, 3, 4, 5, 6)] task: usize,
) {
    let name = TASKS[task];
    let b = Engine::sim(256 << 20).expect("sim");
    let (task, outputs, x, y) = task_data(name, N, 41);
    let mut t = task_trainer(b.clone(), task, outputs, false, CHUNK);
    let whole = t.evaluate(EvalSource::Host(&x, &y)).expect("evaluate");
    let (per, ty) = (x.len() / N, task.target_len());
    let mut eval = ChunkedEval::new(&t, N).expect("starts");
    assert_eq!(eval.rows(), 0..N);
    let early = ChunkedEval::new(&t, N).expect("starts");
    assert!(matches!(
        early.finish(&t),
        Err(zgrad::GradError::BadInput(_))
    ));
    let mut chunks = 0;
    while let Some(rows) = eval.next_chunk() {
        assert!(rows.len() <= CHUNK, "{rows:?}");
        let (xs, ys) = (
            &x[rows.start * per..rows.end * per],
            &y[rows.start * ty..rows.end * ty],
        );
        eval.add(&t, xs, ys).expect("a chunk");
        chunks += 1;
    }
    assert_eq!(chunks, N.div_ceil(CHUNK));
    assert!(matches!(
        eval.add(&t, &x[..per], &y[..ty]),
        Err(zgrad::GradError::BadInput(_))
    ));
    let chunked = eval.finish(&t).expect("finishes");
    assert_eq!(report_bits(&chunked), report_bits(&whole), "{name}");
}
