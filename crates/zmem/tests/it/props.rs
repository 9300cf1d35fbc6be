//! Random sequences of alloc/free/step-end/capture/graph-drop on the simulated device.
//! After every operation: no two live allocations overlap, every live handle still resolves
//! (its memory was never reissued), reclaimed scratch is reused, and the diagnostics add up.
//! `PROPTEST_CASES` raises the case count (CI runs thousands).

use proptest::prelude::*;
use zmem::{AllocClass, Arena, ArenaConfig, Block, CapturePlan, CaptureReservation, Source};

use crate::util::mock;

#[derive(Clone, Debug)]
enum Op {
    Scratch(u64),
    Saved(u64),
    Persistent(u64),
    Drop(usize),
    StepEnd,
    Capture(Vec<u64>),
    GraphDrop(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let size = 1u64..=(64 << 10);
    prop_oneof![
        6 => size.clone().prop_map(Op::Scratch),
        2 => size.clone().prop_map(Op::Saved),
        1 => size.clone().prop_map(Op::Persistent),
        5 => any::<usize>().prop_map(Op::Drop),
        3 => Just(Op::StepEnd),
        1 => prop::collection::vec(1u64..=(16 << 10), 1..4).prop_map(Op::Capture),
        1 => any::<usize>().prop_map(Op::GraphDrop),
    ]
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2048)
}

fn check(
    arena: &Arena<zdevice::sim::SimDriver>,
    live: &[Block],
    allocs: u64,
) -> Result<(), TestCaseError> {
    let mut ranges: Vec<(u64, u64)> = live
        .iter()
        .map(|b| (b.raw_ptr().0, b.raw_ptr().0 + b.size()))
        .collect();
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        prop_assert!(
            w[0].1 <= w[1].0,
            "live blocks overlap: {:?} {:?}",
            w[0],
            w[1]
        );
    }
    for b in live {
        prop_assert!(arena.resolve(b).is_ok(), "live handle went stale: {b:?}");
    }
    let d = arena.diagnostics();
    for class in [AllocClass::Saved, AllocClass::Persistent] {
        let held: u64 = live
            .iter()
            .filter(|b| b.class() == class)
            .map(Block::size)
            .sum();
        prop_assert_eq!(d.bytes_by_class.get(class), held, "{} bytes: {}", class, d);
    }
    prop_assert_eq!(d.live_handles, live.len() as u64, "{}", d);
    prop_assert_eq!(d.sanitize, arena.sanitize(), "{}", d);
    if arena.sanitize() {
        // Every live block is its own driver allocation, of exactly its size.
        let allocs = arena.device().driver().live_allocations();
        for b in live {
            prop_assert!(
                allocs.contains(&(b.raw_ptr(), b.size())),
                "sanitize: {b:?} is not its own allocation"
            );
        }
    }
    prop_assert_eq!(d.allocations, allocs, "{}", d);
    prop_assert!(d.capacity <= d.cap, "{}", d);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn arena_invariants_hold(ops in prop::collection::vec(op(), 1..60), sanitize in any::<bool>()) {
        let dev = mock(32 << 20);
        let cfg = ArenaConfig {
            initial_bytes: 128 << 10,
            segment_bytes: 64 << 10,
            cap_bytes: Some(256 << 10),
            overflow_reserve_bytes: 256 << 10,
            poison: false,
            timeline_events: 64,
            sanitize,
            from_env: Vec::new(),
        };
        let arena = Arena::new(dev.clone(), cfg).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut step = Some(arena.step().map_err(|e| TestCaseError::fail(e.to_string()))?);
        let mut live: Vec<Block> = Vec::new();
        let mut graphs: Vec<CaptureReservation> = Vec::new();
        let mut allocs = 0u64;
        let mut base: Option<u64> = None;
        let mut expect_base = false;
        for op in ops {
            match op {
                Op::Scratch(n) => {
                    let st = match step.as_ref() { Some(s) => s, None => continue };
                    let b = st.alloc_scratch(n).map_err(|e| TestCaseError::fail(e.to_string()))?.clone();
                    allocs += 1;
                    if b.source() == Source::Arena {
                        let first = *base.get_or_insert(b.raw_ptr().0);
                        if expect_base && !arena.sanitize() {
                            prop_assert_eq!(b.raw_ptr().0, first, "reclaimed scratch not reused");
                        }
                    }
                    expect_base = false;
                    live.push(b);
                }
                Op::Saved(n) | Op::Persistent(n) => {
                    let b = match op {
                        Op::Saved(_) => arena.alloc_saved(n),
                        _ => arena.alloc_persistent(n),
                    };
                    live.push(b.map_err(|e| TestCaseError::fail(e.to_string()))?);
                    allocs += 1;
                }
                Op::Drop(i) => {
                    if !live.is_empty() {
                        live.swap_remove(i % live.len());
                    }
                }
                Op::StepEnd => {
                    if let Some(s) = step.take() {
                        let summary = s.end().map_err(|e| TestCaseError::fail(e.to_string()))?;
                        let kept_arena = live.iter().filter(|b| b.class() == AllocClass::Scratch && b.source() == Source::Arena).count();
                        let kept_total = live.iter().filter(|b| b.class() == AllocClass::Scratch).count();
                        prop_assert_eq!(summary.kept.len(), kept_total);
                        expect_base = kept_arena == 0 && base.is_some();
                    }
                    step = Some(arena.step().map_err(|e| TestCaseError::fail(e.to_string()))?);
                }
                Op::Capture(sizes) => {
                    let plan = CapturePlan::from_requests(sizes.iter().copied());
                    let res = arena.reserve_for_capture(&plan).map_err(|e| TestCaseError::fail(e.to_string()))?;
                    {
                        let _scope = arena.capture_into(&res).map_err(|e| TestCaseError::fail(e.to_string()))?;
                        let cap = dev.begin_capture(dev.stream()).map_err(|e| TestCaseError::fail(e.to_string()))?;
                        for (k, n) in sizes.iter().enumerate() {
                            let b = match (&step, k % 2) {
                                (Some(s), 0) => s.alloc_scratch(*n).map(|b| b.clone()),
                                _ => arena.alloc_saved(*n),
                            }.map_err(|e| TestCaseError::fail(e.to_string()))?;
                            prop_assert_eq!(b.class(), AllocClass::Graph);
                            live.push(b);
                            allocs += 1;
                        }
                        drop(cap.end().map_err(|e| TestCaseError::fail(e.to_string()))?);
                    }
                    graphs.push(res);
                }
                Op::GraphDrop(i) => {
                    if !graphs.is_empty() {
                        graphs.swap_remove(i % graphs.len());
                    }
                }
            }
            check(&arena, &live, allocs)?;
        }
        drop(step);
        drop(live);
        drop(graphs);
        let d = arena.diagnostics();
        prop_assert_eq!(d.live_handles, 0, "{}", d);
        prop_assert_eq!(d.capture.reservations, 0, "{}", d);
        prop_assert_eq!(d.overflow.outstanding, 0, "{}", d);
        prop_assert_eq!(d.bytes_by_class.get(AllocClass::Saved) + d.bytes_by_class.get(AllocClass::Persistent), 0, "{}", d);
        if arena.sanitize() {
            // Once a step end has seen the last scratch handles go, nothing is left allocated.
            arena.step().map_err(|e| TestCaseError::fail(e.to_string()))?.end().map_err(|e| TestCaseError::fail(e.to_string()))?;
            let d = arena.diagnostics();
            prop_assert_eq!(d.capacity, 0, "{}", d);
            prop_assert_eq!(d.scratch_segments + d.held_segments, 0, "{}", d);
        }
    }
}
