//! Graph pools on the simulated device: members share one reservation, counted once; what
//! the pool can check is refused with a typed error.

use zmem::{AllocClass, Arena, CapturePlan, CaptureReservation, GraphPool, MemError};

use crate::bodies;
use crate::util::{mock, sanitized, small};

fn plan(bytes: u64) -> CapturePlan {
    CapturePlan::from_requests([bytes])
}

fn arena() -> Arena<zdevice::sim::SimDriver> {
    Arena::new(mock(64 << 20), small(1 << 20)).unwrap()
}

/// Captures `bytes` of graph memory into `res` (nothing recorded: the memory is what counts).
fn capture(
    arena: &Arena<zdevice::sim::SimDriver>,
    res: &CaptureReservation,
    bytes: u64,
) -> zmem::Block {
    let dev = arena.device();
    let step = arena.step().unwrap();
    let scope = arena.capture_into(res).unwrap();
    let cap = dev.begin_capture(dev.stream()).unwrap();
    let block = step.alloc_saved(bytes).unwrap();
    drop(cap.end().unwrap());
    drop(scope);
    step.end().unwrap();
    block
}

#[test]
fn members_replay_alternately_through_one_memory() {
    bodies::pool_members_alternate(&mock(64 << 20)).unwrap();
}

#[test]
fn in_sanitizer_mode_each_member_has_its_own_memory() {
    sanitized(true, || bodies::pool_members_alternate(&mock(64 << 20))).unwrap();
}

#[test]
fn the_graph_class_shows_the_largest_member_not_the_sum() {
    let arena = arena();
    let pool = GraphPool::new();
    let members: Vec<_> = [40_960, 8192, 40_960, 256]
        .into_iter()
        .map(|b| {
            let res = arena.reserve_in_pool(&pool, &plan(b)).unwrap();
            let blk = capture(&arena, &res, b);
            (res, blk)
        })
        .collect();
    let d = arena.diagnostics();
    assert_eq!(d.bytes_by_class.get(AllocClass::Graph), 40_960, "{d}");
    assert_eq!(d.peak_bytes_by_class.get(AllocClass::Graph), 40_960, "{d}");
    assert_eq!(
        (d.capture.reservations, d.capture.reserved),
        (1, 40_960),
        "{d}"
    );
    assert_eq!((pool.bytes(), pool.members()), (40_960, 4));
    drop(members);
    let d = arena.diagnostics();
    assert_eq!(d.bytes_by_class.get(AllocClass::Graph), 0, "{d}");
    assert_eq!(d.capture.reservations, 0, "{d}");
}

#[test]
fn a_member_cannot_capture_while_another_member_captures() {
    let arena = arena();
    let pool = GraphPool::new();
    let a = arena.reserve_in_pool(&pool, &plan(4096)).unwrap();
    let b = arena.reserve_in_pool(&pool, &plan(4096)).unwrap();
    let scope = arena.capture_into(&a).unwrap();
    let err = arena.capture_into(&b).unwrap_err();
    assert!(
        matches!(err, MemError::GraphPoolMemberCapturing { member: 0 }),
        "{err:?}"
    );
    let err = arena.reserve_in_pool(&pool, &plan(256)).unwrap_err();
    assert!(
        matches!(err, MemError::GraphPoolMemberCapturing { .. }),
        "{err:?}"
    );
    drop(scope);
    // Once it has ended, the other member captures.
    drop(arena.capture_into(&b).unwrap());
}

#[test]
fn a_member_is_captured_into_once() {
    let arena = arena();
    let pool = GraphPool::new();
    let a = arena.reserve_in_pool(&pool, &plan(4096)).unwrap();
    let _blk = capture(&arena, &a, 4096);
    let err = arena.capture_into(&a).unwrap_err();
    assert!(
        matches!(err, MemError::GraphPoolMemberReused { member: 0 }),
        "{err:?}"
    );
    assert!(err.to_string().contains("reserve a new member"), "{err}");
}

