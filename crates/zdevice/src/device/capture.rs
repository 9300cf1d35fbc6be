//! Stream capture and graphs: one way in (`Device::begin_capture`), one way out (`Capture::end`
//! or drop), and graphs that own their driver handles.

use crate::driver::{CuCode, Driver};
use crate::error::{DeviceError, DeviceResult};
use crate::types::*;

use super::Device;

/// An active global-mode capture on one stream. While it lives, the device refuses synchronous
/// copies, memsets, allocations and frees, and other threads hold off their waits. End it with
/// [`Capture::end`]; dropping it ends the capture and discards the graph, leaving the device
/// usable.
#[derive(Debug)]
pub struct Capture<'d, D: Driver> {
    device: &'d Device<D>,
    stream: Stream,
    ended: bool,
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
    pub fn begin_capture(&self, stream: Stream) -> DeviceResult<Capture<'_, D>> {
        self.check_lost()?;
        self.book_capture(stream)?;
        let began = self.call(|d| d.stream_begin_capture(stream, CaptureMode::Global));
        if let Err(e) = began {
            self.unbook_capture();
            return Err(e);
        }
        tracing::debug!(target: "zdevice.device.capture", ?stream, "capture begun");
        Ok(Capture {
            device: self,
            stream,
            ended: false,
        })
    }
}

impl<'d, D: Driver> Capture<'d, D> {
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

    /// Ends the capture and returns the graph. A capture the driver invalidated ends with
    /// `CaptureInvalidated`; either way the stream is no longer capturing.
    pub fn end(mut self) -> DeviceResult<CapturedGraph<D>> {
        self.ended = true;
        let r = self.device.call(|d| d.stream_end_capture(self.stream));
        self.device.unbook_capture();
        match r {
            Ok(graph) => Ok(CapturedGraph {
                device: self.device.clone(),
                graph,
            }),
            Err(DeviceError::Driver { call, code })
                if code == CuCode::STREAM_CAPTURE_INVALIDATED =>
            {
                Err(DeviceError::CaptureInvalidated { call, code })
            }
            Err(e) => Err(e),
        }
    }
}

impl<D: Driver> Drop for Capture<'_, D> {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let d = &self.device.inner.driver;
        match d.stream_end_capture(self.stream) {
            Ok(graph) => {
                let _ = d.graph_destroy(graph);
            }
            Err(e) => {
                tracing::debug!(target: "zdevice.device.capture", error = %e, "abandoned capture")
            }
        }
        self.device.unbook_capture();
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
