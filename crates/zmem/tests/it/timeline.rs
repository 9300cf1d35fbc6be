//! The timeline: events, per-step aggregates, subscribers, JSON.

use std::sync::{Arc, Mutex};

use zmem::{AllocClass, Arena, ArenaConfig, Event, EventKind};

use crate::util::{mock, small};

#[test]
fn events_steps_and_sink() {
    let arena = Arena::new(mock(64 << 20), small(256 << 10)).unwrap();
    let seen: Arc<Mutex<Vec<Event>>> = Arc::default();
    let sink = Arc::clone(&seen);
    arena.subscribe(Arc::new(move |e: &Event| {
        sink.lock().unwrap().push(e.clone())
    }));
    let p = arena.alloc_persistent(1000).unwrap();
    for i in 0..3u64 {
        let step = arena.step().unwrap();
        let _s = step.alloc_scratch(1000 * (i + 1)).unwrap();
        let _o = step.alloc_scratch(300 << 10).unwrap();
        drop((_s, _o));
        step.end().unwrap();
    }
    drop(p);
    let t = arena.timeline();
    assert_eq!(t.steps.len(), 3);
    let s2 = &t.steps[1];
    assert_eq!(
        (s2.step, s2.allocations, s2.resets, s2.overflow_calls),
        (2, 2, 1, 1)
    );
    assert_eq!(s2.peak_by_class.get(AllocClass::Persistent), 1024);
    assert_eq!(
        s2.peak_by_class.get(AllocClass::Scratch),
        2048 + (300 << 10)
    );
    let kinds: Vec<&str> = t.events.iter().map(|e| e.kind.name()).collect();
    for k in [
        "alloc",
        "free",
        "step_start",
        "step_end",
        "reset",
        "overflow",
    ] {
        assert!(kinds.contains(&k), "{k} missing from {kinds:?}");
    }
    let got = seen.lock().unwrap();
    assert_eq!(got.len(), t.events.len(), "the sink saw every event");
    assert!(matches!(
        got.last().unwrap().kind,
        EventKind::Free {
            class: AllocClass::Persistent,
            ..
        }
    ));
    let json = t.to_json();
    assert!(json.contains("\"kind\":\"reset\""), "{json}");
    assert!(
        json.contains("\"cause\":\"Step::end at crates/zmem/tests/it/timeline.rs:"),
        "{json}"
    );
    assert!(json.contains("\"peak_by_class\":{\"scratch\":"), "{json}");
}

#[test]
fn the_ring_is_bounded_but_steps_are_kept() {
    let cfg = ArenaConfig {
        timeline_events: 8,
        ..small(1 << 20)
    };
    let arena = Arena::new(mock(64 << 20), cfg).unwrap();
    for _ in 0..20 {
        let step = arena.step().unwrap();
        let _x = step.alloc_scratch(10).unwrap();
    }
    let t = arena.timeline();
    assert_eq!(t.events.len(), 8);
    assert!(t.dropped > 0);
    assert_eq!(t.steps.len(), 20);
}

/// The GPU soak found host memory growing ~96 bytes per arena step: one aggregate record per
/// step, kept forever. The records are bounded now; a long run folds them into coarser ones
/// that still cover every step, with the run's totals and highest peak exact.
#[test]
fn step_records_stay_bounded_over_a_long_run_with_totals_exact() {
    const STEPS: u64 = 100_000;
    let cfg = ArenaConfig {
        timeline_events: 16,
        ..small(1 << 20)
    };
    let arena = Arena::new(mock(64 << 20), cfg).unwrap();
    let (mut allocations, mut bytes, mut max_peak, mut peak_at) = (0u64, 0u64, 0u64, 0u64);
    for i in 1..=STEPS {
        let step = arena.step().unwrap();
        // One step in 7,919 allocates more, so the run's highest peak is one known step.
        let n = if i == 7_919 { 9 } else { 1 + i % 3 };
        let held: Vec<_> = (0..n).map(|_| step.alloc_scratch(256).unwrap()).collect();
        allocations += n;
        bytes += 256 * n;
        if 256 * n > max_peak {
            (max_peak, peak_at) = (256 * n, i);
        }
        drop(held);
        step.end().unwrap();
    }
    let t = arena.timeline();
    assert!(
        t.steps.len() <= zmem::STEP_RECORDS_MAX,
        "{} step records kept for {STEPS} steps",
        t.steps.len()
    );
    assert!(
        t.steps.len() >= zmem::STEP_RECORDS_MAX / 4,
        "{}",
        t.steps.len()
    );
    // The records tile the run: in order, no gap, no overlap.
    assert_eq!(t.steps[0].step, 1);
    assert_eq!(t.steps.last().unwrap().last_step, STEPS);
    for w in t.steps.windows(2) {
        assert_eq!(w[1].step, w[0].last_step + 1, "{:?}", (&w[0], &w[1]));
    }
    let sum = |f: fn(&zmem::StepRecord) -> u64| t.steps.iter().map(f).sum::<u64>();
    assert_eq!(sum(|r| r.allocations), allocations);
    assert_eq!(sum(|r| r.bytes), bytes);
    assert_eq!(sum(|r| r.resets), STEPS);
    let hw = t.steps.iter().max_by_key(|r| r.peak_bytes).unwrap();
    assert_eq!((hw.peak_bytes, hw.peak_step), (max_peak, peak_at));
    assert_eq!(hw.peak_by_class.get(AllocClass::Scratch), max_peak);
}
