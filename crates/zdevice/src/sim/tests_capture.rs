//! Every row of docs/capture-rules.md through the `Driver` trait alone, plus graphs and replay.
//! Graphs and replay are in `tests_replay.rs`.

use rstest::rstest;

use super::calls;
use super::{Effect, SimDriver};
use crate::driver::{CuCode, Driver, DriverError};
use crate::types::*;

pub(super) const N: u64 = 4096;

pub(super) fn sim() -> SimDriver {
    let d = SimDriver::default();
    d.init().expect("init");
    d
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Row {
    MemAlloc,
    MemAllocManaged,
    MemAllocHost,
    MemcpyHtoD,
    MemcpyDtoH,
    MemcpyDtoD,
    MemsetD8,
    MemcpyHtoDAsyncPageable,
    MemsetD8Async,
    MemAllocAsync,
    StreamSynchronize,
    CtxSynchronize,
    StreamQuery,
    EventRecord,
    EventQuery,
    EventSynchronize,
    MemGetInfo,
    MemFreeLive,
    GemmWithWorkspace,
    GemmDefaultWorkspace,
    Kernel,
}

/// What one call during capture produced.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    /// The call's CUDA code (None = success).
    code: Option<u32>,
    status: CaptureStatus,
    /// End of capture: Ok(node count) or the CUDA code.
    end: Result<usize, u32>,
}

fn gemm16(a: DevicePtr, c: DevicePtr) -> GemmF32 {
    GemmF32 {
        transa: Transpose::No,
        transb: Transpose::No,
        m: 16,
        n: 16,
        k: 16,
        alpha: 1.0,
        a,
        lda: 16,
        stride_a: 256,
        b: a,
        ldb: 16,
        stride_b: 256,
        beta: 0.0,
        c,
        ldc: 16,
        stride_c: 256,
        batch: 1,
    }
}

fn run_row(row: Row, mode: CaptureMode, kind: StreamKind) -> Seen {
    let d = sim();
    let s = d.stream_create(kind).unwrap();
    let a = d.mem_alloc(N).unwrap();
    let b = d.mem_alloc(N).unwrap();
    let live = d.mem_alloc(256).unwrap();
    d.memset_d8(a, 0, N).unwrap();
    let event = d.event_create(false).unwrap();
    d.event_record(event, s).unwrap();
    let blas = d.blas_create().unwrap();
    d.blas_set_stream(blas, s).unwrap();
    if row == Row::GemmWithWorkspace {
        let ws = d.mem_alloc(32 << 20).unwrap();
        d.blas_set_workspace(blas, ws, 32 << 20).unwrap();
    }
    let m = d.module_load_ptx(super::BUILTIN_PTX).unwrap();
    let fill = d.module_get_function(m, "fill_f32").unwrap();
    d.stream_synchronize(s).unwrap();
    d.stream_begin_capture(s, mode).unwrap();
    let host = vec![0x22u8; N as usize];
    let r: Result<(), DriverError> = match row {
        Row::MemAlloc => d.mem_alloc(256).map(drop),
        Row::MemAllocManaged => d.mem_alloc_managed(256).map(drop),
        Row::MemAllocHost => d.mem_alloc_host(256).map(drop),
        Row::MemcpyHtoD => d.memcpy_htod(a, &host),
        Row::MemcpyDtoH => d.memcpy_dtoh(&mut [0u8; 64], b),
        Row::MemcpyDtoD => d.memcpy_dtod(a, b, N),
        Row::MemsetD8 => d.memset_d8(a, 0x11, N),
        // SAFETY: the simulator copies the bytes at call time.
        Row::MemcpyHtoDAsyncPageable => unsafe { d.memcpy_htod_async_pageable(a, &host, s) },
        Row::MemsetD8Async => d.memset_d8_async(a, 0x44, N, s),
        Row::MemAllocAsync => d.mem_alloc_async(256, s).map(drop),
        Row::StreamSynchronize => d.stream_synchronize(s),
        Row::CtxSynchronize => d.ctx_synchronize(),
        Row::StreamQuery => d.stream_query(s).map(drop),
        Row::EventRecord => d.event_record(event, s),
        Row::EventQuery => d.event_query(event).map(drop),
        Row::EventSynchronize => d.event_synchronize(event),
        Row::MemGetInfo => d.mem_get_info().map(drop),
        Row::MemFreeLive => d.mem_free(live),
        // SAFETY: operands are checked by the simulator.
        Row::GemmWithWorkspace | Row::GemmDefaultWorkspace => unsafe {
            d.gemm_strided_batched_f32(blas, &gemm16(a, b))
        },
        Row::Kernel => unsafe {
            // SAFETY: checked accessor.
            d.launch_kernel(
                fill,
                LaunchConfig::linear(4, 256, 1),
                &[KernelArg::Ptr(a), KernelArg::F32(1.0), KernelArg::U64(4)],
                s,
            )
        },
    };
    let code = r.err().map(|e| e.cuda_code().map_or(u32::MAX, |c| c.0));
    let status = d.stream_is_capturing(s).unwrap();
    let end = match d.stream_end_capture(s) {
        Ok(g) => Ok(d.graph_node_count(g).unwrap()),
        Err(e) => Err(e.cuda_code().map_or(u32::MAX, |c| c.0)),
    };
    assert_eq!(
        d.stream_is_capturing(s).unwrap(),
        CaptureStatus::None,
        "capture ended"
    );
    Seen { code, status, end }
}

