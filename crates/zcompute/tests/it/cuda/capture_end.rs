//! The end of a capture under faults (simulated driver), and what a tensor the body stored
//! outside holds once `capture` returns (the same on the CPU and on the device).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use super::mock;
use zcompute::{BTensor, Backend, Capture, ComputeError, CpuBackend, UnaryOp};
use zdevice::sim::calls;
use zdevice::{CuCode, DeviceError, FaultAction};

/// The body computes `y = exp(x) + x` (a temporary and an output, both allocated inside) and
/// stores `y` outside. After `capture` it holds the warm-up's result, on every backend; after
/// a replay with a new `x`, the replay's.
pub fn stored_tensor_holds_one_completed_run<B>(b: &B)
where
    B: Capture<f32> + Clone + 'static,
{
    let first = [0.5f32, -1.0, 2.0, 0.0, 3.5];
    let second = [1.0f32, 2.0, -3.0, 0.25, -0.5];
    let want = |x: &[f32]| -> Vec<f32> { x.iter().map(|v| v.exp() + v).collect() };
    let x = b.upload(&first, &[5]).expect("x");
    let stored: Rc<RefCell<Option<BTensor<B, f32>>>> = Rc::default();
    let body = {
        let (b, x, stored) = (b.clone(), x.clone(), Rc::clone(&stored));
        move || {
            let e = b.unary(UnaryOp::Exp, &x)?;
            let y = b.add(&e, &x)?;
            *stored.borrow_mut() = Some(y);
            Ok(())
        }
    };
    let mut graph = b.capture(Box::new(body)).expect("capture");
    let read = |what: &str| {
        let t = stored.borrow().clone().expect("the body stored its output");
        b.download(&t).unwrap_or_else(|e| panic!("{what}: {e}"))
    };
    let close = |got: &[f32], want: &[f32]| {
        got.iter()
            .zip(want)
            .all(|(g, w)| (g - w).abs() <= 1e-5 * w.abs().max(1.0))
    };
    let got = read("after capture");
    assert!(
        close(&got, &want(&first)),
        "after capture the stored tensor holds {got:?}, not the warm-up's {:?}",
        want(&first)
    );
    b.upload_into(&second, &x).expect("refill x");
    b.replay(&mut graph).expect("replay");
    let got = read("after replay");
    assert!(
        close(&got, &want(&second)),
        "after a replay the stored tensor holds {got:?}, not {:?}",
        want(&second)
    );
}

#[test]
fn cpu_stored_tensor_holds_one_completed_run() {
    stored_tensor_holds_one_completed_run::<CpuBackend>(&CpuBackend);
}

/// With an injected failure of `cuStreamEndCapture`, `capture` is a typed error and the
/// backend is eager at once: the next upload, op and download succeed.
#[test]
fn failed_end_of_capture_is_typed_and_eager_work_follows() {
    let gpu = mock();
    let x = gpu.upload(&[1.0, 2.0, 3.0], &[3]).expect("x");
    gpu.device().driver().fault(
        calls::STREAM_END_CAPTURE,
        1,
        FaultAction::Fail(CuCode::INVALID_VALUE),
    );
    let (be, xx) = (gpu.clone(), x.clone());
    let err = gpu
        .capture(Box::new(move || be.unary(UnaryOp::Neg, &xx).map(drop)))
        .expect_err("the injected end failure");
    match &err {
        ComputeError::CaptureFailed { stage, source } => {
            assert_eq!(*stage, "ending the capture", "{err}");
            assert!(
                matches!(
                    source.device_error(),
                    Some(DeviceError::Driver {
                        call: "cuStreamEndCapture",
                        code: CuCode::INVALID_VALUE
                    })
                ),
                "{err:?}"
            );
        }
        other => panic!("expected CaptureFailed, got {other:?}"),
    }
    assert!(!gpu.device().is_capturing());
    assert!(gpu.device().lost_reason().is_none());
    let t = gpu
        .upload(&[4.0, 5.0], &[2])
        .expect("upload after the failed end");
    let y = gpu
        .unary(UnaryOp::Neg, &t)
        .expect("eager op after the failed end");
    assert_eq!(gpu.download(&y).expect("download"), vec![-4.0, -5.0]);
    gpu.synchronize().expect("sync after the failed end");
}

