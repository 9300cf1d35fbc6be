//! The trainer and the tape on zcompute's CUDA backend: on the simulated device in CI
//! (`mock`), on CUDA device 0 with `--features gpu` (`gpu`). Poison is on, so memory reclaimed
//! under a live tensor reads as NaN. Bodies are generic over the driver.

use std::path::PathBuf;
use zcompute::{AllocClass, Backend, CudaBackend, MatmulOpts};
use zdevice::{Device, DeviceConfig, Driver, SimConfig, SimDriver};
use zgrad::StepSource;
use zgrad::{
    AdamW, AdamWHyper, Applied, GradError, LrSchedule, Precision, Tape, TensorFile, TrainSchedule,
    Trainer, TrainerConfig, Var, XAsset, read_tensors,
};
use zmem::{Arena, ArenaConfig, Protection};

fn arena_config() -> ArenaConfig {
    ArenaConfig {
        initial_bytes: 16 << 20,
        segment_bytes: 16 << 20,
        cap_bytes: Some(192 << 20),
        overflow_reserve_bytes: 4 << 20,
        poison: true,
        timeline_events: 256,
        sanitize: false,
        from_env: Vec::new(),
    }
}

fn backend_on<D: Driver>(device: Device<D>) -> CudaBackend<D> {
    let arena = Arena::new(device, arena_config()).expect("arena");
    let b = CudaBackend::new(arena).expect("backend");
    b.set_poison(true);
    b
}

fn mock() -> CudaBackend<SimDriver> {
    let sim = SimDriver::new(SimConfig {
        poison_on_free: true,
        ..SimConfig::with_capacity(512 << 20)
    });
    zcompute::cuda::twins::register(&sim);
    let dev = Device::open(
        sim,
        DeviceConfig {
            blas_workspace_bytes: 0,
            ..DeviceConfig::default()
        },
    )
    .expect("the simulated device opens");
    backend_on(dev)
}

mod own_model;

use crate::support::fixtures;
use crate::support::oracle_step;
use fixtures::fixture;

struct Tiny {
    input: TensorFile<f32>,
    oracle: TensorFile<f64>,
    path: PathBuf,
}

fn tiny() -> Tiny {
    oracle_fixture("tiny")
}

/// The oracle fixture `name` (tiny: one block; deep2, deep3: two and three blocks).
fn oracle_fixture(name: &str) -> Tiny {
    let path = fixture(&format!("xasset_{name}_in.safetensors"));
    Tiny {
        input: read_tensors(&path).unwrap(),
        oracle: read_tensors(&fixture(&format!("xasset_{name}_oracle.safetensors"))).unwrap(),
        path,
    }
}

fn rel(got: &[f32], want: &[f64]) -> f64 {
    let d: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| (f64::from(*a) - b).powi(2))
        .sum();
    let n: f64 = want.iter().map(|b| b * b).sum();
    d.sqrt() / n.sqrt()
}

/// One step of each schedule, eager and captured, with one, two and three blocks: loss and
/// every gradient within 1e-5 of the oracle (each block's kn.bias by its norm), the updated
/// parameters too.
fn one_step_matches_the_oracle<D: Driver>(b: CudaBackend<D>) {
    for fixture in ["tiny", "deep2", "deep3"] {
        oracle_step::trainer_step_matches_the_oracle(&b, fixture);
    }
}

/// AdamW fed the oracle's gradients reproduces the oracle's parameters (1e-6 per tensor).
fn adamw_matches_the_oracle<D: Driver>(b: CudaBackend<D>) {
    let f = tiny();
    let model = XAsset::<_, f32>::from_tensors(&b, &f.input, &f.path).unwrap();
    let params = model.parameters();
    for (name, p) in model.named_parameters() {
        let g: Vec<f32> = f.oracle.tensors[&format!("grad.{name}")]
            .data
            .iter()
            .map(|&v| v as f32)
            .collect();
        b.upload_into(&g, p.grad().unwrap()).unwrap();
    }
    let mut opt = AdamW::new(&b, &params, AdamWHyper::default()).unwrap();
    opt.step(&b, &params, 1e-3).unwrap();
    for (name, p) in model.named_parameters() {
        let e = rel(
            &p.to_vec(&b).unwrap(),
            &f.oracle.tensors[&format!("adamw.{name}")].data,
        );
        assert!(e <= 1e-6, "adamw.{name}: {e:e}");
    }
}

