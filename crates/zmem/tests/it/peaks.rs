//! Peak live bytes per class (`Diagnostics::peak_bytes_by_class`): what a memory plan predicts.

use zmem::{AllocClass, Arena, CapturePlan, ClassBytes};

use crate::util::{mock, sanitized, small};

fn peaks(arena: &Arena<zdevice::sim::SimDriver>) -> ClassBytes {
    arena.diagnostics().peak_bytes_by_class
}

#[rstest::rstest]
fn each_class_keeps_its_own_peak_after_the_memory_is_gone(#[values(false, true)] sanitize: bool) {
    sanitized(sanitize, || {
        let arena = Arena::new(mock(64 << 20), small(1 << 20)).unwrap();
        let weights = arena.alloc_persistent(1000).unwrap();
        {
            let step = arena.step().unwrap();
            // The fast path's scratch and the locked path's both count.
            let a = step.alloc_scratch(3000).unwrap();
            let b = step.alloc_scratch(1000).unwrap();
            let saved = step.alloc_saved(2048).unwrap();
            drop((a, b, saved));
            step.end().unwrap();
        }
        {
            let step = arena.step().unwrap();
            drop(step.alloc_scratch(256).unwrap());
            step.end().unwrap();
        }
        let d = arena.diagnostics();
        assert_eq!(d.bytes_by_class.get(AllocClass::Saved), 0);
        assert_eq!(d.bytes_by_class.get(AllocClass::Scratch), 0);
        let p = d.peak_bytes_by_class;
        assert_eq!(
            [
                AllocClass::Scratch,
                AllocClass::Saved,
                AllocClass::Persistent,
                AllocClass::Graph
            ]
            .map(|c| p.get(c)),
            [3072 + 1024, 2048, 1024, 0],
            "{d}"
        );
        assert!(
            d.to_string()
                .contains("(peak scratch=4.0 KiB saved=2.0 KiB"),
            "{d}"
        );
        arena.reset_peaks();
        assert_eq!(peaks(&arena), arena.diagnostics().bytes_by_class);
        assert_eq!(peaks(&arena).get(AllocClass::Persistent), 1024);
        drop(weights);
    });
}

/// Peak live bytes are the most held by all classes at one moment, not the sum of each
/// class's own peak: PyTorch's `max_memory_allocated` counterpart.
#[rstest::rstest]
fn peak_live_bytes_are_all_classes_at_one_moment(#[values(false, true)] sanitize: bool) {
    sanitized(sanitize, || {
        let arena = Arena::new(mock(64 << 20), small(1 << 20)).unwrap();
        let weights = arena.alloc_persistent(1000).unwrap(); // 1024
        {
            let step = arena.step().unwrap();
            let a = step.alloc_scratch(3000).unwrap(); // 3072
            let saved = step.alloc_saved(2048).unwrap();
            drop((a, saved));
            step.end().unwrap();
        }
        // 1024 + 3072 + 2048 at once in the first step.
        assert_eq!(arena.diagnostics().peak_live_bytes, 6144);
        {
            // A larger saved block alone: the saved peak moves, the scratch one does not.
            let saved = arena.alloc_saved(8192).unwrap();
            drop(saved);
        }
        let d = arena.diagnostics();
        assert_eq!(d.peak_bytes_by_class.total(), 3072 + 8192 + 1024, "{d}");
        assert_eq!(d.peak_live_bytes, 1024 + 8192, "{d}");
        assert!(d.to_string().contains("live peak 9.0 KiB"), "{d}");
        arena.reset_peaks();
        assert_eq!(arena.diagnostics().peak_live_bytes, 1024);
        drop(weights);
        assert_eq!(arena.diagnostics().peak_live_bytes, 1024);
    });
}

/// Overflow blocks and graph blocks count in the live peak; the pool and capture
/// reservations count in the reserved bytes, whose peak outlives them until `reset_peaks`.
#[test]
fn overflow_and_capture_count_in_live_and_reserved_bytes() {
    let dev = mock(64 << 20);
    let arena = Arena::new(dev.clone(), small(256 << 10)).unwrap();
    let d = arena.diagnostics();
    // 256 KiB of segments and the 1 MiB overflow reserve, nothing live.
    assert_eq!(d.reserved_bytes, (256 << 10) + (1 << 20), "{d}");
    assert_eq!(
        (d.peak_reserved_bytes, d.peak_live_bytes),
        (d.reserved_bytes, 0)
    );
    {
        let step = arena.step().unwrap();
        // Larger than the cap leaves room for: served by the pool, beyond its reserve.
        let big = step.alloc_scratch(2 << 20).unwrap();
        let d = arena.diagnostics();
        assert_eq!(d.overflow.outstanding, 2 << 20, "{d}");
        assert_eq!(d.peak_live_bytes, 2 << 20, "{d}");
        assert_eq!(d.reserved_bytes, (256 << 10) + (2 << 20), "{d}");
        drop(big);
        step.end().unwrap();
    }
    let d = arena.diagnostics();
    assert_eq!(d.reserved_bytes, (256 << 10) + (1 << 20), "{d}");
    assert_eq!(d.peak_reserved_bytes, (256 << 10) + (2 << 20), "{d}");
    arena.reset_peaks();
    let d = arena.diagnostics();
    assert_eq!(
        (d.peak_live_bytes, d.peak_reserved_bytes),
        (0, d.reserved_bytes)
    );

    let res = arena
        .reserve_for_capture(&CapturePlan::from_requests([1000, 3000]))
        .unwrap();
    assert_eq!(
        arena.diagnostics().reserved_bytes,
        (256 << 10) + (1 << 20) + 4096
    );
    {
        let step = arena.step().unwrap();
        let scope = arena.capture_into(&res).unwrap();
        let cap = dev.begin_capture(dev.stream()).unwrap();
        let a = step.alloc_scratch(1000).unwrap();
        let b = step.alloc_saved(3000).unwrap();
        drop(cap);
        drop(scope);
        drop((a, b));
        step.end().unwrap();
    }
    assert_eq!(arena.diagnostics().peak_live_bytes, 4096);
    drop(res);
    let d = arena.diagnostics();
    assert_eq!(d.reserved_bytes, (256 << 10) + (1 << 20), "{d}");
    assert_eq!(d.peak_reserved_bytes, d.reserved_bytes + 4096, "{d}");
}
