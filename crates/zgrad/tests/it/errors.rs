//! Each device condition through zgrad's tape on the simulated device, as its own
//! `ComputeError` variant under `GradError::Compute`, with zmem's and zdevice's errors reachable
//! through `source()`: over the device's capacity -> `TooLarge`; fits after a free ->
//! `OutOfMemory`; a captured tape body outgrowing its reservation ->
//! `CaptureReservationExhausted`; a captured tape body the driver invalidated ->
//! `CaptureInvalidated`.

use std::error::Error;

use zcompute::{Backend, Capture, ComputeError, CudaBackend};
use zdevice::{Device, DeviceConfig, DeviceError, Driver as _, SimConfig, SimDriver};
use zgrad::{GradError, Tape, Var};
use zmem::{Arena, ArenaConfig, MemError};

type Mock = CudaBackend<SimDriver>;

fn mock(capacity: u64) -> Mock {
    let sim = SimDriver::new(SimConfig::with_capacity(capacity));
    let config = DeviceConfig {
        blas_workspace_bytes: 0,
        ..DeviceConfig::default()
    };
    zcompute::cuda::twins::register(&sim);
    let dev = Device::open(sim, config).expect("the simulated device opens");
    let arena = Arena::new(
        dev,
        ArenaConfig {
            initial_bytes: 16 << 20,
            segment_bytes: 16 << 20,
            cap_bytes: Some(192 << 20),
            overflow_reserve_bytes: 4 << 20,
            poison: true,
            sanitize: false,
            timeline_events: 256,
            from_env: Vec::new(),
        },
    )
    .expect("arena");
    CudaBackend::new(arena).expect("backend")
}

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

/// A column `[n, 1]` and a row `[1, n]`: their sum broadcasts to `n × n` floats.
fn column_and_row(b: &Mock, n: usize) -> (Var<Mock, f32>, Var<Mock, f32>) {
    let col = Var::constant(b.upload(&vec![1.0; n], &[n, 1]).expect("column"));
    let row = Var::constant(b.upload(&vec![2.0; n], &[1, n]).expect("row"));
    (col, row)
}

#[test]
fn over_the_device_capacity_is_too_large_down_to_zdevice() {
    let b = mock(512 << 20);
    let (col, row) = column_and_row(&b, 16 << 10);
    let tape = Tape::new(&b);
    let err = tape
        .add(&col, &row)
        .expect_err("a 1 GiB sum on a 512 MiB device");
    assert!(
        matches!(&err, GradError::Compute(ComputeError::TooLarge { .. })),
        "{err:?}"
    );
    assert!(err.is_too_large() && !err.is_out_of_memory(), "{err:?}");
    match cause::<DeviceError>(&err) {
        Some(DeviceError::TooLarge {
            requested, total, ..
        }) => assert_eq!((*requested, *total), (1 << 30, 512 << 20)),
        other => panic!("expected zdevice's TooLarge under {err:?}, got {other:?}"),
    }
}

#[test]
fn a_sum_that_fits_after_a_free_is_out_of_memory_down_to_zdevice() {
    // 64 MiB: the arena's scratch and held segments and overflow reserve leave 28 MiB; each
    // sum is 16 MiB.
    let b = mock(64 << 20);
    let (col, row) = column_and_row(&b, 2048);
    let tape = Tape::no_grad(&b);
    let first = tape.add(&col, &row).expect("the first sum fits");
    let err = tape
        .add(&col, &row)
        .expect_err("a second sum does not fit now");
    assert!(
        matches!(&err, GradError::Compute(ComputeError::OutOfMemory { .. })),
        "{err:?}"
    );
    assert!(err.is_out_of_memory() && !err.is_too_large(), "{err:?}");
    assert!(
        matches!(
            cause::<DeviceError>(&err),
            Some(DeviceError::OutOfMemory { .. })
        ),
        "{err:?}"
    );
    drop(first);
    tape.add(&col, &row)
        .expect("the same sum fits once the first is freed");
}

#[test]
fn a_captured_tape_body_that_outgrows_its_reservation_is_reservation_exhausted() {
    let b = mock(512 << 20);
    let x = Var::constant(b.upload(&[0.5; 64], &[64]).expect("x"));
    let be = b.clone();
    let mut runs = 0;
    let err: GradError = b
        .capture(Box::new(move || {
            runs += 1;
            let tape = Tape::no_grad(&be);
            let mut y = tape.exp(&x).map_err(compute)?;
            for _ in 1..runs * 3 {
                y = tape.exp(&y).map_err(compute)?;
            }
            Ok(())
        }))
        .expect_err("a body that allocates more under capture than in its warm-up")
        .into();
    assert!(
        matches!(
            &err,
            GradError::Compute(ComputeError::CaptureReservationExhausted { .. })
        ),
        "{err:?}"
    );
    assert!(err.is_capture_reservation_exhausted(), "{err:?}");
    assert!(!err.is_out_of_memory() && !err.is_too_large(), "{err:?}");
    assert!(
        matches!(
            err.compute_error().and_then(ComputeError::mem_error),
            Some(MemError::CaptureReservationExhausted { .. })
        ),
        "{err:?}"
    );
}

#[test]
fn a_captured_tape_body_the_driver_invalidated_is_capture_invalidated_down_to_zdevice() {
    let b = mock(512 << 20);
    let x = Var::constant(b.upload(&[0.5; 4], &[4]).expect("x"));
    let be = b.clone();
    let err: GradError = b
        .capture(Box::new(move || {
            let tape = Tape::no_grad(&be);
            tape.exp(&x).map_err(compute)?;
            // A raw driver call the guards do not see: the driver invalidates the capture.
            let _ = be.device().driver().ctx_synchronize();
            Ok(())
        }))
        .expect_err("an invalidated capture")
        .into();
    assert!(
        matches!(
            &err,
            GradError::Compute(ComputeError::CaptureInvalidated { .. })
        ),
        "{err:?}"
    );
    assert!(
        err.is_capture_invalidated() && !err.is_device_lost(),
        "{err:?}"
    );
    assert!(
        matches!(
            cause::<DeviceError>(&err),
            Some(DeviceError::CaptureInvalidated { .. })
        ),
        "{err:?}"
    );
}

/// A tape op's error inside a capture body (which returns `ComputeError`).
fn compute(e: GradError) -> ComputeError {
    match e {
        GradError::Compute(c) => c,
        other => panic!("a tape op failed outside the backend: {other}"),
    }
}
