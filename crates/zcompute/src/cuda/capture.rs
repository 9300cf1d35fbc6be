//! The one capture entry point of the CUDA backend (`Capture::capture`).
//!
//! 1. Warm-up: the body runs once for real while zmem records every allocation size (the
//!    plan). Uploads, downloads, syncs and step changes are refused from here on.
//! 2. A reservation of exactly the plan's bytes is made (before capture: it allocates).
//! 3. The arena routes every allocation into the reservation, the device begins a global-mode
//!    capture on the engine stream, and the body runs again: its launches, gemms, async copies
//!    and memsets become graph nodes, its allocations come from the reservation. The capture
//!    ends whatever the body returned, and must finish within the device's sync deadline.
//! 4. The graph is instantiated (bounded by the device's build deadline).
//!
//! The graph owns its reservation, every block its nodes touched (retained in the
//! reservation) and the body (with the tensors it holds), so no address baked into the graph
//! is handed out again while the graph lives. Any failure ends the capture, drops what it
//! made, and leaves the backend eager.

use super::{CaptureState, CudaBackend, device_error, lock, mem_error};
use crate::backend::Capture;
use crate::error::{ComputeError, Result};
use zdevice::{CapturedGraph, Driver, GraphInstance, InstantiateFlags};
use zmem::CaptureReservation;

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

    /// Bytes of the graph's capture reservation.
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

fn failed(stage: &'static str) -> impl Fn(String) -> ComputeError {
    move |detail| ComputeError::CaptureFailed { stage, detail }
}

/// Puts the backend back to eager mode when dropped (also on early returns).
struct Eager<'a, D: Driver>(&'a CudaBackend<D>);

impl<D: Driver> Drop for Eager<'_, D> {
    fn drop(&mut self) {
        *lock(&self.0.inner.capture) = CaptureState::Off;
    }
}

impl<D: Driver> Capture<f32> for CudaBackend<D> {
    type Graph = CudaGraph<D>;

    fn capture(&self, mut body: Box<dyn FnMut() -> Result<()>>) -> Result<CudaGraph<D>> {
        self.refuse_in_capture("capture", "captures do not nest")?;
        let arena = &self.inner.arena;
        let device = &self.inner.device;
        let eager = Eager(self);
        *lock(&self.inner.capture) = CaptureState::WarmUp;

        let (warm, plan) = arena
            .record_plan(&mut body)
            .map_err(|e| mem_error("capture", e))?;
        warm?;
        let reservation = arena
            .reserve_for_capture(&plan)
            .map_err(|e| failed("reserving memory")(mem_error("capture", e).to_string()))?;

        let graph = {
            let scope = arena
                .capture_into(&reservation)
                .map_err(|e| failed("activating the reservation")(e.to_string()))?;
            *lock(&self.inner.capture) = CaptureState::On(Vec::new());
            let cap = device
                .begin_capture(self.inner.stream)
                .map_err(|e| failed("beginning the capture")(e.to_string()))?;
            let t0 = device.driver().now();
            let ran = body();
            let elapsed = device.driver().now().saturating_sub(t0);
            let ended = cap.end();
            let used = match std::mem::take(&mut *lock(&self.inner.capture)) {
                CaptureState::On(used) => used,
                _ => Vec::new(),
            };
            drop(scope);
            ran?;
            let graph = ended.map_err(|e| failed("ending the capture")(e.to_string()))?;
            let deadline = device.config().sync_deadline;
            if elapsed > deadline {
                return Err(failed("capturing")(format!(
                    "the captured run took {elapsed:?}, over the deadline of {deadline:?}"
                )));
            }
            for block in &used {
                reservation.retain(block);
            }
            graph
        };
        drop(eager);

        let exec = graph
            .instantiate(InstantiateFlags::default())
            .map_err(|e| failed("instantiating the graph")(e.to_string()))?;
        let nodes = graph.node_count().map_err(|e| device_error("capture", e))?;
        tracing::info!(
            target: "zcompute.cuda.capture",
            nodes,
            reserved = reservation.bytes(),
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
