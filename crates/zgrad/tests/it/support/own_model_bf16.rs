//! bf16 on a model of the user's own (issue 42, "every guarantee at every precision", for the
//! models we never planned): `support::head`'s tanh MLP under each task of `support::tasks`
//! (binary, weighted, class indices, distributions, regression, masked regression), both
//! schedules, eager and captured. Per task: one bf16 step's loss and every gradient within
//! `BF16_BOUND` of the same step in float64 (the same parameters widened, on the CPU backend),
//! and not equal to float32's (the policy ran); the float32 step within 1e-5 of float64 (the
//! harness compares like with like); captured steps equal eager ones bit for bit.

use crate::support::head::{Head, LossKind};
use crate::support::tasks::{F, TASKS, task_data};
use zcompute::{Capture, CpuBackend, Element, prelude::*};
use zgrad::{Precision, StepSource, Task, TrainSchedule, Trainer, TrainerConfig};

/// A bf16 step's largest error per tensor against float64: bf16 keeps 8 significant bits
/// (unit roundoff 2^-9, 2.0e-3) and this model's products add at most 12 terms; measured
/// 2.0e-3..4.2e-3 on the CPU and the simulated device (2026-11-30).
const BF16_BOUND: f64 = 1e-2;
/// Samples a step.
const N: usize = 16;

fn head<B: Ops<T> + 'static, T: Element>(b: &B, task: Task, outputs: usize) -> Head<B, T> {
    let model = Head::new(b, F, outputs, Some(task), LossKind::Task).expect("model");
    if outputs == 1 && matches!(task.target, zgrad::Target::Binary) {
        model.squeezed()
    } else {
        model
    }
}

/// One step's loss and gradients (by name, widened to f64).
type Step = (f64, Vec<(String, Vec<f64>)>);

fn grads_of<B: Capture<T> + 'static, T: Element>(
    t: &Trainer<B, T, Head<B, T>>,
) -> Vec<(String, Vec<f64>)> {
    use zgrad::Model;
    t.model()
        .named_parameters()
        .into_iter()
        .map(|(name, p)| {
            let g = t
                .backend()
                .download(p.grad().expect("a gradient"))
                .expect("download");
            (name, g.into_iter().map(Element::to_f64).collect())
        })
        .collect()
}

/// The float64 step from `params` (the float32 model's values, widened).
fn float64_step(task: Task, outputs: usize, x: &[f32], y: &[f32], params: &[Vec<f32>]) -> Step {
    use zgrad::Model;
    let b = CpuBackend;
    let model: Head<CpuBackend, f64> = head(&b, task, outputs);
    for (p, v) in model.parameters().iter().zip(params) {
        let wide: Vec<f64> = v.iter().map(|&e| f64::from(e)).collect();
        p.upload(&b, &wide).expect("upload");
    }
    let mut t = Trainer::new(b, model, TrainerConfig::default()).expect("trainer");
    let wide = |v: &[f32]| -> Vec<f64> { v.iter().map(|&e| f64::from(e)).collect() };
    let r = t
        .step(StepSource::host(&wide(x), &wide(y), N))
        .expect("the float64 step");
    (r.loss, grads_of(&t))
}

/// Three steps (the batch scaled by 1, 1.1, 1.2) under `precision` from `params`: the first
/// step's loss and
/// gradients, and every step's loss and the parameters after the last, as bits.
fn steps<B: Capture<f32> + Clone + 'static>(
    b: &B,
    (task, outputs): (Task, usize),
    (x, y, params): (&[f32], &[f32], &[Vec<f32>]),
    (precision, schedule, capture): (Precision, TrainSchedule, bool),
) -> (Step, Vec<u64>) {
    use zgrad::Model;
    let cfg = TrainerConfig {
        precision,
        schedule,
        capture,
        ..TrainerConfig::default()
    };
    let model = head(b, task, outputs);
    for (p, v) in model.parameters().iter().zip(params) {
        p.upload(b, v).expect("upload");
    }
    let mut t = Trainer::new(b.clone(), model, cfg).expect("trainer");
    let (mut first, mut bits) = (None, Vec::new());
    for k in 0..3u8 {
        let scale = 1.0 + 0.1 * f32::from(k);
        let xs: Vec<f32> = x.iter().map(|v| v * scale).collect();
        let r = t.step(StepSource::host(&xs, y, N)).expect("a step");
        assert!(r.loss.is_finite(), "{precision:?}: loss {}", r.loss);
        bits.push(r.loss.to_bits());
        if first.is_none() {
            first = Some((r.loss, grads_of(&t)));
        }
    }
    for p in t.model().parameters() {
        let v = p.to_vec(t.backend()).expect("download");
        bits.extend(v.into_iter().map(|e| u64::from(e.to_bits())));
    }
    (first.expect("a first step"), bits)
}

fn rel(got: &[f64], want: &[f64]) -> f64 {
    let d: f64 = got.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum();
    let n: f64 = want.iter().map(|b| b * b).sum();
    if n == 0.0 {
        d.sqrt()
    } else {
        d.sqrt() / n.sqrt()
    }
}

/// The largest per-tensor error of `got` against `want` (the loss as one more tensor) and
/// where.
fn worst(got: &Step, want: &Step) -> (f64, String) {
    let mut out = (rel(&[got.0], &[want.0]), "loss".to_string());
    for ((name, g), (_, w)) in got.1.iter().zip(&want.1) {
        let e = rel(g, w);
        if e > out.0 {
            out = (e, name.clone());
        }
    }
    out
}

/// The check on `b` (CPU or CUDA backend, simulated or real).
#[allow(clippy::print_stderr)] // each task's errors belong in the run's log
pub fn bf16_on_a_model_of_the_users_own_is_near_float64_for_every_task<
    B: Capture<f32> + Clone + 'static,
>(
    b: &B,
) {
    use zgrad::Model;
    for (seed, name) in TASKS.iter().enumerate() {
        let (task, outputs, x, y) = task_data(name, N, 40 + seed as u64);
        let params: Vec<Vec<f32>> = head::<CpuBackend, f32>(&CpuBackend, task, outputs)
            .parameters()
            .iter()
            .map(|p| p.to_vec(&CpuBackend).expect("download"))
            .collect();
        let oracle = float64_step(task, outputs, &x, &y, &params);
        for schedule in [TrainSchedule::Batched, TrainSchedule::PerSample] {
            let what = format!("{name} {schedule:?}");
            let data = (x.as_slice(), y.as_slice(), params.as_slice());
            let (f32_step, _) = steps(b, (task, outputs), data, (Precision::F32, schedule, false));
            let (e, at) = worst(&f32_step, &oracle);
            assert!(e <= 1e-5, "{what}: float32 {at} {e:e} from float64");
            let (bf16_step, eager) =
                steps(b, (task, outputs), data, (Precision::Bf16, schedule, false));
            let (e, at) = worst(&bf16_step, &oracle);
            eprintln!("{what}: bf16's largest error against float64 {e:.2e} ({at})");
            assert!(e <= BF16_BOUND, "{what}: bf16 {at} {e:e} from float64");
            let differs = bf16_step
                .1
                .iter()
                .zip(&f32_step.1)
                .any(|((_, g), (_, f))| g != f);
            assert!(
                differs,
                "{what}: bf16's gradients are float32's: the policy did not run"
            );
            let (_, captured) = steps(b, (task, outputs), data, (Precision::Bf16, schedule, true));
            assert_eq!(
                eager, captured,
                "{what}: captured bf16 steps are not the eager bits"
            );
        }
    }
}