/// Three replays of the captured batched step equal three eager steps.
fn captured_steps_equal_eager_steps<D: Driver>(b: CudaBackend<D>) {
    let f = tiny();
    let (x, y) = (&f.input.tensors["x"].data, &f.input.tensors["y"].data);
    let run = |schedule, capture| {
        let model = XAsset::from_tensors(&b, &f.input, &f.path).unwrap();
        let cfg = TrainerConfig {
            schedule,
            capture,
            clip_grad: Some(0.5),
            lr: 1e-2,
            lr_schedule: LrSchedule::LinearWarmup { warmup_steps: 2 },
            ..TrainerConfig::default()
        };
        let mut t = Trainer::new(b.clone(), model, cfg).unwrap();
        let mut losses = Vec::new();
        for k in 0..3 {
            let xs: Vec<f32> = x.iter().map(|v| v * (1.0 + 0.1 * k as f32)).collect();
            losses.push(t.step(StepSource::host(&xs, y, 4)).unwrap().loss);
        }
        let params: Vec<Vec<f32>> = t
            .model()
            .parameters()
            .iter()
            .map(|p| p.to_vec(&b).unwrap())
            .collect();
        (losses, params)
    };
    for schedule in [TrainSchedule::Batched, TrainSchedule::PerSample] {
        let (le, pe) = run(schedule, false);
        let (lc, pc) = run(schedule, true);
        for (e, c) in le.iter().zip(&lc) {
            assert!(
                (e - c).abs() <= 1e-6 * e.abs(),
                "{schedule:?} loss {e} vs {c}"
            );
        }
        for (e, c) in pe.iter().zip(&pc) {
            let want: Vec<f64> = e.iter().map(|&v| f64::from(v)).collect();
            let err = rel(c, &want);
            assert!(err <= 1e-6, "{schedule:?}: parameters differ by {err:e}");
        }
    }
}

/// Issue 10 item 4: a replayed batched step whose loss is NaN skips its update on the device
/// (the AdamW kernels' gate): parameters bitwise unchanged, the step not counted, the error
/// "not applied"; the next finite step is counted as the one that was skipped.
fn a_captured_non_finite_step_is_skipped<D: Driver>(b: CudaBackend<D>, precision: Precision) {
    let f = tiny();
    let (x, y) = (&f.input.tensors["x"].data, &f.input.tensors["y"].data);
    let model = XAsset::from_tensors(&b, &f.input, &f.path).unwrap();
    let cfg = TrainerConfig {
        capture: true,
        lr: 1e-2,
        precision,
        ..TrainerConfig::default()
    };
    let mut t = Trainer::new(b.clone(), model, cfg).unwrap();
    assert!(t.step(StepSource::host(x, y, 4)).unwrap().captured);
    let params = |t: &Trainer<CudaBackend<D>, f32, XAsset<CudaBackend<D>>>| -> Vec<Vec<u32>> {
        let ps = t.model().parameters();
        let bits = |p: &Var<CudaBackend<D>, f32>| p.to_vec(&b).unwrap();
        ps.iter()
            .map(|p| bits(p).iter().map(|v| v.to_bits()).collect())
            .collect()
    };
    let before = params(&t);
    let mut bad = x.clone();
    bad[0] = f32::NAN;
    let err = t.step(StepSource::host(&bad, y, 4)).unwrap_err();
    assert_eq!(err.applied(), Some(Applied::No), "{err}");
    assert!(
        matches!(err.cause(), GradError::NonFinite { step: 2, .. }),
        "{err}"
    );
    assert_eq!(
        params(&t),
        before,
        "the gated update left the parameters alone"
    );
    assert_eq!(t.status().step, 1);
    let r = t.step(StepSource::host(x, y, 4)).unwrap();
    assert!(r.captured && r.step == 2 && r.loss.is_finite(), "{r:?}");
    assert_ne!(params(&t), before);
}

/// Scenario C on the device: forward, a step reset that reclaims everything it may (the
/// arena's own protections for live scratch switched off), then backward. Saved tensors
/// (class `Saved`) come through; the negative control (saved tensors in scratch) does not.
fn reset_between_forward_and_backward<D: Driver>(b: CudaBackend<D>, protected: bool) -> Vec<f32> {
    b.arena()
        .set_protection_for_tests(Protection::KeepLiveScratch, false);
    b.arena()
        .set_protection_for_tests(Protection::GenerationCheck, false);
    let w = Var::parameter_from(&b, &[0.3, -0.2, 0.5, 0.1, 0.7, -0.4], &[3, 2]).unwrap();
    b.begin_step().unwrap();
    b.set_alloc_class(AllocClass::Scratch);
    let x = Var::constant(b.upload(&[1.0, 2.0, -1.0, 0.5, 0.0, 3.0], &[2, 3]).unwrap());
    let tape = if protected {
        Tape::new(&b)
    } else {
        Tape::unprotected(&b)
    };
    let h = tape
        .tanh(&tape.matmul(&x, &w, MatmulOpts::default()).unwrap())
        .unwrap();
    let loss = tape.sum_all(&tape.mul(&h, &h).unwrap()).unwrap();
    b.end_step().unwrap();
    b.begin_step().unwrap();
    // Later work of the next step reuses the reclaimed memory.
    let _filler = b.full(&[4096], 1.0e3).unwrap();
    tape.backward(&loss).unwrap();
    let g = b.download(w.grad().unwrap()).unwrap();
    b.end_step().unwrap();
    b.arena()
        .set_protection_for_tests(Protection::KeepLiveScratch, true);
    b.arena()
        .set_protection_for_tests(Protection::GenerationCheck, true);
    g
}

