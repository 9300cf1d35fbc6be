//! The trainer under a precision policy (`TrainerConfig::precision`, issue 42) on the CPU
//! backend, which emulates bf16 products: one step near float32 and not equal to it, eager
//! equal to captured bit for bit, float32 untouched; backends that cannot run a policy refused
//! when the trainer is made; checkpoints that name their policy.

use crate::common::SimBackend;
use crate::support::precision_step::{
    bf16_evaluation_is_near_float32_and_not_equal, bf16_step_is_near_float32_and_not_equal,
    bf16_weight_copy_equals_per_call_bitwise, bf16_weight_copy_equals_per_call_bitwise_wide,
    bf16_weight_copy_follows_loaded_parameters, captured_equals_eager_bitwise,
};
use std::collections::HashMap;
use std::rc::Rc;
use zcompute::CpuBackend;
use zgrad::{
    GradError, PRECISION_KEY, Precision, StepSource, Trainer, TrainerConfig, XAsset, XAssetConfig,
};

#[test]
fn a_bf16_step_on_the_cpu_is_near_float32_and_not_equal() {
    for fixture in ["tiny", "deep2", "deep3"] {
        bf16_step_is_near_float32_and_not_equal(&CpuBackend, fixture);
    }
}

#[test]
fn captured_bf16_steps_on_the_cpu_equal_eager_ones_bitwise() {
    captured_equals_eager_bitwise(&CpuBackend, Precision::Bf16);
}

#[test]
fn the_bf16_weight_copy_on_the_cpu_equals_converting_per_call_bitwise() {
    for fixture in ["tiny", "deep2", "deep3"] {
        bf16_weight_copy_equals_per_call_bitwise(&CpuBackend, fixture);
    }
    bf16_weight_copy_equals_per_call_bitwise_wide(&CpuBackend);
}

#[test]
fn the_bf16_weight_copy_on_the_cpu_follows_loaded_parameters() {
    bf16_weight_copy_follows_loaded_parameters(&CpuBackend);
}

#[test]
fn bf16_evaluation_on_the_cpu_is_near_float32_and_not_equal() {
    for capture in [false, true] {
        bf16_evaluation_is_near_float32_and_not_equal(&CpuBackend, capture);
    }
}

#[test]
fn captured_tf32_steps_on_the_cpu_equal_eager_ones_bitwise() {
    captured_equals_eager_bitwise(&CpuBackend, Precision::Tf32);
}

fn config(precision: Precision) -> TrainerConfig {
    TrainerConfig {
        precision,
        ..TrainerConfig::default()
    }
}

/// float64 elements have no reduced-precision products: a bf16 or TF32 trainer over them is
/// refused when made, naming the policy, with the backend's refusal as the source.
#[test]
fn a_reduced_policy_on_float64_is_refused_when_the_trainer_is_made() {
    for p in [Precision::Tf32, Precision::Bf16] {
        let model =
            XAsset::<CpuBackend, f64>::init(&CpuBackend, XAssetConfig::default(), 1).unwrap();
        match Trainer::new(CpuBackend, model, config(p)) {
            Err(GradError::PrecisionUnsupported { precision, source }) => {
                assert_eq!(precision, p.name());
                assert!(
                    matches!(*source, zcompute::ComputeError::MathModeUnsupported { .. }),
                    "{source}"
                );
            }
            other => panic!("{}: {:?}", p.name(), other.err()),
        }
    }
    let model = XAsset::<CpuBackend, f64>::init(&CpuBackend, XAssetConfig::default(), 1).unwrap();
    assert!(Trainer::new(CpuBackend, model, config(Precision::F32)).is_ok());
}

/// A backend with no `PrecisionOps` of its own (the tests' host backend) runs float32 only:
/// bf16 is refused, never run in float32 under its name.
#[test]
fn a_backend_without_reduced_products_is_refused() {
    let b = Rc::new(SimBackend::<f32>::new());
    let model = XAsset::init(&*b, XAssetConfig::default(), 1).unwrap();
    let err = Trainer::new(Rc::clone(&b), model, config(Precision::Bf16)).err();
    assert!(
        matches!(
            err,
            Some(GradError::PrecisionUnsupported {
                precision: "bf16",
                ..
            })
        ),
        "{err:?}"
    );
}

fn trained(precision: Precision) -> Trainer<CpuBackend, f32, XAsset<CpuBackend>> {
    let model = XAsset::init(&CpuBackend, XAssetConfig::default(), 7).unwrap();
    let mut t = Trainer::new(CpuBackend, model, config(precision)).unwrap();
    let c = XAssetConfig::default();
    let n = c.scales * c.features;
    let x: Vec<f32> = (0..4 * n)
        .map(|i| ((i * 7 % 11) as f32 - 5.0) / 5.0)
        .collect();
    t.step(StepSource::host(&x, &[0.0, 1.0, 1.0, 0.0], 4))
        .unwrap();
    t
}

/// A checkpoint names a reduced policy in its metadata (a float32 one is as before, no key);
/// resuming under another policy is refused (`PrecisionMismatch`: the steps to come could not
/// continue the run bit for bit), under the same one it loads.
#[test]
fn a_checkpoint_resumes_only_under_its_own_precision() {
    let dir = tempfile::tempdir().unwrap();
    let (bf16_path, f32_path) = (dir.path().join("bf16.st"), dir.path().join("f32.st"));
    trained(Precision::Bf16)
        .save_checkpoint(&bf16_path, HashMap::new())
        .unwrap();
    trained(Precision::F32)
        .save_checkpoint(&f32_path, HashMap::new())
        .unwrap();
    let meta = zgrad::CheckpointFile::<f32>::read(&f32_path)
        .unwrap()
        .metadata;
    assert!(!meta.contains_key(PRECISION_KEY), "{meta:?}");
    let meta = zgrad::CheckpointFile::<f32>::read(&bf16_path)
        .unwrap()
        .metadata;
    assert_eq!(meta.get(PRECISION_KEY).map(String::as_str), Some("bf16"));

    let mut f32_trainer = trained(Precision::F32);
    match f32_trainer.load_checkpoint(&bf16_path) {
        Err(GradError::PrecisionMismatch { saved, requested }) => {
            assert_eq!((saved, requested), ("bf16", "f32"));
        }
        other => panic!("{other:?}"),
    }
    let mut bf16_trainer = trained(Precision::Bf16);
    match bf16_trainer.load_checkpoint(&f32_path) {
        Err(GradError::PrecisionMismatch { saved, requested }) => {
            assert_eq!((saved, requested), ("f32", "bf16"));
        }
        other => panic!("{other:?}"),
    }
    bf16_trainer.load_checkpoint(&bf16_path).unwrap();
    f32_trainer.load_checkpoint(&f32_path).unwrap();
}

/// bf16 on a model of the user's own under every task (support/own_model_bf16.rs; device.rs
/// runs it on the simulated device and the GPU).
#[test]
fn bf16_on_a_model_of_the_users_own_on_the_cpu_is_near_float64_for_every_task() {
    crate::support::own_model_bf16::bf16_on_a_model_of_the_users_own_is_near_float64_for_every_task(
        &CpuBackend,
    );
}
