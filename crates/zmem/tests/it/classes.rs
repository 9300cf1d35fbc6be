//! Allocation classes and the protections of live memory, each with its negative control.

use rstest::rstest;
use zmem::{AllocClass, Arena, Block, MemError, Protection, Source};

use crate::bodies;
use crate::util::{Check, ensure, mock, s, small};

#[test]
fn saved_and_kept_scratch_survive_step_ends() {
    bodies::saved_survives_step_end(&mock(64 << 20), true).unwrap();
}

#[rstest]
#[case(AllocClass::Saved)]
#[case(AllocClass::Persistent)]
fn held_blocks_never_come_from_scratch(#[case] class: AllocClass) {
    let arena = Arena::new(mock(64 << 20), small(1 << 20)).unwrap();
    let step = arena.step().unwrap();
    let b = match class {
        AllocClass::Saved => step.alloc_saved(1000).unwrap(),
        _ => arena.alloc_persistent(1000).unwrap(),
    };
    assert_eq!(
        (b.class(), b.source(), b.size()),
        (class, Source::Held, 1024)
    );
    step.end().unwrap();
    assert_eq!(arena.diagnostics().bytes_by_class.get(class), 1024);
    drop(b);
    assert_eq!(arena.diagnostics().bytes_by_class.get(class), 0);
    // The freed range is reused.
    let again = arena.alloc_persistent(1000).unwrap();
    assert_eq!(arena.diagnostics().reuses, 1, "{:?}", again);
}

/// A scratch block still referenced when its step ends is never reissued.
fn live_scratch_is_not_reissued(arena: &Arena<zdevice::sim::SimDriver>) -> Check {
    let step = arena.step().map_err(s)?;
    let kept: Block = step.alloc_scratch(4096).map_err(s)?.clone();
    step.end().map_err(s)?;
    let step = arena.step().map_err(s)?;
    for _ in 0..64 {
        let x = step.alloc_scratch(4096).map_err(s)?;
        let (a, e) = (x.raw_ptr().0, x.raw_ptr().0 + x.size());
        let (ka, ke) = (kept.raw_ptr().0, kept.raw_ptr().0 + kept.size());
        ensure(
            e <= ka || ke <= a,
            "a live scratch block's memory was reissued",
        )?;
    }
    arena.resolve(&kept).map_err(s)?;
    Ok(())
}

#[test]
fn live_scratch_is_kept_exactly() {
    let arena = Arena::new(mock(64 << 20), small(1 << 20)).unwrap();
    live_scratch_is_not_reissued(&arena).unwrap();
}

#[test]
fn negative_control_without_keeping_live_scratch_it_is_reissued() {
    let arena = Arena::new(mock(64 << 20), small(1 << 20)).unwrap();
    arena.set_protection_for_tests(Protection::KeepLiveScratch, false);
    assert!(live_scratch_is_not_reissued(&arena).is_err());
}

/// With keeping switched off, the generation check still catches the stale handle.
fn stale_handle_is_refused(arena: &Arena<zdevice::sim::SimDriver>) -> Check {
    arena.set_protection_for_tests(Protection::KeepLiveScratch, false);
    let step = arena.step().map_err(s)?;
    let stale: Block = step.alloc_scratch(3000).map_err(s)?.clone();
    step.end().map_err(s)?;
    match arena.resolve(&stale) {
        Err(MemError::UseAfterReclaim {
            class: AllocClass::Scratch,
            size: 3072,
            ..
        }) => Ok(()),
        other => Err(format!("expected UseAfterReclaim, got {other:?}")),
    }
}

#[test]
fn use_after_reclaim_names_class_and_size() {
    let arena = Arena::new(mock(64 << 20), small(1 << 20)).unwrap();
    stale_handle_is_refused(&arena).unwrap();
}

#[test]
fn negative_control_without_the_generation_check_a_stale_handle_resolves() {
    let arena = Arena::new(mock(64 << 20), small(1 << 20)).unwrap();
    arena.set_protection_for_tests(Protection::GenerationCheck, false);
    assert!(stale_handle_is_refused(&arena).is_err());
}

#[test]
fn end_strict_lists_what_is_alive_and_keeps_it() {
    let arena = Arena::new(mock(64 << 20), small(1 << 20)).unwrap();
    let step = arena.step().unwrap();
    let a = step.alloc_scratch(100).unwrap().clone();
    let b = step.alloc_scratch(5000).unwrap().clone();
    let _dropped = step.alloc_scratch(64).unwrap();
    drop(_dropped);
    let err = step.end_strict().unwrap_err();
    match &err {
        MemError::LiveScratchAtStepEnd { step: 1, alive } => {
            let sizes: Vec<u64> = alive.iter().map(|l| l.size).collect();
            assert_eq!(sizes, vec![256, 5120]);
        }
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains("scratch 5.0 KiB"), "{err}");
    assert!(a.ptr().is_ok() && b.ptr().is_ok());
    assert_eq!(arena.diagnostics().pinned_bytes, 256 + 5120);
    drop((a, b));
    arena.step().unwrap().end_strict().unwrap();
    assert_eq!(arena.diagnostics().pinned_bytes, 0);
}

