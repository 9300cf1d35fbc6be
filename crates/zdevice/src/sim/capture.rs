//! Stream capture: the per-stream state machine and THE TABLE of what each call does while a
//! stream captures, transcribed from `docs/capture-rules.md`.
//!
//! State machine: a stream is not capturing → `cuStreamBeginCapture_v2` → Active (mode, owning
//! thread, graph in progress) → an illegal call → Invalidated; `cuStreamEndCapture` ends either
//! (a graph, or 901) and the stream is back to not capturing. At most one stream captures at a
//! time: beginning a second capture is a row the document does not measure, so it is refused.
//!
//! Cross-stream capture (CUDA's fork and join, not in the document): a stream that waits on an
//! event recorded inside the capture joins it, and its later work is captured too (a second
//! stream overlapping the first inside one graph). Every joined stream must be joined back
//! before the capture ends: the capturing stream waits on an event recorded on it after its last
//! captured work; otherwise the end fails with 904 `STREAM_CAPTURE_UNJOINED`, as CUDA's does.
//! The graph holds the nodes in the order they were issued, a valid order for both streams.

use std::thread::ThreadId;

use super::oplog::Effect;
use super::ops::Op;
use super::state::{Cx, LEGACY, State};
use crate::driver::{CuCode, DriverError, DriverResult};
use crate::sim::calls::*;
use crate::types::{CaptureMode, CaptureStatus, DevicePtr, Graph, Stream, StreamKind};

#[derive(Debug)]
pub(crate) struct Capture {
    pub stream: Stream,
    pub kind: StreamKind,
    pub mode: CaptureMode,
    pub owner: ThreadId,
    pub invalidated: bool,
    pub nodes: Vec<Op>,
    /// Operations numbered below this were queued before the capture began.
    pub begin_seq: u64,
    /// Addresses handed out by memory-allocation nodes, and those freed by free nodes.
    pub allocs: Vec<DevicePtr>,
    pub freed: Vec<DevicePtr>,
    /// Streams that joined the capture by waiting on one of its events (fork).
    pub joined: Vec<Joined>,
    /// Events recorded inside the capture on a joined stream: (event, stream, that stream's
    /// work count just after the record).
    pub marks: Vec<(u64, Stream, u64)>,
}

/// A stream that joined a capture: what it captured, and how much of that the capturing stream
/// has waited for.
#[derive(Debug)]
pub(crate) struct Joined {
    pub stream: Stream,
    /// Captured calls on this stream, the fork's wait included.
    pub work: u64,
    /// The `work` count the capturing stream last waited for (joined back up to there).
    pub rejoined: u64,
}

impl Capture {
    /// Whether `s` is the capturing stream or joined the capture.
    pub(crate) fn holds(&self, s: Stream) -> bool {
        self.stream == s || self.joined.iter().any(|j| j.stream == s)
    }

    /// Counts one captured call on `s` if it is a joined stream.
    pub(crate) fn count_work(&mut self, s: Option<Stream>) {
        if let Some(j) = self.joined.iter_mut().find(|j| Some(j.stream) == s) {
            j.work += 1;
        }
    }

    /// The joined streams with captured work the capturing stream has not waited for.
    pub(crate) fn unjoined(&self) -> Vec<Stream> {
        self.joined
            .iter()
            .filter(|j| j.work > j.rejoined)
            .map(|j| j.stream)
            .collect()
    }
}

/// For event queries: when the event was last recorded, relative to the capture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EventStatus {
    NotAnEvent,
    NeverRecorded,
    BeforeCapture,
    InCapture,
}

/// For frees: what the pointer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FreeTarget {
    NotAFree,
    /// A live allocation made outside this capture.
    Live,
    /// Memory from a memory-allocation node of this capture, not yet freed in it.
    CapturedAlloc,
    /// Unknown, stale or already freed.
    Unknown,
}

/// What a call tells the table about itself.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ask {
    pub stream: Option<Stream>,
    pub event: EventStatus,
    pub free: FreeTarget,
}

impl Ask {
    pub(crate) fn none() -> Self {
        Ask {
            stream: None,
            event: EventStatus::NotAnEvent,
            free: FreeTarget::NotAFree,
        }
    }
    pub(crate) fn on(stream: Stream) -> Self {
        Ask {
            stream: Some(stream),
            ..Ask::none()
        }
    }
    pub(crate) fn event(event: EventStatus) -> Self {
        Ask {
            event,
            ..Ask::none()
        }
    }
    pub(crate) fn free(free: FreeTarget, stream: Option<Stream>) -> Self {
        Ask {
            free,
            stream,
            ..Ask::none()
        }
    }
}

