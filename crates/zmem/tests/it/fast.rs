//! The scratch fast path (plain scratch from the step's window, no lock, no reference count):
//! random steps mixing plain, kept, locked-path and held allocations, with the diagnostics,
//! the timeline and the step end checked against a model after every operation; and the same
//! window shared with another thread's locked allocations.

use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use rstest::rstest;
use zmem::{AllocClass, Arena, ArenaConfig, Block, CapturePlan, Event, EventKind, Scratch, Source};

use crate::util::mock;

#[derive(Clone, Debug)]
enum Op {
    /// A plain scratch held until the step's end (or a `DropPlain`).
    Plain(u64),
    /// A scratch allocation dropped at once.
    Temp(u64),
    /// A scratch allocation cloned into a block kept past the step.
    Keep(u64),
    /// Scratch through the arena's locked path while the step is open.
    Locked(u64),
    Saved(u64),
    DropPlain(usize),
    DropKept(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let size = prop_oneof![3 => 1u64..=4096, 1 => 1u64..=(96 << 10)];
    prop_oneof![
        6 => size.clone().prop_map(Op::Plain),
        3 => size.clone().prop_map(Op::Temp),
        2 => size.clone().prop_map(Op::Keep),
        2 => size.clone().prop_map(Op::Locked),
        1 => size.clone().prop_map(Op::Saved),
        3 => any::<usize>().prop_map(Op::DropPlain),
        2 => any::<usize>().prop_map(Op::DropKept),
    ]
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024)
}

