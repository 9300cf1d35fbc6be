//! The per-sample schedule over a device-resident batch on zcompute's CUDA backend (the
//! simulated device in CI, CUDA device 0 under `gpu`), against the CPU backend: captured
//! equals eager equals CPU over batches of changing size (a smaller batch reuses the table's
//! first rows and the graph; a larger one makes both anew). Poison is on.

use zcompute::{Capture, CpuBackend, CudaBackend, CudaGraph};
use zdevice::{Device, DeviceConfig, Driver, SimConfig, SimDriver};
use zgrad::{
    LrSchedule, StepSource, TensorFile, TrainSchedule, Trainer, TrainerConfig, XAsset, read_tensors,
};
use zmem::{Arena, ArenaConfig};

use crate::support::fixtures;

fn backend_on<D: Driver>(device: Device<D>) -> CudaBackend<D> {
    let config = ArenaConfig {
        poison: true,
        cap_bytes: Some(192 << 20),
        ..ArenaConfig::default()
    };
    let b = CudaBackend::new(Arena::new(device, config).expect("arena")).expect("backend");
    b.set_poison(true);
    b
}

fn mock() -> CudaBackend<SimDriver> {
    let sim = SimDriver::new(SimConfig {
        poison_on_free: true,
        ..SimConfig::with_capacity(512 << 20)
    });
    zcompute::cuda::twins::register(&sim);
    let device = Device::open(
        sim,
        DeviceConfig {
            blas_workspace_bytes: 0,
            ..DeviceConfig::default()
        },
    )
    .expect("the simulated device opens");
    backend_on(device)
}

/// Batch sizes of the run: a first graph at 2, a larger batch (slots and graph made anew),
/// smaller ones (the first rows of the table, the same graph), the full one again.
const BATCHES: [usize; 5] = [2, 4, 3, 1, 4];

struct Outcome {
    losses: Vec<f64>,
    norms: Vec<f64>,
    params: Vec<Vec<f32>>,
}

/// Trains `BATCHES` on backend `b` (the first `n` samples of the tiny fixture, scaled per
/// step) with the per-sample schedule; `check` sees the trainer after each step.
fn train<B: Capture<f32> + 'static>(
    b: B,
    capture: bool,
    mut check: impl FnMut(&Trainer<B, f32, XAsset<B>>, usize),
) -> Outcome {
    let path = fixtures::fixture("xasset_tiny_in.safetensors");
    let input: TensorFile<f32> = read_tensors(&path).unwrap();
    let (x, y) = (&input.tensors["x"].data, &input.tensors["y"].data);
    let per = x.len() / 4;
    let model = XAsset::from_tensors(&b, &input, &path).unwrap();
    let b = std::rc::Rc::new(b);
    let config = TrainerConfig {
        schedule: TrainSchedule::PerSample,
        capture,
        clip_grad: Some(0.5),
        lr: 1e-2,
        lr_schedule: LrSchedule::LinearWarmup { warmup_steps: 2 },
        ..TrainerConfig::default()
    };
    let mut t = Trainer::new(std::rc::Rc::clone(&b), model, config).unwrap();
    let (mut losses, mut norms) = (Vec::new(), Vec::new());
    for (k, &n) in BATCHES.iter().enumerate() {
        let xs: Vec<f32> = x[..n * per]
            .iter()
            .map(|v| v * (1.0 + 0.1 * k as f32))
            .collect();
        let r = t.step(StepSource::host(&xs, &y[..n], n)).unwrap();
        assert_eq!((r.captured, r.samples), (capture, n), "step {k}");
        losses.push(r.loss);
        norms.push(r.grad_norm);
        check(&t, k);
    }
    let params = t
        .model()
        .parameters()
        .iter()
        .map(|p| b.download(p.value()).unwrap())
        .collect();
    Outcome {
        losses,
        norms,
        params,
    }
}

fn rel(got: &[f32], want: &[f32]) -> f64 {
    let d: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| (f64::from(*a) - f64::from(*b)).powi(2))
        .sum();
    let n: f64 = want.iter().map(|b| f64::from(*b).powi(2)).sum();
    d.sqrt() / n.sqrt()
}

/// Losses and gradient norms of every step within `tol`, and the parameters at the end when
/// `params` (AdamW's normalised update turns float rounding in near-zero gradients into
/// lr-sized steps, so parameters of two backends are compared through the trajectory's losses
/// and norms instead).
fn assert_close(what: &str, got: &Outcome, want: &Outcome, tol: f64, params: bool) {
    for (name, g, w) in [
        ("loss", &got.losses, &want.losses),
        ("norm", &got.norms, &want.norms),
    ] {
        for (k, (a, b)) in g.iter().zip(w).enumerate() {
            assert!(
                (a - b).abs() <= tol * b.abs(),
                "{what}: step {k} {name} {a} vs {b}"
            );
        }
    }
    if !params {
        return;
    }
    for (i, (g, w)) in got.params.iter().zip(&want.params).enumerate() {
        let e = rel(g, w);
        assert!(e <= tol, "{what}: parameter {i} differs by {e:e}");
    }
}

/// Captured equals eager (1e-6, parameters included) equals the CPU backend (1e-5), over batches of changing size;
/// the graph is made again only when the batch grows past the table.
fn captured_equals_eager_equals_cpu<D: Driver>(make: impl Fn() -> CudaBackend<D>) {
    let cpu = train(CpuBackend, false, |_, _| {});
    let eager = train(make(), false, |t, _| assert!(t.graphs().step.is_none()));
    let mut graphs: Vec<(usize, u64)> = Vec::new();
    let captured = train(make(), true, |t, _| {
        let g: &CudaGraph<D> = t.graphs().step.expect("a graph");
        graphs.push((g.nodes(), g.replays()));
    });
    // Replays per step: n - 1 after a capture (its warm-up ran sample 0), n after.
    let replays: Vec<u64> = graphs.iter().map(|g| g.1).collect();
    assert_eq!(
        replays,
        [1, 3, 6, 7, 11],
        "graph made at batch 2, again at 4, then kept"
    );
    assert!(graphs.iter().all(|g| g.0 == graphs[0].0), "{graphs:?}");
    assert_close("captured vs eager", &captured, &eager, 1e-6, true);
    assert_close("device vs CPU", &eager, &cpu, 1e-5, false);
    assert_close("captured device vs CPU", &captured, &cpu, 1e-5, false);
}

#[test]
fn captured_equals_eager_equals_cpu_on_the_simulated_device() {
    captured_equals_eager_equals_cpu(mock);
}

#[cfg(feature = "gpu")]
mod gpu {
    #[test]
    fn captured_equals_eager_equals_cpu_on_the_gpu() {
        super::captured_equals_eager_equals_cpu(|| {
            let driver =
                zdevice::CudaDriver::load().expect("the CUDA driver loads on a GPU machine");
            let device = zdevice::Device::open(driver, zdevice::DeviceConfig::default())
                .expect("CUDA device 0 opens");
            super::backend_on(device)
        });
    }
}
