//! Allocation classes, steps and the generation check on the simulated device.

use super::mock;
use zcompute::{AllocClass, Backend, ComputeError, UnaryOp};
use zmem::Protection;

#[test]
fn scratch_needs_an_open_step() {
    let gpu = mock();
    assert_eq!(gpu.alloc_class(), AllocClass::Persistent);
    assert_eq!(
        gpu.set_alloc_class(AllocClass::Scratch),
        AllocClass::Persistent
    );
    let err = gpu.zeros(&[4]).expect_err("scratch with no step");
    assert_eq!(err, ComputeError::NoOpenStep { op: "full" });
    gpu.begin_step().expect("begin");
    assert!(matches!(
        gpu.begin_step(),
        Err(ComputeError::StepState { .. })
    ));
    let t = gpu.zeros(&[4]).expect("scratch in a step");
    assert_eq!(gpu.storage_class(&t), Some(AllocClass::Scratch));
    gpu.end_step().expect("end");
    assert!(matches!(
        gpu.end_step(),
        Err(ComputeError::StepState { .. })
    ));
    // Still referenced at the step's end: kept exactly, so still usable.
    gpu.set_alloc_class(AllocClass::Persistent);
    let y = gpu.unary(UnaryOp::Exp, &t).expect("kept scratch is valid");
    assert_eq!(gpu.download(&y).expect("download"), vec![1.0; 4]);
}

#[test]
fn classes_follow_the_backend_setting() {
    let gpu = mock();
    for class in [AllocClass::Saved, AllocClass::Persistent] {
        gpu.set_alloc_class(class);
        let t = gpu.full(&[3], 1.0).expect("alloc");
        assert_eq!(gpu.storage_class(&t), Some(class));
    }
    gpu.set_alloc_class(AllocClass::Graph);
    assert!(matches!(
        gpu.zeros(&[3]),
        Err(ComputeError::Unsupported { .. })
    ));
}

#[test]
fn reclaimed_scratch_is_a_typed_error_not_garbage() {
    let gpu = mock();
    gpu.set_alloc_class(AllocClass::Scratch);
    gpu.begin_step().expect("begin");
    let t = gpu.upload(&[1.0, 2.0, 3.0], &[3]).expect("upload");
    // Negative control: without keeping live scratch, the step end reclaims it under `t`.
    gpu.arena()
        .set_protection_for_tests(Protection::KeepLiveScratch, false);
    gpu.end_step().expect("end");
    gpu.arena()
        .set_protection_for_tests(Protection::KeepLiveScratch, true);
    gpu.set_alloc_class(AllocClass::Persistent);
    let err = gpu.unary(UnaryOp::Neg, &t).expect_err("use after reclaim");
    assert!(
        matches!(err, ComputeError::UseAfterReclaim { op: "unary", .. }),
        "{err}"
    );
    assert!(matches!(
        gpu.download(&t),
        Err(ComputeError::UseAfterReclaim { .. })
    ));
}

#[test]
fn kernels_load_once_and_the_sim_runs_the_real_ptx_entries() {
    let gpu = mock();
    let sim = gpu.device().driver();
    // One load per PTX module of the kernel-id table: elementwise, rows, train, flat,
    // attention, fused, indexed, linear, norm_params, linear_backward, attention_short, select,
    // convert, linear_bf16.
    assert_eq!(sim.call_count("cuModuleLoadData"), 14);
    let x = gpu.upload(&[1.0, -1.0], &[2]).expect("upload");
    let _ = gpu.unary(UnaryOp::Relu, &x).expect("relu");
    assert_eq!(sim.call_count("cuModuleLoadData"), 14);
}