fn fail(e: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

/// What the model expects of the step so far.
#[derive(Default)]
struct Expect {
    allocs_total: u64,
    allocs_step: u64,
    bytes_step: u64,
    /// Scratch bytes held: kept and overflow ones from earlier steps, this step's, less the
    /// overflow ones given back (arena scratch stays counted until the step ends).
    scratch_held: u64,
}

fn check(
    arena: &Arena<zdevice::sim::SimDriver>,
    plains: &[Scratch<'_>],
    kept: &[Block],
    want: &Expect,
    ring: usize,
) -> Result<(), TestCaseError> {
    let mut ranges: Vec<(u64, u64)> = plains
        .iter()
        .map(|s| (s.raw_ptr().0, s.raw_ptr().0 + s.size()))
        .chain(
            kept.iter()
                .map(|b| (b.raw_ptr().0, b.raw_ptr().0 + b.size())),
        )
        .collect();
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        prop_assert!(w[0].1 <= w[1].0, "live allocations overlap: {:?}", w);
    }
    for s in plains {
        prop_assert!(
            s.ptr().is_ok() && s.is_valid(),
            "plain scratch went stale: {s:?}"
        );
    }
    for b in kept {
        prop_assert!(arena.resolve(b).is_ok(), "kept block went stale: {b:?}");
    }
    let d = arena.diagnostics();
    prop_assert_eq!(d.allocations, want.allocs_total, "{}", d);
    prop_assert_eq!(d.allocations_since_reset, want.allocs_step, "{}", d);
    prop_assert_eq!(d.bytes_since_reset, want.bytes_step, "{}", d);
    prop_assert_eq!(
        d.bytes_by_class.get(AllocClass::Scratch),
        want.scratch_held,
        "{}",
        d
    );
    prop_assert_eq!(d.live_handles, (plains.len() + kept.len()) as u64, "{}", d);
    prop_assert!(d.offset <= d.capacity, "{}", d);
    if ring >= 4096 {
        let t = arena.timeline();
        let allocs = t
            .events
            .iter()
            .filter(|e| e.step == d.open_step && matches!(e.kind, EventKind::Alloc { .. }))
            .count() as u64;
        prop_assert_eq!(allocs, want.allocs_step, "alloc events of the step");
        for w in t.events.windows(2) {
            prop_assert_eq!(w[1].seq, w[0].seq + 1, "events out of order");
        }
        let open = t.steps.last().map_or(0, |s| s.allocations);
        prop_assert_eq!(open, want.allocs_step, "the open step's aggregate");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn fast_path_invariants_hold(
        steps in prop::collection::vec(prop::collection::vec(op(), 0..40), 1..6),
        ring in prop_oneof![Just(0usize), Just(8), Just(4096)],
        sink_at in prop::option::of(0usize..6),
    ) {
        let dev = mock(64 << 20);
        let cfg = ArenaConfig {
            initial_bytes: 256 << 10,
            segment_bytes: 128 << 10,
            cap_bytes: Some(1 << 20),
            overflow_reserve_bytes: 1 << 20,
            poison: false,
            timeline_events: ring,
            sanitize: false,
            from_env: Vec::new(),
        };
        let arena = Arena::new(dev, cfg).map_err(fail)?;
        let seen: Arc<Mutex<Vec<Event>>> = Arc::default();
        // A subscriber arrives after the first operation of step `sink_at` (while the step's
        // window is open): it must see every allocation from then on.
        let mut subscribed_at: Option<u64> = None;
        let mut kept: Vec<Block> = Vec::new();
        let mut want = Expect::default();
        let mut base: Option<u64> = None;
        for (index, ops) in steps.into_iter().enumerate() {
            let step = arena.step().map_err(fail)?;
            let reuse_expected = base.is_some()
                && !kept.iter().any(|b| b.class() == AllocClass::Scratch && b.source() == Source::Arena);
            let mut first = true;
            want.allocs_step = 0;
            want.bytes_step = 0;
            want.scratch_held = arena.diagnostics().bytes_by_class.get(AllocClass::Scratch);
            let mut plains: Vec<Scratch<'_>> = Vec::new();
            for (k, op) in ops.into_iter().enumerate() {
                if sink_at == Some(index) && k == 1 {
                    let to = Arc::clone(&seen);
                    arena.subscribe(Arc::new(move |e: &Event| {
                        to.lock().unwrap_or_else(|p| p.into_inner()).push(e.clone());
                    }));
                    subscribed_at = Some(want.allocs_total);
                }
                let mut count = |n: u64, scratch: bool| {
                    let size = zmem::units::align_up(n).unwrap_or(0);
                    want.allocs_total += 1;
                    want.allocs_step += 1;
                    want.bytes_step += size;
                    if scratch {
                        want.scratch_held += size;
                    }
                };
                // An overflow scratch handle gives its bytes back when its last clone goes.
                let returned = |class: AllocClass, source: Source, size: u64| {
                    // Overflow and lent (held) scratch go back when dropped.
                    if class == AllocClass::Scratch && source != Source::Arena { size } else { 0 }
                };
                match op {
                    Op::Plain(n) | Op::Temp(n) | Op::Keep(n) => {
                        let s = step.alloc_scratch(n).map_err(fail)?;
                        count(n, true);
                        if s.source() == Source::Arena {
                            let at = s.raw_ptr().0;
                            if first && reuse_expected {
                                prop_assert_eq!(Some(at), base, "reclaimed scratch not reused");
                            }
                            base.get_or_insert(at);
                            first = false;
                        }
                        match op {
                            Op::Plain(_) => plains.push(s),
                            Op::Keep(_) => kept.push(s.clone()),
                            _ => {
                                want.scratch_held -= returned(s.class(), s.source(), s.size());
                                drop(s);
                            }
                        }
                    }
                    Op::Locked(n) => {
                        let b = arena.alloc_scratch(n).map_err(fail)?;
                        count(n, true);
                        if b.source() == Source::Arena {
                            if first && reuse_expected {
                                prop_assert_eq!(Some(b.raw_ptr().0), base, "reclaimed scratch not reused");
                            }
                            base.get_or_insert(b.raw_ptr().0);
                            first = false;
                        }
                        kept.push(b);
                    }
                    Op::Saved(n) => {
                        kept.push(step.alloc_saved(n).map_err(fail)?);
                        count(n, false);
                    }
                    Op::DropPlain(i) => {
                        if !plains.is_empty() {
                            let s = plains.swap_remove(i % plains.len());
                            want.scratch_held -= returned(s.class(), s.source(), s.size());
                        }
                    }
                    Op::DropKept(i) => {
                        if !kept.is_empty() {
                            let b = kept.swap_remove(i % kept.len());
                            let last = !kept.iter().any(|k| k.same(&b));
                            if last {
                                want.scratch_held -= returned(b.class(), b.source(), b.size());
                            }
                        }
                    }
                }
                check(&arena, &plains, &kept, &want, ring)?;
            }
            drop(plains);
            let summary = step.end().map_err(fail)?;
            let kept_scratch = kept.iter().filter(|b| b.class() == AllocClass::Scratch).count();
            prop_assert_eq!(summary.kept.len(), kept_scratch, "kept exactly the referenced");
        }
        let d = arena.diagnostics();
        prop_assert_eq!(d.live_handles, kept.len() as u64, "{}", d);
        if let Some(before) = subscribed_at {
            let allocs = seen.lock().unwrap_or_else(|p| p.into_inner())
                .iter().filter(|e| matches!(e.kind, EventKind::Alloc { .. })).count() as u64;
            prop_assert_eq!(allocs, want.allocs_total - before, "the sink saw every allocation");
        }
        drop(kept);
        prop_assert_eq!(arena.diagnostics().live_handles, 0);
    }
}

/// Another thread allocates through the arena's lock (and reads diagnostics, which folds the
/// fast path in) while the step's thread bumps through its window: nothing overlaps and every
/// allocation is counted once.
#[test]
fn the_window_and_the_locked_path_share_a_step() {
    let arena = Arena::new(
        mock(256 << 20),
        ArenaConfig {
            initial_bytes: 4 << 20,
            segment_bytes: 4 << 20,
            cap_bytes: Some(64 << 20),
            ..crate::util::small(64 << 20)
        },
    )
    .unwrap();
    let step = arena.step().unwrap();
    let (plains, locked) = std::thread::scope(|s| {
        let other = s.spawn(|| {
            (0..2000)
                .map(|i| {
                    if i % 100 == 0 {
                        let _ = arena.diagnostics();
                    }
                    arena.alloc_scratch(256 * (1 + i % 5)).unwrap()
                })
                .collect::<Vec<Block>>()
        });
        let plains: Vec<Scratch<'_>> = (0..2000)
            .map(|i| step.alloc_scratch(256 * (1 + i % 7)).unwrap())
            .collect();
        (plains, other.join().unwrap())
    });
    let mut ranges: Vec<(u64, u64)> = plains
        .iter()
        .map(|s| (s.raw_ptr().0, s.raw_ptr().0 + s.size()))
        .chain(
            locked
                .iter()
                .map(|b| (b.raw_ptr().0, b.raw_ptr().0 + b.size())),
        )
        .collect();
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        assert!(w[0].1 <= w[1].0, "overlap: {w:?}");
    }
    let d = arena.diagnostics();
    assert_eq!(d.allocations, 4000, "{d}");
    assert_eq!(d.live_handles, 4000, "{d}");
    let bytes: u64 = ranges.iter().map(|r| r.1 - r.0).sum();
    assert_eq!(d.bytes_since_reset, bytes, "{d}");
    drop(plains);
    let summary = step.end().unwrap();
    assert_eq!(
        summary.kept.len(),
        2000,
        "the locked path's blocks are kept"
    );
}

/// Methods of a plain scratch answer without making a block; dereferencing makes exactly one.
#[test]
fn a_plain_scratch_becomes_a_block_once_and_only_when_asked() {
    let arena = Arena::new(mock(64 << 20), crate::util::small(1 << 20)).unwrap();
    let step = arena.step().unwrap();
    let s = step.alloc_scratch(1000).unwrap();
    assert_eq!((s.size(), s.requested(), s.step()), (1024, 1000, 1));
    assert_eq!(
        (s.class(), s.source()),
        (AllocClass::Scratch, Source::Arena)
    );
    assert_eq!(s.ptr().unwrap(), s.raw_ptr());
    assert_eq!(arena.diagnostics().live_handles, 1);
    let b1: Block = s.clone();
    let b2: Block = (*s).clone();
    assert!(b1.same(&b2) && s.same(&b1), "one block per scratch");
    assert_eq!((b1.raw_ptr(), b1.size()), (s.raw_ptr(), 1024));
    assert_eq!(
        arena.diagnostics().live_handles,
        1,
        "one allocation, one handle"
    );
    drop(s);
    let summary = step.end().unwrap();
    assert_eq!(summary.kept.len(), 1);
    assert!(b1.ptr().is_ok());
    drop((b1, b2));
    assert_eq!(arena.diagnostics().live_handles, 0);
}

/// What closes the fast path's gate while the step's window is open.
#[derive(Clone, Copy, Debug)]
enum Gate {
    Recording,
    Reservation,
    Subscriber,
    DeferredReturns,
}

/// With the window open (one allocation made), each of these must send the next scratch
/// request to the locked path, where it is seen: recorded, served by the reservation, told to
/// the subscriber, or preceded by the returns a capture deferred.
#[rstest]
#[case(Gate::Recording)]
#[case(Gate::Reservation)]
#[case(Gate::Subscriber)]
#[case(Gate::DeferredReturns)]
fn the_gate_sends_requests_past_an_open_window(#[case] gate: Gate) {
    let dev = mock(64 << 20);
    let arena = Arena::new(dev.clone(), crate::util::small(1 << 20)).unwrap();
    let res = arena
        .reserve_for_capture(&CapturePlan::from_requests([4096]))
        .unwrap();
    let persistent = arena.alloc_persistent(4096).unwrap();
    let step = arena.step().unwrap();
    let first = step.alloc_scratch(256).unwrap();
    assert_eq!(first.source(), Source::Arena, "the window is open");
    drop(first);
    let seen: Arc<Mutex<Vec<Event>>> = Arc::default();
    match gate {
        Gate::Recording => {
            let rec = arena.start_recording().unwrap();
            drop(step.alloc_scratch(3000).unwrap());
            assert_eq!(rec.finish().requests(), &[3072]);
        }
        Gate::Reservation => {
            let _scope = arena.capture_into(&res).unwrap();
            let s = step.alloc_scratch(3000).unwrap();
            assert_eq!(
                (s.class(), s.source()),
                (AllocClass::Graph, Source::Reservation)
            );
        }
        Gate::Subscriber => {
            let to = Arc::clone(&seen);
            arena.subscribe(Arc::new(move |e: &Event| {
                to.lock().unwrap_or_else(|p| p.into_inner()).push(e.clone());
            }));
            drop(step.alloc_scratch(3000).unwrap());
            let got = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
            assert!(
                matches!(
                    got.last().map(|e| &e.kind),
                    Some(EventKind::Alloc { bytes: 3072, .. })
                ),
                "{got:?}"
            );
        }
        Gate::DeferredReturns => {
            {
                let _scope = arena.capture_into(&res).unwrap();
                let cap = dev.begin_capture(dev.stream()).unwrap();
                drop(persistent);
                cap.end().unwrap();
            }
            let held = |a: &Arena<_>| a.diagnostics().bytes_by_class.get(AllocClass::Persistent);
            assert_eq!(held(&arena), 4096, "deferred while capturing");
            drop(step.alloc_scratch(3000).unwrap());
            assert_eq!(
                held(&arena),
                0,
                "the next allocation applies deferred returns"
            );
            return;
        }
    }
    drop(persistent);
}

/// The window is claimed whole, but the diagnostics count what was bumped: offset and
/// high-water follow the allocations, and reuse counts only memory an earlier step used.
#[test]
fn offset_high_water_and_reuse_count_allocations_not_the_window() {
    let arena = Arena::new(mock(64 << 20), crate::util::small(1 << 20)).unwrap();
    let step = arena.step().unwrap();
    for _ in 0..4 {
        drop(step.alloc_scratch(1024).unwrap());
    }
    let d = arena.diagnostics();
    assert_eq!((d.offset, d.high_water, d.reuses), (4096, 4096, 0), "{d}");
    step.end().unwrap();
    let step = arena.step().unwrap();
    for _ in 0..6 {
        drop(step.alloc_scratch(1024).unwrap());
    }
    let d = arena.diagnostics();
    assert_eq!((d.offset, d.high_water, d.reuses), (6144, 6144, 4), "{d}");
    assert_eq!(d.bytes_by_class.get(AllocClass::Scratch), 6144, "{d}");
    let summary = step.end().unwrap();
    assert_eq!(
        summary.reclaimed_bytes, 6144,
        "the unused window is not reported"
    );
}
