//! The one capture entry point of the CUDA backend (`Capture::capture`).
//!
//! 1. Warm-up: the body runs once for real while zmem records every allocation size (the
//!    plan). Uploads, downloads, syncs and step changes are refused from here on.
//! 2. A reservation of exactly the plan's bytes is made (before capture: it allocates).
//! 3. The arena routes every allocation into the reservation, the device begins a global-mode
//!    capture on the engine stream, and the body runs again: its launches, gemms, async copies
//!    and memsets become graph nodes, its allocations come from the reservation. The capture
//!    ends whatever the body returned; the body and the end together must finish within the
//!    device's sync deadline (zdevice judges it: a late end is `Timeout` and the device lost).
//!    An end that fails while the driver still captures is retried once by dropping the
//!    capture; if the driver still will not stop, zdevice marks the device lost rather than
//!    let eager work run under a capturing stream.
//! 4. Tensors the warm-up allocated and that are still held when it returns (the body stored
//!    them outside) are paired, in allocation order, with the captured run's tensors, and
//!    their values copied over (stream-ordered, device to device). So after `capture`
//!    returns, a tensor the body stored outside holds the warm-up's result, as on the CPU
//!    backend, instead of the graph's not-yet-run memory; each replay then overwrites it.
//! 5. The graph is instantiated (bounded by the device's build deadline).
//!
//! `capture_in_pool` does the same with the reservation a member of a `zmem::GraphPool`
//! (memory shared with graphs the caller never runs at the same time as this one). A body
//! that stores tensors it allocated is refused there after step 1 (`CaptureOutputInPool`):
//! step 4 would leave them in memory the other members overwrite.
//!
//! The graph owns its reservation, every block its nodes touched (retained in the
//! reservation) and the body (with the tensors it holds), so no address baked into the graph
//! is handed out again while the graph lives. Any failure ends the capture, drops what it
//! made, and leaves the backend eager.
//!
//! Which of these steps is under way is the device's capture session's phase (opened in step
//! 1, `Reserved` once zmem routes the reservation in step 3, `Capturing` while the stream
//! captures); the backend reads it and keeps only what its ops collect (`CaptureLog`).

use std::sync::Arc;

use super::{CaptureLog, CudaBackend, CudaStorage, device_error, lock, mem_error};
use crate::capture::Capture;
use crate::error::{ComputeError, Result};
use zdevice::{
    CaptureSession, CapturedGraph, DeviceError, Driver, GraphInstance, InstantiateFlags,
};
use zmem::{Arena, Block, CapturePlan, CaptureReservation, GraphPool, MemResult};

/// A captured, instantiated sequence of ops. Replay with `Capture::replay`; refill inputs with
/// `upload_into`/`copy_into` between replays.
pub struct CudaGraph<D: Driver> {
    // Field order is drop order: the executable graph goes before the memory it uses.
    exec: GraphInstance<D>,
    _graph: CapturedGraph<D>,
    reservation: CaptureReservation,
    _body: Box<dyn FnMut() -> Result<()>>,
    nodes: usize,
    replays: u64,
}

impl<D: Driver> CudaGraph<D> {
    /// Nodes in the captured graph.
    #[must_use]
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// How many times it was replayed.
    #[must_use]
    pub fn replays(&self) -> u64 {
        self.replays
    }

    /// Bytes of the graph's capture reservation (shared with the other members of its pool
    /// for a graph captured by `capture_in_pool`).
    #[must_use]
    pub fn reserved_bytes(&self) -> u64 {
        self.reservation.bytes()
    }
}

impl<D: Driver> std::fmt::Debug for CudaGraph<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaGraph")
            .field("nodes", &self.nodes)
            .field("replays", &self.replays)
            .field("reservation", &self.reservation)
            .finish_non_exhaustive()
    }
}

/// Wraps what failed at `stage` of a capture as the capture's failure (the backend is eager).
fn failed(stage: &'static str) -> impl Fn(ComputeError) -> ComputeError {
    move |e| ComputeError::CaptureFailed {
        stage,
        source: Box::new(e),
    }
}