/// Everything a row of the table depends on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct View {
    pub mode: CaptureMode,
    /// Kind of the capturing stream.
    pub kind: StreamKind,
    /// The call names the capturing stream (or, for cuBLAS, its handle is bound to it).
    pub on_capturing_stream: bool,
    /// Global mode, or thread-local mode and the caller is the capturing thread: the modes in
    /// which CUDA refuses "potentially unsafe" calls.
    pub refuses_unsafe: bool,
    pub invalidated: bool,
    pub event: EventStatus,
    pub free: FreeTarget,
}

/// The answer of a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Behave as outside capture.
    Run,
    /// Succeed and run now; the work is not in the graph ("silent" rows).
    Silent,
    /// Add the work to the graph instead of running it.
    Capture,
    /// Fail with `code`; invalidate the capture if `invalidate`.
    Fail { code: CuCode, invalidate: bool },
    /// Not covered by the document: refuse by name.
    NotModelled,
    /// The stream joins the capture (it waits on an event recorded inside it).
    Join,
}

const UNSUPPORTED: Outcome = Outcome::Fail {
    code: CuCode::STREAM_CAPTURE_UNSUPPORTED,
    invalidate: true,
};
const IMPLICIT: Outcome = Outcome::Fail {
    code: CuCode::STREAM_CAPTURE_IMPLICIT,
    invalidate: true,
};

