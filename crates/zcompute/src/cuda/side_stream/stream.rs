//! The side stream itself: its stream, its two events and the ordering between it and the
//! engine stream (module docs of `side_stream.rs`); made from a backend there.

use crate::cuda::support::device_error;
use crate::error::Result;
use zdevice::{Device, Driver, Event, Stream};

/// The side stream of one backend's device (see the module docs). Dropping it destroys its
/// events; the stream itself lives as long as the device.
pub struct SideStream<D: Driver> {
    pub(super) device: Device<D>,
    pub(super) engine: Stream,
    pub(super) stream: Stream,
    pub(super) forked: Event,
    pub(super) joined: Event,
}

impl<D: Driver> std::fmt::Debug for SideStream<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SideStream")
            .field("engine", &self.engine)
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

impl<D: Driver> SideStream<D> {
    /// The side stream's handle (to queue work on it: an NCCL collective).
    #[must_use]
    pub fn stream(&self) -> Stream {
        self.stream
    }

    /// The device it belongs to.
    #[must_use]
    pub fn device(&self) -> &Device<D> {
        &self.device
    }

    /// Orders the side stream after everything queued on the engine stream so far.
    ///
    /// # Errors
    /// `Device` from recording or waiting.
    pub fn fork(&self) -> Result<()> {
        const OP: &str = "side_stream.fork";
        self.device
            .record_event(self.forked, self.engine)
            .map_err(|e| device_error(OP, e))?;
        self.device
            .stream_wait_event(self.stream, self.forked)
            .map_err(|e| device_error(OP, e))
    }

    /// Orders the engine stream after everything queued on the side stream so far.
    ///
    /// # Errors
    /// `Device` from recording or waiting.
    pub fn join(&self) -> Result<()> {
        const OP: &str = "side_stream.join";
        self.device
            .record_event(self.joined, self.stream)
            .map_err(|e| device_error(OP, e))?;
        self.device
            .stream_wait_event(self.engine, self.joined)
            .map_err(|e| device_error(OP, e))
    }

    /// Waits, bounded by the device's deadline, until the side stream's work has run.
    ///
    /// # Errors
    /// `Timeout` past the deadline, `Device` for a failure the stream reports.
    pub fn synchronize(&self) -> Result<()> {
        self.device
            .synchronize(self.stream)
            .map_err(|e| device_error("side_stream.synchronize", e))
    }
}

impl<D: Driver> Drop for SideStream<D> {
    fn drop(&mut self) {
        for e in [self.forked, self.joined] {
            if let Err(err) = self.device.destroy_event(e) {
                tracing::debug!(target: "zcompute.cuda.side_stream", error = %err, "event not destroyed");
            }
        }
    }
}
