//! The trainer on a host backend with device-like memory rules (tests/common): both schedules
//! against the PyTorch oracle, captured against eager, step scopes, non-finite detection,
//! capture fallback and evaluation.

use crate::common;

use common::SimBackend;
use rstest::rstest;
use std::path::PathBuf;
use std::rc::Rc;
use zcompute::{AllocClass, Backend, CpuBackend, CpuStorage, Element};
use zgrad::{
    Applied, EvalSource, GradError, Load, LrSchedule, NonFiniteKind, StepReport, StepSource,
    TensorFile, TrainSchedule, Trainer, TrainerConfig, XAsset, read_tensors,
};

use crate::support::fixtures;
use fixtures::fixture;

struct Tiny<T> {
    input: TensorFile<T>,
    oracle: TensorFile<f64>,
    path: PathBuf,
}

fn tiny<T: Element>() -> Tiny<T> {
    let path = fixture("xasset_tiny_in.safetensors");
    Tiny {
        input: read_tensors(&path).unwrap(),
        oracle: read_tensors(&fixture("xasset_tiny_oracle.safetensors")).unwrap(),
        path,
    }
}

type Sim<T> = Rc<SimBackend<T>>;
type SimTrainer<T> = Trainer<SimBackend<T>, T, XAsset<SimBackend<T>, T>>;

fn trainer<T: Element>(f: &Tiny<T>, config: TrainerConfig) -> (Sim<T>, SimTrainer<T>)
where
    CpuBackend: Backend<T, Storage = CpuStorage<T>>,
{
    let b = Rc::new(SimBackend::<T>::new());
    let model = XAsset::from_tensors(&*b, &f.input, &f.path).unwrap();
    let t = Trainer::new(Rc::clone(&b), model, config).unwrap();
    (b, t)
}

fn host<T: Element>(b: &SimBackend<T>, t: &zcompute::BTensor<SimBackend<T>, T>) -> Vec<f64>
where
    CpuBackend: Backend<T, Storage = CpuStorage<T>>,
{
    b.download(t).unwrap().iter().map(|v| v.to_f64()).collect()
}

fn rel(got: &[f64], want: &[f64]) -> f64 {
    let d: f64 = got.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum();
    let n: f64 = want.iter().map(|b| b * b).sum();
    d.sqrt() / n.sqrt()
}

fn config(schedule: TrainSchedule, capture: bool) -> TrainerConfig {
    TrainerConfig {
        schedule,
        capture,
        ..TrainerConfig::default()
    }
}

#[rstest]
#[case::batched(TrainSchedule::Batched, false)]
#[case::batched_captured(TrainSchedule::Batched, true)]
#[case::per_sample(TrainSchedule::PerSample, false)]
#[case::per_sample_captured(TrainSchedule::PerSample, true)]
fn one_step_matches_the_oracle(#[case] schedule: TrainSchedule, #[case] capture: bool) {
    let f = tiny::<f64>();
    let (b, mut t) = trainer(&f, config(schedule, capture));
    let (x, y) = (&f.input.tensors["x"].data, &f.input.tensors["y"].data);
    let r = t.step(StepSource::host(x, y, 4)).unwrap();
    assert_eq!((r.step, r.samples, r.captured), (1, 4, capture));
    let want_loss = f.oracle.tensors["loss"].data[0];
    assert!(
        (r.loss - want_loss).abs() < 1e-12,
        "loss {} vs {want_loss}",
        r.loss
    );
    for (name, p) in t.model().named_parameters() {
        let g = host(&b, p.grad().unwrap());
        let want = &f.oracle.tensors[&format!("grad.{name}")].data;
        if name == "kn.bias" {
            assert!(g.iter().map(|v| v * v).sum::<f64>().sqrt() < 1e-6);
            continue;
        }
        let e = rel(&g, want);
        assert!(e < 1e-10, "{schedule:?} grad.{name}: {e:e}");
        let after = host(&b, p.value());
        let want = &f.oracle.tensors[&format!("adamw.{name}")].data;
        let e = rel(&after, want);
        assert!(e < 1e-9, "{schedule:?} adamw.{name}: {e:e}");
    }
    assert_eq!(
        b.log.steps_begun.get(),
        b.log.steps_ended.get(),
        "every step closed"
    );
}