/// THE TABLE: what `call` does while a stream captures. Each arm cites its row of
/// docs/capture-rules.md; anything not listed is refused as not modelled.
pub(crate) fn rule(call: &str, v: &View) -> Outcome {
    use CaptureMode::Global;
    use Outcome::*;
    use StreamKind::{Blocking, NonBlocking};
    // A row marked "same as global" for thread_local, and "success" for relaxed: CUDA refuses
    // these potentially unsafe calls only where `refuses_unsafe` holds.
    let unsafe_call = if v.refuses_unsafe { UNSUPPORTED } else { Run };
    // Rows "captured" / "a node": work on the capturing stream joins the graph. On an
    // invalidated capture CUDA answers 901 instead (the documented meaning of that code).
    let captured = if !v.on_capturing_stream {
        NotModelled
    } else if v.invalidated {
        Fail {
            code: CuCode::STREAM_CAPTURE_INVALIDATED,
            invalidate: false,
        }
    } else {
        Capture
    };
    match call {
        // "cuMemGetInfo | success | same | same". Querying capture status is what the
        // measurement itself did after every call.
        MEM_GET_INFO | STREAM_IS_CAPTURING => Run,
        // Not in the document: binding a thread to the primary context submits, waits for and
        // allocates nothing, and the device binds waiter threads while a capture runs. The
        // conformance test `waiter_does_not_invalidate_capture` checks this row on the GPU.
        CTX_SET_CURRENT => Run,
        // Not in the document: measured with zdevice's capture-rules harness (rules.rs) on 2x
        // NVIDIA H200, driver 580.159.04 (sixteenth session): making a non-blocking stream, with
        // or without a priority, and asking the context's priority range succeed in every mode
        // and leave the capture active with no node.
        STREAM_CREATE | STREAM_CREATE_WITH_PRIORITY | STREAM_PRIORITY_RANGE => Run,
        // Not in the document: measured with the same harness on 2x NVIDIA H100 80GB HBM3,
        // driver 580.159.04 (twentieth session; rules.rs `IpcExport`, `IpcOpenOwn`,
        // `IpcCloseUnopened`, and a second process's `Foreign` rows): the three IPC calls
        // answer as outside capture in every mode (export and a peer's open and close
        // succeed; opening a handle of one's own is 201, closing an address never opened 1)
        // and leave the capture active with no node. The device refuses them during capture
        // all the same (they run now and are not replayed).
        IPC_GET_MEM_HANDLE | IPC_OPEN_MEM_HANDLE | IPC_CLOSE_MEM_HANDLE => Run,
        // Not in the document, and not measured yet (issue 44): asking where kernels see a
        // page-locked host allocation submits, waits for and allocates nothing, so it is
        // expected to answer as outside capture in every mode and leave the capture active
        // with no node. The GPU test `gpu_a_peer_wait_gives_up_from_the_host` makes the call
        // outside capture only.
        MEM_HOST_GET_DEVICE_POINTER => Run,
        // "cuMemAlloc | 900, invalidated, end 901 | same as global | success"; likewise
        // cuMemAllocManaged and cuMemAllocHost.
        MEM_ALLOC | MEM_ALLOC_MANAGED | MEM_ALLOC_HOST => unsafe_call,
        // "cuMemFree of a live allocation | 900, invalidated, end 901 (relaxed mode: success)".
        // Thread-local mode was not measured; CUDA classes cuMemFree with cuMemAlloc.
        MEM_FREE if v.free == FreeTarget::Live => unsafe_call,
        // "cuMemcpyHtoD / cuMemcpyDtoH / cuMemsetD8 (synchronous) | silent | same | same", and
        // the second table: a blocking capturing stream gives 906 for cuMemsetD8 and
        // cuMemcpyHtoD (global mode only measured; cuMemcpyDtoH not measured there).
        MEMCPY_HTOD | MEMCPY_DTOH | MEMSET_D8 => match (v.kind, v.mode, call) {
            (NonBlocking, _, _) => Silent,
            (Blocking, Global, MEMCPY_HTOD | MEMSET_D8) => IMPLICIT,
            _ => NotModelled,
        },
        // "cuMemcpyDtoD (synchronous) | silent: 0 nodes | 906, invalidated" (global mode only).
        MEMCPY_DTOD => match (v.kind, v.mode) {
            (NonBlocking, Global) => Silent,
            (Blocking, Global) => IMPLICIT,
            _ => NotModelled,
        },
        // "cuMemcpyHtoDAsync on the capturing stream | captured as a node", "cuMemsetD8Async |
        // captured", "cuEventRecord on the capturing stream | captured", "cuMemAllocAsync on the
        // capturing stream | a memory-allocation node", cublasSgemm on a handle bound to the
        // capturing stream: captured (node counts in blas.rs); kernel launches and the other
        // asynchronous copies and memsets are captured the same way (issue text).
        MEMCPY_HTOD_ASYNC
        | MEMCPY_DTOH_ASYNC
        | MEMCPY_DTOD_ASYNC
        | MEMSET_D8_ASYNC
        | MEMSET_D32_ASYNC
        | LAUNCH_KERNEL
        | EVENT_RECORD
        | MEM_ALLOC_ASYNC
        | GEMM_STRIDED_BATCHED
        | GEMM_STRIDED_BATCHED_EX => captured,
        // The "matching free inside the graph" of the memory-node paragraph.
        MEM_FREE_ASYNC if v.free == FreeTarget::CapturedAlloc => captured,
        // "cuStreamSynchronize / cuCtxSynchronize / cuStreamQuery | 900, invalidated | same |
        // same" (measured on the capturing stream).
        STREAM_SYNCHRONIZE | STREAM_QUERY if v.on_capturing_stream => UNSUPPORTED,
        CTX_SYNCHRONIZE => UNSUPPORTED,
        // "cuEventQuery / cuEventSynchronize (event recorded before capture) | 900,
        // invalidated | same | success".
        EVENT_QUERY | EVENT_SYNCHRONIZE if v.event == EventStatus::BeforeCapture => unsafe_call,
        // Cross-stream capture (see the module docs): a wait on an event recorded inside the
        // capture is a dependency for a stream in the capture and a fork for any other. A
        // stream outside the capture waiting on an event outside it is unrelated to it.
        STREAM_WAIT_EVENT => match (v.event, v.on_capturing_stream) {
            (EventStatus::InCapture, true) => captured,
            (EventStatus::InCapture, false) if v.invalidated => Fail {
                code: CuCode::STREAM_CAPTURE_INVALIDATED,
                invalidate: false,
            },
            (EventStatus::InCapture, false) => Join,
            (_, false) => Run,
            (_, true) => NotModelled,
        },
        _ => NotModelled,
    }
}

/// What the caller should do after the gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gate {
    Run,
    Silent,
    Capture,
    /// The call's stream joins the capture (only `cuStreamWaitEvent`).
    Join,
}

