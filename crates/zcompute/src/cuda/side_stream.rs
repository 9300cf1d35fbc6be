//! A second stream beside the backend's engine stream, for work that overlaps the engine's
//! (the data-parallel gradient all-reduce during backward), usable eagerly and inside a
//! capture alike.
//!
//! Ordering is by events only: [`SideStream::fork`] records an event on the engine stream and
//! makes the side stream wait for it (work queued on the side afterwards sees everything queued
//! on the engine before); [`SideStream::join`] records an event on the side stream and makes
//! the engine stream wait for it (work queued on the engine afterwards sees everything queued on
//! the side before). Inside a capture the driver turns the fork into the side stream joining the
//! capture and the join into the edge that brings it back (CUDA's cross-stream capture; the
//! simulated driver models it, `zdevice::sim`'s capture module): a capture that ends with side
//! work not joined fails (904), so a body must `join` before it ends.
//!
//! The stream and its two events are made when the side stream is (never during a capture); the
//! events are reused by every fork and join: a wait uses the record made just before it.

pub(super) mod stream;

pub use stream::SideStream;

use super::CudaBackend;
use super::support::device_error;
use crate::error::Result;
use zdevice::{Driver, StreamPriority};

impl<D: Driver> SideStream<D> {
    /// A new non-blocking stream on `b`'s device, of CUDA's default priority, and its fork and
    /// join events.
    ///
    /// # Errors
    /// `Device` (`CaptureIllegal` during a capture: make it before) from the driver's calls.
    pub fn new(b: &CudaBackend<D>) -> Result<Self> {
        Self::with_priority(b, StreamPriority::Normal)
    }

    /// As [`SideStream::new`], the stream of priority `priority` against the engine stream's
    /// (`zdevice::DeviceConfig::engine_priority`). A captured graph keeps each kernel's
    /// priority (the backend instantiates with `use_node_priority`).
    ///
    /// # Errors
    /// As [`SideStream::new`].
    pub fn with_priority(b: &CudaBackend<D>, priority: StreamPriority) -> Result<Self> {
        const OP: &str = "side_stream";
        let device = b.device().clone();
        let stream = device
            .create_stream_with_priority(priority)
            .map_err(|e| device_error(OP, e))?;
        let forked = device
            .create_event(false)
            .map_err(|e| device_error(OP, e))?;
        let joined = match device.create_event(false) {
            Ok(e) => e,
            Err(e) => {
                let _ = device.destroy_event(forked);
                return Err(device_error(OP, e));
            }
        };
        tracing::debug!(target: "zcompute.cuda.side_stream", ?stream, "side stream made");
        Ok(SideStream {
            engine: b.inner.stream,
            device,
            stream,
            forked,
            joined,
        })
    }
}

impl SideStream<zdevice::SimDriver> {
    /// Launches `function` (a kernel registered on the simulator outside this crate: the
    /// simulated communicator's) on the side stream, with `tensors`' addresses then `scalars`
    /// as its arguments. Simulator only, as [`super::twins::launch_simulated`] is.
    ///
    /// # Errors
    /// As `launch_simulated`.
    pub fn launch_simulated(
        &self,
        b: &CudaBackend<zdevice::SimDriver>,
        op: &'static str,
        function: zdevice::Function,
        config: zdevice::LaunchConfig,
        tensors: &[&super::CudaTensor],
        scalars: &[zdevice::KernelArg],
    ) -> Result<()> {
        let mut args = Vec::with_capacity(tensors.len() + scalars.len());
        for t in tensors {
            args.push(zdevice::KernelArg::Ptr(b.ptr(op, t)?));
        }
        args.extend_from_slice(scalars);
        b.launch_on_simulator_stream(op, function, config, &args, self.stream)
    }
}
