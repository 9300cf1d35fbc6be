//! What the scenarios share: backends on each device, a deterministic data set, trainers that
//! start from the same parameters, and the per-tensor error measure of docs/xasset.md.

use std::sync::{Arc, Mutex};

use zcompute::{Capture, CpuBackend, CudaBackend, prelude::*};
use zdevice::{Device, DeviceConfig, Driver, SimConfig, SimDriver};
use zgrad::{TrainSchedule, Trainer, TrainerConfig, XAsset, XAssetConfig};
use zmem::{AllocClass, Arena, ArenaConfig, Event, EventKind};

/// A scenario's size: the model, the samples per mini-batch and the number of mini-batches.
#[derive(Clone, Copy, Debug)]
pub struct Size {
    pub model: XAssetConfig,
    pub batch: usize,
    pub batches: usize,
}

/// The tiny configuration of the PyTorch fixtures (F=7, S=3, D=8, H=2, FF=16), batch 4.
pub const TINY: Size = Size {
    model: XAssetConfig {
        features: 7,
        scales: 3,
        width: 8,
        heads: 2,
        ff: 16,
        layers: 1,
    },
    batch: 4,
    batches: 50,
};

/// An arena with room to spare: 16 MiB segments up to 256 MiB, poison as asked.
pub fn roomy_arena(poison: bool) -> ArenaConfig {
    ArenaConfig {
        initial_bytes: 16 << 20,
        segment_bytes: 16 << 20,
        cap_bytes: Some(256 << 20),
        overflow_reserve_bytes: 8 << 20,
        poison,
        timeline_events: 1024,
        sanitize: false,
        from_env: Vec::new(),
    }
}

/// The simulated device with `capacity` bytes (freed memory poisoned, as the arena's own
/// poison would be on the GPU).
pub fn sim_device(capacity: u64) -> Device<SimDriver> {
    let sim = SimDriver::new(SimConfig {
        poison_on_free: true,
        ..SimConfig::with_capacity(capacity)
    });
    // The kernels' Rust twins, registered explicitly (as `zcompute::Engine::sim` does).
    zcompute::cuda::twins::register(&sim);
    Device::open(
        sim,
        DeviceConfig {
            blas_workspace_bytes: 0,
            ..DeviceConfig::default()
        },
    )
    .expect("the simulated device opens")
}

/// A CUDA backend over `device` with an arena of `config`; output poisoning follows the
/// arena's poison setting, so an element an op forgets to write is NaN.
pub fn backend_on<D: Driver>(device: Device<D>, config: ArenaConfig) -> CudaBackend<D> {
    let poison = config.poison;
    let arena = Arena::new(device, config).expect("the arena is created");
    let b = CudaBackend::new(arena).expect("the CUDA backend starts");
    b.set_poison(poison);
    b
}

pub fn mock(config: ArenaConfig) -> CudaBackend<SimDriver> {
    backend_on(sim_device(1 << 30), config)
}

#[cfg(feature = "gpu")]
pub fn cuda(config: ArenaConfig) -> CudaBackend<zdevice::CudaDriver> {
    let driver = zdevice::CudaDriver::load().expect("the CUDA driver loads on a GPU machine");
    let dev = Device::open(driver, DeviceConfig::default()).expect("CUDA device 0 opens");
    tracing_free_name(&dev);
    backend_on(dev, config)
}

/// Prints the device a GPU scenario ran on (tests may print; the closing note quotes it).
#[cfg(feature = "gpu")]
fn tracing_free_name<D: Driver>(dev: &Device<D>) {
    #[allow(clippy::print_stdout)]
    {
        println!("device: {}", dev.info().name);
    }
}

/// A deterministic data set: features uniform in [-1, 1), label 1 when the first feature's
/// mean over the scales exceeds the last feature's (a rule the model can learn).
pub fn data(size: &Size, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let (s, f) = (size.model.scales, size.model.features);
    let n = size.batch * size.batches;
    let mut state = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    let mut next = move || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        // Top 24 bits as a fraction in [0, 1), mapped to [-1, 1).
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    let x: Vec<f32> = (0..n * s * f).map(|_| next()).collect();
    let y = (0..n)
        .map(|i| {
            let sample = &x[i * s * f..(i + 1) * s * f];
            let mean = |j: usize| (0..s).map(|k| sample[k * f + j]).sum::<f32>() / s as f32;
            if mean(0) > mean(f - 1) { 1.0 } else { 0.0 }
        })
        .collect();
    (x, y)
}

/// Mini-batch `k` of `(x, y)`.
pub fn batch<'d>(
    size: &Size,
    (x, y): &'d (Vec<f32>, Vec<f32>),
    k: usize,
) -> (&'d [f32], &'d [f32]) {
    let per = size.model.scales * size.model.features;
    let (a, b) = (k * size.batch, (k + 1) * size.batch);
    (&x[a * per..b * per], &y[a..b])
}