#[test]
fn kept_blocks_do_not_strand_memory_below_them() {
    let arena = Arena::new(mock(64 << 20), small(1 << 20)).unwrap();
    let step = arena.step().unwrap();
    let _low = step.alloc_scratch(1024).unwrap();
    let high = step.alloc_scratch(1024).unwrap().clone();
    let base = _low.raw_ptr();
    drop(_low);
    step.end().unwrap();
    let step = arena.step().unwrap();
    // Memory below the kept block is reissued (no floor), the kept block is skipped.
    let x = step.alloc_scratch(1024).unwrap();
    let y = step.alloc_scratch(1024).unwrap();
    assert_eq!(x.raw_ptr(), base);
    assert_eq!(y.raw_ptr().0, high.raw_ptr().0 + 1024);
}

#[test]
fn one_step_at_a_time() {
    let arena = Arena::new(mock(64 << 20), small(1 << 20)).unwrap();
    let step = arena.step().unwrap();
    assert!(matches!(
        arena.step(),
        Err(MemError::StepAlreadyOpen { open: 1 })
    ));
    drop(step);
    let d = arena.diagnostics();
    assert_eq!(d.resets, 1);
    assert!(
        d.last_reset.unwrap().by.starts_with("Step drop (opened at"),
        "dropped step resets"
    );
    assert_eq!(arena.step().unwrap().index(), 2);
}

#[test]
fn handles_outliving_their_arena_are_stale() {
    let dev = mock(64 << 20);
    let arena = Arena::new(dev.clone(), small(1 << 20)).unwrap();
    let p = arena.alloc_persistent(4096).unwrap();
    let o = arena.alloc_saved(8 << 20).unwrap();
    assert_eq!(o.source(), Source::Overflow);
    drop(arena);
    assert!(matches!(
        p.ptr(),
        Err(MemError::UseAfterReclaim {
            class: AllocClass::Persistent,
            ..
        })
    ));
    assert!(o.ptr().is_err());
    // The arena's segments went back to the device.
    assert!(
        dev.driver().live_allocations().len() <= 1,
        "{:?}",
        dev.driver().live_allocations()
    );
}

#[test]
fn foreign_blocks_are_refused() {
    let dev = mock(64 << 20);
    let a = Arena::new(dev.clone(), small(1 << 20)).unwrap();
    let b = Arena::new(dev, small(1 << 20)).unwrap();
    let blk = a.alloc_persistent(10).unwrap();
    assert!(matches!(b.resolve(&blk), Err(MemError::ForeignBlock)));
}

#[rstest]
#[case(true)]
#[case(false)]
fn poison_makes_stale_reads_nan(#[case] poison: bool) {
    // poison off is the negative control: the stale read sees the old data.
    let r = bodies::poison_reclaimed_scratch(&mock(64 << 20), poison);
    assert_eq!(r.is_ok(), poison, "{r:?}");
}

#[test]
fn poison_covers_freed_held_memory() {
    let dev = mock(64 << 20);
    let arena = Arena::new(
        dev.clone(),
        zmem::ArenaConfig {
            poison: true,
            ..small(1 << 20)
        },
    )
    .unwrap();
    let p = arena.alloc_saved(512).unwrap();
    let ptr = p.raw_ptr();
    dev.memset_d32(ptr, 0, 128).unwrap();
    drop(p);
    dev.synchronize(dev.stream()).unwrap();
    let bytes = dev.driver().peek(ptr, 512).unwrap();
    assert!(bytes.iter().all(|b| *b == 0xFF));
}

#[rstest]
#[case(1, 256)]
#[case(255, 256)]
#[case(256, 256)]
#[case(257, 512)]
#[case(48 * 1024, 48 * 1024)]
#[case(100_000, 100_096)]
fn every_block_is_256_aligned(#[case] bytes: u64, #[case] size: u64) {
    let arena = Arena::new(mock(64 << 20), small(1 << 20)).unwrap();
    let step = arena.step().unwrap();
    let a = step.alloc_scratch(bytes).unwrap();
    let b = step.alloc_saved(bytes).unwrap();
    for blk in [&*a, &b] {
        assert_eq!(blk.size(), size);
        assert_eq!(blk.requested(), bytes);
        assert_eq!(blk.raw_ptr().0 % 256, 0);
    }
}

/// The owned step (for owners holding the arena and the step side by side): scratch needs an
/// open step, the end reclaims what is dropped and keeps exactly what is referenced.
#[test]
fn owned_step_issues_scratch_and_keeps_live_blocks() {
    let arena = Arena::new(mock(64 << 20), small(1 << 20)).unwrap();
    assert!(matches!(
        arena.alloc_scratch(100),
        Err(MemError::NoOpenStep { requested: 100 })
    ));
    let step = arena.step_owned().unwrap();
    assert!(matches!(
        arena.step_owned(),
        Err(MemError::StepAlreadyOpen { .. })
    ));
    let dropped = arena.alloc_scratch(4096).unwrap();
    let first = dropped.raw_ptr();
    drop(dropped);
    let kept = step.alloc_scratch(4096).unwrap();
    assert_eq!(kept.class(), AllocClass::Scratch);
    let summary = step.end().unwrap();
    assert_eq!(summary.kept.len(), 1);
    let step = arena.step_owned().unwrap();
    let again = step.alloc_scratch(4096).unwrap();
    assert_eq!(again.raw_ptr(), first, "reclaimed scratch is reused");
    assert!(arena.resolve(&kept).is_ok());
    drop(again);
    drop(step);
    assert!(arena.alloc_scratch(1).is_err(), "dropping the step ends it");
}
