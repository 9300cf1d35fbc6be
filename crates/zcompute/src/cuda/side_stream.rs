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
//!
//! A few of the backend's kernels can be queued on the side stream too ([`SideStream::binary_into`],
//! [`SideStream::sum_squares_into`]): work that belongs beside the collectives queued there (the
//! data-parallel step's scaled loss before its first bucket, a bucket's norm partials after its
//! all-reduce). They allocate nothing (the arena reuses memory in the engine stream's order, which
//! this stream is not), and the side stream holds every tensor they touch until its next `join`
//! has ordered the engine stream after them, so no block they use is freed for reuse before they
//! have run.

use super::kernels::{self, Args, Kernel, ptr, u64a};
use super::{CudaBackend, CudaTensor, device_error, lock};
use crate::backend::BinaryOp;
use crate::error::{ComputeError, Result};
use crate::validate;
use std::sync::Mutex;
use zdevice::{Device, Driver, Event, KernelArg, Stream, StreamPriority};

/// The side stream of one backend's device (see the module docs). Dropping it destroys its
/// events; the stream itself lives as long as the device.
pub struct SideStream<D: Driver> {
    device: Device<D>,
    engine: Stream,
    stream: Stream,
    forked: Event,
    joined: Event,
    /// The tensors kernels queued here touch, held until the next `join` (see the module docs).
    held: Mutex<Vec<CudaTensor>>,
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
            held: Mutex::new(Vec::new()),
        })
    }

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

    /// Orders the engine stream after everything queued on the side stream so far, and lets
    /// go of the tensors the side stream's kernels held (the engine stream reuses their memory
    /// only after this wait).
    ///
    /// # Errors
    /// `Device` from recording or waiting (the tensors stay held then).
    pub fn join(&self) -> Result<()> {
        const OP: &str = "side_stream.join";
        self.device
            .record_event(self.joined, self.stream)
            .map_err(|e| device_error(OP, e))?;
        self.device
            .stream_wait_event(self.engine, self.joined)
            .map_err(|e| device_error(OP, e))?;
        lock(&self.held).clear();
        Ok(())
    }

    /// `out = a op c` elementwise on the side stream, for dense `a`, `c` and `out` of one shape
    /// on `b`'s device (`out` other memory than both): as the backend's `binary_into`, after
    /// the side stream's work so far (call [`SideStream::fork`] first for what the engine
    /// stream produced). Allocates nothing.
    ///
    /// # Errors
    /// `ShapeMismatch` for operands of other shapes, `NotContiguous` for a view, `Aliased`,
    /// `Unsupported` for a backend of another device, `Device` from the launch.
    pub fn binary_into(
        &self,
        b: &CudaBackend<D>,
        op: BinaryOp,
        a: &CudaTensor,
        c: &CudaTensor,
        out: &CudaTensor,
    ) -> Result<()> {
        let name = validate::binary_name(op);
        self.same_device(b, name)?;
        validate::binary_into(op, a, c, out)?;
        for (t, other) in [(a, out), (c, out)] {
            if t.shape() != other.shape() {
                return Err(ComputeError::ShapeMismatch {
                    op: name,
                    lhs: t.shape().into(),
                    rhs: other.shape().into(),
                });
            }
        }
        for t in [a, c, out] {
            dense(name, t)?;
        }
        let n = out.numel();
        if n == 0 {
            return Ok(());
        }
        let args: Args = [
            ptr(b.ptr(name, out)?),
            ptr(b.ptr(name, a)?),
            ptr(b.ptr(name, c)?),
            KernelArg::U32(kernels::binary_code(op)),
            u64a(n),
        ]
        .into_iter()
        .collect();
        self.launch(
            b,
            name,
            Kernel::Binary,
            kernels::elementwise_config(n),
            &args,
            [a, c, out],
        )
    }

    /// The backend's `sum_squares_into` (a norm's first pass over dense `x`, a partial sum for
    /// each of `parts`' 1 to `MAX_NORM_PARTS` elements) on the side stream, after its work so
    /// far (a bucket's all-reduce queued there). Allocates nothing.
    ///
    /// # Errors
    /// As `Backend::sum_squares_into`; `Unsupported` for a backend of another device, `Device`
    /// from the launch.
    pub fn sum_squares_into(
        &self,
        b: &CudaBackend<D>,
        x: &CudaTensor,
        parts: &CudaTensor,
    ) -> Result<()> {
        const OP: &str = "sum_squares_into";
        self.same_device(b, OP)?;
        validate::sum_squares_into(x, parts)?;
        let (grid, args) = b.sum_squares_launch(OP, x, parts)?;
        self.launch(
            b,
            OP,
            Kernel::SumSquaresPartial,
            grid,
            &args,
            [x, parts, parts],
        )
    }

    /// Queues `kernel` here and holds `touched` until the next join.
    fn launch(
        &self,
        b: &CudaBackend<D>,
        op: &'static str,
        kernel: Kernel,
        config: zdevice::LaunchConfig,
        args: &Args,
        touched: [&CudaTensor; 3],
    ) -> Result<()> {
        // Held before the launch: whatever happens to the launch, nothing it may read is freed
        // for reuse before the join.
        lock(&self.held).extend(touched.into_iter().cloned());
        b.launch_beside(op, kernel, config, args, self.stream)
    }

    /// Refuses a backend of another device than the side stream's.
    fn same_device(&self, b: &CudaBackend<D>, op: &'static str) -> Result<()> {
        if b.device().context() == self.device.context() {
            return Ok(());
        }
        Err(ComputeError::Unsupported {
            op,
            reason: format!(
                "the backend is on device {}, the side stream on device {}",
                b.device().info().ordinal,
                self.device.info().ordinal
            ),
        })
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

/// Refuses a view: the side stream's kernels address dense memory.
fn dense(op: &'static str, t: &CudaTensor) -> Result<()> {
    if t.is_contiguous() {
        return Ok(());
    }
    Err(ComputeError::NotContiguous {
        op,
        shape: t.shape().into(),
        strides: t.layout().strides().into(),
    })
}

impl<D: Driver> Drop for SideStream<D> {
    fn drop(&mut self) {
        let held = std::mem::take(&mut *lock(&self.held));
        if !held.is_empty() {
            // Kernels never joined back: their tensors go back to the arena only once they
            // have run (bounded by the device's deadline; a failure is the step's to report).
            if let Err(err) = self.device.synchronize(self.stream) {
                tracing::warn!(target: "zcompute.cuda.side_stream", error = %err, "side stream not drained before its tensors were let go");
            }
        }
        drop(held);
        for e in [self.forked, self.joined] {
            if let Err(err) = self.device.destroy_event(e) {
                tracing::debug!(target: "zcompute.cuda.side_stream", error = %err, "event not destroyed");
            }
        }
    }
}
