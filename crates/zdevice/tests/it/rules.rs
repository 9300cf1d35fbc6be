//! Every row of `docs/capture-rules.md`, through the raw driver layer: one call
//! during a capture, then what the call returned, the capture's state, what ending it returned
//! and how many nodes the graph holds.

use zdevice::*;

use crate::util::*;

/// The call made during capture (one per table row).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Row {
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
    StreamCreate,
    StreamCreateWithPriority,
    StreamPriorityRange,
    /// `cuIpcGetMemHandle` of a live allocation.
    IpcExport,
    /// `cuIpcOpenMemHandle` of a handle this process exported (CUDA refuses it outside
    /// capture with 201, `CUDA_ERROR_INVALID_CONTEXT`).
    IpcOpenOwn,
    /// `cuIpcCloseMemHandle` of an address never opened (1, `CUDA_ERROR_INVALID_VALUE`, outside
    /// capture).
    IpcCloseUnopened,
    /// `cublasGemmStridedBatchedEx` (issue 42) under TF32 and bf16 on a handle bound to the
    /// capturing stream with a 32 MiB workspace set, warmed up before the capture.
    GemmExTf32WithWorkspace,
    GemmExBf16WithWorkspace,
    /// `cuMemHostGetDevicePointer_v2` of page-locked memory allocated before the capture
    /// (`Driver::host_device_ptr`), then a store into it from the host
    /// (`Driver::host_store_u32`): how a kernel's give-up flag is reached (issue 44).
    HostDevicePtr,
}

/// What the table says happens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The call fails with this code and invalidates the capture; ending returns 901.
    Invalidates(u32),
    /// The call succeeds, runs now, and the graph stays empty (a silent row).
    Silent,
    /// The call succeeds and adds this many nodes (None: the table does not say).
    Captured(Option<usize>),
    /// The call succeeds; nothing is captured.
    Succeeds,
    /// The call fails with this code, as outside capture, and the capture stays active and
    /// empty.
    FailsAsOutside(u32),
}

/// The expected outcome of `row` in `mode` on a stream of `kind`, transcribed from the table.
pub fn expected(row: Row, mode: CaptureMode, kind: StreamKind) -> Outcome {
    use Outcome::*;
    use Row::*;
    if matches!(row, MemcpyHtoD | MemcpyDtoH | MemcpyDtoD | MemsetD8) {
        // Synchronous copies and memsets: 906 on a blocking capturing stream, silent otherwise.
        return if kind == StreamKind::Blocking {
            Invalidates(906)
        } else {
            Silent
        };
    }
    let relaxed = mode == CaptureMode::Relaxed;
    match row {
        MemAlloc | MemAllocManaged | MemAllocHost | MemFreeLive | EventQuery | EventSynchronize => {
            if relaxed {
                Succeeds
            } else {
                Invalidates(900)
            }
        }
        MemcpyHtoDAsyncPageable | MemsetD8Async | MemAllocAsync => Captured(Some(1)),
        StreamSynchronize | CtxSynchronize | StreamQuery => Invalidates(900),
        EventRecord => Captured(None),
        GemmWithWorkspace => Captured(Some(2)),
        GemmDefaultWorkspace => Captured(Some(4)),
        MemGetInfo | MemcpyHtoD | MemcpyDtoH | MemcpyDtoD | MemsetD8 => Succeeds,
        // Not in the document; measured with this harness on an H100 (docs/benchmarks.md,
        // sixteenth session): making a stream, with or without a priority, and asking the
        // context's priority range neither fail nor touch the capture, in every mode.
        StreamCreate | StreamCreateWithPriority | StreamPriorityRange => Succeeds,
        // Not in the document; measured with this harness on 2x NVIDIA H100 80GB HBM3
        // (twentieth session): the IPC calls answer as outside capture in every mode and
        // leave the capture active with no node.
        IpcExport => Succeeds,
        IpcOpenOwn => FailsAsOutside(201),
        IpcCloseUnopened => FailsAsOutside(1),
        // Measured on an H200 (2026-11-29): 2 nodes in every mode, as the Sgemm row.
        GemmExTf32WithWorkspace | GemmExBf16WithWorkspace => Captured(Some(2)),
        // Measured on an H200 (2026-11-29): answered as outside capture in every mode, no
        // node (it submits nothing); the store is host memory.
        HostDevicePtr => Succeeds,
    }
}