/// A `capture` call under way: the device's capture session and this backend's log. Dropping
/// it (also on early returns) drops the log and closes the session: the backend is eager.
struct Session<'a, D: Driver> {
    backend: &'a CudaBackend<D>,
    _device: CaptureSession<'a, D>,
}

impl<'a, D: Driver> Session<'a, D> {
    fn open(backend: &'a CudaBackend<D>) -> Result<Session<'a, D>> {
        let device = backend
            .inner
            .device
            .open_capture_session()
            .map_err(|e| match e {
                DeviceError::CaptureIllegal { .. } => ComputeError::CaptureIllegal {
                    op: "capture",
                    why: "captures do not nest".to_string(),
                },
                other => device_error("capture", other),
            })?;
        *lock(&backend.inner.capture_log) = Some(CaptureLog::default());
        Ok(Session {
            backend,
            _device: device,
        })
    }

    /// Takes what the warm-up allocated: those still held, by index, and how many there were.
    fn take_warm_up(&self) -> (Survivors, usize) {
        let made = lock(&self.backend.inner.capture_log)
            .as_mut()
            .map(|log| std::mem::take(&mut log.warm_up))
            .unwrap_or_default();
        let survivors = made
            .iter()
            .enumerate()
            .filter_map(|(i, w)| w.upgrade().map(|b| (i, b)))
            .collect();
        (survivors, made.len())
    }
}

impl<D: Driver> Drop for Session<'_, D> {
    fn drop(&mut self) {
        // Before the device session closes (the field is dropped after this).
        *lock(&self.backend.inner.capture_log) = None;
    }
}

/// The warm-up's tensors still held when it returned, by their index in allocation order.
type Survivors = Vec<(usize, Arc<Block>)>;

impl<D: Driver> CudaBackend<D> {
    /// Step 3: routes the arena into `reservation`, captures the body's second run on the
    /// engine stream, and hands the graph every block the run touched. The capture ends
    /// whatever the body returned.
    fn captured_run(
        &self,
        body: &mut Box<dyn FnMut() -> Result<()>>,
        reservation: &CaptureReservation,
        survivors: &Survivors,
        warm_allocations: usize,
    ) -> Result<CapturedGraph<D>> {
        let scope = self
            .inner
            .arena
            .capture_into(reservation)
            .map_err(|e| failed("activating the reservation")(mem_error("capture", e)))?;
        let cap = self
            .inner
            .device
            .begin_capture(self.inner.stream)
            .map_err(|e| failed("beginning the capture")(device_error("capture", e)))?;
        let ran = body();
        // A capture the driver still runs after a failed end is dropped inside `into_error`:
        // ended then, or the device marked lost (never left unguarded).
        let ended = cap.end().map_err(|e| end_failed(e.into_error()));
        let run = lock(&self.inner.capture_log)
            .as_mut()
            .map(|log| std::mem::take(&mut log.run))
            .unwrap_or_default();
        drop(scope);
        ran?;
        let graph = ended?;
        for block in &run.used {
            reservation.retain(block);
        }
        self.fill_from_warm_up(survivors, warm_allocations, &run.allocated)?;
        Ok(graph)
    }

    /// Copies each warm-up tensor still held into its counterpart of the captured run (see the
    /// module docs, step 4). The runs must have allocated alike; a body that did not is refused.
    fn fill_from_warm_up(
        &self,
        survivors: &Survivors,
        warm_allocations: usize,
        captured: &[CudaStorage],
    ) -> Result<()> {
        if survivors.is_empty() {
            return Ok(());
        }
        let mismatch = |detail: String| {
            failed("pairing the captured run with its warm-up")(ComputeError::CaptureRunsDiffer {
                detail,
            })
        };
        if captured.len() != warm_allocations {
            return Err(mismatch(format!(
                "the warm-up allocated {warm_allocations} tensors and the captured run {}; a captured body must allocate the same tensors on every run",
                captured.len()
            )));
        }
        let (arena, device, stream) = (&self.inner.arena, &self.inner.device, self.inner.stream);
        for (i, warm) in survivors {
            let dst = captured[*i].block();
            if dst.requested() != warm.requested() {
                return Err(mismatch(format!(
                    "allocation {i} was {} bytes in the warm-up and {} in the captured run",
                    warm.requested(),
                    dst.requested()
                )));
            }
            let src = arena.resolve(warm).map_err(|e| mem_error("capture", e))?;
            let dst = arena.resolve(dst).map_err(|e| mem_error("capture", e))?;
            device
                .copy_dtod_async(dst, src, warm.requested(), stream)
                .map_err(|e| device_error("capture", e))?;
        }
        Ok(())
    }
}