/// A stalled `cuStreamEndCapture` (600 virtual seconds against the 60 s sync deadline) is a
/// `Timeout` naming it, and the device is lost, instead of an `Ok` graph.
#[test]
fn stalled_end_of_capture_times_out_and_loses_the_device() {
    let gpu = mock();
    let x = gpu.upload(&[1.0, 2.0, 3.0], &[3]).expect("x");
    gpu.device().driver().fault(
        calls::STREAM_END_CAPTURE,
        1,
        FaultAction::Stall(Duration::from_secs(600)),
    );
    let (be, xx) = (gpu.clone(), x.clone());
    let err = gpu
        .capture(Box::new(move || be.unary(UnaryOp::Neg, &xx).map(drop)))
        .expect_err("a stalled end");
    match &err {
        ComputeError::Timeout { source, .. } => assert!(
            matches!(source, DeviceError::Timeout { waited_for, .. } if waited_for.contains("cuStreamEndCapture")),
            "{err:?}"
        ),
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert!(gpu.device().lost_reason().is_some());
    assert!(matches!(
        gpu.unary(UnaryOp::Neg, &x),
        Err(ComputeError::Device {
            source: DeviceError::DeviceLost { .. },
            ..
        })
    ));
}

/// A kernel launch of the captured run that stalls (600 virtual seconds against the 60 s
/// sync deadline; the end itself is quick): the device is lost, so the `Timeout` says so
/// (`is_device_lost`), and it names the launch that overran, not `cuStreamEndCapture`
/// (issue 23: `is_device_lost()` was false and the error named the end).
#[test]
fn a_launch_that_stalls_the_capture_is_named_and_the_device_is_lost() {
    let gpu = mock();
    let x = gpu.upload(&[1.0, 2.0, 3.0], &[3]).expect("x");
    // The warm-up run launches first (#1), the captured run second (#2).
    gpu.device().driver().fault(
        calls::LAUNCH_KERNEL,
        2,
        FaultAction::Stall(Duration::from_secs(600)),
    );
    let (be, xx) = (gpu.clone(), x.clone());
    let err = gpu
        .capture(Box::new(move || be.unary(UnaryOp::Neg, &xx).map(drop)))
        .expect_err("a capture past its deadline");
    assert!(gpu.device().lost_reason().is_some(), "{err:?}");
    assert!(
        err.is_device_lost(),
        "the device is lost but the error says not: {err:?}"
    );
    match err.device_error() {
        Some(DeviceError::Timeout { waited_for, .. }) => {
            assert!(waited_for.contains("cuLaunchKernel"), "{err:?}");
            assert!(!waited_for.contains("cuStreamEndCapture"), "{err:?}");
        }
        other => panic!("expected a Timeout, got {other:?} ({err:?})"),
    }
}

/// A body that stores a tensor outside but allocates differently in its two runs cannot have
/// its stored tensor paired with the warm-up's: refused by name, and the backend stays eager.
#[test]
fn stored_tensor_of_a_body_whose_runs_differ_is_refused() {
    let gpu = mock();
    let x = gpu.upload(&[1.0, 2.0, 3.0], &[3]).expect("x");
    let stored: Rc<RefCell<Option<zcompute::CudaTensor>>> = Rc::default();
    let body = {
        let (be, x, stored) = (gpu.clone(), x.clone(), Rc::clone(&stored));
        let mut runs = 0;
        move || {
            runs += 1;
            let src = if runs == 1 {
                be.unary(UnaryOp::Exp, &x)?
            } else {
                x.clone()
            };
            *stored.borrow_mut() = Some(be.add(&src, &x)?);
            Ok(())
        }
    };
    let err = gpu.capture(Box::new(body)).expect_err("runs that differ");
    assert!(
        matches!(
            err,
            ComputeError::CaptureFailed {
                stage: "pairing the captured run with its warm-up",
                ..
            }
        ),
        "{err}"
    );
    let y = gpu
        .unary(UnaryOp::Neg, &x)
        .expect("eager after the refusal");
    assert_eq!(gpu.download(&y).expect("download"), vec![-1.0, -2.0, -3.0]);
}
