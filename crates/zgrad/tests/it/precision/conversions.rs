//! The bf16 conversions a training step makes (issue 42), counted on the simulated device:
//! every run of the conversion kernel (`Kernel::F32ToBf16`), eager or replayed from a captured
//! graph. Under bf16 each operand of a Linear layer's products is converted once a step: the
//! weights once for all (the step's copy), each layer's input once in its forward (its copy
//! kept for the weight's gradient) and the gradient of its output once for both backward
//! products. The per-call reference (`bf16_weights_per_call`) converts both operands of every
//! product that cuBLAS runs, and none of a product with few rows (at most
//! `zcompute::cuda::LINEAR_ROW_LIMIT`, one sample's), which the small-row kernels' bf16 forms
//! run on the float32 operands, rounding as they read. The bits are the same (`trainer.rs`,
//! `device.rs`: the bf16 copy's bitwise tests).

// The counts belong in the test's output (reported before/after in issue 42).
#![allow(clippy::print_stderr)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use zcompute::CudaBackend;
use zcompute::cuda::Kernel;
use zdevice::{Device, DeviceConfig, SimConfig, SimDriver};
use zgrad::{Precision, StepSource, TrainSchedule, Trainer, TrainerConfig, XAsset, XAssetConfig};
use zmem::{Arena, ArenaConfig};

/// A simulated device whose conversion-kernel runs (`F32ToBf16`, and `TanhBackwardBf16`,
/// which writes its result's copy) are counted in the returned counter.
fn counting_device() -> (CudaBackend<SimDriver>, Arc<AtomicUsize>) {
    let sim = SimDriver::new(SimConfig::with_capacity(512 << 20));
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    zcompute::cuda::twins::register_observed(&sim, move |k| {
        // Tanh's backward with its result's copy converts too.
        if matches!(k, Kernel::F32ToBf16 | Kernel::TanhBackwardBf16) {
            seen.fetch_add(1, Ordering::Relaxed);
        }
    });
    let dev = Device::open(
        sim,
        DeviceConfig {
            blas_workspace_bytes: 0,
            ..DeviceConfig::default()
        },
    )
    .expect("the simulated device opens");
    let arena = Arena::new(dev, ArenaConfig::default()).expect("arena");
    (CudaBackend::new(arena).expect("backend"), count)
}

fn config(layers: usize) -> XAssetConfig {
    XAssetConfig {
        features: 7,
        scales: 3,
        width: 8,
        heads: 2,
        ff: 12,
        layers,
    }
}

/// Samples of the step: 36 rows a batched step (past the small-row kernels' 32, so its
/// products take cuBLAS), 3 a sample.
const ROWS: usize = 12;

/// Linear layers of XAsset with `layers` blocks that run as `Tape::linear` nodes in training:
/// the embedding and each block's `qkv`, `o`, `f1` and `f2` (the head's product is part of
/// the fused pooled loss, `Tape::pool_head_bce`, in float32).
fn linears(layers: usize) -> usize {
    1 + 4 * layers
}

/// Conversions of the third step of a bf16 trainer (the first two record and replay a
/// captured graph), `per_call`: the reference that converts every operand on every call.
fn conversions_per_step(
    layers: usize,
    schedule: TrainSchedule,
    capture: bool,
    per_call: bool,
) -> usize {
    let (b, count) = counting_device();
    let c = config(layers);
    let model = XAsset::init(&b, c, 5).expect("model");
    let cfg = TrainerConfig {
        schedule,
        capture,
        precision: Precision::Bf16,
        bf16_weights_per_call: per_call,
        ..TrainerConfig::default()
    };
    let mut t = Trainer::new(b, model, cfg).expect("trainer");
    let x: Vec<f32> = (0..ROWS * c.scales * c.features)
        .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
        .collect();
    let y: Vec<f32> = (0..ROWS).map(|i| (i % 2) as f32).collect();
    let mut step = || {
        let r = t.step(StepSource::host(&x, &y, ROWS)).expect("step");
        assert_eq!(r.captured, capture);
    };
    step();
    step();
    count.store(0, Ordering::Relaxed);
    step();
    count.load(Ordering::Relaxed)
}

/// Each Linear layer converts two tensors a step (its input in the forward, its output's
/// gradient in the backward; per sample in the per-sample schedule), and the weights convert
/// once: `1 + 2·linears` conversions a batched step, `1 + 2·linears·rows` a per-sample one,
/// eager and captured alike. Converting per call costs `4·linears − 2` a batched step: both
/// operands of the forward product and of the input's gradient (the embedding's input needs
/// none); the weight's gradient `gzᵀ · x` has as many rows as the layer has outputs (at most
/// 24 here), so it runs on a small-row kernel's bf16 form, which rounds as it reads and
/// converts nothing (before those forms: `6·linears − 2`), as does every product of a sample.
#[test]
fn a_bf16_step_converts_each_operand_once() {
    for layers in [1, 3] {
        let n = linears(layers);
        for (schedule, passes, per_call_passes) in [
            (TrainSchedule::Batched, 1, 1),
            (TrainSchedule::PerSample, ROWS, 0),
        ] {
            for capture in [false, true] {
                let once = conversions_per_step(layers, schedule, capture, false);
                let per_call = conversions_per_step(layers, schedule, capture, true);
                eprintln!(
                    "L = {layers} {schedule:?} captured {capture}: {once} conversions a step \
                     (per call: {per_call})"
                );
                assert_eq!(
                    once,
                    1 + 2 * n * passes,
                    "L = {layers} {schedule:?} {capture}"
                );
                assert_eq!(
                    per_call,
                    (4 * n - 2) * per_call_passes,
                    "L = {layers} {schedule:?} {capture}"
                );
            }
        }
    }
}

