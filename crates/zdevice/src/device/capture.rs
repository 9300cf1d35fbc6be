//! Stream capture and graphs: one way in (`Device::begin_capture`), one way out
//! (`StreamCapture::end` or drop), and graphs that own their driver handles.
//!
//! The guard (refusal of synchronous calls, hold-off of other threads' polls) stays on for as
//! long as the driver captures: a failed end that leaves the driver capturing hands the
//! `StreamCapture` back, and a drop that cannot end it marks the device lost rather than switch
//! the guard off under a capturing stream.

use std::marker::PhantomData;
use std::time::Duration;

use crate::driver::{CuCode, Driver};
use crate::error::{DeviceError, DeviceResult};
use crate::types::*;

use super::Device;

const END_CAPTURE: &str = "cuStreamEndCapture";

/// An active global-mode capture on one stream. While it lives, the device refuses synchronous
/// copies, memsets, allocations and frees, and other threads hold off their waits. End it with
/// [`StreamCapture::end`]; dropping it ends the capture and discards the graph, leaving the
/// device usable (or, if the driver cannot be made to stop capturing, lost).
///
/// The capture and its end belong to the thread that began it: the driver answers
/// `cuStreamEndCapture` from any other thread with 908 (wrong thread) and keeps capturing. So a
/// `StreamCapture` is not `Send`:
///
/// ```compile_fail
/// fn needs_send<T: Send>(_: T) {}
/// fn try_to_move(cap: zdevice::StreamCapture<'_, zdevice::SimDriver>) {
///     needs_send(cap); // error: `*const ()` cannot be sent between threads safely
/// }
/// ```
///
/// # Deadline
/// The body and the end together are judged against the device's sync deadline, on the
/// driver's clock, from the moment the capture began. The end call itself runs on this thread
/// (a watchdog thread would get 908), so a driver that never returns keeps this thread; one
/// that returns late gives `Timeout` naming `cuStreamEndCapture` and the device is lost, as
/// after any driver call that overran its deadline.
#[derive(Debug)]
pub struct StreamCapture<'d, D: Driver> {
    device: &'d Device<D>,
    stream: Stream,
    /// When the capture began, on the driver's clock.
    began: Duration,
    /// The driver no longer captures (ended, or found not capturing): drop has nothing to do.
    finished: bool,
    /// Not `Send`/`Sync`: see the type's docs.
    _this_thread: PhantomData<*const ()>,
}

/// A failed [`StreamCapture::end`]: the error, and the capture itself when the driver is still
/// capturing (the guard then stays on). End it again with [`CaptureEndError::into_capture`] and
/// [`StreamCapture::end`], or drop it: dropping ends the capture, or marks the device lost when
/// the driver cannot be made to stop.
pub struct CaptureEndError<'d, D: Driver> {
    error: DeviceError,
    capture: Option<StreamCapture<'d, D>>,
}

impl<'d, D: Driver> CaptureEndError<'d, D> {
    /// What the end failed with.
    #[must_use]
    pub fn error(&self) -> &DeviceError {
        &self.error
    }

    /// Whether the driver is still capturing (the capture was handed back; the guard is on).
    #[must_use]
    pub fn still_capturing(&self) -> bool {
        self.capture.is_some()
    }

    /// The capture to end again, when the driver is still capturing.
    #[must_use]
    pub fn into_capture(self) -> Option<StreamCapture<'d, D>> {
        self.capture
    }

    /// The error; a capture still held is dropped (ended, or the device lost).
    #[must_use]
    pub fn into_error(self) -> DeviceError {
        self.error
    }
}

impl<D: Driver> std::fmt::Debug for CaptureEndError<'_, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaptureEndError")
            .field("error", &self.error)
            .field("still_capturing", &self.still_capturing())
            .finish()
    }
}

impl<D: Driver> std::fmt::Display for CaptureEndError<'_, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ending the capture failed: {}", self.error)?;
        if self.still_capturing() {
            write!(
                f,
                " (the stream is still capturing; end it again or drop it)"
            )?;
        }
        Ok(())
    }
}

impl<D: Driver> std::error::Error for CaptureEndError<'_, D> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<D: Driver> From<CaptureEndError<'_, D>> for DeviceError {
    fn from(e: CaptureEndError<'_, D>) -> DeviceError {
        e.into_error()
    }
}

