//! The captured batched step replayed on the batch already on the device
//! (`Trainer::replay_resident`, what the benchmark times with CUDA events) and the captured
//! graphs' node counts, on the CUDA backend over the simulated driver. The node report at the
//! default size runs on the accounting-only simulator (the graphs are the same; no kernel runs).

#![allow(clippy::print_stdout)]

use zcompute::{CudaBackend, Engine};
use zdevice::{Device, DeviceConfig, SimConfig, SimDriver};
use zgrad::rng::SplitMix64;
use zgrad::{
    Applied, GradError, ReplayMark, StepReport, TrainSchedule, Trainer, TrainerConfig, XAsset,
    XAssetConfig,
};
use zmem::{Arena, ArenaConfig};

type Sim = CudaBackend<SimDriver>;

const SMALL: XAssetConfig = XAssetConfig {
    features: 5,
    scales: 3,
    width: 8,
    heads: 2,
    ff: 16,
    layers: 1,
};

fn batch(c: XAssetConfig, n: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let mut rng = SplitMix64::new(seed);
    let x = rng
        .normal_vec(n * c.scales * c.features)
        .iter()
        .map(|&v| v as f32)
        .collect();
    let y = (0..n)
        .map(|_| f32::from(u8::from(rng.next_f64() > 0.5)))
        .collect();
    (x, y)
}

fn trainer(schedule: TrainSchedule, capture: bool) -> (Sim, Trainer<Sim>) {
    let b = Engine::sim(256 << 20).expect("simulated backend");
    b.set_poison(true);
    let model = XAsset::init(&b, SMALL, 3).expect("model");
    let config = TrainerConfig {
        schedule,
        capture,
        ..TrainerConfig::default()
    };
    let t = Trainer::new(b.clone(), model, config).expect("trainer");
    (b, t)
}

fn params(b: &Sim, t: &Trainer<Sim>) -> Vec<Vec<u32>> {
    t.model()
        .parameters()
        .iter()
        .map(|p| p.to_vec(b).unwrap().iter().map(|v| v.to_bits()).collect())
        .collect()
}

fn bits(r: &StepReport) -> (u64, u64, u64, bool) {
    (r.step, r.loss.to_bits(), r.grad_norm.to_bits(), r.captured)
}

#[test]
fn replaying_the_resident_batch_equals_train_batch_of_that_batch() {
    let (x, y) = batch(SMALL, 4, 11);
    let (b1, mut uploads) = trainer(TrainSchedule::Batched, true);
    let (b2, mut resident) = trainer(TrainSchedule::Batched, true);
    assert!(uploads.train_batch(&x, &y, 4).unwrap().captured);
    assert!(resident.train_batch(&x, &y, 4).unwrap().captured);
    for _ in 0..3 {
        let want = uploads.train_batch(&x, &y, 4).unwrap();
        let mut marks = Vec::new();
        let got = resident.replay_resident(|m| marks.push(m)).unwrap();
        assert_eq!(marks, [ReplayMark::Before, ReplayMark::After]);
        assert_eq!(bits(&got), bits(&want));
    }
    assert_eq!(resident.step(), 4);
    assert_eq!(params(&b2, &resident), params(&b1, &uploads));
    assert_eq!(resident.batched_graph().map(|g| g.replays()), Some(3));
}

#[test]
fn replay_resident_without_a_captured_step_is_refused_and_applies_nothing() {
    let (x, y) = batch(SMALL, 4, 12);
    for capture in [true, false] {
        let (b, mut t) = trainer(TrainSchedule::Batched, capture);
        if !capture {
            t.train_batch(&x, &y, 4).unwrap();
        }
        let before = params(&b, &t);
        let mut marks = 0;
        let e = t.replay_resident(|_| marks += 1).unwrap_err();
        assert_eq!(e.applied(), Some(Applied::No), "{e}");
        assert!(
            matches!(e.cause(), GradError::BadInput(m) if m.contains("no captured batched step")),
            "{e:?}"
        );
        assert_eq!(
            (marks, t.step(), params(&b, &t)),
            (0, u64::from(!capture), before)
        );
    }
}

#[test]
fn a_non_finite_resident_step_names_its_sample_and_applies_nothing() {
    let (mut x, y) = batch(SMALL, 4, 13);
    let (b, mut t) = trainer(TrainSchedule::Batched, true);
    t.train_batch(&x, &y, 4).unwrap();
    // A NaN in sample 2 of the batch on the device, as the last upload left it.
    x[2 * SMALL.scales * SMALL.features] = f32::NAN;
    let e = t.train_batch(&x, &y, 4).unwrap_err();
    assert_eq!(e.applied(), Some(Applied::No), "{e}");
    let before = params(&b, &t);
    let e = t.replay_resident(|_| {}).unwrap_err();
    assert_eq!(e.applied(), Some(Applied::No), "{e}");
    assert!(
        matches!(
            e.cause(),
            GradError::NonFinite {
                sample: Some(2),
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!((t.step(), params(&b, &t)), (1, before));
}

/// Nodes per captured batched step and per captured per-sample step at the default size
/// (batch 256), printed for the benchmark's report; the per-sample graph's budget is checked
/// beside its schedule.
#[test]
fn nodes_per_captured_step_at_the_default_size() {
    let mut nodes = Vec::new();
    for schedule in [TrainSchedule::Batched, TrainSchedule::PerSample] {
        let sim = SimDriver::new(SimConfig::accounting(64 << 30));
        zcompute::cuda::twins::register(&sim);
        let device = Device::open(sim, DeviceConfig::default()).expect("accounting device");
        let arena = Arena::new(
            device,
            ArenaConfig {
                cap_bytes: Some(32 << 30),
                ..ArenaConfig::default()
            },
        )
        .expect("arena");
        let b = CudaBackend::new(arena).expect("backend");
        let c = XAssetConfig::default();
        let model = XAsset::zeroed(&b, c).expect("model");
        let config = TrainerConfig {
            schedule,
            capture: true,
            ..TrainerConfig::default()
        };
        let mut t = Trainer::new(b, model, config).expect("trainer");
        let x = vec![0.0f32; 256 * c.scales * c.features];
        let y = vec![0.0f32; 256];
        assert!(t.train_batch(&x, &y, 256).unwrap().captured, "{schedule:?}");
        let graph = match schedule {
            TrainSchedule::Batched => t.batched_graph(),
            TrainSchedule::PerSample => t.sample_graph(),
        };
        let n = graph.expect("a captured graph").nodes();
        assert!(n > 0, "{schedule:?}: an empty graph");
        nodes.push(n);
    }
    println!(
        "graph nodes at the default size, batch 256: batched step {}, per-sample step {} (x256 per optimiser step)",
        nodes[0], nodes[1]
    );
}