struct Prepared {
    a: DevicePtr,
    b: DevicePtr,
    live: DevicePtr,
    event: Event,
    blas: Option<BlasHandle>,
    workspace: Option<DevicePtr>,
    gemm_operands: Option<DevicePtr>,
    host: Vec<u8>,
    /// `a`'s IPC handle, exported before the capture (the `IpcOpenOwn` row).
    handle: Option<IpcMemHandle>,
    /// Page-locked memory allocated before the capture (the `HostDevicePtr` row).
    pinned: Option<HostPtr>,
}

const N: u64 = 4096;

/// Runs one row on `dev`'s driver and compares with [`expected`].
pub fn check_row<D: Driver>(
    dev: &Device<D>,
    row: Row,
    mode: CaptureMode,
    kind: StreamKind,
) -> Check {
    check_row_nodes(dev, row, mode, kind).map(drop)
}

/// [`check_row`], returning the graph's node count (None: no graph).
pub fn check_row_nodes<D: Driver>(
    dev: &Device<D>,
    row: Row,
    mode: CaptureMode,
    kind: StreamKind,
) -> Result<Option<usize>, String> {
    let d = dev.driver();
    dev.bind_thread().map_err(s)?;
    let stream = d.stream_create(kind).map_err(s)?;
    let p = prepare(d, row, stream)?;
    d.stream_synchronize(stream).map_err(s)?;
    d.stream_begin_capture(stream, mode).map_err(s)?;
    let (code, extra) = call(d, row, stream, &p);
    let mut ended = end_capture(d, stream)?;
    let nodes = ended.nodes;
    // What a silent call wrote, read after the capture has ended.
    let mut now = vec![0u8; N as usize];
    d.memcpy_dtoh(&mut now, p.a).map_err(s)?;
    cleanup(d, stream, p, extra, ended.graph.take())?;
    let ran = match row {
        Row::MemsetD8 => now.iter().all(|&x| x == 0x11),
        Row::MemcpyHtoD => now.iter().all(|&x| x == 0x22),
        Row::MemcpyDtoD => now.iter().all(|&x| x == 0x33),
        _ => true,
    };
    let want = expected(row, mode, kind);
    let (ok, got) = (ended.is(code, want, ran), ended.describe(code));
    ensure(
        ok,
        format!("{row:?} in {mode:?} on a {kind:?} stream: expected {want:?}, got {got}"),
    )
    .map(|()| nodes)
}

/// What ending a capture after a row's call found.
struct Ended {
    /// The capture's status before the end.
    status: CaptureStatus,
    /// The end's CUDA code (None: it made a graph).
    end_code: Option<u32>,
    /// The graph's node count, and the graph.
    nodes: Option<usize>,
    graph: Option<Graph>,
}

impl Ended {
    /// Whether a call that answered `code` and left this capture behind is `want` (`ran`: what
    /// a silent call writes is there).
    fn is(&self, code: Option<u32>, want: Outcome, ran: bool) -> bool {
        let active = self.status == CaptureStatus::Active;
        let empty = active && self.nodes == Some(0);
        match want {
            Outcome::Invalidates(c) => {
                code == Some(c)
                    && self.status == CaptureStatus::Invalidated
                    && self.end_code == Some(901)
            }
            Outcome::Silent => code.is_none() && empty && ran,
            Outcome::Captured(n) => {
                code.is_none() && active && self.nodes.is_some() && (n.is_none() || self.nodes == n)
            }
            Outcome::Succeeds => code.is_none() && empty,
            Outcome::FailsAsOutside(c) => code == Some(c) && empty,
        }
    }