fn invalidated(code: u32) -> Seen {
    Seen {
        code: Some(code),
        status: CaptureStatus::Invalidated,
        end: Err(901),
    }
}

fn ok(nodes: usize) -> Seen {
    Seen {
        code: None,
        status: CaptureStatus::Active,
        end: Ok(nodes),
    }
}

/// The first table of docs/capture-rules.md (H200), on a non-blocking stream, one column per mode.
#[rstest]
#[case::mem_alloc(Row::MemAlloc, invalidated(900), invalidated(900), ok(0))]
#[case::mem_alloc_managed(Row::MemAllocManaged, invalidated(900), invalidated(900), ok(0))]
#[case::mem_alloc_host(Row::MemAllocHost, invalidated(900), invalidated(900), ok(0))]
#[case::memcpy_htod_silent(Row::MemcpyHtoD, ok(0), ok(0), ok(0))]
#[case::memcpy_dtoh_silent(Row::MemcpyDtoH, ok(0), ok(0), ok(0))]
#[case::memset_d8_silent(Row::MemsetD8, ok(0), ok(0), ok(0))]
#[case::htod_async_pageable(Row::MemcpyHtoDAsyncPageable, ok(1), ok(1), ok(1))]
#[case::memset_d8_async(Row::MemsetD8Async, ok(1), ok(1), ok(1))]
#[case::mem_alloc_async(Row::MemAllocAsync, ok(1), ok(1), ok(1))]
#[case::stream_synchronize(
    Row::StreamSynchronize,
    invalidated(900),
    invalidated(900),
    invalidated(900)
)]
#[case::ctx_synchronize(
    Row::CtxSynchronize,
    invalidated(900),
    invalidated(900),
    invalidated(900)
)]
#[case::stream_query(Row::StreamQuery, invalidated(900), invalidated(900), invalidated(900))]
#[case::event_record(Row::EventRecord, ok(1), ok(1), ok(1))]
#[case::event_query(Row::EventQuery, invalidated(900), invalidated(900), ok(0))]
#[case::event_synchronize(Row::EventSynchronize, invalidated(900), invalidated(900), ok(0))]
#[case::mem_get_info(Row::MemGetInfo, ok(0), ok(0), ok(0))]
#[case::kernel(Row::Kernel, ok(1), ok(1), ok(1))]
fn first_table(
    #[case] row: Row,
    #[case] global: Seen,
    #[case] thread_local: Seen,
    #[case] relaxed: Seen,
) {
    for (mode, want) in [
        (CaptureMode::Global, global),
        (CaptureMode::ThreadLocal, thread_local),
        (CaptureMode::Relaxed, relaxed),
    ] {
        assert_eq!(
            run_row(row, mode, StreamKind::NonBlocking),
            want,
            "{row:?} in {mode:?}"
        );
    }
}