/// The parameters every trainer of a scenario starts from (PyTorch's default init, seed 7).
pub fn initial_parameters(size: &Size) -> Vec<Vec<f32>> {
    let model = XAsset::<CpuBackend, f32>::init(&CpuBackend, size.model, 7).expect("init");
    parameters(&CpuBackend, &model)
}

pub fn parameters<B: Ops<f32>>(b: &B, model: &XAsset<B, f32>) -> Vec<Vec<f32>> {
    model
        .parameters()
        .iter()
        .map(|p| p.to_vec(b).expect("parameters download"))
        .collect()
}

/// A trainer on `b` whose model holds `params` (in docs/xasset.md order).
pub fn trainer<B: Capture<f32> + 'static>(
    b: B,
    size: &Size,
    params: &[Vec<f32>],
    config: TrainerConfig,
) -> Trainer<B, f32, XAsset<B>> {
    let model = XAsset::<B, f32>::init(&b, size.model, 0).expect("init");
    for (p, data) in model.parameters().iter().zip(params) {
        p.upload(&b, data).expect("parameters upload");
    }
    Trainer::new(b, model, config).expect("trainer")
}

pub fn config(schedule: TrainSchedule, capture: bool) -> TrainerConfig {
    TrainerConfig {
        schedule,
        capture,
        ..TrainerConfig::default()
    }
}

/// Overwrites a trainer's parameters (so several trainers compute gradients from the same ones).
pub fn set_parameters<B: Capture<f32> + 'static>(
    t: &Trainer<B, f32, XAsset<B>>,
    params: &[Vec<f32>],
) {
    for (p, data) in t.model().parameters().iter().zip(params) {
        p.upload(t.backend(), data).expect("parameters upload");
    }
}

/// Gradients by parameter name, in the model's order.
pub type NamedGrads = Vec<(String, Vec<f32>)>;

/// Every gradient of a trainer, by parameter name, after its last step.
pub fn gradients<B: Capture<f32> + 'static>(t: &Trainer<B, f32, XAsset<B>>) -> NamedGrads {
    t.model()
        .named_parameters()
        .into_iter()
        .map(|(name, p)| {
            let g = p.grad().expect("parameters have gradients");
            (name, t.backend().download(g).expect("gradient download"))
        })
        .collect()
}

/// ‖a − b‖ / ‖b‖ in f64.
pub fn rel(a: &[f32], b: &[f32]) -> f64 {
    let d: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
        .sum();
    d.sqrt() / norm(b)
}

pub fn norm(v: &[f32]) -> f64 {
    v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt()
}

/// Below this reference norm a gradient is a near-cancelling sum (head.bias and f2.bias on a
/// batch whose samples pull in opposite directions: terms of size 1/B adding up to 1e-4), whose
/// float32 rounding alone is about 1e-8 absolute, so it is measured against this floor instead
/// of its own tiny norm. Tensors of ordinary size (every weight) are unaffected.
pub const CANCELLATION_FLOOR: f64 = 1e-2;

/// Compares two gradient sets per tensor as docs/xasset.md says: ‖ours − ref‖ / ‖ref‖ at most `tol`
/// (the denominator floored at `CANCELLATION_FLOOR`); kn.bias (zero in exact arithmetic) by its
/// norm, below 1e-6. Returns the worst error.
pub fn assert_gradients_agree(
    what: &str,
    ours: &[(String, Vec<f32>)],
    reference: &[(String, Vec<f32>)],
    tol: f64,
) -> f64 {
    let mut worst = 0.0f64;
    for ((name, g), (rname, r)) in ours.iter().zip(reference) {
        assert_eq!(name, rname);
        if name.ends_with("kn.bias") {
            assert!(
                norm(g) < 1e-6,
                "{what}: kn.bias gradient norm {:e}",
                norm(g)
            );
            continue;
        }
        let diff = rel(g, r) * norm(r);
        let e = diff / norm(r).max(CANCELLATION_FLOOR);
        assert!(
            e <= tol,
            "{what}: grad.{name} differs by {e:e} (|diff| {diff:e}, |ref| {:e}, tolerance {tol:e})",
            norm(r)
        );
        worst = worst.max(e);
    }
    worst
}

/// Collects every event an arena publishes from now on.
pub fn record_events<D: Driver>(arena: &Arena<D>) -> Arc<Mutex<Vec<Event>>> {
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&events);
    arena.subscribe(Arc::new(move |e: &Event| {
        sink.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(e.clone());
    }));
    events
}

/// Scratch allocation addresses by step, from recorded events.
pub fn scratch_addresses_by_step(events: &[Event]) -> std::collections::BTreeMap<u64, Vec<u64>> {
    let mut by_step = std::collections::BTreeMap::<u64, Vec<u64>>::new();
    for e in events {
        if let EventKind::Alloc {
            class: AllocClass::Scratch,
            ptr,
            ..
        } = e.kind
        {
            by_step.entry(e.step).or_default().push(ptr);
        }
    }
    by_step
}