    fn describe(&self, code: Option<u32>) -> String {
        format!(
            "call {code:?}, status {:?}, end {:?}, nodes {:?}",
            self.status, self.end_code, self.nodes
        )
    }
}

/// Ends the capture on `stream` after a row's call.
fn end_capture<D: Driver>(d: &D, stream: Stream) -> Result<Ended, String> {
    let status = d.stream_is_capturing(stream).map_err(s)?;
    let ended = d.stream_end_capture(stream);
    let end_code = ended
        .as_ref()
        .err()
        .and_then(DriverError::cuda_code)
        .map(|c| c.0);
    let nodes = match &ended {
        Ok(g) => Some(d.graph_node_count(*g).map_err(s)?),
        Err(_) => None,
    };
    Ok(Ended {
        status,
        end_code,
        nodes,
        graph: ended.ok(),
    })
}

fn prepare<D: Driver>(d: &D, row: Row, stream: Stream) -> Result<Prepared, String> {
    let a = d.mem_alloc(N).map_err(s)?;
    let b = d.mem_alloc(N).map_err(s)?;
    let live = d.mem_alloc(256).map_err(s)?;
    d.memset_d8(a, 0, N).map_err(s)?;
    d.memset_d8(b, 0x33, N).map_err(s)?;
    let event = d.event_create(false).map_err(s)?;
    d.event_record(event, stream).map_err(s)?;
    let (mut blas, mut workspace, mut gemm_operands) = (None, None, None);
    let ex = gemm_ex_math(row);
    if matches!(row, Row::GemmDefaultWorkspace | Row::GemmWithWorkspace) || ex.is_some() {
        let h = d.blas_create().map_err(s)?;
        d.blas_set_stream(h, stream).map_err(s)?;
        if row != Row::GemmDefaultWorkspace {
            let ws = d.mem_alloc(32 << 20).map_err(s)?;
            d.blas_set_workspace(h, ws, 32 << 20).map_err(s)?;
            workspace = Some(ws);
        }
        let operands = d.mem_alloc(GEMM_BYTES).map_err(s)?;
        d.memset_d8(operands, 0, GEMM_BYTES).map_err(s)?;
        gemm_operands = Some(operands);
        // Warm the handle up before capture, as the measurement did.
        // SAFETY: `operands` holds GEMM_BYTES, which covers every operand of `gemm_row`; it
        // lives until cleanup.
        unsafe { gemm_call(d, h, operands, ex) }.map_err(s)?;
        d.stream_synchronize(stream).map_err(s)?;
        blas = Some(h);
    }
    let handle = if row == Row::IpcOpenOwn {
        Some(d.ipc_get_mem_handle(a).map_err(s)?)
    } else {
        None
    };
    let pinned = if row == Row::HostDevicePtr {
        Some(d.mem_alloc_host(256).map_err(s)?)
    } else {
        None
    };
    Ok(Prepared {
        pinned,
        handle,
        a,
        b,
        live,
        event,
        blas,
        workspace,
        gemm_operands,
        host: vec![0x22; N as usize],
    })
}

/// A long-k product (64x64, k = 8192), the shape for which cuBLAS splits k and uses its
/// workspace; its node count in a graph is what the cuBLAS rows compare.
const GEMM_K: i32 = 8192;
const GEMM_BYTES: u64 = (2 * 64 * GEMM_K as u64 + 64 * 64) * 4;

fn gemm_row(base: DevicePtr) -> GemmF32 {
    let b_at = base.offset(64 * GEMM_K as u64 * 4);
    GemmF32 {
        transa: Transpose::No,
        transb: Transpose::No,
        m: 64,
        n: 64,
        k: GEMM_K,
        alpha: 1.0,
        a: base,
        lda: 64,
        stride_a: 0,
        b: b_at,
        ldb: GEMM_K,
        stride_b: 0,
        beta: 0.0,
        c: b_at.offset(64 * GEMM_K as u64 * 4),
        ldc: 64,
        stride_c: 0,
        batch: 1,
    }
}