/// The second table (H100), global mode unless named.
#[rstest]
#[case::memset_d8_nonblocking(Row::MemsetD8, CaptureMode::Global, StreamKind::NonBlocking, ok(0))]
#[case::memset_d8_blocking(
    Row::MemsetD8,
    CaptureMode::Global,
    StreamKind::Blocking,
    invalidated(906)
)]
#[case::dtod_nonblocking(Row::MemcpyDtoD, CaptureMode::Global, StreamKind::NonBlocking, ok(0))]
#[case::dtod_blocking(
    Row::MemcpyDtoD,
    CaptureMode::Global,
    StreamKind::Blocking,
    invalidated(906)
)]
#[case::htod_nonblocking(Row::MemcpyHtoD, CaptureMode::Global, StreamKind::NonBlocking, ok(0))]
#[case::htod_blocking(
    Row::MemcpyHtoD,
    CaptureMode::Global,
    StreamKind::Blocking,
    invalidated(906)
)]
#[case::memset_async_nonblocking(
    Row::MemsetD8Async,
    CaptureMode::Global,
    StreamKind::NonBlocking,
    ok(1)
)]
#[case::memset_async_blocking(Row::MemsetD8Async, CaptureMode::Global, StreamKind::Blocking, ok(1))]
#[case::free_live(
    Row::MemFreeLive,
    CaptureMode::Global,
    StreamKind::NonBlocking,
    invalidated(900)
)]
#[case::free_live_relaxed(Row::MemFreeLive, CaptureMode::Relaxed, StreamKind::NonBlocking, ok(0))]
#[case::gemm_workspace(
    Row::GemmWithWorkspace,
    CaptureMode::Global,
    StreamKind::NonBlocking,
    ok(2)
)]
#[case::gemm_default(
    Row::GemmDefaultWorkspace,
    CaptureMode::Global,
    StreamKind::NonBlocking,
    ok(4)
)]
fn second_table(
    #[case] row: Row,
    #[case] mode: CaptureMode,
    #[case] kind: StreamKind,
    #[case] want: Seen,
) {
    assert_eq!(run_row(row, mode, kind), want);
}

/// Rows the document does not measure are refused by name, leaving the capture as it was.
#[rstest]
#[case::dtoh_blocking(Row::MemcpyDtoH, CaptureMode::Global, StreamKind::Blocking)]
#[case::memset_blocking_relaxed(Row::MemsetD8, CaptureMode::Relaxed, StreamKind::Blocking)]
#[case::dtod_thread_local(Row::MemcpyDtoD, CaptureMode::ThreadLocal, StreamKind::NonBlocking)]
fn unmeasured_rows_are_not_modelled(
    #[case] row: Row,
    #[case] mode: CaptureMode,
    #[case] kind: StreamKind,
) {
    assert_eq!(
        run_row(row, mode, kind),
        Seen {
            code: Some(u32::MAX),
            ..ok(0)
        }
    );
}

