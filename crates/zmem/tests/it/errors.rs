//! Each memory condition through the public API on the simulated device, as its own variant,
//! with the device's error reachable through `source()`: a request over the device's capacity
//! is `TooLarge` (never fits), one that fits once memory is freed is `OutOfMemory` (not now),
//! and a capture's reservation running out is `CaptureReservationExhausted`.

use std::error::Error;

use zdevice::DeviceError;
use zmem::{Arena, CapturePlan, MemError};

use crate::util::{mock, small};

/// The first `DeviceError` in `e`'s cause chain (`e` itself excluded).
fn device_source(e: &MemError) -> Option<&DeviceError> {
    let mut next = e.source();
    while let Some(cause) = next {
        if let Some(d) = cause.downcast_ref::<DeviceError>() {
            return Some(d);
        }
        next = cause.source();
    }
    None
}

#[test]
fn over_the_device_capacity_is_too_large_with_the_device_refusal_as_source() {
    let dev = mock(64 << 20);
    let arena = Arena::new(dev.clone(), small(1 << 20)).unwrap();
    let err = arena.alloc_persistent(1 << 30).unwrap_err();
    assert!(err.is_too_large() && !err.is_out_of_memory(), "{err:?}");
    match device_source(&err) {
        Some(DeviceError::TooLarge {
            requested, total, ..
        }) => assert_eq!((*requested, *total), (1 << 30, 64 << 20)),
        other => panic!("expected zdevice's TooLarge under {err:?}, got {other:?}"),
    }
    assert_eq!(err.device_error(), device_source(&err));
}

#[test]
fn a_request_that_fits_after_a_free_is_out_of_memory_with_the_device_error_as_source() {
    let dev = mock(16 << 20);
    let arena = Arena::new(dev.clone(), small(64 << 20)).unwrap();
    let first = arena.alloc_persistent(10 << 20).unwrap();
    let err = arena.alloc_persistent(10 << 20).unwrap_err();
    assert!(err.is_out_of_memory() && !err.is_too_large(), "{err:?}");
    match device_source(&err) {
        Some(DeviceError::OutOfMemory {
            requested, total, ..
        }) => assert_eq!((*requested, *total), (10 << 20, 16 << 20)),
        other => panic!("expected zdevice's OutOfMemory under {err:?}, got {other:?}"),
    }
    drop(first);
    arena
        .alloc_persistent(10 << 20)
        .expect("the same request fits once the first block is freed");
}

#[test]
fn an_exhausted_reservation_is_its_own_condition_not_out_of_memory() {
    let dev = mock(64 << 20);
    let arena = Arena::new(dev.clone(), small(1 << 20)).unwrap();
    let res = arena
        .reserve_for_capture(&CapturePlan::from_requests([1000]))
        .unwrap();
    let step = arena.step().unwrap();
    let scope = arena.capture_into(&res).unwrap();
    let cap = dev.begin_capture(dev.stream()).unwrap();
    let err = step.alloc_scratch(4096).unwrap_err();
    drop(cap);
    drop(scope);
    assert!(
        matches!(err, MemError::CaptureReservationExhausted { .. }),
        "{err:?}"
    );
    assert!(err.is_capture_reservation_exhausted(), "{err:?}");
    assert!(!err.is_out_of_memory() && !err.is_too_large(), "{err:?}");
    // zmem's own condition: the device was not asked, so there is no device error under it.
    assert!(
        err.source().is_none() && err.device_error().is_none(),
        "{err:?}"
    );
}
