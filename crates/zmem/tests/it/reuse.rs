//! Scratch served from the memory saved blocks gave back (issue 21 item 6): an eager step's
//! backward allocates scratch while its forward's saved tensors are freed, so scratch the
//! segments cannot hold takes the held region's free memory before the arena grows.

use zmem::{AllocClass, Arena, Source};

use crate::util::{mock, small};

const K64: u64 = 64 << 10;

/// The held region's bytes: the arena's segments less its scratch segments (all of `small`'s
/// 64 KiB).
fn held_bytes(d: &zmem::Diagnostics) -> u64 {
    d.capacity - d.scratch_segments as u64 * K64
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.0 + b.1 && b.0 < a.0 + a.1
}

/// Forward: four saved blocks and the segments' 256 KiB of scratch. Backward: the saved
/// blocks freed, four more scratch blocks. Reserved does not move, the new scratch lies where
/// the saved blocks were, and a saved block allocated while it lives never lands on it.
#[test]
fn scratch_beyond_the_segments_reuses_what_saved_blocks_gave_back() {
    let arena = Arena::new(mock(64 << 20), small(16 << 20)).unwrap();
    let step = arena.step().unwrap();
    let saved: Vec<_> = (0..4).map(|_| arena.alloc_saved(K64).unwrap()).collect();
    let forward: Vec<_> = (0..4).map(|_| step.alloc_scratch(K64).unwrap()).collect();
    let reserved = arena.diagnostics().reserved_bytes;
    let was: Vec<(u64, u64)> = saved.iter().map(|b| (b.raw_ptr().0, K64)).collect();
    drop(saved);

    let backward: Vec<_> = (0..4).map(|_| step.alloc_scratch(K64).unwrap()).collect();
    let d = arena.diagnostics();
    assert_eq!(d.reserved_bytes, reserved, "the arena grew: {d}");
    assert_eq!(d.overflow.calls, 0, "{d}");
    assert_eq!(d.bytes_by_class.get(AllocClass::Scratch), 8 * K64, "{d}");
    for g in &backward {
        assert_eq!((g.class(), g.source()), (AllocClass::Scratch, Source::Held));
        let at = (g.raw_ptr().0, K64);
        assert!(
            was.iter().any(|&s| overlaps(s, at)),
            "{at:?} is not saved memory"
        );
    }

    // Memory lent to scratch is not free: a saved block goes elsewhere (the arena grows).
    let later = arena.alloc_saved(K64).unwrap();
    let at = (later.raw_ptr().0, K64);
    for g in backward.iter().chain(forward.iter()) {
        assert!(
            !overlaps((g.raw_ptr().0, K64), at),
            "saved block over live scratch"
        );
    }
    drop((forward, backward));
    step.end().unwrap();
    let d = arena.diagnostics();
    assert_eq!(d.bytes_by_class.get(AllocClass::Scratch), 0, "{d}");
    // Every held byte is free again but `later`'s: the lent scratch went back when dropped.
    assert_eq!(d.held_free, held_bytes(&d) - K64, "{d}");
    drop(later);
}

/// A lent scratch block still referenced when its step ends keeps its memory, exactly as a
/// kept segment block does: nothing later lands on it until its last handle drops.
#[test]
fn lent_scratch_alive_after_its_step_keeps_its_memory() {
    let arena = Arena::new(mock(64 << 20), small(16 << 20)).unwrap();
    let step = arena.step_owned().unwrap();
    let saved = arena.alloc_saved(4 * K64).unwrap();
    let fill: Vec<_> = (0..4).map(|_| step.alloc_scratch(K64).unwrap()).collect();
    drop(saved);
    let kept = step.alloc_scratch(K64).unwrap();
    assert_eq!(kept.source(), Source::Held);
    drop(fill);
    step.end().unwrap();
    assert!(kept.is_valid());
    let at = (kept.raw_ptr().0, K64);
    let step = arena.step_owned().unwrap();
    let others: Vec<_> = (0..8)
        .map(|_| step.alloc_scratch(K64).unwrap())
        .chain((0..4).map(|_| arena.alloc_saved(K64).unwrap()))
        .collect();
    for o in &others {
        assert!(
            !overlaps((o.raw_ptr().0, K64), at),
            "a block over kept scratch"
        );
    }
    drop(others);
    step.end().unwrap();
    let d = arena.diagnostics();
    assert_eq!(d.bytes_by_class.get(AllocClass::Scratch), K64, "{d}");
    drop(kept);
    let d = arena.diagnostics();
    assert_eq!(d.bytes_by_class.get(AllocClass::Scratch), 0, "{d}");
    assert_eq!(d.held_free, held_bytes(&d), "{d}");
}

/// The same on data (the simulated twin of `gpu_lent_scratch_keeps_every_live_block`): every
/// live block reads back what was written to it, with and without poison, in both modes.
#[rstest::rstest]
fn lent_scratch_keeps_every_live_block(
    #[values(false, true)] poison: bool,
    #[values(false, true)] sanitize: bool,
) {
    crate::util::sanitized(sanitize, || {
        crate::bodies::lent_scratch_keeps_every_live_block(&mock(64 << 20), poison).unwrap();
    });
}
