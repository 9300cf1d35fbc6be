//! A model of the user's own (`mlp.rs`, not XAsset) through the trainer: captured equals eager
//! bit for bit on the simulated device (poison on) in both schedules, batched and per-sample
//! gradients agree to rounding, it learns on the CPU backend, the device gate stops a
//! non-finite step, and a sample of the wrong shape is a typed error that changes nothing.

use crate::support::mlp;

use mlp::{Mlp, data};
use rstest::rstest;
use zcompute::{Capture, CpuBackend, CudaBackend};
use zdevice::SimDriver;
use zgrad::{
    Applied, EvalSource, GradError, Model, NonFiniteKind, StepSource, TrainSchedule, Trainer,
    TrainerConfig, Var,
};

const S: usize = 3;
const F: usize = 4;
const HIDDEN: usize = 8;
const BATCH: usize = 6;

fn config(schedule: TrainSchedule, capture: bool) -> TrainerConfig {
    TrainerConfig {
        schedule,
        capture,
        lr: 1e-2,
        clip_grad: Some(0.5),
        ..TrainerConfig::default()
    }
}

fn trainer<B: Capture<f32> + 'static>(b: B, cfg: TrainerConfig) -> Trainer<B, f32, Mlp<B, f32>> {
    let model = Mlp::new(&b, S, F, HIDDEN, 5).expect("model");
    Trainer::new(b, model, cfg).expect("trainer")
}

fn values<B: Capture<f32> + 'static>(t: &Trainer<B, f32, Mlp<B, f32>>) -> Vec<u32> {
    t.model()
        .parameters()
        .iter()
        .flat_map(|p| p.to_vec(t.backend()).expect("download"))
        .map(f32::to_bits)
        .collect()
}

fn grads<B: Capture<f32> + 'static>(t: &Trainer<B, f32, Mlp<B, f32>>) -> Vec<f32> {
    t.backend()
        .download(&t.model().flat_gradients().expect("flat gradients"))
        .expect("download")
}

/// Losses and parameters (as bits) after 4 steps, and whether every step ran captured.
fn run(
    b: CudaBackend<SimDriver>,
    schedule: TrainSchedule,
    capture: bool,
) -> (Vec<u64>, Vec<u32>, bool) {
    let mut t = trainer(b, config(schedule, capture));
    let mut losses = Vec::new();
    let mut captured = true;
    for step in 0..4 {
        let (x, y) = data(step, BATCH, S * F);
        let r = t.step(StepSource::host(&x, &y, BATCH)).expect("step");
        assert_eq!(r.step, step + 1);
        losses.push(r.loss.to_bits());
        captured &= r.captured;
    }
    let graph = t.graphs().step.is_some();
    assert_eq!(
        graph, capture,
        "{schedule:?}: a graph exactly when captured"
    );
    (losses, values(&t), captured)
}

#[rstest]
#[case::batched(TrainSchedule::Batched)]
#[case::per_sample(TrainSchedule::PerSample)]
fn own_model_captured_equals_eager_bitwise_on_the_simulated_device(
    #[case] schedule: TrainSchedule,
) {
    let eager = run(super::mock(), schedule, false);
    let captured = run(super::mock(), schedule, true);
    assert!(
        !eager.2 && captured.2,
        "eager {} captured {}",
        eager.2,
        captured.2
    );
    assert_eq!(captured.0, eager.0, "{schedule:?}: losses");
    assert_eq!(captured.1, eager.1, "{schedule:?}: parameters");
    let start = values(&trainer(super::mock(), config(schedule, false)));
    assert_ne!(eager.1, start, "the steps moved the parameters");
}

fn rel(a: &[f32], b: &[f32]) -> f64 {
    let d: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
    let n: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (d / n.max(1e-30)).sqrt()
}

/// One step of each schedule from the same start: the per-sample accumulation of loss/B
/// gradients equals the batched gradient to f32 rounding, and so does the update.
#[test]
fn own_model_batched_and_per_sample_gradients_agree_to_rounding() {
    let (x, y) = data(0, BATCH, S * F);
    let step = |schedule| {
        let mut t = trainer(super::mock(), config(schedule, false));
        let r = t.step(StepSource::host(&x, &y, BATCH)).expect("step");
        let params: Vec<f32> = t
            .model()
            .parameters()
            .iter()
            .flat_map(|p| p.to_vec(t.backend()).expect("download"))
            .collect();
        (r.loss, grads(&t), params)
    };
    let (batched, per_sample) = (step(TrainSchedule::Batched), step(TrainSchedule::PerSample));
    assert!(
        (batched.0 - per_sample.0).abs() < 1e-6,
        "loss {} vs {}",
        batched.0,
        per_sample.0
    );
    assert!(batched.1.iter().any(|g| *g != 0.0), "a gradient at all");
    let e = rel(&per_sample.1, &batched.1);
    assert!(e < 1e-5, "gradients differ by {e:e}");
    let e = rel(&per_sample.2, &batched.2);
    assert!(e < 1e-6, "parameters after the step differ by {e:e}");
}

