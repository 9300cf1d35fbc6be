//! Graphs and replay through the `Driver` trait alone: what a replay runs and reads, memory
//! nodes, captured events, and streams forked and joined inside a capture.

use rstest::rstest;

use super::Effect;
use super::tests_capture::{N, sim};
use crate::driver::{CuCode, Driver};
use crate::types::*;

/// The replay proof of docs/capture-rules.md: a synchronous memset of `a` (0) and an async memset
/// of `b` (5) give a 1-node graph; after setting `a` to 9 and replaying, `a` is 9 and `b` is 5.
#[test]
fn silent_rows_are_not_replayed() {
    let d = sim();
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    let a = d.mem_alloc(64).unwrap();
    let b = d.mem_alloc(64).unwrap();
    d.stream_begin_capture(s, CaptureMode::Global).unwrap();
    d.memset_d8(a, 0, 64).unwrap();
    d.memset_d8_async(b, 5, 64, s).unwrap();
    let g = d.stream_end_capture(s).unwrap();
    assert_eq!(d.graph_node_count(g).unwrap(), 1);
    let silent = d
        .op_log()
        .iter()
        .filter(|r| r.effect == Effect::Silent)
        .count();
    assert_eq!(silent, 1);
    assert_eq!(
        d.peek(a, 64).unwrap(),
        vec![0; 64],
        "the silent memset ran at capture time"
    );
    d.memset_d8(a, 9, 64).unwrap();
    d.memset_d8(b, 0, 64).unwrap();
    let x = d.graph_instantiate(g, InstantiateFlags::default()).unwrap();
    d.graph_launch(x, s).unwrap();
    d.stream_synchronize(s).unwrap();
    assert_eq!(d.peek(a, 64).unwrap(), vec![9; 64]);
    assert_eq!(d.peek(b, 64).unwrap(), vec![5; 64]);
}

#[test]
fn replay_reads_memory_at_launch_time() {
    let d = sim();
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    let x = d.mem_alloc(16).unwrap();
    let y = d.mem_alloc(16).unwrap();
    // Fresh memory reads as poison (NaN) until written.
    assert!(d.peek_f32(y, 4).unwrap().iter().all(|v| v.is_nan()));
    d.memset_d32(y, 0, 4).unwrap();
    let m = d.module_load_ptx(super::BUILTIN_PTX).unwrap();
    let axpy = d.module_get_function(m, "axpy_f32").unwrap();
    let args = [
        KernelArg::Ptr(y),
        KernelArg::Ptr(x),
        KernelArg::F32(2.0),
        KernelArg::U64(4),
    ];
    d.stream_begin_capture(s, CaptureMode::Global).unwrap();
    // SAFETY: checked accessor.
    unsafe { d.launch_kernel(axpy, LaunchConfig::linear(4, 128, 1), &args, s) }.unwrap();
    let g = d.stream_end_capture(s).unwrap();
    let exec = d.graph_instantiate(g, InstantiateFlags::default()).unwrap();
    for (xv, want) in [(1.0f32, 2.0f32), (3.0, 8.0)] {
        let bytes: Vec<u8> = [xv; 4].iter().flat_map(|v| v.to_le_bytes()).collect();
        d.memcpy_htod(x, &bytes).unwrap();
        d.graph_launch(exec, s).unwrap();
        d.stream_synchronize(s).unwrap();
        assert_eq!(d.peek_f32(y, 4).unwrap(), vec![want; 4]);
    }
    d.graph_exec_destroy(exec).unwrap();
    d.graph_destroy(g).unwrap();
    assert_eq!(
        d.graph_launch(exec, s).unwrap_err().cuda_code(),
        Some(CuCode::INVALID_HANDLE)
    );
    assert_eq!(
        d.graph_node_count(g).unwrap_err().cuda_code(),
        Some(CuCode::INVALID_HANDLE)
    );
    assert_eq!(
        d.graph_destroy(g).unwrap_err().cuda_code(),
        Some(CuCode::INVALID_HANDLE)
    );
}

#[rstest]
#[case::once(false)]
#[case::auto_free(true)]
fn memory_node_relaunch(#[case] auto_free: bool) {
    let d = sim();
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    let used = d.used_bytes();
    d.stream_begin_capture(s, CaptureMode::Global).unwrap();
    let p = d.mem_alloc_async(1 << 16, s).unwrap();
    d.memset_d8_async(p, 1, 1 << 16, s).unwrap();
    let g = d.stream_end_capture(s).unwrap();
    let exec = d
        .graph_instantiate(
            g,
            InstantiateFlags {
                auto_free_on_launch: auto_free,
                ..InstantiateFlags::default()
            },
        )
        .unwrap();
    d.graph_launch(exec, s).unwrap();
    d.stream_synchronize(s).unwrap();
    assert_eq!(
        d.peek(p, 4).unwrap(),
        vec![1; 4],
        "the graph's memory is at the captured address"
    );
    let second = d.graph_launch(exec, s);
    if auto_free {
        second.unwrap();
    } else {
        assert_eq!(second.unwrap_err().cuda_code(), Some(CuCode::INVALID_VALUE));
        // Freeing what the launch allocated lets it launch again.
        d.mem_free_async(p, s).unwrap();
        d.stream_synchronize(s).unwrap();
        d.graph_launch(exec, s).unwrap();
    }
    d.stream_synchronize(s).unwrap();
    d.graph_exec_destroy(exec).unwrap();
    assert!(d.used_bytes() > used, "the graph still holds its memory");
    d.graph_destroy(g).unwrap();
    assert_eq!(d.used_bytes(), used);
}