fn reference_gradient() -> Vec<f32> {
    let cpu = zcompute::CpuBackend;
    let w =
        Var::<_, f32>::parameter_from(&cpu, &[0.3, -0.2, 0.5, 0.1, 0.7, -0.4], &[3, 2]).unwrap();
    let x = Var::constant(
        cpu.upload(&[1.0f32, 2.0, -1.0, 0.5, 0.0, 3.0], &[2, 3])
            .unwrap(),
    );
    let tape = Tape::new(&cpu);
    let h = tape
        .tanh(&tape.matmul(&x, &w, MatmulOpts::default()).unwrap())
        .unwrap();
    let loss = tape.sum_all(&tape.mul(&h, &h).unwrap()).unwrap();
    tape.backward(&loss).unwrap();
    cpu.download(w.grad().unwrap()).unwrap()
}

fn saved_tensors_survive_the_reset<D: Driver>(b: CudaBackend<D>) {
    let want: Vec<f64> = reference_gradient().iter().map(|&v| f64::from(v)).collect();
    let got = reset_between_forward_and_backward(b, true);
    assert!(rel(&got, &want) < 1e-6, "{got:?} vs {want:?}");
}

fn negative_control_scratch_saved_tensors_break<D: Driver>(b: CudaBackend<D>) {
    let want: Vec<f64> = reference_gradient().iter().map(|&v| f64::from(v)).collect();
    let got = reset_between_forward_and_backward(b, false);
    assert!(
        got.iter().any(|v| !v.is_finite()) || rel(&got, &want) > 1e-3,
        "unprotected saved tensors should have been overwritten: {got:?}"
    );
}

/// `$make()` returns a guard (held for the test) and a backend.
macro_rules! suite {
    ($make:path) => {
        #[test]
        fn one_step_matches_the_oracle() {
            let (_guard, b) = $make();
            super::one_step_matches_the_oracle(b);
        }
        #[test]
        fn adamw_matches_the_oracle() {
            let (_guard, b) = $make();
            super::adamw_matches_the_oracle(b);
        }
        #[test]
        fn captured_steps_equal_eager_steps() {
            let (_guard, b) = $make();
            super::captured_steps_equal_eager_steps(b);
        }
        #[test]
        fn a_captured_non_finite_step_is_skipped() {
            let (_guard, b) = $make();
            // Under bf16 too: a NaN rounded to bf16 stays a NaN (the gate must still see it).
            for precision in [zgrad::Precision::F32, zgrad::Precision::Bf16] {
                super::a_captured_non_finite_step_is_skipped(b.clone(), precision);
            }
        }
        #[test]
        fn saved_tensors_survive_the_reset() {
            let (_guard, b) = $make();
            super::saved_tensors_survive_the_reset(b);
        }
        #[test]
        fn a_bf16_step_is_near_float32_and_not_equal() {
            let (_guard, b) = $make();
            for fixture in ["tiny", "deep2", "deep3"] {
                crate::support::precision_step::bf16_step_is_near_float32_and_not_equal(
                    &b, fixture,
                );
            }
        }
        #[test]
        fn a_bf16_step_is_within_twice_autocast_error() {
            let (_guard, b) = $make();
            crate::support::autocast_error::bf16_step_is_within_twice_autocast_error(&b);
        }
        #[test]
        fn bf16_on_a_model_of_the_users_own_is_near_float64_for_every_task() {
            let (_guard, b) = $make();
            crate::support::own_model_bf16::bf16_on_a_model_of_the_users_own_is_near_float64_for_every_task(&b);
        }
        #[test]
        fn a_bf16_step_is_within_twice_autocast_mean_error_over_draws() {
            let (_guard, b) = $make();
            crate::support::autocast_draws::bf16_mean_error_over_draws_is_within_twice_autocast(&b);
        }
        #[test]
        fn captured_bf16_steps_equal_eager_ones_bitwise() {
            let (_guard, b) = $make();
            crate::support::precision_step::captured_equals_eager_bitwise(
                &b,
                zgrad::Precision::Bf16,
            );
        }
        #[test]
        fn the_bf16_weight_copy_equals_converting_per_call_bitwise() {
            let (_guard, b) = $make();
            for fixture in ["tiny", "deep2", "deep3"] {
                crate::support::precision_step::bf16_weight_copy_equals_per_call_bitwise(
                    &b, fixture,
                );
            }
        }
        #[test]
        fn the_bf16_weight_copy_of_a_wide_model_equals_converting_per_call_bitwise() {
            let (_guard, b) = $make();
            crate::support::precision_step::bf16_weight_copy_equals_per_call_bitwise_wide(&b);
        }
        #[test]
        fn bf16_evaluation_is_near_float32_and_not_equal() {
            let (_guard, b) = $make();
            for capture in [false, true] {
                crate::support::precision_step::bf16_evaluation_is_near_float32_and_not_equal(
                    &b, capture,
                );
            }
        }
        #[test]
        fn the_bf16_weight_copy_follows_loaded_parameters() {
            let (_guard, b) = $make();
            crate::support::precision_step::bf16_weight_copy_follows_loaded_parameters(&b);
        }
        #[test]
        fn negative_control_scratch_saved_tensors_break() {
            let (_guard, b) = $make();
            super::negative_control_scratch_saved_tensors_break(b);
        }
    };
}