/// Three batches of made-up data (the tiny input's samples, permuted and scaled).
fn batches<T: Element>(f: &Tiny<T>) -> Vec<(Vec<T>, Vec<T>)> {
    let x = &f.input.tensors["x"].data;
    let y = &f.input.tensors["y"].data;
    let per = x.len() / 4;
    (0..3)
        .map(|k| {
            let order: Vec<usize> = (0..4).map(|i| (i + k) % 4).collect();
            let xs = order
                .iter()
                .flat_map(|&i| {
                    x[i * per..(i + 1) * per]
                        .iter()
                        .map(|&v| v * T::from_f64(1.0 + 0.1 * k as f64))
                })
                .collect();
            let ys = order.iter().map(|&i| y[i]).collect();
            (xs, ys)
        })
        .collect()
}

fn run_three(schedule: TrainSchedule, capture: bool) -> (Vec<StepReport>, Vec<Vec<f64>>) {
    let f = tiny::<f32>();
    let cfg = TrainerConfig {
        clip_grad: Some(0.5),
        lr_schedule: LrSchedule::LinearWarmup { warmup_steps: 2 },
        lr: 1e-2,
        ..config(schedule, capture)
    };
    let (b, mut t) = trainer(&f, cfg);
    let reports = batches(&f)
        .iter()
        .map(|(x, y)| t.step(StepSource::host(x, y, 4)).unwrap())
        .collect();
    let params = t
        .model()
        .parameters()
        .iter()
        .map(|p| host(&b, p.value()))
        .collect();
    if capture {
        assert_eq!(b.captures.get(), 1, "captured once, replayed after");
    }
    (reports, params)
}

#[rstest]
#[case::batched(TrainSchedule::Batched)]
#[case::per_sample(TrainSchedule::PerSample)]
fn three_captured_steps_equal_three_eager_steps(#[case] schedule: TrainSchedule) {
    let (eager, p_eager) = run_three(schedule, false);
    let (captured, p_captured) = run_three(schedule, true);
    for (e, c) in eager.iter().zip(&captured) {
        assert_eq!(
            (e.step, e.loss, e.grad_norm, e.lr),
            (c.step, c.loss, c.grad_norm, c.lr)
        );
        assert!(c.captured && !e.captured);
    }
    assert_eq!(p_eager, p_captured, "parameters after three steps");
    assert_eq!(eager[0].lr, 5e-3, "warm-up: half the rate at step 1 of 2");
}

#[test]
fn per_sample_opens_a_step_per_sample_and_keeps_saved_tensors_out_of_scratch() {
    let f = tiny::<f32>();
    let (b, mut t) = trainer(&f, config(TrainSchedule::PerSample, false));
    let (x, y) = (&f.input.tensors["x"].data, &f.input.tensors["y"].data);
    let persistent_before = b.allocs(AllocClass::Persistent);
    t.step(StepSource::host(x, y, 4)).unwrap();
    assert_eq!(
        b.log.steps_begun.get(),
        5,
        "one per sample, one for the update"
    );
    assert_eq!(b.log.steps_ended.get(), 5);
    assert!(b.log.poisoned.get() > 0, "steps reclaimed their scratch");
    assert!(
        b.allocs(AllocClass::Saved) > 0,
        "forward outputs went to the saved class"
    );
    // The per-sample input/output slots and the loss vector once, then nothing per step.
    let first = b.allocs(AllocClass::Persistent) - persistent_before;
    t.step(StepSource::host(x, y, 4)).unwrap();
    let second = b.allocs(AllocClass::Persistent) - persistent_before - first;
    assert_eq!(second, 0, "no persistent allocation per step");
}