#[test]
fn uncovered_calls_are_refused_by_name_and_the_capture_survives() {
    let d = sim();
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    let other = d.stream_create(StreamKind::NonBlocking).unwrap();
    let p = d.mem_alloc(1024).unwrap();
    d.stream_begin_capture(s, CaptureMode::Relaxed).unwrap();
    let refused: Vec<(&str, Result<(), DriverError>)> = vec![
        (calls::STREAM_DESTROY, d.stream_destroy(other)),
        (
            calls::STREAM_BEGIN_CAPTURE,
            d.stream_begin_capture(other, CaptureMode::Global),
        ),
        (calls::MEMSET_D8_ASYNC, d.memset_d8_async(p, 1, 16, other)),
        (
            calls::MODULE_LOAD_DATA,
            d.module_load_ptx(super::BUILTIN_PTX).map(drop),
        ),
        (
            calls::MEM_POOL_CREATE,
            d.mem_pool_create(PoolProps {
                ordinal: 0,
                max_size: 0,
            })
            .map(drop),
        ),
        (calls::STREAM_SYNCHRONIZE, d.stream_synchronize(other)),
        (calls::MEMSET_D32, d.memset_d32(p, 1, 4)),
        (
            calls::MEM_ALLOC_FROM_POOL_ASYNC,
            d.mem_alloc_from_pool_async(64, MemPool(7), s).map(drop),
        ),
        (calls::EVENT_CREATE, d.event_create(false).map(drop)),
        (calls::BLAS_CREATE, d.blas_create().map(drop)),
    ];
    for (call, r) in refused {
        match r {
            Err(DriverError::NotModelled { call: c }) => assert_eq!(c, call),
            other => panic!("{call}: expected NotModelled, got {other:?}"),
        }
    }
    // Binding a thread to the primary context is allowed (see the table).
    d.ctx_set_current(Context(1)).unwrap();
    assert_eq!(d.stream_is_capturing(s).unwrap(), CaptureStatus::Active);
    let g = d.stream_end_capture(s).unwrap();
    assert_eq!(d.graph_node_count(g).unwrap(), 0);
    let refused = d
        .op_log()
        .iter()
        .filter(|r| r.effect == Effect::Refused)
        .count();
    assert_eq!(refused, 10);
}

#[test]
fn thread_local_mode_refuses_only_the_capturing_thread() {
    let d = std::sync::Arc::new(sim());
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    d.stream_begin_capture(s, CaptureMode::ThreadLocal).unwrap();
    let d2 = d.clone();
    let other = std::thread::spawn(move || d2.mem_alloc(256))
        .join()
        .unwrap();
    assert!(other.is_ok(), "{other:?}");
    assert_eq!(d.stream_is_capturing(s).unwrap(), CaptureStatus::Active);
    let mine = d.mem_alloc(256).unwrap_err();
    assert_eq!(mine.cuda_code(), Some(CuCode::STREAM_CAPTURE_UNSUPPORTED));
    assert_eq!(
        d.stream_is_capturing(s).unwrap(),
        CaptureStatus::Invalidated
    );
    // Global mode refuses every thread.
    assert_eq!(
        d.stream_end_capture(s).unwrap_err().cuda_code(),
        Some(CuCode::STREAM_CAPTURE_INVALIDATED)
    );
    d.stream_begin_capture(s, CaptureMode::Global).unwrap();
    let d2 = d.clone();
    let other = std::thread::spawn(move || d2.mem_alloc(256))
        .join()
        .unwrap();
    assert_eq!(
        other.unwrap_err().cuda_code(),
        Some(CuCode::STREAM_CAPTURE_UNSUPPORTED)
    );
    // Ending from another thread in global mode is 908 and leaves the capture running.
    let d2 = d.clone();
    let end = std::thread::spawn(move || d2.stream_end_capture(s))
        .join()
        .unwrap();
    assert_eq!(
        end.unwrap_err().cuda_code(),
        Some(CuCode::STREAM_CAPTURE_WRONG_THREAD)
    );
    assert_eq!(
        d.stream_is_capturing(s).unwrap(),
        CaptureStatus::Invalidated
    );
    assert!(d.stream_end_capture(s).is_err());
}

#[test]
fn work_on_an_invalidated_capture_returns_901() {
    let d = sim();
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    let p = d.mem_alloc(256).unwrap();
    d.stream_begin_capture(s, CaptureMode::Global).unwrap();
    d.mem_alloc(16).unwrap_err();
    let e = d.memset_d8_async(p, 1, 16, s).unwrap_err();
    assert_eq!(e.cuda_code(), Some(CuCode::STREAM_CAPTURE_INVALIDATED));
    assert!(d.stream_end_capture(s).is_err());
    // The stream is usable again, and ending a capture that is not running is 401.
    d.memset_d8_async(p, 1, 16, s).unwrap();
    assert_eq!(
        d.stream_end_capture(s).unwrap_err().cuda_code(),
        Some(CuCode::ILLEGAL_STATE)
    );
}