/// On the CPU backend, both schedules, captured: the loss falls and the model learns the
/// labels (evaluation through the model's logits).
#[rstest]
#[case::batched(TrainSchedule::Batched)]
#[case::per_sample(TrainSchedule::PerSample)]
fn own_model_learns_on_the_cpu_backend(#[case] schedule: TrainSchedule) {
    let mut t = trainer(CpuBackend, config(schedule, true));
    let (x, y) = data(1, 64, S * F);
    let before = t.evaluate(EvalSource::Host(&x, &y)).expect("evaluate");
    let mut first = None;
    let mut last = 0.0;
    for _ in 0..60 {
        let r = t.step(StepSource::host(&x, &y, 64)).expect("step");
        first.get_or_insert(r.loss);
        last = r.loss;
    }
    let after = t.evaluate(EvalSource::Host(&x, &y)).expect("evaluate");
    assert!(
        last < 0.5 * first.unwrap(),
        "{schedule:?}: loss {first:?} -> {last}"
    );
    assert!(
        after.loss < before.loss && after.accuracy > 0.9,
        "{before:?} -> {after:?}"
    );
    assert_eq!(after.samples, 64);
}

/// A NaN in one sample: the captured batched step's device gate skips the update (nothing
/// applied, parameters bitwise unchanged) and the error names the sample.
#[rstest]
#[case::batched_captured(TrainSchedule::Batched, true)]
#[case::per_sample_eager(TrainSchedule::PerSample, false)]
fn own_model_non_finite_step_is_refused_naming_the_sample(
    #[case] schedule: TrainSchedule,
    #[case] capture: bool,
) {
    let mut t = trainer(super::mock(), config(schedule, capture));
    let (x, y) = data(0, BATCH, S * F);
    t.step(StepSource::host(&x, &y, BATCH))
        .expect("a healthy first step (captures)");
    let before = values(&t);
    let (mut x, y) = data(1, BATCH, S * F);
    x[4 * S * F + 2] = f32::NAN;
    let e = t.step(StepSource::host(&x, &y, BATCH)).unwrap_err();
    assert_eq!(e.applied(), Some(Applied::No), "{e}");
    assert!(
        matches!(
            e.cause(),
            GradError::NonFinite {
                step: 2,
                sample: Some(4),
                kind: NonFiniteKind::Loss
            }
        ),
        "{e}"
    );
    assert_eq!(values(&t), before, "nothing applied");
    assert_eq!(t.status().step, 1);
}

#[test]
fn own_model_bad_input_shape_is_a_typed_error_that_changes_nothing() {
    let mut t = trainer(super::mock(), config(TrainSchedule::Batched, true));
    let before = values(&t);
    // One value too many per sample: the model takes [S, F] only.
    let (x, y) = data(0, BATCH, S * F + 1);
    let e = t.step(StepSource::host(&x, &y, BATCH)).unwrap_err();
    assert_eq!(e.applied(), Some(Applied::No), "{e}");
    assert!(
        matches!(e.cause(), GradError::BadInput(m) if m.contains("the MLP takes [3, 4]")),
        "{e}"
    );
    assert!(matches!(t.predict(&x, BATCH), Err(GradError::BadInput(_))));
    // A pinned batch of another sample shape, though of as many values: refused.
    let p = zgrad::PinnedBatch::new(t.backend(), BATCH, F, S).expect("pinned");
    let e = t.step(StepSource::pinned(&p, BATCH)).unwrap_err();
    assert!(
        matches!(e.cause(), GradError::BadInput(m) if m.contains("[3, 4]")),
        "{e}"
    );
    // A pinned batch of 3 target values a sample for a binary model: refused, by both counts.
    let p = zgrad::PinnedBatch::with_targets(t.backend(), BATCH, S, F, 3).expect("pinned");
    for e in [
        t.step(StepSource::pinned(&p, BATCH)).unwrap_err(),
        t.queue(StepSource::pinned(&p, BATCH), 2).unwrap_err(),
    ] {
        assert_eq!(e.applied(), Some(Applied::No), "{e}");
        assert!(
            matches!(e.cause(), GradError::BadInput(m) if m.contains("3 target values") && m.contains("(1 a sample)")),
            "{e}"
        );
    }
    assert_eq!(values(&t), before);
    assert_eq!(t.status().step, 0);
    // The trainer goes on with good input.
    let (x, y) = data(0, BATCH, S * F);
    assert!(
        t.step(StepSource::host(&x, &y, BATCH))
            .expect("step")
            .captured
    );
}

