//! ztrain prints the whole cause chain of an error, down to the device's own error, and keeps
//! each condition distinct: the command on a simulated device too small for its step, and
//! `TrainError`s built from each condition provoked on the simulated device through zgrad.

use crate::common;

use std::error::Error;

use common::{assert_fails_with, text, ztrain};
use zcompute::{Backend, Capture, ComputeError, CudaBackend};
use zdevice::{Device, DeviceConfig, DeviceError, Driver as _, SimConfig, SimDriver};
use zgrad::{GradError, Tape, Var};
use zmem::{Arena, ArenaConfig, MemError};
use ztrain::error::{TrainError, report};

type Mock = CudaBackend<SimDriver>;

#[test]
fn a_step_out_of_device_memory_prints_every_cause_down_to_the_driver_call() {
    let o = ztrain(&[
        "--device",
        "sim",
        // 64M fits the step since scratch reuses the memory saved tensors give back (29.6
        // MiB reserved beside the 32 MiB cuBLAS workspace); 60M does not.
        "--sim-memory",
        "60M",
        "--arena-bytes",
        "1M",
        "--segment-bytes",
        "1M",
        "--overflow-reserve",
        "1M",
        "--epochs",
        "1",
        "--samples",
        "64",
        "--batch",
        "64",
    ]);
    assert_fails_with(
        &o,
        &[
            "error: step 1 failed (the update was not applied",
            // The op that meets the cap first depends on the layout (scratch lent from the
            // held region and the copy stream's two landing buffers, issue 21; it was matmul).
            ": out of device memory now; end steps, drop tensors or raise the arena cap",
            // A scratch or a saved request, as the layout has it: the arena's own layer.
            "\n  caused by: out of memory for a ",
            "\n  caused by: out of device memory in cuMemAlloc",
        ],
    );
    let (_, stderr) = text(&o);
    // One line per layer, each printed once.
    let chain: Vec<&str> = stderr
        .lines()
        .skip_while(|l| !l.starts_with("error: "))
        .collect();
    assert_eq!(chain.len(), 4, "{stderr}");
}

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
            poison: false,
            sanitize: false,
            timeline_events: 0,
            from_env: Vec::new(),
        },
    )
    .expect("arena");
    CudaBackend::new(arena).expect("backend")
}

/// The first error of type `E` in `e`'s cause chain.
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

/// `x + y` of a column and a row of `n`: an `n × n` result.
fn outer_sum(b: &Mock, tape: &Tape<'_, Mock, f32>, n: usize) -> Result<Var<Mock, f32>, GradError> {
    let col = Var::constant(b.upload(&vec![1.0; n], &[n, 1])?);
    let row = Var::constant(b.upload(&vec![2.0; n], &[1, n])?);
    tape.add(&col, &row)
}

#[test]
fn over_the_device_capacity_is_too_large_in_the_printed_chain() {
    let b = mock(512 << 20);
    let err: TrainError = outer_sum(&b, &Tape::new(&b), 16 << 10)
        .expect_err("1 GiB on a 512 MiB device")
        .into();
    assert!(
        matches!(
            &err,
            TrainError::Grad(GradError::Compute(ComputeError::TooLarge { .. }))
        ),
        "{err:?}"
    );
    assert!(
        matches!(
            cause::<DeviceError>(&err),
            Some(DeviceError::TooLarge { .. })
        ),
        "{err:?}"
    );
    let printed = report(&err);
    let lines: Vec<&str> = printed.lines().collect();
    assert_eq!(lines.len(), 3, "{printed}");
    assert!(
        lines[0].starts_with("error: add: the request can never fit"),
        "{printed}"
    );
    assert!(
        lines[1].starts_with("  caused by: a persistent request of 1.0 GiB can never fit"),
        "{printed}"
    );
    assert!(lines[2].starts_with("  caused by: zmem.arena.alloc: requested 1073741824 bytes, more than the device's 536870912"), "{printed}");
}

#[test]
fn a_request_that_fits_after_a_free_is_out_of_memory_in_the_printed_chain() {
    let b = mock(64 << 20);
    let tape = Tape::no_grad(&b);
    let first = outer_sum(&b, &tape, 2048).expect("16 MiB fits");
    let err: TrainError = outer_sum(&b, &tape, 2048)
        .expect_err("16 MiB more does not fit now")
        .into();
    assert!(
        matches!(
            &err,
            TrainError::Grad(GradError::Compute(ComputeError::OutOfMemory { .. }))
        ),
        "{err:?}"
    );
    assert!(
        matches!(
            cause::<DeviceError>(&err),
            Some(DeviceError::OutOfMemory { .. })
        ),
        "{err:?}"
    );
    let printed = report(&err);
    assert!(
        printed.starts_with("error: add: out of device memory now"),
        "{printed}"
    );
    assert!(
        printed.contains("\n  caused by: out of memory for a persistent request"),
        "{printed}"
    );
    assert!(
        printed.contains("\n  caused by: out of device memory in cuMemAlloc"),
        "{printed}"
    );
    drop(first);
    outer_sum(&b, &tape, 2048).expect("fits once the first is freed");
}

#[test]
fn reservation_exhaustion_and_an_invalidated_capture_stay_distinct_in_the_printed_chain() {
    let b = mock(512 << 20);
    let x = b.upload(&[0.5; 64], &[64]).expect("x");
    let (be, xx) = (b.clone(), x.clone());
    let mut runs = 0;
    let exhausted: TrainError = b
        .capture(Box::new(move || {
            runs += 1;
            let mut y = be.unary(zcompute::UnaryOp::Exp, &xx)?;
            for _ in 1..runs * 3 {
                y = be.unary(zcompute::UnaryOp::Exp, &y)?;
            }
            Ok(())
        }))
        .expect_err("a body that outgrows its reservation")
        .into();
    assert!(
        matches!(
            &exhausted,
            TrainError::Compute(ComputeError::CaptureReservationExhausted { .. })
        ),
        "{exhausted:?}"
    );
    assert!(
        matches!(
            cause::<Box<MemError>>(&exhausted).map(|m| &**m),
            Some(MemError::CaptureReservationExhausted { .. })
        ),
        "{exhausted:?}"
    );
    let printed = report(&exhausted);
    assert!(
        printed.contains("the capture reservation is exhausted"),
        "{printed}"
    );
    assert!(
        printed.contains("\n  caused by: capture reservation"),
        "{printed}"
    );

    let be = b.clone();
    let invalidated: TrainError = b
        .capture(Box::new(move || {
            be.unary(zcompute::UnaryOp::Neg, &x)?;
            let _ = be.device().driver().ctx_synchronize();
            Ok(())
        }))
        .expect_err("an invalidated capture")
        .into();
    assert!(
        matches!(
            &invalidated,
            TrainError::Compute(ComputeError::CaptureInvalidated { .. })
        ),
        "{invalidated:?}"
    );
    assert!(
        matches!(
            cause::<DeviceError>(&invalidated),
            Some(DeviceError::CaptureInvalidated { .. })
        ),
        "{invalidated:?}"
    );
    let printed = report(&invalidated);
    assert!(
        printed.contains("the driver invalidated the capture"),
        "{printed}"
    );
    assert!(
        printed.contains("\n  caused by: stream capture was invalidated"),
        "{printed}"
    );
}