/// A captured graph (not yet launchable). Destroyed on drop.
#[derive(Debug)]
pub struct CapturedGraph<D: Driver> {
    device: Device<D>,
    graph: Graph,
}

/// An instantiated graph, launchable any number of times. Destroyed on drop.
#[derive(Debug)]
pub struct GraphInstance<D: Driver> {
    device: Device<D>,
    exec: GraphExec,
}

impl<D: Driver> Device<D> {
    /// Begins a global-mode capture on `stream`. One capture at a time per device; waits
    /// (bounded) for other threads' in-flight queries to finish first.
    pub fn begin_capture(&self, stream: Stream) -> DeviceResult<StreamCapture<'_, D>> {
        self.check_lost()?;
        self.book_capture(stream)?;
        let began = self.inner.driver.now();
        let begun = self.call(|d| d.stream_begin_capture(stream, CaptureMode::Global));
        if let Err(e) = begun {
            self.unbook_capture();
            return Err(e);
        }
        tracing::debug!(target: "zdevice.device.capture", ?stream, "capture begun");
        Ok(StreamCapture {
            device: self,
            stream,
            began,
            finished: false,
            _this_thread: PhantomData,
        })
    }

    /// After a failed end: whether the driver has stopped capturing on `stream`. A status the
    /// driver cannot give counts as still capturing (the guard must not come off blind).
    fn stopped_capturing(&self, stream: Stream) -> bool {
        matches!(
            self.inner.driver.stream_is_capturing(stream),
            Ok(CaptureStatus::None)
        )
    }
}

impl<'d, D: Driver> StreamCapture<'d, D> {
    /// The capturing stream: queue the work to capture on it.
    #[must_use]
    pub fn stream(&self) -> Stream {
        self.stream
    }

    /// The device being captured on.
    #[must_use]
    pub fn device(&self) -> &'d Device<D> {
        self.device
    }

    /// Ends the capture and returns the graph.
    ///
    /// Errors: a capture the driver invalidated ends with `CaptureInvalidated` (the driver
    /// stopped capturing); a capture that took longer than the sync deadline, body and end
    /// together, ends with `Timeout` naming `cuStreamEndCapture` and the device is lost; any
    /// other failure leaves the guard on exactly as long as the driver still captures, and then
    /// hands this `StreamCapture` back inside the error so it can be ended again.
    pub fn end(mut self) -> Result<CapturedGraph<D>, CaptureEndError<'d, D>> {
        let device = self.device;
        let stream = self.stream;
        let end_began = device.inner.driver.now();
        let ended = device.call(|d| d.stream_end_capture(stream));
        let now = device.inner.driver.now();
        let elapsed = now.saturating_sub(self.began);
        let end_took = now.saturating_sub(end_began);
        let deadline = device.inner.config.sync_deadline;
        let late = elapsed > deadline;
        let error = match ended {
            Ok(graph) => {
                self.finish();
                let graph = CapturedGraph {
                    device: device.clone(),
                    graph,
                };
                if !late {
                    return Ok(graph);
                }
                // Destroyed while the device still answers; it is lost right after.
                drop(graph);
                None
            }
            Err(DeviceError::Driver { call, code })
                if code == CuCode::STREAM_CAPTURE_INVALIDATED =>
            {
                Some(DeviceError::CaptureInvalidated { call, code })
            }
            Err(e) => Some(e),
        };
        if let Some(e) = &error {
            tracing::warn!(target: "zdevice.device.capture", error = %e, "ending the capture failed");
        }
        let error = match error {
            Some(e) if !late => e,
            _ => {
                let waited_for = overran(device, end_took, elapsed);
                device.mark_lost(format!(
                    "{waited_for}: the capture ended {elapsed:?} after it began, past the sync deadline of {deadline:?}"
                ));
                DeviceError::Timeout {
                    waited_for,
                    deadline,
                    elapsed,
                    device_lost: true,
                }
            }
        };
        if self.finished || device.stopped_capturing(stream) {
            self.finish();
            return Err(CaptureEndError {
                error,
                capture: None,
            });
        }
        Err(CaptureEndError {
            error,
            capture: Some(self),
        })
    }

    /// The driver has stopped capturing: the guard comes off.
    fn finish(&mut self) {
        if !self.finished {
            self.finished = true;
            self.device.unbook_capture();
        }
    }
}