impl<D: Driver> CudaBackend<D> {
    /// The capture (module docs), its memory reserved by `reserve` from the recorded plan:
    /// the graph's own, or (`pooled`) a graph pool member's. A pooled body that stores tensors
    /// it allocated is refused after its warm-up: they would live in the shared memory.
    fn capture_reserving(
        &self,
        mut body: Box<dyn FnMut() -> Result<()>>,
        pooled: bool,
        reserve: impl FnOnce(&Arena<D>, &CapturePlan) -> MemResult<CaptureReservation>,
    ) -> Result<CudaGraph<D>> {
        self.refuse_in_capture("capture", "captures do not nest")?;
        let arena = &self.inner.arena;
        let session = Session::open(self)?;

        let (warm, plan) = arena
            .record_plan(&mut body)
            .map_err(|e| mem_error("capture", e))?;
        warm?;
        let (survivors, warm_allocations) = session.take_warm_up();
        if pooled && !survivors.is_empty() {
            return Err(failed("checking what the pooled body keeps")(
                ComputeError::CaptureOutputInPool {
                    tensors: survivors.len(),
                },
            ));
        }
        // Still warming up as far as the refusals go, until the captured run starts.
        let reservation = reserve(arena, &plan)
            .map_err(|e| failed("reserving memory")(mem_error("capture", e)))?;
        let graph = self.captured_run(&mut body, &reservation, &survivors, warm_allocations)?;
        drop(survivors);
        drop(session);

        // Each kernel at the priority of the stream it was captured from (a side stream's
        // collectives against the engine's work), as when it ran eagerly.
        let exec = graph
            .instantiate(InstantiateFlags {
                use_node_priority: true,
                ..InstantiateFlags::default()
            })
            .map_err(|e| failed("instantiating the graph")(device_error("capture", e)))?;
        let nodes = graph.node_count().map_err(|e| device_error("capture", e))?;
        tracing::info!(
            target: "zcompute.cuda.capture",
            nodes,
            reserved = reservation.bytes(),
            pooled = reservation.is_pool_member(),
            requests = plan.requests().len(),
            "graph captured"
        );
        Ok(CudaGraph {
            exec,
            _graph: graph,
            reservation,
            _body: body,
            nodes,
            replays: 0,
        })
    }
}

/// What a failed end of capture means to the caller: a deadline overrun or a lost device as
/// such (the device is gone), an invalidated capture as such (the body made a call the driver
/// cannot record), anything else a failed capture with the backend eager.
fn end_failed(e: DeviceError) -> ComputeError {
    match e {
        DeviceError::Timeout { .. }
        | DeviceError::DeviceLost { .. }
        | DeviceError::CaptureInvalidated { .. } => device_error("capture", e),
        other => failed("ending the capture")(device_error("capture", other)),
    }
}

impl<D: Driver> Capture<f32> for CudaBackend<D> {
    type Graph = CudaGraph<D>;

    fn capture(&self, body: Box<dyn FnMut() -> Result<()>>) -> Result<CudaGraph<D>> {
        self.capture_reserving(body, false, |arena, plan| arena.reserve_for_capture(plan))
    }

    fn capture_in_pool(
        &self,
        pool: &GraphPool,
        body: Box<dyn FnMut() -> Result<()>>,
    ) -> Result<CudaGraph<D>> {
        self.capture_reserving(body, true, |arena, plan| arena.reserve_in_pool(pool, plan))
    }

    fn replay(&self, graph: &mut CudaGraph<D>) -> Result<()> {
        self.refuse_in_capture("replay", "replay after the capture has ended")?;
        graph
            .exec
            .launch(self.inner.stream)
            .map_err(|e| device_error("replay", e))?;
        graph.replays += 1;
        Ok(())
    }
}
