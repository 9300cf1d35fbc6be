//! Sanitizer mode on the simulated device: every block is its own driver allocation, the
//! scenario bodies hold unchanged, and the planted out-of-bounds write is seen only in it.

use rstest::rstest;
use zmem::{AllocClass, Arena, MemError, Source};

use crate::bodies;
use crate::util::{Logs, mock, sanitized, small};

/// The scenario bodies of the default mode, in sanitizer mode.
#[rstest]
#[case::overflow("overflow")]
#[case::capture("capture")]
#[case::saved("saved")]
#[case::saved_poisoned("saved_poisoned")]
fn scenario_bodies_hold_in_sanitizer_mode(#[case] body: &str) {
    let dev = mock(64 << 20);
    let r = sanitized(true, || match body {
        "overflow" => bodies::overflow_loop(&dev, &Logs::default()),
        "capture" => bodies::capture_from_reservation(&dev)
            .and_then(|a| crate::util::ensure(a.sanitize(), "the arena is not in sanitizer mode")),
        "saved" => bodies::saved_survives_step_end(&dev, false),
        _ => bodies::saved_survives_step_end(&dev, true),
    });
    r.unwrap();
}

/// Whether a driver allocation of `size` bytes starts at `ptr`, once the stream-ordered frees
/// queued so far have run.
fn has_alloc(arena: &Arena<zdevice::sim::SimDriver>, ptr: u64, size: u64) -> bool {
    let dev = arena.device();
    dev.synchronize(dev.stream()).expect("the stream drains");
    let allocs = arena.device().driver().live_allocations();
    allocs.iter().any(|(p, s)| p.0 == ptr && *s == size)
}

#[test]
fn every_block_is_its_own_allocation_and_goes_back_when_reclaimed() {
    let arena = Arena::new(mock(64 << 20), sanitized(true, || small(1 << 20))).unwrap();
    assert!(arena.sanitize());
    let d = arena.diagnostics();
    assert!(d.sanitize && d.capacity == 0, "no segments up front: {d}");
    assert!(d.to_string().contains("sanitize on"), "{d}");
    let step = arena.step().unwrap();
    let a = step.alloc_scratch(1000).unwrap();
    let b = step.alloc_scratch(3000).unwrap();
    let kept = a.clone();
    let (pa, pb) = (a.raw_ptr().0, b.raw_ptr().0);
    let saved = arena.alloc_saved(5000).unwrap();
    for (p, size) in [(pa, 1024), (pb, 3072), (saved.raw_ptr().0, 5120)] {
        assert!(has_alloc(&arena, p, size), "{p:#x} {size}");
    }
    let d = arena.diagnostics();
    assert_eq!(
        (d.capacity, d.scratch_segments, d.held_segments),
        (9216, 2, 1),
        "{d}"
    );
    drop((a, b));
    let summary = step.end().unwrap();
    assert_eq!(summary.kept.len(), 1);
    // The dead block went back to the driver; the kept one is still its own, and valid.
    assert!(!has_alloc(&arena, pb, 3072) && has_alloc(&arena, pa, 1024));
    assert!(kept.ptr().is_ok());
    drop(kept);
    arena.step().unwrap().end().unwrap();
    assert!(!has_alloc(&arena, pa, 1024));
    let p = saved.raw_ptr().0;
    drop(saved);
    assert!(
        !has_alloc(&arena, p, 5120),
        "a held block goes back on its last drop"
    );
    let d = arena.diagnostics();
    assert_eq!((d.capacity, d.live_handles), (0, 0), "{d}");
    assert_eq!(d.bytes_by_class.get(AllocClass::Saved), 0, "{d}");
}

/// A capture reservation in sanitizer mode is one allocation per recorded request, made before
/// the capture; the captured blocks take them in order, and nothing is allocated while capturing.
#[test]
fn a_reservation_is_one_allocation_per_recorded_block() {
    let dev = mock(64 << 20);
    let arena = Arena::new(dev.clone(), sanitized(true, || small(1 << 20))).unwrap();
    let plan = zmem::CapturePlan::from_requests([1000, 5000]).with_headroom(512);
    let res = arena.reserve_for_capture(&plan).unwrap();
    assert_eq!(res.bytes(), 1024 + 5120 + 512);
    let step = arena.step().unwrap();
    dev.driver().clear_op_log();
    let (a, b, c) = {
        let _scope = arena.capture_into(&res).unwrap();
        let cap = dev.begin_capture(dev.stream()).unwrap();
        let a = step.alloc_scratch(1000).unwrap().clone();
        let b = arena.alloc_saved(5000).unwrap();
        let c = arena.alloc_saved(300).unwrap();
        // No recorded slot left for this one, and the headroom is spent.
        let err = arena.alloc_saved(300).unwrap_err();
        assert!(
            matches!(err, MemError::CaptureReservationExhausted { .. }),
            "{err}"
        );
        drop(cap.end().unwrap());
        (a, b, c)
    };
    let during: Vec<&str> = dev
        .driver()
        .op_log()
        .iter()
        .filter(|o| o.capture.is_some())
        .map(|o| o.call)
        .collect();
    assert_eq!(during, ["cuStreamEndCapture"]);
    for blk in [&a, &b, &c] {
        assert_eq!(blk.source(), Source::Reservation);
    }
    assert!(has_alloc(&arena, a.raw_ptr().0, 1024));
    assert!(has_alloc(&arena, b.raw_ptr().0, 5120));
    // Blocks past the recorded ones share the headroom allocation.
    assert!(has_alloc(&arena, c.raw_ptr().0, 512));
    step.end().unwrap();
    drop((res, a, b, c));
    arena.flush().unwrap();
    assert_eq!(arena.diagnostics().capture.reservations, 0);
}

/// Reclaimed scratch is given back to the driver in this mode: a stale read (behind the
/// generation check, through the raw address) is refused by the driver instead of reading
/// poison, the check the sanitizer makes on the device.
#[test]
fn a_stale_read_of_reclaimed_scratch_is_a_use_after_free() {
    let r = sanitized(true, || {
        bodies::poison_reclaimed_scratch(&mock(64 << 20), true)
    });
    let err = r.unwrap_err();
    assert!(
        err.contains("CUDA_ERROR") || err.contains("stale") || err.contains("700"),
        "{err}"
    );
}

/// The negative control's simulated twin: the planted write past a block faults in sanitizer
/// mode and goes unseen by default (it lands in the arena's own segment).
#[rstest]
#[case::default_mode(false)]
#[case::sanitizer_mode(true)]
fn planted_out_of_bounds_write_is_seen_only_in_sanitizer_mode(#[case] sanitize: bool) {
    let dev = mock(64 << 20);
    let inside = bodies::planted_oob_write(&dev, sanitize, bodies::PLANT_BLOCK_FLOATS).unwrap();
    assert!(inside.is_ok(), "an in-bounds fill is clean: {inside:?}");
    let planted = bodies::planted_oob_write(&dev, sanitize, 1024).unwrap();
    match planted {
        Ok(()) => assert!(!sanitize, "sanitizer mode missed the planted write"),
        Err(e) => {
            assert!(sanitize, "default mode saw the planted write: {e}");
            assert!(e.contains("ILLEGAL_ADDRESS"), "{e}");
        }
    }
}
