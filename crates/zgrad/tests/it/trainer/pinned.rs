//! a pinned `step`: a batch written in place into pinned host memory and
//! uploaded straight from it trains exactly as the same values given to a host `step` as
//! slices (bitwise: loss, norm, parameters), in both schedules, eager and captured, on the
//! CUDA backend over the simulated driver and on the CPU backend; bad sizes and non-finite
//! values get the same errors.

use crate::support::small::{SMALL, labelled};
use rstest::rstest;
use zcompute::{Capture, CpuBackend, CudaBackend, Engine, PinnedHost};
use zdevice::SimDriver;
use zgrad::{
    Applied, GradError, NonFiniteKind, PinnedBatch, StepReport, StepSource, TrainSchedule, Trainer,
    TrainerConfig, XAsset,
};

type Sim = CudaBackend<SimDriver>;

const CAPACITY: usize = 6;

fn batch(n: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    labelled(SMALL, n, seed)
}

fn trainer<B: Capture<f32> + Clone + 'static>(
    b: &B,
    schedule: TrainSchedule,
    capture: bool,
) -> Trainer<B, f32, XAsset<B>> {
    let model = XAsset::init(b, SMALL, 3).expect("model");
    let config = TrainerConfig {
        schedule,
        capture,
        clip_grad: Some(1.0),
        ..TrainerConfig::default()
    };
    Trainer::new(b.clone(), model, config).expect("trainer")
}

fn params<B: Capture<f32> + 'static>(b: &B, t: &Trainer<B, f32, XAsset<B>>) -> Vec<u32> {
    let flat = t.model().flat_parameters().unwrap();
    b.download(&flat)
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

fn bits(r: &StepReport) -> (u64, u64, u64, bool, usize) {
    (
        r.step,
        r.loss.to_bits(),
        r.grad_norm.to_bits(),
        r.captured,
        r.samples,
    )
}

/// Writes `x` and `y` at the start of the pinned batch (the rest keeps whatever it held).
fn fill<B: PinnedHost<f32>>(p: &mut PinnedBatch<B>, x: &[f32], y: &[f32]) {
    p.fill(|px, py| {
        px[..x.len()].copy_from_slice(x);
        py[..y.len()].copy_from_slice(y);
    })
    .unwrap();
}

/// Four steps, one of them on fewer samples than the capacity (a captured batched step then
/// runs eagerly, a shape the graph does not have, and captures no second graph), each on
/// both trainers: every report and the parameters after every step agree bit for bit.
fn same_as_slices<B: Capture<f32> + PinnedHost<f32> + Clone + 'static>(
    b: &B,
    schedule: TrainSchedule,
    capture: bool,
) {
    let mut slices = trainer(b, schedule, capture);
    let mut pinned = trainer(b, schedule, capture);
    let mut p = PinnedBatch::new(b, CAPACITY, SMALL.scales, SMALL.features).unwrap();
    for (k, n) in [CAPACITY, CAPACITY, 4, CAPACITY].into_iter().enumerate() {
        let (x, y) = batch(n, 10 + k as u64);
        let want = slices.step(StepSource::host(&x, &y, n)).unwrap();
        fill(&mut p, &x, &y);
        let got = pinned.step(StepSource::pinned(&p, n)).unwrap();
        assert_eq!(bits(&got), bits(&want), "step {k}");
        assert_eq!(params(b, &pinned), params(b, &slices), "step {k}");
    }
    assert_eq!(pinned.status().step, 4);
}

#[rstest]
#[case::batched(TrainSchedule::Batched, false)]
#[case::batched_captured(TrainSchedule::Batched, true)]
#[case::per_sample(TrainSchedule::PerSample, false)]
#[case::per_sample_captured(TrainSchedule::PerSample, true)]
fn a_pinned_batch_trains_as_the_same_slices_on_the_simulated_device(
    #[case] schedule: TrainSchedule,
    #[case] capture: bool,
) {
    let b: Sim = Engine::sim(256 << 20).expect("simulated backend");
    b.set_poison(true);
    same_as_slices(&b, schedule, capture);
}

#[rstest]
#[case::batched(TrainSchedule::Batched, false)]
#[case::per_sample(TrainSchedule::PerSample, false)]
fn a_pinned_batch_trains_as_the_same_slices_on_the_cpu(
    #[case] schedule: TrainSchedule,
    #[case] capture: bool,
) {
    same_as_slices(&CpuBackend, schedule, capture);
}