/// The Ex rows' mode.
fn gemm_ex_math(row: Row) -> Option<GemmMath> {
    match row {
        Row::GemmExTf32WithWorkspace => Some(GemmMath::Tf32),
        Row::GemmExBf16WithWorkspace => Some(GemmMath::Bf16),
        _ => None,
    }
}

/// The float32 gemm of the cuBLAS rows, or the same shape under `ex` (bf16 operands take half
/// the bytes, so `GEMM_BYTES` covers them too).
///
/// # Safety
/// `operands` holds `GEMM_BYTES` of live device memory.
unsafe fn gemm_call<D: Driver>(
    d: &D,
    h: BlasHandle,
    operands: DevicePtr,
    ex: Option<GemmMath>,
) -> Result<(), DriverError> {
    let gemm = gemm_row(operands);
    match ex {
        // SAFETY: the caller's contract covers every operand of `gemm_row`.
        None => unsafe { d.gemm_strided_batched_f32(h, &gemm) },
        // SAFETY: as above; bf16 operands reach half as far.
        Some(math) => unsafe { d.gemm_strided_batched_ex(h, &GemmEx { math, gemm }) },
    }
}

/// Makes the row's call; returns its CUDA code (None on success) and anything it allocated.
fn call<D: Driver>(d: &D, row: Row, stream: Stream, p: &Prepared) -> (Option<u32>, Extra) {
    let code = |e: DriverError| Some(e.cuda_code().map_or(u32::MAX, |c| c.0));
    let mut extra = Extra::None;
    let r: Result<(), DriverError> = match row {
        Row::MemAlloc => d.mem_alloc(256).map(|p| extra = Extra::Device(p)),
        Row::MemAllocManaged => d.mem_alloc_managed(256).map(|p| extra = Extra::Device(p)),
        Row::MemAllocHost => d.mem_alloc_host(256).map(|p| extra = Extra::Host(p)),
        Row::MemcpyHtoD => d.memcpy_htod(p.a, &p.host),
        Row::MemcpyDtoH => d.memcpy_dtoh(&mut vec![0u8; N as usize], p.b),
        Row::MemcpyDtoD => d.memcpy_dtod(p.a, p.b, N),
        Row::MemsetD8 => d.memset_d8(p.a, 0x11, N),
        // SAFETY: `p.host` outlives the graph, which is destroyed in cleanup, never launched.
        Row::MemcpyHtoDAsyncPageable => unsafe {
            d.memcpy_htod_async_pageable(p.a, &p.host, stream)
        },
        Row::MemsetD8Async => d.memset_d8_async(p.a, 0x44, N, stream),
        Row::MemAllocAsync => d.mem_alloc_async(256, stream).map(|_| ()),
        Row::StreamSynchronize => d.stream_synchronize(stream),
        Row::CtxSynchronize => d.ctx_synchronize(),
        Row::StreamQuery => d.stream_query(stream).map(|_| ()),
        Row::EventRecord => d.event_record(p.event, stream),
        Row::EventQuery => d.event_query(p.event).map(|_| ()),
        Row::EventSynchronize => d.event_synchronize(p.event),
        Row::MemGetInfo => d.mem_get_info().map(|_| ()),
        Row::MemFreeLive => d.mem_free(p.live).map(|()| extra = Extra::FreedLive),
        Row::StreamCreate => d
            .stream_create(StreamKind::NonBlocking)
            .map(|s| extra = Extra::Stream(s)),
        Row::StreamCreateWithPriority => d
            .stream_create_with_priority(StreamKind::NonBlocking, -1)
            .map(|s| extra = Extra::Stream(s)),
        Row::StreamPriorityRange => d.stream_priority_range().map(|_| ()),
        Row::IpcExport => d.ipc_get_mem_handle(p.a).map(|_| ()),
        Row::IpcOpenOwn => match &p.handle {
            Some(h) => d.ipc_open_mem_handle(h).map(|q| extra = Extra::Opened(q)),
            None => Ok(()),
        },
        Row::IpcCloseUnopened => d.ipc_close_mem_handle(p.b),
        Row::HostDevicePtr => match p.pinned {
            Some(h) => d.host_device_ptr(h).and_then(|at| {
                // Unified addressing: the host address itself, on the GPU as on the simulator.
                if at.0 == h.0 {
                    d.host_store_u32(h, 1)
                } else {
                    Err(DriverError::InvalidArgument {
                        call: "host_device_ptr",
                        reason: format!("{at:?} is not the host address {h:?}"),
                    })
                }
            }),
            None => Ok(()),
        },
        Row::GemmWithWorkspace
        | Row::GemmDefaultWorkspace
        | Row::GemmExTf32WithWorkspace
        | Row::GemmExBf16WithWorkspace => match (p.blas, p.gemm_operands) {
            // SAFETY: as in the warm-up: operands within `gemm_operands`, live until cleanup.
            (Some(h), Some(ops)) => unsafe { gemm_call(d, h, ops, gemm_ex_math(row)) },
            _ => Ok(()),
        },
    };
    (r.err().and_then(code), extra)
}