#[test]
fn a_larger_member_later_gets_new_memory_which_later_members_share() {
    let arena = arena();
    let pool = GraphPool::new();
    let first = arena.reserve_in_pool(&pool, &plan(4096)).unwrap();
    let a = capture(&arena, &first, 4096);
    let larger = arena.reserve_in_pool(&pool, &plan(8192)).unwrap();
    let b = capture(&arena, &larger, 8192);
    assert_ne!(first.id(), larger.id(), "new memory for the larger member");
    assert!(a.ptr().is_ok(), "the first member keeps its memory");
    let third = arena.reserve_in_pool(&pool, &plan(2048)).unwrap();
    assert_eq!(
        third.id(),
        larger.id(),
        "later members share the larger memory"
    );
    let d = arena.diagnostics();
    assert_eq!(
        (d.capture.reservations, d.capture.reserved),
        (2, 12_288),
        "{d}"
    );
    assert_eq!(pool.bytes(), 8192);
    drop((first, a));
    let d = arena.diagnostics();
    assert_eq!(
        (d.capture.reservations, d.capture.reserved),
        (1, 8192),
        "{d}"
    );
    drop((larger, b, third));
}

#[test]
fn a_pool_sized_up_front_refuses_a_larger_member_while_members_hold_it() {
    let arena = arena();
    let pool = GraphPool::with_bytes(4096);
    let small_member = arena.reserve_in_pool(&pool, &plan(4096)).unwrap();
    let blk = capture(&arena, &small_member, 4096);
    let err = arena.reserve_in_pool(&pool, &plan(8192)).unwrap_err();
    assert_eq!(
        err,
        MemError::GraphPoolTooSmall {
            pool_bytes: 4096,
            needed: 8192,
            members: 1
        }
    );
    assert!(err.to_string().contains("largest member first"), "{err}");
    assert_eq!(
        arena.diagnostics().capture.reserved,
        4096,
        "nothing reserved"
    );
    drop((small_member, blk));
    let large = arena.reserve_in_pool(&pool, &plan(8192)).unwrap();
    assert_eq!((large.bytes(), pool.bytes()), (8192, 8192));
}

#[test]
fn a_pool_sized_up_front_takes_a_larger_member_later() {
    let arena = arena();
    let pool = GraphPool::with_bytes(8192);
    let first = arena.reserve_in_pool(&pool, &plan(4096)).unwrap();
    let _a = capture(&arena, &first, 4096);
    let second = arena.reserve_in_pool(&pool, &plan(8192)).unwrap();
    let _b = capture(&arena, &second, 8192);
    let d = arena.diagnostics();
    assert_eq!(
        (d.capture.reservations, d.capture.reserved),
        (1, 8192),
        "{d}"
    );
    assert_eq!(d.bytes_by_class.get(AllocClass::Graph), 8192, "{d}");
}

#[test]
fn a_block_of_an_earlier_member_is_stale_once_another_member_captured() {
    let arena = arena();
    let pool = GraphPool::new();
    let a = arena.reserve_in_pool(&pool, &plan(4096)).unwrap();
    let from_a = capture(&arena, &a, 4096);
    assert!(from_a.ptr().is_ok(), "valid until another member captures");
    let b = arena.reserve_in_pool(&pool, &plan(4096)).unwrap();
    let from_b = capture(&arena, &b, 4096);
    assert_eq!(from_a.raw_ptr(), from_b.raw_ptr());
    assert!(
        matches!(from_a.ptr(), Err(MemError::UseAfterReclaim { .. })),
        "{:?}",
        from_a.ptr()
    );
    assert!(from_b.ptr().is_ok());
}

#[test]
fn a_pool_serves_one_arena() {
    let dev = mock(64 << 20);
    let (one, two) = (
        Arena::new(dev.clone(), small(1 << 20)).unwrap(),
        Arena::new(dev, small(1 << 20)).unwrap(),
    );
    let pool = GraphPool::new();
    let _a = one.reserve_in_pool(&pool, &plan(4096)).unwrap();
    let err = two.reserve_in_pool(&pool, &plan(4096)).unwrap_err();
    assert_eq!(err, MemError::GraphPoolOfAnotherArena);
}

#[test]
fn a_member_is_not_reserved_during_a_capture() {
    let arena = arena();
    let dev = arena.device();
    let pool = GraphPool::new();
    let plain = arena.reserve_for_capture(&plan(4096)).unwrap();
    let scope = arena.capture_into(&plain).unwrap();
    let cap = dev.begin_capture(dev.stream()).unwrap();
    let err = arena.reserve_in_pool(&pool, &plan(4096)).unwrap_err();
    assert!(matches!(err, MemError::CaptureActive { .. }), "{err:?}");
    drop(cap.end().unwrap());
    drop(scope);
}