fn nan_in_sample<T: Element>(x: &[T], sample: usize) -> Vec<T> {
    let per = x.len() / 4;
    let mut x = x.to_vec();
    x[sample * per + 1] = T::from_f64(f64::NAN);
    x
}

#[rstest]
#[case::batched(TrainSchedule::Batched, false)]
#[case::per_sample(TrainSchedule::PerSample, false)]
#[case::per_sample_captured(TrainSchedule::PerSample, true)]
#[case::batched_captured(TrainSchedule::Batched, true)]
fn a_non_finite_loss_names_step_and_sample(#[case] schedule: TrainSchedule, #[case] capture: bool) {
    let f = tiny::<f32>();
    let (b, mut t) = trainer(&f, config(schedule, capture));
    let (x, y) = (&f.input.tensors["x"].data, &f.input.tensors["y"].data);
    t.step(StepSource::host(x, y, 4)).unwrap();
    let before: Vec<Vec<f64>> = t
        .model()
        .parameters()
        .iter()
        .map(|p| host(&b, p.value()))
        .collect();
    let err = t
        .step(StepSource::host(&nan_in_sample(x, 2), y, 4))
        .unwrap_err();
    assert_eq!(err.applied(), Some(Applied::No), "{err}");
    assert!(
        matches!(
            err.cause(),
            GradError::NonFinite {
                step: 2,
                sample: Some(2),
                kind: NonFiniteKind::Loss
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("step 2") && err.cause().to_string().contains("sample 2"),
        "{err}"
    );
    let after: Vec<Vec<f64>> = t
        .model()
        .parameters()
        .iter()
        .map(|p| host(&b, p.value()))
        .collect();
    // Captured batched steps included: the update in the graph is gated on the device.
    assert_eq!(before, after, "no update after a non-finite loss");
    assert_eq!(t.status().step, 1, "the skipped step is not counted");
    assert_eq!(b.log.steps_begun.get(), b.log.steps_ended.get());
    // The step that was skipped is taken again, as step 2.
    assert_eq!(t.step(StepSource::host(x, y, 4)).unwrap().step, 2);
}

#[rstest]
#[case::batched_before_running(TrainSchedule::Batched, false)]
#[case::batched_after_running(TrainSchedule::Batched, true)]
#[case::per_sample_before_running(TrainSchedule::PerSample, false)]
#[case::per_sample_after_running(TrainSchedule::PerSample, true)]
fn a_failed_capture_falls_back_to_eager(#[case] schedule: TrainSchedule, #[case] body_ran: bool) {
    let (eager, p_eager) = run_three(schedule, false);
    let f = tiny::<f32>();
    let cfg = TrainerConfig {
        clip_grad: Some(0.5),
        lr_schedule: LrSchedule::LinearWarmup { warmup_steps: 2 },
        lr: 1e-2,
        ..config(schedule, true)
    };
    let (b, mut t) = trainer(&f, cfg);
    b.fail_capture.set(Some(body_ran));
    let reports: Vec<StepReport> = batches(&f)
        .iter()
        .map(|(x, y)| t.step(StepSource::host(x, y, 4)).unwrap())
        .collect();
    let params: Vec<Vec<f64>> = t
        .model()
        .parameters()
        .iter()
        .map(|p| host(&b, p.value()))
        .collect();
    assert_eq!(b.captures.get(), 0);
    for (e, r) in eager.iter().zip(&reports) {
        assert!(!r.captured);
        assert_eq!((e.step, e.loss, e.grad_norm), (r.step, r.loss, r.grad_norm));
    }
    assert_eq!(
        p_eager, params,
        "the fallback neither skips nor repeats work"
    );
}

/// The trainer under the schedule's fallback test config, capture on, the tiny fixture's four
/// samples loaded as its validation set.
fn fallback_trainer(schedule: TrainSchedule) -> (Tiny<f32>, Sim<f32>, SimTrainer<f32>) {
    let f = tiny::<f32>();
    let cfg = TrainerConfig {
        clip_grad: Some(0.5),
        lr_schedule: LrSchedule::LinearWarmup { warmup_steps: 2 },
        lr: 1e-2,
        ..config(schedule, true)
    };
    let (b, mut t) = trainer(&f, cfg);
    let (x, y) = (&f.input.tensors["x"].data, &f.input.tensors["y"].data);
    t.load(Load::Validation { x, y, n: 4 }).unwrap();
    (f, b, t)
}

/// The validation pass on the device against `evaluate` from the host: the same bits.
fn validation_is_evaluate(f: &Tiny<f32>, t: &mut SimTrainer<f32>) {
    let (x, y) = (&f.input.tensors["x"].data, &f.input.tensors["y"].data);
    let got = t.evaluate(EvalSource::Validation).unwrap();
    let want = t.evaluate(EvalSource::Host(x, y)).unwrap();
    assert_eq!(
        (got.loss.to_bits(), got.accuracy.to_bits(), got.samples),
        (want.loss.to_bits(), want.accuracy.to_bits(), want.samples)
    );
}

/// One capture policy for every graph: a capture that fails in the validation pass (after
/// the step's graph was captured) turns capture off for the training steps too. The rest of
/// the run is eager, the step's graph already held included, and it takes exactly the
/// steps an eager run takes; the pass itself reports what `evaluate` reports.
#[rstest]
fn a_failed_evaluation_capture_turns_capture_off_for_the_steps(
    #[values(TrainSchedule::Batched, TrainSchedule::PerSample)] schedule: TrainSchedule,
    #[values(false, true)] body_ran: bool,
) {
    let (eager, p_eager) = run_three(schedule, false);
    let (f, b, mut t) = fallback_trainer(schedule);
    let mut reports = Vec::new();
    for (i, (x, y)) in batches(&f).iter().enumerate() {
        if i == 1 {
            b.fail_capture.set(Some(body_ran));
            validation_is_evaluate(&f, &mut t);
            b.fail_capture.set(None);
            assert_eq!(t.graphs().validation.len(), 0, "the pass ran eagerly");
        }
        reports.push(t.step(StepSource::host(x, y, 4)).unwrap());
    }
    validation_is_evaluate(&f, &mut t);
    assert_eq!(b.captures.get(), 1, "the first step's graph only");
    assert_eq!(t.graphs().validation.len(), 0);
    let captured: Vec<bool> = reports.iter().map(|r| r.captured).collect();
    assert_eq!(captured, [true, false, false]);
    for (e, r) in eager.iter().zip(&reports) {
        assert_eq!((e.step, e.loss, e.grad_norm), (r.step, r.loss, r.grad_norm));
    }
    let params: Vec<Vec<f64>> = t
        .model()
        .parameters()
        .iter()
        .map(|p| host(&b, p.value()))
        .collect();
    assert_eq!(p_eager, params);
}

/// The other way round: a capture that fails in a training step leaves the validation pass
/// eager (no graph captured for it), reporting what `evaluate` reports.
#[rstest]
fn a_failed_step_capture_leaves_evaluation_eager(
    #[values(TrainSchedule::Batched, TrainSchedule::PerSample)] schedule: TrainSchedule,
    #[values(false, true)] body_ran: bool,
) {
    let (f, b, mut t) = fallback_trainer(schedule);
    b.fail_capture.set(Some(body_ran));
    let (x, y) = &batches(&f)[0];
    assert!(!t.step(StepSource::host(x, y, 4)).unwrap().captured);
    b.fail_capture.set(None);
    validation_is_evaluate(&f, &mut t);
    validation_is_evaluate(&f, &mut t);
    assert_eq!((b.captures.get(), t.graphs().validation.len()), (0, 0));
}

#[test]
fn evaluate_is_the_oracle_loss_without_recording() {
    let f = tiny::<f64>();
    let (b, mut t) = trainer(&f, config(TrainSchedule::Batched, false));
    let (x, y) = (&f.input.tensors["x"].data, &f.input.tensors["y"].data);
    let saved_before = b.allocs(AllocClass::Saved);
    let r = t.evaluate(EvalSource::Host(x, y)).unwrap();
    assert_eq!(
        b.allocs(AllocClass::Saved),
        saved_before,
        "no-grad saves nothing"
    );
    assert!((r.loss - f.oracle.tensors["loss"].data[0]).abs() < 1e-12);
    assert!((0.0..=1.0).contains(&r.accuracy) && r.samples == 4);
    let logits = t.predict(x, 4).unwrap();
    let correct = logits
        .iter()
        .zip(y)
        .filter(|(l, t)| (**l > 0.0) == (**t > 0.5))
        .count();
    assert_eq!(r.accuracy, correct as f64 / 4.0);
}

#[test]
fn bad_batches_are_refused() {
    let f = tiny::<f32>();
    let (_b, mut t) = trainer(&f, config(TrainSchedule::Batched, false));
    let x = &f.input.tensors["x"].data;
    let err = t.step(StepSource::host(x, &[0.0; 3], 4)).unwrap_err();
    assert!(
        matches!(err.cause(), GradError::Target { expected, given, .. } if expected == &[4] && given == &[3]),
        "{err}"
    );
    assert_eq!(err.applied(), Some(Applied::No));
    let err = t.step(StepSource::host(&x[1..], &[0.0; 4], 4)).unwrap_err();
    assert!(matches!(err.cause(), GradError::BadInput(_)), "{err}");
    assert_eq!(err.applied(), Some(Applied::No));
    let err = t.step(StepSource::host(x, &[], 0)).unwrap_err();
    assert!(matches!(err.cause(), GradError::BadInput(_)), "{err}");
    assert_eq!(err.applied(), Some(Applied::No));
}

#[rstest]
#[case::batched(TrainSchedule::Batched, false)]
#[case::per_sample(TrainSchedule::PerSample, false)]
#[case::batched_captured(TrainSchedule::Batched, true)]
fn a_non_finite_gradient_with_a_finite_loss_names_the_sample(
    #[case] schedule: TrainSchedule,
    #[case] capture: bool,
) {
    let f = tiny::<f32>();
    let (b, mut t) = trainer(&f, config(schedule, capture));
    let (x, y) = (&f.input.tensors["x"].data, &f.input.tensors["y"].data);
    // Huge but finite inputs in sample 3, labelled against the sign of its (huge) logit: the
    // loss stays finite (about 1e29), the squared gradient norm overflows float32.
    let per = x.len() / 4;
    let mut x = x.clone();
    for v in &mut x[3 * per..] {
        *v *= 1e30;
    }
    let mut y = y.clone();
    let logit = t.predict(&x[3 * per..], 1).unwrap()[0];
    y[3] = if logit > 0.0 { 0.0 } else { 1.0 };
    let y = &y;
    let before: Vec<Vec<f64>> = t
        .model()
        .parameters()
        .iter()
        .map(|p| host(&b, p.value()))
        .collect();
    let err = t.step(StepSource::host(&x, y, 4)).unwrap_err();
    assert_eq!(err.applied(), Some(Applied::No), "{err}");
    assert!(
        matches!(
            err.cause(),
            GradError::NonFinite {
                step: 1,
                sample: Some(3),
                kind: NonFiniteKind::Gradient
            }
        ),
        "{err}"
    );
    let after: Vec<Vec<f64>> = t
        .model()
        .parameters()
        .iter()
        .map(|p| host(&b, p.value()))
        .collect();
    assert_eq!(before, after, "no update after a non-finite gradient");
}
