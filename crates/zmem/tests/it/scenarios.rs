//! The ways an arena fills, overflow, and the stalled overflow, on the simulated device.

use std::time::Duration;

use rstest::rstest;
use zdevice::Driver as _;
use zmem::{AllocClass, Arena, ArenaConfig, FillCause, MemError, Source};

use crate::bodies;
use crate::util::{Logs, mock, small};

#[test]
fn overflow_loop_completes_and_warns_once() {
    let dev = mock(64 << 20);
    bodies::overflow_loop(&dev, &Logs::default()).unwrap();
}

#[test]
fn creation_logs_config_and_diagnostics() {
    let logs = Logs::default();
    let dev = mock(64 << 20);
    let _arena = logs
        .capture(|| Arena::new(dev.clone(), small(1 << 20)))
        .unwrap();
    assert_eq!(
        logs.count(&[
            "zmem.arena.new",
            "arena created",
            "segment 64.0 KiB",
            "verdict"
        ]),
        1
    );
}

#[test]
fn never_reset_is_told_apart() {
    let arena = Arena::new(mock(64 << 20), small(256 << 10)).unwrap();
    let step = arena.step().unwrap();
    // A loop that never ends its step: every sample's temporaries pile up.
    for _ in 0..64 {
        let _t = step.alloc_scratch(48 << 10).unwrap();
    }
    let d = arena.diagnostics();
    assert_eq!(d.fill_cause(), FillCause::NeverReset, "{d}");
    assert_eq!(d.resets, 0);
    assert!(
        d.overflow.calls > 0 && d.allocations_since_reset == 64,
        "{d}"
    );
    assert!(d.to_string().contains("verdict: never reset"), "{d}");
}

#[test]
fn full_working_set_is_told_apart() {
    let arena = Arena::new(mock(64 << 20), small(256 << 10)).unwrap();
    let mut keep = Vec::new();
    for _ in 0..3 {
        let step = arena.step().unwrap();
        keep.push(step.alloc_saved(100 << 10).unwrap());
        keep.push(step.alloc_scratch(32 << 10).unwrap().clone());
        step.end().unwrap();
    }
    let d = arena.diagnostics();
    assert_eq!(d.fill_cause(), FillCause::WorkingSetFull, "{d}");
    assert!(d.resets == 3 && d.overflow.calls > 0, "{d}");
}

#[test]
fn one_huge_request_is_told_apart() {
    let arena = Arena::new(mock(64 << 20), small(256 << 10)).unwrap();
    let step = arena.step().unwrap();
    let big = step.alloc_scratch(4 << 20).unwrap();
    assert_eq!(big.source(), Source::Overflow);
    let d = arena.diagnostics();
    assert_eq!(d.fill_cause(), FillCause::HugeRequest, "{d}");
    assert_eq!(d.largest_request, 4 << 20);
}