/// Memory a row's call allocated (or freed) that cleanup must account for.
enum Extra {
    None,
    Device(DevicePtr),
    Host(HostPtr),
    Stream(Stream),
    /// An address `cuIpcOpenMemHandle` returned (closed in cleanup).
    Opened(DevicePtr),
    FreedLive,
}

fn cleanup<D: Driver>(
    d: &D,
    stream: Stream,
    p: Prepared,
    extra: Extra,
    graph: Option<Graph>,
) -> Check {
    if let Some(g) = graph {
        d.graph_destroy(g).map_err(s)?;
    }
    d.stream_synchronize(stream).map_err(s)?;
    match extra {
        Extra::Device(x) => d.mem_free(x).map_err(s)?,
        Extra::Host(x) => d.mem_free_host(x).map_err(s)?,
        Extra::Stream(x) => d.stream_destroy(x).map_err(s)?,
        Extra::Opened(x) => d.ipc_close_mem_handle(x).map_err(s)?,
        Extra::FreedLive | Extra::None => {}
    }
    let freed_live = matches!(extra, Extra::FreedLive);
    if !freed_live {
        d.mem_free(p.live).map_err(s)?;
    }
    if let Some(h) = p.blas {
        d.blas_destroy(h).map_err(s)?;
    }
    for buf in [p.workspace, p.gemm_operands].into_iter().flatten() {
        d.mem_free(buf).map_err(s)?;
    }
    if let Some(h) = p.pinned {
        d.mem_free_host(h).map_err(s)?;
    }
    d.event_destroy(p.event).map_err(s)?;
    d.mem_free(p.a).map_err(s)?;
    d.mem_free(p.b).map_err(s)?;
    d.stream_destroy(stream).map_err(s)
}