/// The captured step replays the graph on the pinned batch: the step after the capture is
/// a replay (`captured`), and a refill between steps reaches the next replay.
#[test]
fn captured_replays_read_each_refill() {
    let b: Sim = Engine::sim(256 << 20).expect("simulated backend");
    let mut t = trainer(&b, TrainSchedule::Batched, true);
    let mut p = PinnedBatch::new(&b, CAPACITY, SMALL.scales, SMALL.features).unwrap();
    let mut losses = Vec::new();
    for k in 0..3 {
        let (x, y) = batch(CAPACITY, 40 + k);
        fill(&mut p, &x, &y);
        let r = t.step(StepSource::pinned(&p, CAPACITY)).unwrap();
        assert!(r.captured, "step {k}");
        losses.push(r.loss.to_bits());
    }
    assert!(t.graphs().step.is_some());
    losses.dedup();
    assert_eq!(losses.len(), 3, "every step saw its own batch");
}

#[test]
fn bad_sizes_are_refused_as_train_batch_refuses_them() {
    let b: Sim = Engine::sim(256 << 20).expect("simulated backend");
    let mut t = trainer(&b, TrainSchedule::Batched, false);
    let p = PinnedBatch::new(&b, CAPACITY, SMALL.scales, SMALL.features).unwrap();
    let other = PinnedBatch::new(&b, CAPACITY, SMALL.scales, SMALL.features + 1).unwrap();
    for (what, err) in [
        ("n = 0", t.step(StepSource::pinned(&p, 0)).unwrap_err()),
        (
            "n > capacity",
            t.step(StepSource::pinned(&p, CAPACITY + 1)).unwrap_err(),
        ),
        (
            "other features",
            t.step(StepSource::pinned(&other, CAPACITY)).unwrap_err(),
        ),
    ] {
        assert!(
            matches!(err.cause(), GradError::BadInput(_)),
            "{what}: {err}"
        );
        assert_eq!(err.applied(), Some(Applied::No), "{what}");
    }
    assert_eq!(t.status().step, 0);
    assert!(matches!(
        PinnedBatch::<Sim>::new(&b, 0, SMALL.scales, SMALL.features),
        Err(GradError::BadInput(_))
    ));
}

/// A NaN feature in sample 2 is reported as a host `step` reports it (the sample located on
/// a host copy of the pinned rows), nothing applied, in every schedule.
#[rstest]
#[case::batched(TrainSchedule::Batched, false)]
#[case::batched_captured(TrainSchedule::Batched, true)]
#[case::per_sample(TrainSchedule::PerSample, false)]
#[case::per_sample_captured(TrainSchedule::PerSample, true)]
fn a_non_finite_value_names_its_sample_as_train_batch_does(
    #[case] schedule: TrainSchedule,
    #[case] capture: bool,
) {
    let b: Sim = Engine::sim(256 << 20).expect("simulated backend");
    let (mut x, y) = batch(CAPACITY, 7);
    x[2 * SMALL.scales * SMALL.features + 1] = f32::NAN;
    let mut slices = trainer(&b, schedule, capture);
    let mut pinned = trainer(&b, schedule, capture);
    let want = slices.step(StepSource::host(&x, &y, CAPACITY)).unwrap_err();
    let mut p = PinnedBatch::new(&b, CAPACITY, SMALL.scales, SMALL.features).unwrap();
    fill(&mut p, &x, &y);
    let got = pinned.step(StepSource::pinned(&p, CAPACITY)).unwrap_err();
    assert!(
        matches!(
            got.cause(),
            GradError::NonFinite {
                step: 1,
                sample: Some(2),
                kind: NonFiniteKind::Loss
            }
        ),
        "{got}"
    );
    assert_eq!(got.to_string(), want.to_string());
    assert_eq!(got.applied(), want.applied());
    assert_eq!(params(&b, &pinned), params(&b, &slices));
}

/// The GPU twin of the simulated-device equality above (the `gpu` feature; needs a GPU).
#[cfg(feature = "gpu")]
mod gpu {
    use rstest::rstest;
    use zgrad::TrainSchedule;

    #[rstest]
    #[case::batched(TrainSchedule::Batched, false)]
    #[case::batched_captured(TrainSchedule::Batched, true)]
    #[case::per_sample(TrainSchedule::PerSample, false)]
    #[case::per_sample_captured(TrainSchedule::PerSample, true)]
    fn a_pinned_batch_trains_as_the_same_slices_on_the_gpu(
        #[case] schedule: TrainSchedule,
        #[case] capture: bool,
    ) {
        let b = zcompute::Engine::cuda(0).expect("CUDA device 0 opens");
        b.set_poison(true);
        super::same_as_slices(&b, schedule, capture);
    }
}