#[test]
fn a_request_larger_than_the_device_is_too_large_without_a_device_call() {
    let dev = mock(64 << 20);
    let arena = Arena::new(dev.clone(), small(256 << 10)).unwrap();
    let before = dev.driver().op_log().len();
    let err = arena.alloc_persistent(1 << 30).unwrap_err();
    assert!(
        matches!(
            err,
            MemError::TooLarge {
                class: AllocClass::Persistent,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(dev.driver().op_log().len(), before);
}

#[test]
fn exhausted_pool_is_out_of_memory_with_diagnostics() {
    // 4 MiB device: the arena and the pool's reserve take most of it.
    let dev = mock(4 << 20);
    let cfg = ArenaConfig {
        overflow_reserve_bytes: 1 << 20,
        ..small(1 << 20)
    };
    let arena = Arena::new(dev, cfg).unwrap();
    let step = arena.step().unwrap();
    let mut live = Vec::new();
    let err = loop {
        match step.alloc_scratch(512 << 10) {
            Ok(b) => live.push(b.clone()),
            Err(e) => break e,
        }
    };
    match &err {
        MemError::OutOfMemory {
            requested,
            class,
            diagnostics,
            device,
        } => {
            assert_eq!((*requested, *class), (512 << 10, AllocClass::Scratch));
            assert!(diagnostics.overflow.calls > 0, "{diagnostics}");
            assert!(device.is_some());
        }
        other => panic!("expected OutOfMemory, got {other}"),
    }
    assert!(err.to_string().contains("verdict"), "{err}");
}

#[rstest]
#[case::stall_past_deadline(Duration::from_secs(30), true)]
#[case::stall_within_deadline(Duration::from_secs(5), false)]
fn stalled_overflow_times_out_at_its_deadline(#[case] stall: Duration, #[case] times_out: bool) {
    let dev = mock(64 << 20);
    let arena = Arena::new(dev.clone(), small(256 << 10)).unwrap();
    let step = arena.step().unwrap();
    let _fill: Vec<_> = (0..4)
        .map(|_| step.alloc_scratch(64 << 10).unwrap().clone())
        .collect();
    dev.driver().stall("cuMemAllocFromPoolAsync", 1, stall);
    let t0 = dev.driver().now();
    let r = step.alloc_scratch(64 << 10);
    let waited = dev.driver().now() - t0;
    assert!(
        waited >= stall && waited < stall + Duration::from_secs(1),
        "{waited:?}"
    );
    match (r, times_out) {
        (
            Err(MemError::Timeout {
                deadline,
                diagnostics,
                ..
            }),
            true,
        ) => {
            assert_eq!(deadline, dev.config().alloc_deadline);
            assert_eq!(diagnostics.scratch_segments, 4, "{diagnostics}");
        }
        (Ok(b), false) => assert_eq!(b.source(), Source::Overflow),
        (other, _) => panic!("unexpected {other:?}"),
    }
}

#[test]
fn overflow_never_synchronises_the_device() {
    let dev = mock(64 << 20);
    let arena = Arena::new(dev.clone(), small(256 << 10)).unwrap();
    dev.driver().clear_op_log();
    {
        let step = arena.step().unwrap();
        let _b: Vec<_> = (0..8)
            .map(|_| step.alloc_scratch(64 << 10).unwrap().clone())
            .collect();
        drop(_b);
        step.end().unwrap();
    }
    let calls: Vec<&str> = dev.driver().op_log().iter().map(|o| o.call).collect();
    for forbidden in [
        "cuStreamSynchronize",
        "cuCtxSynchronize",
        "cuStreamQuery",
        "cuMemAlloc_v2",
    ] {
        assert!(!calls.contains(&forbidden), "{forbidden} in {calls:?}");
    }
    assert!(calls.contains(&"cuMemAllocFromPoolAsync") && calls.contains(&"cuMemFreeAsync"));
}

/// With overflow forbidden, a request past the cap is `OutOfMemory` at once (the diagnostics
/// say why, nothing reached the pool); allowed again, the same request overflows.
#[test]
fn forbidden_overflow_is_out_of_memory_at_once() {
    let arena = Arena::new(mock(64 << 20), small(256 << 10)).unwrap();
    assert!(arena.overflow_enabled());
    arena.set_overflow_enabled(false);
    let step = arena.step().unwrap();
    let mut live = Vec::new();
    let err = loop {
        match step.alloc_scratch(64 << 10) {
            Ok(b) => live.push(b.clone()),
            Err(e) => break e,
        }
    };
    match &err {
        MemError::OutOfMemory {
            diagnostics,
            device,
            ..
        } => {
            assert_eq!(diagnostics.overflow.calls, 0, "{diagnostics}");
            assert!(device.is_none(), "no device call was made");
        }
        other => panic!("expected OutOfMemory, got {other}"),
    }
    assert_eq!(live.len(), 4, "the cap holds four 64 KiB blocks");
    arena.set_overflow_enabled(true);
    let b = step.alloc_scratch(64 << 10).unwrap();
    assert_eq!(b.source(), zmem::Source::Overflow);
    assert_eq!(arena.diagnostics().overflow.calls, 1);
}