/// What a capture that ended late waited for: the slowest call of its body (a kernel launch,
/// a copy) when it took longer than the end itself, else `cuStreamEndCapture`.
fn overran<D: Driver>(device: &Device<D>, end_took: Duration, elapsed: Duration) -> String {
    let slowest = device.inner.gate.lock().slowest;
    match slowest {
        Some((call, took)) if took > end_took => format!(
            "{call} to return during the capture (it took {took:?} of the capture's {elapsed:?})"
        ),
        _ => format!("{END_CAPTURE} to return"),
    }
}

impl<D: Driver> Drop for StreamCapture<'_, D> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let d = &self.device.inner.driver;
        match d.stream_end_capture(self.stream) {
            Ok(graph) => {
                let _ = d.graph_destroy(graph);
            }
            Err(e) => {
                tracing::debug!(target: "zdevice.device.capture", error = %e, "abandoned capture");
                if !self.device.stopped_capturing(self.stream) {
                    // The guard stays on, and nothing more runs on this device: the driver
                    // would silently leave synchronous work out of a graph nobody will launch.
                    self.device.mark_lost(format!(
                        "{END_CAPTURE} failed ({e}) and the stream is still capturing"
                    ));
                    return;
                }
            }
        }
        self.finish();
    }
}

impl<D: Driver> CapturedGraph<D> {
    /// Number of nodes in the graph (what was really captured).
    pub fn node_count(&self) -> DeviceResult<usize> {
        self.device.call(|d| d.graph_node_count(self.graph))
    }

    /// The raw handle.
    #[must_use]
    pub fn raw(&self) -> Graph {
        self.graph
    }

    /// Instantiates the graph for launching.
    pub fn instantiate(&self, flags: InstantiateFlags) -> DeviceResult<GraphInstance<D>> {
        let call = "cuGraphInstantiateWithFlags";
        self.device
            .refuse_during_capture(call, "instantiate after the capture ends")?;
        let graph = self.graph;
        let deadline = self.device.inner.config.build_deadline;
        let exec = self
            .device
            .call_watched(call, deadline, move |d| d.graph_instantiate(graph, flags))?;
        Ok(GraphInstance {
            device: self.device.clone(),
            exec,
        })
    }
}

impl<D: Driver> Drop for CapturedGraph<D> {
    fn drop(&mut self) {
        if self.device.check_lost().is_ok()
            && let Err(e) = self.device.inner.driver.graph_destroy(self.graph)
        {
            tracing::warn!(target: "zdevice.device.graph", error = %e, "graph destroy failed");
        }
    }
}

impl<D: Driver> GraphInstance<D> {
    /// Queues one replay of the graph on `stream`.
    pub fn launch(&self, stream: Stream) -> DeviceResult<()> {
        self.device.call(|d| d.graph_launch(self.exec, stream))
    }

    /// The raw handle.
    #[must_use]
    pub fn raw(&self) -> GraphExec {
        self.exec
    }
}

impl<D: Driver> Drop for GraphInstance<D> {
    fn drop(&mut self) {
        if self.device.check_lost().is_ok()
            && let Err(e) = self.device.inner.driver.graph_exec_destroy(self.exec)
        {
            tracing::warn!(target: "zdevice.device.graph", error = %e, "graph exec destroy failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{CuCode, DeviceConfig, DeviceError, Driver, MockDevice, SimDriver};

    /// The "obvious fix" for an unbounded end, running it as a watched call, moves it to the
    /// watchdog thread: the real driver answers 908 there, and so does the simulated one, since
    /// watched calls run on the worker with virtual time too.
    #[test]
    fn ending_a_capture_from_the_watchdog_thread_is_refused_as_on_the_gpu() {
        let dev = MockDevice::open(SimDriver::default(), DeviceConfig::default()).unwrap();
        let stream = dev.stream();
        let cap = dev.begin_capture(stream).unwrap();
        let watched = dev.call_watched(super::END_CAPTURE, Duration::from_secs(60), move |d| {
            d.stream_end_capture(stream)
        });
        match watched {
            Err(DeviceError::Driver { code, .. }) => {
                assert_eq!(code, CuCode::STREAM_CAPTURE_WRONG_THREAD);
            }
            other => panic!("a watched end: expected 908, got {other:?}"),
        }
        cap.end().expect("the capturing thread ends it");
        assert!(!dev.is_capturing());
    }
}
