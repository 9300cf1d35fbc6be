//! Capture reservations on the simulated device.

use zmem::{AllocClass, Arena, CapturePlan, MemError, Protection};

use crate::bodies;
use crate::util::{Check, mock, s, small};

#[test]
fn capture_allocates_from_its_reservation_and_replays() {
    let dev = mock(64 << 20);
    let arena = bodies::capture_from_reservation(&dev).unwrap();
    // Nothing synchronous, and no allocation at all, happened while capturing.
    let log = dev.driver().op_log();
    let during: Vec<&str> = log
        .iter()
        .filter(|o| o.capture.is_some())
        .map(|o| o.call)
        .collect();
    assert_eq!(
        during,
        ["cuMemsetD32Async", "cuMemsetD32Async", "cuStreamEndCapture"]
    );
    let t = arena.timeline();
    let kinds: Vec<&str> = t.events.iter().map(|e| e.kind.name()).collect();
    for k in ["reserve", "capture_begin", "capture_end", "graph_drop"] {
        assert!(kinds.contains(&k), "{k} missing from {kinds:?}");
    }
}

/// An allocation while a stream captures and no reservation is active must fail, not reach
/// the arena's scratch (whose addresses a step reset would hand to new tensors).
fn capture_without_reservation_is_refused(arena: &Arena<zdevice::sim::SimDriver>) -> Check {
    let dev = arena.device();
    let step = arena.step().map_err(s)?;
    let cap = dev.begin_capture(dev.stream()).map_err(s)?;
    let r = step.alloc_scratch(1024);
    let got = match r {
        Err(MemError::AllocationDuringCapture {
            class: AllocClass::Scratch,
            requested: 1024,
        }) => Ok(()),
        other => Err(format!("expected AllocationDuringCapture, got {other:?}")),
    };
    drop(cap);
    got
}

#[test]
fn allocation_during_capture_without_reservation_is_refused() {
    let arena = Arena::new(mock(64 << 20), small(1 << 20)).unwrap();
    capture_without_reservation_is_refused(&arena).unwrap();
}

#[test]
fn negative_control_without_capture_routing_the_arena_serves_the_capture() {
    let arena = Arena::new(mock(64 << 20), small(1 << 20)).unwrap();
    arena.set_protection_for_tests(Protection::CaptureRouting, false);
    assert!(capture_without_reservation_is_refused(&arena).is_err());
}

#[test]
fn an_exhausted_reservation_says_how_much_more_is_needed() {
    let dev = mock(64 << 20);
    let arena = Arena::new(dev.clone(), small(1 << 20)).unwrap();
    let res = arena
        .reserve_for_capture(&CapturePlan::from_requests([1000, 1000]))
        .unwrap();
    assert_eq!(res.bytes(), 2048);
    let step = arena.step().unwrap();
    let scope = arena.capture_into(&res).unwrap();
    let cap = dev.begin_capture(dev.stream()).unwrap();
    let _a = step.alloc_scratch(1024).unwrap();
    let err = step.alloc_saved(4096).unwrap_err();
    match err {
        MemError::CaptureReservationExhausted {
            needed_more,
            reserved,
            used,
            ..
        } => {
            assert_eq!((needed_more, reserved, used), (3072, 2048, 1024));
        }
        other => panic!("{other}"),
    }
    drop(cap);
    drop(scope);
}

#[test]
fn step_end_during_capture_defers_the_reclaim() {
    let dev = mock(64 << 20);
    let arena = Arena::new(dev.clone(), small(1 << 20)).unwrap();
    let res = arena
        .reserve_for_capture(&CapturePlan::from_requests([256]))
        .unwrap();
    let step = arena.step().unwrap();
    let before = step.alloc_scratch(1024).unwrap().raw_ptr();
    {
        let _scope = arena.capture_into(&res).unwrap();
        let _cap = dev.begin_capture(dev.stream()).unwrap();
        assert!(matches!(step.end(), Err(MemError::CaptureActive { .. })));
    }
    assert_eq!(arena.diagnostics().resets, 0);
    // The next step continues after the deferred memory; its end reclaims both.
    let step = arena.step().unwrap();
    let x = step.alloc_scratch(1024).unwrap();
    assert_ne!(x.raw_ptr(), before);
    drop(x);
    step.end().unwrap();
    let step = arena.step().unwrap();
    assert_eq!(step.alloc_scratch(1024).unwrap().raw_ptr(), before);
}