mod mock {
    /// A fresh simulated device per test: tests run in parallel.
    fn device() -> ((), zcompute::CudaBackend<zdevice::SimDriver>) {
        ((), super::mock())
    }
    suite!(device);

    /// An injected failure of `cuStreamEndCapture` at the first capture: the trainer's
    /// capture gets a typed error, falls back to eager, and its steps equal an eager run's
    /// (before the fix: the guard came off under a capturing stream, and the next upload
    /// failed with 900, the eager fallback with 901).
    #[test]
    fn failed_end_of_capture_falls_back_to_eager() {
        use zdevice::{CuCode, FaultAction, sim::calls};
        use zgrad::{StepSource, TrainSchedule, Trainer, TrainerConfig, XAsset};
        let f = super::tiny();
        let (x, y) = (&f.input.tensors["x"].data, &f.input.tensors["y"].data);
        for schedule in [TrainSchedule::Batched, TrainSchedule::PerSample] {
            let run = |capture: bool| {
                let b = super::mock();
                if capture {
                    b.device().driver().fault(
                        calls::STREAM_END_CAPTURE,
                        1,
                        FaultAction::Fail(CuCode::INVALID_VALUE),
                    );
                }
                let model = XAsset::from_tensors(&b, &f.input, &f.path).unwrap();
                let cfg = TrainerConfig {
                    schedule,
                    capture,
                    lr: 1e-2,
                    ..TrainerConfig::default()
                };
                let mut t = Trainer::new(b.clone(), model, cfg).unwrap();
                let losses: Vec<f64> = (0..3)
                    .map(|k| {
                        let xs: Vec<f32> = x.iter().map(|v| v * (1.0 + 0.1 * k as f32)).collect();
                        t.step(StepSource::host(&xs, y, 4))
                            .unwrap_or_else(|e| panic!("{schedule:?} step {k}: {e}"))
                            .loss
                    })
                    .collect();
                assert!(!b.device().is_capturing());
                assert!(b.device().lost_reason().is_none());
                let params: Vec<Vec<f32>> = t
                    .model()
                    .parameters()
                    .iter()
                    .map(|p| p.to_vec(&b).unwrap())
                    .collect();
                (losses, params)
            };
            let (le, pe) = run(false);
            let (lf, pf) = run(true);
            assert_eq!(le, lf, "{schedule:?}: losses after the failed end");
            assert_eq!(pe, pf, "{schedule:?}: parameters after the failed end");
        }
    }
}

#[cfg(feature = "gpu")]
mod gpu {
    use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

    /// One backend on CUDA device 0 for the binary; the guard serialises the tests (they share
    /// its step scope and arena switches).
    fn device() -> (
        MutexGuard<'static, ()>,
        zcompute::CudaBackend<zdevice::CudaDriver>,
    ) {
        static LOCK: Mutex<()> = Mutex::new(());
        static GPU: OnceLock<zcompute::CudaBackend<zdevice::CudaDriver>> = OnceLock::new();
        let guard = LOCK.lock().unwrap_or_else(PoisonError::into_inner);
        let b = GPU.get_or_init(|| {
            let driver =
                zdevice::CudaDriver::load().expect("the CUDA driver loads on a GPU machine");
            let dev = zdevice::Device::open(driver, zdevice::DeviceConfig::default())
                .expect("CUDA device 0 opens");
            super::backend_on(dev)
        });
        (guard, b.clone())
    }
    suite!(device);
}
