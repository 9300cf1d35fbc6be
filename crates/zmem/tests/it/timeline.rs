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