#[test]
fn frees_during_capture_are_applied_after_it() {
    let dev = mock(64 << 20);
    let arena = Arena::new(dev.clone(), small(1 << 20)).unwrap();
    let p = arena.alloc_persistent(4096).unwrap();
    let res = arena
        .reserve_for_capture(&CapturePlan::from_requests([256]))
        .unwrap();
    {
        let _scope = arena.capture_into(&res).unwrap();
        let cap = dev.begin_capture(dev.stream()).unwrap();
        drop(p);
        assert_eq!(
            arena
                .diagnostics()
                .bytes_by_class
                .get(AllocClass::Persistent),
            4096
        );
        cap.end().unwrap();
    }
    arena.flush().unwrap();
    assert_eq!(
        arena
            .diagnostics()
            .bytes_by_class
            .get(AllocClass::Persistent),
        0
    );
}

#[test]
fn warm_up_recording_matches_the_capture() {
    let arena = Arena::new(mock(64 << 20), small(1 << 20)).unwrap();
    let step = arena.step().unwrap();
    // The step's scratch window is open before the recording starts: the recording must
    // still see the next scratch request.
    drop(step.alloc_scratch(64).unwrap());
    let rec = arena.start_recording().unwrap();
    assert!(arena.start_recording().is_err());
    let _a = step.alloc_scratch(10).unwrap();
    let _b = arena.alloc_persistent(300).unwrap();
    let plan = rec.finish().with_headroom(256);
    assert_eq!(plan.requests(), &[256, 512]);
    assert_eq!(plan.bytes(), 1024);
}

/// A graph block (and its reservation, held by the graph) outliving the arena is stale like
/// every other class: the arena's teardown frees the capture pool its memory came from.
#[test]
fn graph_blocks_outliving_their_arena_are_stale() {
    let dev = mock(64 << 20);
    let arena = Arena::new(dev.clone(), small(1 << 20)).unwrap();
    let plan = CapturePlan::from_requests([4096]);
    let res = arena.reserve_for_capture(&plan).unwrap();
    let step = arena.step().unwrap();
    let block = {
        let _scope = arena.capture_into(&res).unwrap();
        let cap = dev.begin_capture(dev.stream()).unwrap();
        let b = step.alloc_scratch(4096).unwrap().clone();
        drop(cap.end().unwrap());
        b
    };
    assert_eq!(block.class(), AllocClass::Graph);
    assert!(block.ptr().is_ok() && block.is_valid());
    step.end().unwrap();
    drop(arena);
    assert!(!block.is_valid(), "{block:?}");
    assert!(
        matches!(
            block.ptr(),
            Err(MemError::UseAfterReclaim {
                class: AllocClass::Graph,
                size: 4096,
                ..
            })
        ),
        "{:?}",
        block.ptr()
    );
    drop(res);
}

/// The reservation a scope routes to is the device's capture session's: the session's phase
/// says so, and another arena on the same device neither allocates from it nor routes a
/// second one while it is active.
#[test]
fn the_routed_reservation_lives_on_the_device_session() {
    use zdevice::CapturePhase;
    let dev = mock(64 << 20);
    let a = Arena::new(dev.clone(), small(1 << 20)).unwrap();
    let b = Arena::new(dev.clone(), small(1 << 20)).unwrap();
    let res_a = a
        .reserve_for_capture(&CapturePlan::from_requests([1024]))
        .unwrap();
    let res_b = b
        .reserve_for_capture(&CapturePlan::from_requests([1024]))
        .unwrap();
    assert_eq!(dev.capture_phase(), CapturePhase::Idle);
    let scope = a.capture_into(&res_a).unwrap();
    assert_eq!(dev.capture_phase(), CapturePhase::Reserved);
    assert!(a.diagnostics().capture.active);
    assert!(!b.diagnostics().capture.active);
    // Arena b is not routed: it serves from its own memory, its reservation untouched.
    let held = b.alloc_persistent(512).unwrap();
    assert_eq!(held.class(), AllocClass::Persistent);
    assert!(matches!(
        b.capture_into(&res_b),
        Err(MemError::CaptureActive { .. })
    ));
    let graph = a.alloc_persistent(1024).unwrap();
    assert_eq!(graph.class(), AllocClass::Graph);
    assert_eq!(scope.used(), 1024);
    drop(scope);
    assert_eq!(dev.capture_phase(), CapturePhase::Idle);
    assert!(!a.diagnostics().capture.active);
    drop(b.capture_into(&res_b).unwrap());
}
