//! Each device condition through the backend's public API on the simulated device, as its own
//! `ComputeError` variant with zmem's and zdevice's errors (fields and all) under it through
//! `source()`: over the device's capacity -> `TooLarge`; fits after a free -> `OutOfMemory`;
//! a capture's reservation running out -> `CaptureReservationExhausted`; a capture the driver
//! invalidated -> `CaptureInvalidated`. After each, eager work still runs.

use std::error::Error;

use zcompute::{Backend, Capture, ComputeError, CudaBackend, UnaryOp};
use zdevice::{Device, DeviceConfig, DeviceError, Driver as _, SimConfig, SimDriver};
use zmem::MemError;

use super::{backend_on, mock};

/// The first error of type `E` in `e`'s cause chain (`e` itself excluded).
fn cause<'e, E: Error + 'static>(e: &'e (dyn Error + 'static)) -> Option<&'e E> {
    let mut next = e.source();
    while let Some(c) = next {
        if let Some(found) = c.downcast_ref::<E>() {
            return Some(found);
        }
        next = c.source();
    }
    None
}

/// A backend on a simulated device of `capacity` bytes.
fn backend_with(capacity: u64) -> CudaBackend<SimDriver> {
    let sim = SimDriver::new(SimConfig::with_capacity(capacity));
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

fn eager_still_works(gpu: &CudaBackend<SimDriver>) {
    let x = gpu
        .upload(&[1.0, 2.0], &[2])
        .expect("upload after the failure");
    let y = gpu.unary(UnaryOp::Neg, &x).expect("op after the failure");
    assert_eq!(gpu.download(&y).expect("download"), vec![-1.0, -2.0]);
}

#[test]
fn over_the_device_capacity_is_too_large_down_to_zdevice() {
    let gpu = mock(); // 512 MiB
    let err = gpu
        .zeros(&[1 << 28])
        .expect_err("1 GiB on a 512 MiB device");
    assert!(
        matches!(&err, ComputeError::TooLarge { op: "full", .. }),
        "{err:?}"
    );
    assert!(err.is_too_large() && !err.is_out_of_memory(), "{err:?}");
    assert!(
        matches!(err.mem_error(), Some(MemError::TooLarge { .. })),
        "{err:?}"
    );
    // The arena's error is boxed under the backend's (`mem_error()` gives it typed).
    assert!(cause::<Box<MemError>>(&err).is_some(), "{err:?}");
    match cause::<DeviceError>(&err) {
        Some(DeviceError::TooLarge {
            requested, total, ..
        }) => assert_eq!((*requested, *total), (1 << 30, 512 << 20)),
        other => panic!("expected zdevice's TooLarge under {err:?}, got {other:?}"),
    }
    assert_eq!(err.device_error(), cause::<DeviceError>(&err));
    eager_still_works(&gpu);
}

#[test]
fn a_request_that_fits_after_a_free_is_out_of_memory_down_to_zdevice() {
    // 64 MiB: the arena's first 16 MiB segment and 4 MiB overflow reserve leave 44 MiB.
    let gpu = backend_with(64 << 20);
    let first = gpu.zeros(&[30 << 18]).expect("30 MiB");
    let err = gpu
        .zeros(&[30 << 18])
        .expect_err("30 MiB more, with at most 14 MiB free");
    assert!(matches!(&err, ComputeError::OutOfMemory { .. }), "{err:?}");
    assert!(err.is_out_of_memory() && !err.is_too_large(), "{err:?}");
    assert!(
        matches!(
            cause::<DeviceError>(&err),
            Some(DeviceError::OutOfMemory { total, .. }) if *total == 64 << 20
        ),
        "{err:?}"
    );
    drop(first);
    gpu.zeros(&[30 << 18])
        .expect("the same request fits once the first tensor is freed");
    eager_still_works(&gpu);
}

#[test]
fn a_body_that_outgrows_its_reservation_is_reservation_exhausted_not_out_of_memory() {
    let gpu = mock();
    let x = gpu.upload(&[1.0; 64], &[64]).expect("x");
    let (be, xx) = (gpu.clone(), x.clone());
    let mut runs = 0;
    let err = gpu
        .capture(Box::new(move || {
            runs += 1;
            let mut y = be.unary(UnaryOp::Exp, &xx)?;
            for _ in 1..runs * 3 {
                y = be.unary(UnaryOp::Exp, &y)?;
            }
            Ok(())
        }))
        .expect_err("a body that allocates more under capture than in its warm-up");
    assert!(
        matches!(&err, ComputeError::CaptureReservationExhausted { .. })
            && matches!(
                err.mem_error(),
                Some(MemError::CaptureReservationExhausted { needed_more, .. }) if *needed_more > 0
            ),
        "{err:?}"
    );
    assert!(err.is_capture_reservation_exhausted(), "{err:?}");
    assert!(!err.is_out_of_memory() && !err.is_too_large(), "{err:?}");
    // zmem's own condition: no device call failed.
    assert!(cause::<DeviceError>(&err).is_none(), "{err:?}");
    eager_still_works(&gpu);
}

#[test]
fn a_capture_the_driver_invalidated_is_capture_invalidated_down_to_zdevice() {
    let gpu = mock();
    let x = gpu.upload(&[1.0; 4], &[4]).expect("x");
    let (be, xx) = (gpu.clone(), x.clone());
    let err = gpu
        .capture(Box::new(move || {
            be.unary(UnaryOp::Neg, &xx)?;
            // A raw driver call the guards do not see: the driver invalidates the capture.
            let _ = be.device().driver().ctx_synchronize();
            Ok(())
        }))
        .expect_err("an invalidated capture");
    assert!(
        matches!(
            &err,
            ComputeError::CaptureInvalidated {
                source: DeviceError::CaptureInvalidated { .. },
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.is_capture_invalidated() && !err.is_device_lost(),
        "{err:?}"
    );
    assert!(
        !matches!(err, ComputeError::CaptureIllegal { .. }),
        "{err:?}"
    );
    assert!(cause::<DeviceError>(&err).is_some(), "{err:?}");
    assert!(!gpu.device().is_capturing());
    eager_still_works(&gpu);
}