/// Kernel runs of the third step by kernel (a captured per-sample step), for `precision`.
fn launches_per_step(c: XAssetConfig, precision: Precision) -> Vec<(Kernel, usize)> {
    let sim = SimDriver::new(SimConfig::with_capacity(512 << 20));
    let log: Arc<std::sync::Mutex<Vec<Kernel>>> = Arc::default();
    let seen = log.clone();
    zcompute::cuda::twins::register_observed(&sim, move |k| seen.lock().unwrap().push(k));
    let dev = Device::open(
        sim,
        DeviceConfig {
            blas_workspace_bytes: 0,
            ..DeviceConfig::default()
        },
    )
    .expect("the simulated device opens");
    let arena = Arena::new(dev, ArenaConfig::default()).expect("arena");
    let b = CudaBackend::new(arena).expect("backend");
    let model = XAsset::init(&b, c, 5).expect("model");
    let cfg = TrainerConfig {
        schedule: TrainSchedule::PerSample,
        capture: true,
        precision,
        ..TrainerConfig::default()
    };
    let mut t = Trainer::new(b, model, cfg).expect("trainer");
    let x: Vec<f32> = (0..ROWS * c.scales * c.features)
        .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
        .collect();
    let y: Vec<f32> = (0..ROWS).map(|i| (i % 2) as f32).collect();
    for _ in 0..2 {
        t.step(StepSource::host(&x, &y, ROWS)).expect("step");
    }
    log.lock().unwrap().clear();
    t.step(StepSource::host(&x, &y, ROWS)).expect("step");
    let mut counts: Vec<(Kernel, usize)> = Vec::new();
    for &k in log.lock().unwrap().iter() {
        match counts.iter_mut().find(|(c, _)| *c == k) {
            Some((_, n)) => *n += 1,
            None => counts.push((k, 1)),
        }
    }
    counts
}

/// A per-sample step's Linear forwards under bf16 are one product launch each (on the input's
/// and the weight's copies), the bias epilogue and a skip connection's add inside, as under
/// float32: no bias epilogue or add of their own, and tanh's backward writes gz's copy (no
/// TanhBackward). Where every layer has more outputs than the row kernels take (`wide`), each
/// layer's backward is one launch too (`zc_linear_backward_bf16`, as float32's is one
/// `zc_linear_backward_f32`): no tanh backward, weight-gradient kernel or bias column sum of
/// its own. Printed: the step's launches by kernel, for the record (issue 42's launch counts).
#[test]
fn a_bf16_per_sample_layer_is_one_launch_each_way() {
    let count =
        |v: &[(Kernel, usize)], k: Kernel| v.iter().find(|(c, _)| *c == k).map_or(0, |&(_, n)| n);
    let total = |v: &[(Kernel, usize)]| v.iter().map(|x| x.1).sum::<usize>();
    let wide = XAssetConfig {
        width: 48,
        ff: 64,
        ..config(1)
    };
    for (c, is_wide) in [(config(1), false), (config(3), false), (wide, true)] {
        let n = linears(c.layers);
        let f32 = launches_per_step(c, Precision::F32);
        let bf16 = launches_per_step(c, Precision::Bf16);
        let what = format!("L = {} width {}", c.layers, c.width);
        eprintln!("{what}: float32 {} launches a step {f32:?}", total(&f32));
        eprintln!("{what}: bf16 {} launches a step {bf16:?}", total(&bf16));
        assert_eq!(
            count(&bf16, Kernel::LinearRowsKMajorBf16),
            n * ROWS,
            "{what}"
        );
        assert_eq!(count(&f32, Kernel::LinearRowsKMajor), n * ROWS, "{what}");
        for k in [Kernel::BiasAct, Kernel::BiasActAdd, Kernel::Binary] {
            assert_eq!(count(&bf16, k), 0, "{what}: {k:?}");
        }
        assert_eq!(count(&bf16, Kernel::TanhBackward), 0, "{what}");
        if is_wide {
            assert_eq!(count(&bf16, Kernel::LinearBackwardBf16), n * ROWS, "{what}");
            assert_eq!(count(&f32, Kernel::LinearBackward), n * ROWS, "{what}");
            for k in [
                Kernel::LinearParamGradsBf16,
                Kernel::TanhBackwardBf16,
                Kernel::LinearRowsNMajorBf16,
            ] {
                assert_eq!(count(&bf16, k), 0, "{what}: {k:?}");
            }
            // The bias gradient is summed inside: no column sums beyond float32's.
            assert_eq!(
                count(&bf16, Kernel::ReduceCols),
                count(&f32, Kernel::ReduceCols),
                "{what}"
            );
        }
    }
}
