//! Peak live bytes per class (`Diagnostics::peak_bytes_by_class`): what a memory plan predicts.

use zmem::{AllocClass, Arena, ClassBytes};

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