impl State {
    /// Applies the table to the current call. Refusals leave the capture as the row says
    /// (invalidated or untouched) and return the error.
    pub(crate) fn gate(&mut self, cx: &mut Cx, ask: Ask) -> DriverResult<Gate> {
        let Some(c) = self.capture.as_mut() else {
            return Ok(Gate::Run);
        };
        let view = View {
            mode: c.mode,
            kind: c.kind,
            on_capturing_stream: ask.stream.is_some_and(|s| c.holds(s)),
            refuses_unsafe: match c.mode {
                CaptureMode::Global => true,
                CaptureMode::ThreadLocal => cx.thread == c.owner,
                CaptureMode::Relaxed => false,
            },
            invalidated: c.invalidated,
            event: ask.event,
            free: ask.free,
        };
        match rule(cx.call, &view) {
            Outcome::Run => Ok(Gate::Run),
            Outcome::Silent => {
                cx.effect = Effect::Silent;
                Ok(Gate::Silent)
            }
            Outcome::Capture => {
                c.count_work(ask.stream);
                Ok(Gate::Capture)
            }
            Outcome::Join => Ok(Gate::Join),
            Outcome::Fail { code, invalidate } => {
                c.invalidated |= invalidate;
                cx.effect = Effect::Refused;
                Err(cx.cuda(code))
            }
            Outcome::NotModelled => {
                cx.effect = Effect::Refused;
                tracing::debug!(call = cx.call, "refused during capture: not modelled");
                Err(DriverError::NotModelled { call: cx.call })
            }
        }
    }

    /// Appends nodes to the capture in progress.
    pub(crate) fn capture_nodes(&mut self, cx: &mut Cx, nodes: Vec<Op>) {
        if let Some(c) = self.capture.as_mut() {
            cx.effect = Effect::Captured(nodes.len());
            c.nodes.extend(nodes);
        }
    }

    pub(crate) fn begin_capture(
        &mut self,
        cx: &mut Cx,
        s: Stream,
        mode: CaptureMode,
    ) -> DriverResult<()> {
        self.gate(cx, Ask::on(s))?;
        let kind = self
            .streams
            .get(&s.0)
            .ok_or(cx.cuda(CuCode::INVALID_HANDLE))?
            .kind;
        if s == LEGACY {
            // The legacy stream cannot be captured.
            return Err(cx.cuda(CuCode::STREAM_CAPTURE_UNSUPPORTED));
        }
        self.capture = Some(Capture {
            stream: s,
            kind,
            mode,
            owner: cx.thread,
            invalidated: false,
            nodes: Vec::new(),
            begin_seq: self.next_seq,
            allocs: Vec::new(),
            freed: Vec::new(),
            joined: Vec::new(),
            marks: Vec::new(),
        });
        Ok(())
    }

    /// Ends the capture on `s`: the graph, or 901 if it was invalidated (it ends either way).
    /// Ending a non-relaxed capture from another thread is 908 WRONG_THREAD (CUDA's documented
    /// meaning of that code) and leaves the capture running.
    pub(crate) fn end_capture(&mut self, cx: &mut Cx, s: Stream) -> DriverResult<Graph> {
        match &self.capture {
            Some(c) if c.stream == s => {
                if c.mode != CaptureMode::Relaxed && c.owner != cx.thread {
                    return Err(cx.cuda(CuCode::STREAM_CAPTURE_WRONG_THREAD));
                }
            }
            Some(_) => {
                self.gate(cx, Ask::on(s))?;
            }
            None => {
                self.stream_exists(cx, s)?;
                return Err(cx.cuda(CuCode::ILLEGAL_STATE));
            }
        }
        let Some(c) = self.capture.take() else {
            return Err(cx.cuda(CuCode::ILLEGAL_STATE));
        };
        let unjoined = c.unjoined();
        if c.invalidated || !unjoined.is_empty() {
            for p in &c.allocs {
                if let Some((base, _)) = self.mem.find_base(*p) {
                    self.mem.release(base);
                }
            }
            if c.invalidated {
                return Err(cx.cuda(CuCode::STREAM_CAPTURE_INVALIDATED));
            }
            tracing::debug!(?unjoined, "capture ended with streams not joined back");
            return Err(cx.cuda(CuCode::STREAM_CAPTURE_UNJOINED));
        }
        Ok(self.graph_from_capture(c))
    }

    pub(crate) fn is_capturing(&mut self, cx: &mut Cx, s: Stream) -> DriverResult<CaptureStatus> {
        self.stream_exists(cx, s)?;
        Ok(match &self.capture {
            Some(c) if c.holds(s) && c.invalidated => CaptureStatus::Invalidated,
            Some(c) if c.holds(s) => CaptureStatus::Active,
            _ => CaptureStatus::None,
        })
    }
}