/// Memory nodes: a graph holding `cuMemAllocAsync` and no free launches once; the second launch
/// returns 1 (INVALID_VALUE), unless instantiated with auto-free-on-launch.
pub fn memory_node_relaunch<D: Driver>(dev: &Device<D>, auto_free: bool) -> Check {
    let d = dev.driver();
    dev.bind_thread().map_err(s)?;
    let stream = d.stream_create(StreamKind::NonBlocking).map_err(s)?;
    d.stream_begin_capture(stream, CaptureMode::Global)
        .map_err(s)?;
    let p = d.mem_alloc_async(1 << 16, stream).map_err(s)?;
    d.memset_d8_async(p, 1, 1 << 16, stream).map_err(s)?;
    let graph = d.stream_end_capture(stream).map_err(s)?;
    let flags = InstantiateFlags {
        auto_free_on_launch: auto_free,
        ..InstantiateFlags::default()
    };
    let exec = d.graph_instantiate(graph, flags).map_err(s)?;
    let first = d.graph_launch(exec, stream);
    d.stream_synchronize(stream).map_err(s)?;
    let second = d.graph_launch(exec, stream);
    d.stream_synchronize(stream).map_err(s)?;
    let second_code = second
        .as_ref()
        .err()
        .and_then(DriverError::cuda_code)
        .map(|c| c.0);
    // The graph's allocation outlives its launches unless freed; return it to the pool.
    d.mem_free_async(p, stream).map_err(s)?;
    d.stream_synchronize(stream).map_err(s)?;
    d.graph_exec_destroy(exec).map_err(s)?;
    d.graph_destroy(graph).map_err(s)?;
    d.stream_destroy(stream).map_err(s)?;
    ensure(first.is_ok(), format!("first launch failed: {first:?}"))?;
    if auto_free {
        ensure(
            second.is_ok(),
            format!("second launch with auto-free failed: {second:?}"),
        )
    } else {
        ensure(
            second_code == Some(1),
            format!("second launch returned {second:?}, expected 1"),
        )
    }
}

/// The IPC calls that need a handle another process exported (the peer process of
/// `ipc::gpu::a_peer_process_opens_and_closes_during_capture`; the simulator has no second
/// process to open from).
#[cfg(feature = "gpu")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Foreign {
    /// `cuIpcOpenMemHandle` during the capture.
    Open,
    /// `cuIpcCloseMemHandle`, during the capture, of a mapping opened before it.
    CloseMapped,
}

/// What the driver answers to `call` in `mode` (a non-blocking capturing stream), measured on
/// 2x NVIDIA H100 80GB HBM3 (twentieth session): both succeed in every mode, the capture stays
/// active with no node (the mapping is made or removed now, not replayed).
#[cfg(feature = "gpu")]
pub fn expected_foreign(call: Foreign, mode: CaptureMode) -> Outcome {
    let _ = (call, mode);
    Outcome::Succeeds
}

/// One foreign row on `dev`'s driver, compared with [`expected_foreign`]; whatever happens,
/// the mapping is closed before it returns.
#[cfg(feature = "gpu")]
pub fn check_foreign<D: Driver>(
    dev: &Device<D>,
    call: Foreign,
    mode: CaptureMode,
    handle: &IpcMemHandle,
) -> Check {
    let d = dev.driver();
    dev.bind_thread().map_err(s)?;
    let stream = d.stream_create(StreamKind::NonBlocking).map_err(s)?;
    let before = match call {
        Foreign::Open => None,
        Foreign::CloseMapped => Some(d.ipc_open_mem_handle(handle).map_err(s)?),
    };
    d.stream_begin_capture(stream, mode).map_err(s)?;
    let (code, mapped) = match (call, before) {
        (Foreign::Open, _) => match d.ipc_open_mem_handle(handle) {
            Ok(p) => (None, Some(p)),
            Err(e) => (e.cuda_code().map(|c| c.0), None),
        },
        (Foreign::CloseMapped, Some(p)) => match d.ipc_close_mem_handle(p) {
            Ok(()) => (None, None),
            Err(e) => (e.cuda_code().map(|c| c.0), Some(p)),
        },
        (Foreign::CloseMapped, None) => (Some(u32::MAX), None),
    };
    let mut ended = end_capture(d, stream)?;
    if let Some(g) = ended.graph.take() {
        d.graph_destroy(g).map_err(s)?;
    }
    if let Some(p) = mapped {
        d.ipc_close_mem_handle(p).map_err(s)?;
    }
    d.stream_destroy(stream).map_err(s)?;
    let want = expected_foreign(call, mode);
    let (ok, got) = (ended.is(code, want, true), ended.describe(code));
    ensure(
        ok,
        format!("foreign {call:?} in {mode:?}: expected {want:?}, got {got}"),
    )
}
