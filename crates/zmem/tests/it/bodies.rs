//! Scenario bodies, generic over the driver: each runs on the simulated device (mock modules)
//! and on the CUDA device (`gpu`), with the same code.

use zdevice::{CapturedGraph, Device, Driver, KernelArg, LaunchConfig};
use zmem::{
    AllocClass, Arena, ArenaConfig, Block, CapturePlan, CaptureReservation, GraphPool, Source,
};

use crate::util::{Check, Logs, ensure, s};

fn f32_bits(v: f32) -> u32 {
    v.to_bits()
}

/// Waits for the engine stream, then reads `n` floats at `block`.
pub fn read_f32<D: Driver>(dev: &Device<D>, block: &Block, n: usize) -> Result<Vec<f32>, String> {
    dev.synchronize(dev.stream()).map_err(s)?;
    let mut b = vec![0u8; n * 4];
    dev.copy_dtoh(&mut b, block.ptr().map_err(s)?).map_err(s)?;
    Ok(b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

fn fill<D: Driver>(dev: &Device<D>, block: &Block, v: f32) -> Check {
    let ptr = block.ptr().map_err(s)?;
    dev.memset_d32_async(ptr, f32_bits(v), block.size() / 4, dev.stream())
        .map_err(s)
}

/// An arena smaller than the working set: every step overflows into the stream-ordered pool,
/// the loop completes, and the overflow warning is emitted once.
pub fn overflow_loop<D: Driver>(dev: &Device<D>, logs: &Logs) -> Check {
    logs.capture(|| -> Check {
        let cfg = ArenaConfig {
            initial_bytes: 128 << 10,
            ..crate::util::small(256 << 10)
        };
        let arena = Arena::new(dev.clone(), cfg).map_err(s)?;
        let params = arena.alloc_persistent(128 << 10).map_err(s)?;
        fill(dev, &params, 0.5)?;
        for i in 0..10 {
            let step = arena.step().map_err(s)?;
            let blocks: Vec<_> = (0..6)
                .map(|_| step.alloc_scratch(64 << 10))
                .collect::<Result<_, _>>()
                .map_err(s)?;
            for b in &blocks {
                fill(dev, b, i as f32)?;
            }
            let last = read_f32(dev, &blocks[5], 4)?;
            ensure(
                last == vec![i as f32; 4],
                format!("step {i} computed {last:?}"),
            )?;
            drop(blocks);
            step.end().map_err(s)?;
        }
        let d = arena.diagnostics();
        ensure(
            d.overflow.calls == 40,
            format!("expected 40 overflow calls: {d}"),
        )?;
        ensure(
            d.overflow.outstanding == 0,
            format!("overflow not returned: {d}"),
        )?;
        ensure(d.overflow.peak == 256 << 10, format!("peak: {d}"))?;
        ensure(params.ptr().is_ok() && d.resets == 10, format!("{d}"))?;
        Ok(())
    })?;
    let warnings = logs.count(&["WARN", "zmem.arena.overflow"]);
    ensure(
        warnings == 1,
        format!(
            "expected one overflow warning, got {warnings}:\n{}",
            logs.text()
        ),
    )?;
    ensure(
        logs.count(&["zmem.arena.overflow", "verdict"]) == 1,
        "the warning carries diagnostics",
    )
}

/// A capture allocates from its reservation, survives step resets, and replays.
pub fn capture_from_reservation<D: Driver>(dev: &Device<D>) -> Result<Arena<D>, String> {
    let arena = Arena::new(dev.clone(), crate::util::small(1 << 20)).map_err(s)?;
    let input = arena.alloc_persistent(4096).map_err(s)?;
    let warm = arena.step().map_err(s)?;
    let (r, plan) = arena
        .record_plan(|| -> Check {
            let _a = warm.alloc_scratch(4096).map_err(s)?;
            let _b = warm.alloc_scratch(8000).map_err(s)?;
            Ok(())
        })
        .map_err(s)?;
    r?;
    warm.end().map_err(s)?;
    ensure(plan.bytes() == 4096 + 8192, format!("plan {plan:?}"))?;
    let res = arena.reserve_for_capture(&plan).map_err(s)?;
    res.retain(&input);
    let step = arena.step().map_err(s)?;
    let (a, b, graph) = {
        let scope = arena.capture_into(&res).map_err(s)?;
        let cap = dev.begin_capture(dev.stream()).map_err(s)?;
        let a = step.alloc_scratch(4096).map_err(s)?.clone();
        let b = step.alloc_scratch(8000).map_err(s)?.clone();
        dev.memset_d32_async(a.ptr().map_err(s)?, f32_bits(2.0), 1024, cap.stream())
            .map_err(s)?;
        dev.memset_d32_async(b.ptr().map_err(s)?, f32_bits(3.0), 2000, cap.stream())
            .map_err(s)?;
        let graph = cap.end().map_err(s)?;
        ensure(
            scope.used() == plan.bytes(),
            "the capture used exactly the plan",
        )?;
        (a, b, graph)
    };
    for blk in [&a, &b] {
        ensure(
            blk.class() == AllocClass::Graph,
            format!("{blk:?} is not graph memory"),
        )?;
        ensure(
            blk.source() == Source::Reservation,
            format!("{blk:?} not from the reservation"),
        )?;
    }
    step.end().map_err(s)?;
    // Steps that reuse scratch heavily must not touch the graph's memory.
    for _ in 0..3 {
        let st = arena.step().map_err(s)?;
        for _ in 0..8 {
            let x = st.alloc_scratch(16 << 10).map_err(s)?;
            let (xa, xe) = (x.raw_ptr().0, x.raw_ptr().0 + x.size());
            for g in [&a, &b] {
                let (ga, ge) = (g.raw_ptr().0, g.raw_ptr().0 + g.size());
                ensure(xe <= ga || ge <= xa, "scratch overlapped graph memory")?;
            }
            fill(dev, &x, -1.0)?;
        }
        st.end().map_err(s)?;
    }
    let exec = graph.instantiate(Default::default()).map_err(s)?;
    exec.launch(dev.stream()).map_err(s)?;
    let got = read_f32(dev, &a, 1024)?;
    ensure(
        got.iter().all(|v| *v == 2.0),
        format!("replay wrote {:?}", &got[..4]),
    )?;
    let got = read_f32(dev, &b, 2000)?;
    ensure(
        got.iter().all(|v| *v == 3.0),
        format!("replay wrote {:?}", &got[..4]),
    )?;
    drop(exec);
    drop(graph);
    drop(res);
    ensure(
        arena.diagnostics().capture.reservations == 1,
        "blocks keep the reservation alive",
    )?;
    drop((a, b));
    ensure(
        arena.diagnostics().capture.reservations == 0,
        "reservation given back",
    )?;
    Ok(arena)
}

/// Saved blocks (and scratch clones kept by a tape) survive any number of step ends with
/// their contents, while each step's scratch is reused around them.
pub fn saved_survives_step_end<D: Driver>(dev: &Device<D>, poison: bool) -> Check {
    let cfg = ArenaConfig {
        poison,
        ..crate::util::small(512 << 10)
    };
    let arena = Arena::new(dev.clone(), cfg).map_err(s)?;
    let mut tape: Vec<(Block, f32)> = Vec::new();
    let mut first_scratch = None;
    for sample in 0..6u8 {
        let step = arena.step().map_err(s)?;
        let saved = step.alloc_saved(4096).map_err(s)?;
        fill(dev, &saved, f32::from(sample) + 1.0)?;
        tape.push((saved, f32::from(sample) + 1.0));
        for k in 0..8 {
            let x = step.alloc_scratch(8192).map_err(s)?;
            fill(dev, &x, -7.0)?;
            if k == 3 {
                // A forward output handed to backward as an input: the tape keeps a clone.
                fill(dev, &x, 100.0 + f32::from(sample))?;
                tape.push((x.clone(), 100.0 + f32::from(sample)));
            }
            // Sanitizer mode gives each block its own allocation: no address reuse to check.
            if k == 0 && !arena.sanitize() {
                let p = x.raw_ptr();
                ensure(
                    *first_scratch.get_or_insert(p) == p,
                    "scratch was not reused",
                )?;
            }
        }
        let summary = step.end().map_err(s)?;
        ensure(
            summary.kept.len() == (sample as usize + 1),
            format!("kept {summary:?}"),
        )?;
    }
    for (block, want) in &tape {
        let got = read_f32(dev, block, block.size() as usize / 4)?;
        ensure(
            got.iter().all(|v| v == want),
            format!("{block:?} holds {:?}, want {want}", &got[..2]),
        )?;
    }
    Ok(())
}

/// Reclaimed scratch reads as NaN when poison is on.
pub fn poison_reclaimed_scratch<D: Driver>(dev: &Device<D>, poison: bool) -> Check {
    let arena = Arena::new(
        dev.clone(),
        ArenaConfig {
            poison,
            ..crate::util::small(1 << 20)
        },
    )
    .map_err(s)?;
    let step = arena.step().map_err(s)?;
    let stale = step.alloc_scratch(1024).map_err(s)?.raw_ptr();
    dev.memset_d32_async(stale, f32_bits(1.0), 256, dev.stream())
        .map_err(s)?;
    step.end().map_err(s)?;
    dev.synchronize(dev.stream()).map_err(s)?;
    let mut b = vec![0u8; 1024];
    dev.copy_dtoh(&mut b, stale).map_err(s)?;
    let v: Vec<f32> = b
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    ensure(
        v.iter().all(|x| x.is_nan()),
        format!("stale scratch reads {:?}", &v[..4]),
    )
}

/// Floats in the planted control's block (1 KiB).
pub const PLANT_BLOCK_FLOATS: u64 = 256;

/// The sanitizer's negative control: zdevice's fill kernel over `floats` floats of a 1 KiB
/// scratch block (`PLANT_BLOCK_FLOATS`), the arena's only block. With more floats than that it
/// writes out of the block: by default into the rest of the arena's 1 MiB segment, where no
/// tool can tell it from a legal write; in sanitizer mode past the block's own driver
/// allocation, where compute-sanitizer (and the simulator's bounds check) sees it. The outer
/// result is the set-up; the inner one is what the stream's sync answered after the kernel.
/// `floats` is at most 1024 (4 KiB), so the default mode's write stays inside the segment.
pub fn planted_oob_write<D: Driver>(
    dev: &Device<D>,
    sanitize: bool,
    floats: u64,
) -> Result<Result<(), String>, String> {
    ensure(floats <= 1024, "the planted write stays within 4 KiB")?;
    let cfg = ArenaConfig {
        initial_bytes: 1 << 20,
        segment_bytes: 1 << 20,
        cap_bytes: Some(4 << 20),
        overflow_reserve_bytes: 1 << 20,
        sanitize,
        ..ArenaConfig::default()
    };
    let arena = Arena::new(dev.clone(), cfg).map_err(s)?;
    let module = dev.load_module(zdevice::kernels::FILL_PTX).map_err(s)?;
    let fill = module.function(zdevice::kernels::FILL_F32).map_err(s)?;
    let step = arena.step().map_err(s)?;
    let block = step.alloc_scratch(PLANT_BLOCK_FLOATS * 4).map_err(s)?;
    let args = [
        KernelArg::Ptr(block.ptr().map_err(s)?),
        KernelArg::F32(7.0),
        KernelArg::U64(floats),
    ];
    let launch = LaunchConfig::linear(floats, 128, 1);
    // SAFETY: fill_f32(float* out, float value, unsigned long long n). Up to
    // PLANT_BLOCK_FLOATS the writes are the block's. Past it (the planted control only) they
    // land in this test's own arena: the rest of its 1 MiB segment by default (owned by the
    // arena, no other block there), or past the block's own allocation in sanitizer mode,
    // which is the access the sanitizer must report (the simulator refuses it).
    unsafe { dev.launch(fill, launch, &args, dev.stream()) }.map_err(s)?;
    let synced = dev.synchronize(dev.stream()).map_err(s);
    drop(block);
    if synced.is_ok() {
        step.end().map_err(s)?;
    } else {
        // The device is lost (a sticky fault): the step's end would only report that again.
        std::mem::forget(step);
    }
    Ok(synced)
}

/// An eager step's shape: forward saves blocks and fills the scratch segments, backward frees
/// the saved blocks one by one and allocates scratch, which is lent from the memory they gave
/// back. Every live block keeps its data: a saved block still alive, lent scratch across a
/// later saved allocation and across the step's end (it is kept while referenced).
pub fn lent_scratch_keeps_every_live_block<D: Driver>(dev: &Device<D>, poison: bool) -> Check {
    let cfg = ArenaConfig {
        poison,
        ..crate::util::small(16 << 20)
    };
    let arena = Arena::new(dev.clone(), cfg).map_err(s)?;
    let step = arena.step_owned().map_err(s)?;
    let mut saved = Vec::new();
    for k in 0..4u8 {
        let b = arena.alloc_saved(64 << 10).map_err(s)?;
        fill(dev, &b, f32::from(k) + 1.0)?;
        saved.push((b, f32::from(k) + 1.0));
    }
    let mut live = Vec::new();
    for _ in 0..4 {
        let b = step.alloc_scratch(64 << 10).map_err(s)?;
        fill(dev, &b, -1.0)?;
        live.push((b, -1.0));
    }
    // Backward: the last saved block is freed first; each gradient takes its memory.
    let mut lent = 0;
    while saved.len() > 1 {
        drop(saved.pop());
        let g = step.alloc_scratch(64 << 10).map_err(s)?;
        lent += usize::from(g.source() == Source::Held);
        let v = 10.0 + live.len() as f32;
        fill(dev, &g, v)?;
        live.push((g, v));
    }
    if !arena.sanitize() {
        ensure(
            lent == 3,
            format!("{lent} of 3 gradients lent from the held region"),
        )?;
    }
    let late = arena.alloc_saved(64 << 10).map_err(s)?;
    fill(dev, &late, 99.0)?;
    live.push((late, 99.0));
    live.extend(saved);
    drop(step.end().map_err(s)?);
    // A later step's scratch must not land on what is still referenced.
    let next = arena.step_owned().map_err(s)?;
    for _ in 0..8 {
        let b = next.alloc_scratch(64 << 10).map_err(s)?;
        fill(dev, &b, -5.0)?;
    }
    for (block, want) in &live {
        let got = read_f32(dev, block, block.size() as usize / 4)?;
        ensure(
            got.iter().all(|v| v == want),
            format!("{block:?} holds {:?}, want {want}", &got[..2]),
        )?;
    }
    drop(next.end().map_err(s)?);
    Ok(())
}

/// Captures one graph pool member that fills `bytes` of graph memory with `v` and copies it
/// into `out` (persistent, outside the pool), as far as `out` goes.
fn pool_member<D: Driver>(
    arena: &Arena<D>,
    pool: &GraphPool,
    bytes: u64,
    v: f32,
    out: &Block,
) -> Result<(CaptureReservation, CapturedGraph<D>, Block), String> {
    let dev = arena.device();
    let res = arena
        .reserve_in_pool(pool, &CapturePlan::from_requests([bytes]))
        .map_err(s)?;
    res.retain(out);
    let step = arena.step().map_err(s)?;
    let (graph, inner) = {
        let _scope = arena.capture_into(&res).map_err(s)?;
        let cap = dev.begin_capture(dev.stream()).map_err(s)?;
        let inner = step.alloc_scratch(bytes).map_err(s)?.clone();
        let ptr = inner.ptr().map_err(s)?;
        dev.memset_d32_async(ptr, f32_bits(v), bytes / 4, cap.stream())
            .map_err(s)?;
        let to = out.ptr().map_err(s)?;
        dev.copy_dtod_async(to, ptr, out.size().min(bytes), cap.stream())
            .map_err(s)?;
        (cap.end().map_err(s)?, inner)
    };
    step.end().map_err(s)?;
    Ok((res, graph, inner))
}

/// Two graph pool members write different values through the same memory and copy them out;
/// replayed alternately, each output holds its own member's value. The memory is counted
/// once (the larger member's), and outlives the first member dropped. In sanitizer mode each
/// member has memory of its own, counted for each.
pub fn pool_members_alternate<D: Driver>(dev: &Device<D>) -> Check {
    let arena = Arena::new(dev.clone(), crate::util::small(1 << 20)).map_err(s)?;
    let sanitize = arena.diagnostics().sanitize;
    let (out_a, out_b) = (
        arena.alloc_persistent(4096).map_err(s)?,
        arena.alloc_persistent(4096).map_err(s)?,
    );
    let pool = GraphPool::new();
    let (res_a, graph_a, a) = pool_member(&arena, &pool, 8192, 2.0, &out_a)?;
    let (res_b, graph_b, b) = pool_member(&arena, &pool, 4096, 3.0, &out_b)?;
    let d = arena.diagnostics();
    let (graph, reserved) = if sanitize {
        (8192 + 4096, 8192 + 4096)
    } else {
        (8192, 8192)
    };
    ensure(
        d.bytes_by_class.get(AllocClass::Graph) == graph && d.capture.reserved == reserved,
        format!("graph memory counted once: {d}"),
    )?;
    ensure(
        sanitize || a.raw_ptr() == b.raw_ptr(),
        format!("members share the memory: {a:?} {b:?}"),
    )?;
    ensure(
        pool.members() == 2 && res_a.is_pool_member(),
        format!("{pool:?}"),
    )?;
    let (exec_a, exec_b) = (
        graph_a.instantiate(Default::default()).map_err(s)?,
        graph_b.instantiate(Default::default()).map_err(s)?,
    );
    for round in 0..3 {
        fill(dev, &out_a, -1.0)?;
        fill(dev, &out_b, -1.0)?;
        exec_a.launch(dev.stream()).map_err(s)?;
        exec_b.launch(dev.stream()).map_err(s)?;
        let (got_a, got_b) = (read_f32(dev, &out_a, 1024)?, read_f32(dev, &out_b, 1024)?);
        ensure(
            got_a.iter().all(|v| *v == 2.0) && got_b.iter().all(|v| *v == 3.0),
            format!("round {round}: {:?} {:?}", &got_a[..2], &got_b[..2]),
        )?;
    }
    // The first member goes; the memory stays for the second, which still replays.
    drop((exec_a, graph_a, res_a, a));
    ensure(
        arena.diagnostics().capture.reservations == 1 && pool.members() == 1,
        format!(
            "the second member keeps the memory: {}",
            arena.diagnostics()
        ),
    )?;
    fill(dev, &out_b, -1.0)?;
    exec_b.launch(dev.stream()).map_err(s)?;
    let got_b = read_f32(dev, &out_b, 1024)?;
    ensure(
        got_b.iter().all(|v| *v == 3.0),
        format!("after the first member went: {:?}", &got_b[..2]),
    )?;
    drop((exec_b, graph_b, res_b, b));
    let d = arena.diagnostics();
    ensure(
        d.capture.reservations == 0
            && d.bytes_by_class.get(AllocClass::Graph) == 0
            && pool.members() == 0
            && pool.bytes() == 0,
        format!("the memory went with the last member: {d}"),
    )
}