#[test]
fn a_free_node_for_the_graphs_own_allocation_allows_relaunch() {
    let d = sim();
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    d.stream_begin_capture(s, CaptureMode::Global).unwrap();
    let p = d.mem_alloc_async(256, s).unwrap();
    d.mem_free_async(p, s).unwrap();
    let g = d.stream_end_capture(s).unwrap();
    assert_eq!(d.graph_node_count(g).unwrap(), 2);
    let exec = d.graph_instantiate(g, InstantiateFlags::default()).unwrap();
    d.graph_launch(exec, s).unwrap();
    d.graph_launch(exec, s).unwrap();
    d.stream_synchronize(s).unwrap();
}

#[test]
fn captured_event_records_are_replayed() {
    let d = sim();
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    let e = d.event_create(true).unwrap();
    let p = d.mem_alloc(1 << 20).unwrap();
    d.stream_begin_capture(s, CaptureMode::Global).unwrap();
    d.memset_d8_async(p, 3, 1 << 20, s).unwrap();
    d.event_record(e, s).unwrap();
    let g = d.stream_end_capture(s).unwrap();
    let exec = d.graph_instantiate(g, InstantiateFlags::default()).unwrap();
    d.graph_launch(exec, s).unwrap();
    assert_eq!(d.event_query(e).unwrap(), Readiness::NotReady);
    d.event_synchronize(e).unwrap();
    assert_eq!(d.event_query(e).unwrap(), Readiness::Ready);
    assert_eq!(d.peek(p, 4).unwrap(), vec![3; 4]);
}

/// Fork and join inside one capture: `side` waits on an event the capturing stream recorded,
/// so it joins the capture; the capturing stream waits on an event recorded on `side` after its
/// work, so it is joined back. Both streams' work is in the graph and every replay runs it.
#[test]
fn a_forked_stream_joined_back_is_captured_and_replayed() {
    let d = sim();
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    let side = d.stream_create(StreamKind::NonBlocking).unwrap();
    let (fork, join) = (
        d.event_create(false).unwrap(),
        d.event_create(false).unwrap(),
    );
    let (a, b) = (d.mem_alloc(N).unwrap(), d.mem_alloc(N).unwrap());
    d.memset_d8(b, 0, N).unwrap();
    d.stream_begin_capture(s, CaptureMode::Global).unwrap();
    d.memset_d8_async(a, 1, N, s).unwrap();
    d.event_record(fork, s).unwrap();
    d.stream_wait_event(side, fork).unwrap();
    assert_eq!(d.stream_is_capturing(side).unwrap(), CaptureStatus::Active);
    d.memset_d8_async(b, 2, N, side).unwrap();
    d.event_record(join, side).unwrap();
    d.stream_wait_event(s, join).unwrap();
    d.memset_d8_async(a, 3, 16, s).unwrap();
    let g = d.stream_end_capture(s).unwrap();
    assert_eq!(d.stream_is_capturing(side).unwrap(), CaptureStatus::None);
    // Three memsets and the two event records; the waits are edges, not nodes.
    assert_eq!(d.graph_node_count(g).unwrap(), 5);
    assert_eq!(d.peek(b, 4).unwrap(), vec![0; 4], "captured, not run");
    let exec = d.graph_instantiate(g, InstantiateFlags::default()).unwrap();
    for _ in 0..2 {
        d.memset_d8(a, 0, N).unwrap();
        d.memset_d8(b, 0, N).unwrap();
        d.graph_launch(exec, s).unwrap();
        d.stream_synchronize(s).unwrap();
        assert_eq!(d.peek(a, 17).unwrap()[15..], [3, 1]);
        assert_eq!(d.peek(b, 4).unwrap(), vec![2; 4]);
    }
}

/// A capture that ends while a forked stream still holds work the capturing stream never
/// waited for fails with 904 (CUDA's `STREAM_CAPTURE_UNJOINED`) and leaves no stream capturing.
#[rstest]
#[case::never_joined(false)]
#[case::work_after_the_join(true)]
fn a_capture_with_a_forked_stream_not_joined_back_fails_904(#[case] joined_once: bool) {
    let d = sim();
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    let side = d.stream_create(StreamKind::NonBlocking).unwrap();
    let (fork, join) = (
        d.event_create(false).unwrap(),
        d.event_create(false).unwrap(),
    );
    let b = d.mem_alloc(N).unwrap();
    d.stream_begin_capture(s, CaptureMode::Global).unwrap();
    d.event_record(fork, s).unwrap();
    d.stream_wait_event(side, fork).unwrap();
    d.memset_d8_async(b, 2, N, side).unwrap();
    if joined_once {
        d.event_record(join, side).unwrap();
        d.stream_wait_event(s, join).unwrap();
        d.memset_d8_async(b, 4, N, side).unwrap();
    }
    let end = d.stream_end_capture(s).map(drop);
    assert_eq!(
        end.unwrap_err().cuda_code(),
        Some(CuCode::STREAM_CAPTURE_UNJOINED)
    );
    assert_eq!(d.stream_is_capturing(side).unwrap(), CaptureStatus::None);
    assert_eq!(d.stream_is_capturing(s).unwrap(), CaptureStatus::None);
}