/// A model naming two parameters alike (a checkpoint could not hold both) or holding a
/// parameter that cannot be trained is refused when the trainer is made.
#[test]
fn a_model_with_a_repeated_name_or_a_constant_is_refused() {
    #[derive(Clone)]
    struct Renamed(Mlp<CpuBackend, f32>, bool);
    impl Model<CpuBackend, f32> for Renamed {
        fn named_parameters(&self) -> Vec<(String, Var<CpuBackend, f32>)> {
            let mut p = self.0.named_parameters();
            if self.1 {
                p[1].0 = p[0].0.clone();
            } else {
                p[1].1 = p[1].1.detach();
            }
            p
        }
        fn loss(
            &self,
            tape: &zgrad::Tape<'_, CpuBackend, f32>,
            x: &Var<CpuBackend, f32>,
            y: &Var<CpuBackend, f32>,
        ) -> zgrad::Result<(Var<CpuBackend, f32>, Var<CpuBackend, f32>)> {
            self.0.loss(tape, x, y)
        }
        fn sample_shape(&self, values: usize) -> zgrad::Result<Vec<usize>> {
            self.0.sample_shape(values)
        }
    }
    let mlp = Mlp::new(&CpuBackend, S, F, HIDDEN, 1).expect("model");
    let e = Trainer::new(
        CpuBackend,
        Renamed(mlp.clone(), true),
        TrainerConfig::default(),
    )
    .unwrap_err();
    assert!(
        matches!(&e, GradError::Config(m) if m.contains("`l1.weight` appears twice")),
        "{e}"
    );
    let e = Trainer::new(CpuBackend, Renamed(mlp, false), TrainerConfig::default()).unwrap_err();
    assert!(
        matches!(&e, GradError::Config(m) if m.contains("`l1.bias` is not trainable")),
        "{e}"
    );
}

/// The parameters are views of one flat buffer, which the trainer exposes.
#[test]
fn own_model_parameters_are_one_flat_buffer() {
    let t = trainer(CpuBackend, TrainerConfig::default());
    let set = t.model().parameter_set().expect("one flat set");
    let numel: usize = t
        .model()
        .parameters()
        .iter()
        .map(|p| p.value().numel())
        .sum();
    assert_eq!(numel, HIDDEN * S * F + HIDDEN + HIDDEN + 1);
    assert!(set.len() >= numel);
    assert_eq!(
        t.model().flat_parameters().expect("flat").numel(),
        set.len()
    );
}

/// The other sources for the own model: a pinned batch and the captured step replayed on the
/// batch already on the device give a host `step`'s bits.
#[test]
fn own_model_pinned_and_resident_steps_equal_train_batch() {
    let cfg = config(TrainSchedule::Batched, true);
    let (x, y) = data(0, BATCH, S * F);
    let mut slices = trainer(super::mock(), cfg);
    let mut pinned = trainer(super::mock(), cfg);
    let mut resident = trainer(super::mock(), cfg);
    let mut p = zgrad::PinnedBatch::new(pinned.backend(), BATCH, S, F).expect("pinned");
    p.fill(|px, py| {
        px.copy_from_slice(&x);
        py.copy_from_slice(&y);
    })
    .expect("fill");
    let mut losses = [Vec::new(), Vec::new(), Vec::new()];
    for step in 0..3 {
        losses[0].push(
            slices
                .step(StepSource::host(&x, &y, BATCH))
                .expect("slices")
                .loss,
        );
        losses[1].push(
            pinned
                .step(StepSource::pinned(&p, BATCH))
                .expect("pinned")
                .loss,
        );
        let r = if step == 0 {
            resident.step(StepSource::host(&x, &y, BATCH))
        } else {
            resident.step(StepSource::held(|_| {}))
        };
        losses[2].push(r.expect("resident").loss);
    }
    assert_eq!(losses[1], losses[0]);
    assert_eq!(losses[2], losses[0]);
    assert_eq!(values(&pinned), values(&slices));
    assert_eq!(values(&resident), values(&slices));
    assert_eq!(resident.status().step, 3);
}
