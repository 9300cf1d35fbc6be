//! The stream-capture and graph calls of `CudaDriver`.
//!
//! Every `unsafe` block below calls one libcuda/cuBLAS entry point resolved by cuda-sys with the
//! signature of the pinned 13.0 header. Out-pointers are always live locals; handles are ones
//! this driver returned earlier (a stale or foreign handle is the driver's to reject, and its
//! status is checked); host buffers are Rust slices whose length is the count passed.

use std::ptr;

use cuda_sys::driver as cu;

use super::streams::stream;
use super::{CudaDriver, check};
use crate::driver::{DriverError, DriverResult};
use crate::types::*;

impl CudaDriver {
    pub(super) fn cu_stream_begin_capture(&self, s: Stream, mode: CaptureMode) -> DriverResult<()> {
        self.bind()?;
        let mode = match mode {
            CaptureMode::Global => cu::CU_STREAM_CAPTURE_MODE_GLOBAL,
            CaptureMode::ThreadLocal => cu::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            CaptureMode::Relaxed => cu::CU_STREAM_CAPTURE_MODE_RELAXED,
        };
        // SAFETY: see the module comment on handles.
        check("cuStreamBeginCapture_v2", unsafe {
            self.cu.cuStreamBeginCapture_v2(stream(s), mode)
        })
    }

    pub(super) fn cu_stream_end_capture(&self, s: Stream) -> DriverResult<Graph> {
        self.bind()?;
        let mut g: cu::CUgraph = ptr::null_mut();
        // SAFETY: out-pointer to a local; see the module comment on handles.
        check("cuStreamEndCapture", unsafe {
            self.cu.cuStreamEndCapture(stream(s), &mut g)
        })?;
        Ok(Graph(g as u64))
    }

    pub(super) fn cu_stream_is_capturing(&self, s: Stream) -> DriverResult<CaptureStatus> {
        self.bind()?;
        let mut status: cu::CUstreamCaptureStatus = cu::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: out-pointer to a local; see the module comment on handles.
        check("cuStreamIsCapturing", unsafe {
            self.cu.cuStreamIsCapturing(stream(s), &mut status)
        })?;
        match status {
            cu::CU_STREAM_CAPTURE_STATUS_NONE => Ok(CaptureStatus::None),
            cu::CU_STREAM_CAPTURE_STATUS_ACTIVE => Ok(CaptureStatus::Active),
            cu::CU_STREAM_CAPTURE_STATUS_INVALIDATED => Ok(CaptureStatus::Invalidated),
            other => Err(DriverError::InvalidArgument {
                call: "cuStreamIsCapturing",
                reason: format!("the driver answered capture status {other}, unknown in CUDA 13.0"),
            }),
        }
    }

    pub(super) fn cu_graph_node_count(&self, graph: Graph) -> DriverResult<usize> {
        self.bind()?;
        let mut n = 0usize;
        // SAFETY: a null node array asks only for the count, written to a local.
        check("cuGraphGetNodes", unsafe {
            self.cu
                .cuGraphGetNodes(graph.0 as cu::CUgraph, ptr::null_mut(), &mut n)
        })?;
        Ok(n)
    }

    pub(super) fn cu_graph_destroy(&self, graph: Graph) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: see the module comment on handles.
        check("cuGraphDestroy", unsafe {
            self.cu.cuGraphDestroy(graph.0 as cu::CUgraph)
        })
    }

    pub(super) fn cu_graph_instantiate(
        &self,
        graph: Graph,
        flags: InstantiateFlags,
    ) -> DriverResult<GraphExec> {
        self.bind()?;
        let mut bits = 0u64;
        if flags.auto_free_on_launch {
            bits |= u64::from(cu::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
        }
        if flags.use_node_priority {
            bits |= u64::from(cu::CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY);
        }
        let mut exec: cu::CUgraphExec = ptr::null_mut();
        // SAFETY: out-pointer to a local; see the module comment on handles.
        check("cuGraphInstantiateWithFlags", unsafe {
            self.cu
                .cuGraphInstantiateWithFlags(&mut exec, graph.0 as cu::CUgraph, bits)
        })?;
        Ok(GraphExec(exec as u64))
    }

    pub(super) fn cu_graph_launch(&self, exec: GraphExec, s: Stream) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: see the module comment on handles.
        check("cuGraphLaunch", unsafe {
            self.cu.cuGraphLaunch(exec.0 as cu::CUgraphExec, stream(s))
        })
    }

    pub(super) fn cu_graph_exec_destroy(&self, exec: GraphExec) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: see the module comment on handles.
        check("cuGraphExecDestroy", unsafe {
            self.cu.cuGraphExecDestroy(exec.0 as cu::CUgraphExec)
        })
    }
}
