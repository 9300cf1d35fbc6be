//! cuBLAS handles and `cublasSgemmStridedBatched`.
//!
//! Node counts during capture mirror the measurement in docs/capture-rules.md: a gemm captured on a
//! handle with a workspace set by `cublasSetWorkspace_v2` adds 2 nodes, with cuBLAS's default
//! workspace 4. One node does the product; the others stand for cuBLAS's auxiliary nodes
//! (workspace handling) and do nothing.

use super::capture::{Ask, Gate};
use super::gemm;
use super::memory::ALIGN;
use super::ops::Op;
use super::state::{Cx, LEGACY, State};
use crate::driver::DriverResult;
use crate::types::{BlasHandle, DevicePtr, GemmF32, Stream};

pub(super) const NOT_INITIALIZED: u32 = 1;
pub(super) const INVALID_VALUE: u32 = 7;
/// Captured nodes per gemm: with a user workspace, and with cuBLAS's own.
pub(super) const NODES_WITH_WORKSPACE: usize = 2;
pub(super) const NODES_DEFAULT_WORKSPACE: usize = 4;

#[derive(Debug)]
pub(crate) struct BlasState {
    pub stream: Stream,
    pub workspace: Option<(DevicePtr, u64)>,
    pub tf32: bool,
}

impl State {
    fn blas_handle(&mut self, cx: &Cx, h: BlasHandle) -> DriverResult<&mut BlasState> {
        self.blas.get_mut(&h.0).ok_or(cx.blas(NOT_INITIALIZED))
    }

    pub(crate) fn blas_create(&mut self, cx: &mut Cx) -> DriverResult<BlasHandle> {
        self.gate(cx, Ask::none())?;
        let id = self.handle();
        self.blas.insert(
            id,
            BlasState {
                stream: LEGACY,
                workspace: None,
                tf32: false,
            },
        );
        Ok(BlasHandle(id))
    }

    pub(crate) fn blas_destroy(&mut self, cx: &mut Cx, h: BlasHandle) -> DriverResult<()> {
        self.gate(cx, Ask::none())?;
        self.blas
            .remove(&h.0)
            .map(|_| ())
            .ok_or(cx.blas(NOT_INITIALIZED))
    }

    pub(crate) fn blas_set_stream(
        &mut self,
        cx: &mut Cx,
        h: BlasHandle,
        s: Stream,
    ) -> DriverResult<()> {
        self.gate(cx, Ask::none())?;
        if !self.streams.contains_key(&s.0) {
            return Err(cx.blas(INVALID_VALUE));
        }
        self.blas_handle(cx, h)?.stream = s;
        Ok(())
    }

    /// cuBLAS requires a 256-byte aligned workspace; the whole range must be device memory.
    pub(crate) fn blas_set_workspace(
        &mut self,
        cx: &mut Cx,
        h: BlasHandle,
        ptr: DevicePtr,
        bytes: u64,
    ) -> DriverResult<()> {
        self.gate(cx, Ask::none())?;
        self.blas_handle(cx, h)?;
        let valid =
            bytes == 0 || (ptr.0.is_multiple_of(ALIGN) && self.mem.resolve(ptr, bytes).is_ok());
        if !valid {
            return Err(cx.blas(INVALID_VALUE));
        }
        self.blas_handle(cx, h)?.workspace = Some((ptr, bytes));
        Ok(())
    }

    pub(crate) fn blas_set_tf32(
        &mut self,
        cx: &mut Cx,
        h: BlasHandle,
        tf32: bool,
    ) -> DriverResult<()> {
        self.gate(cx, Ask::none())?;
        self.blas_handle(cx, h)?.tf32 = tf32;
        Ok(())
    }

    /// Operands are not checked here (cuBLAS does not either): a bad address faults when the
    /// product runs, as a sticky 700.
    pub(crate) fn gemm(&mut self, cx: &mut Cx, h: BlasHandle, g: &GemmF32) -> DriverResult<()> {
        let handle = self.blas_handle(cx, h)?;
        let (stream, tf32, workspace) = (handle.stream, handle.tf32, handle.workspace.is_some());
        cx.stream = Some(stream);
        if let Err(reason) = gemm::validate(g) {
            tracing::debug!(reason, "gemm rejected");
            return Err(cx.blas(INVALID_VALUE));
        }
        self.capture_or_queue_product(cx, stream, workspace, Op::Gemm { gemm: *g, tf32 })
    }

    /// A product (float32 or mixed precision) as cuBLAS submits it: during a capture, its node
    /// plus cuBLAS's auxiliary ones (2 with a workspace set, 4 with cuBLAS's own); else queued
    /// on the handle's stream.
    pub(super) fn capture_or_queue_product(
        &mut self,
        cx: &mut Cx,
        stream: Stream,
        workspace: bool,
        op: Op,
    ) -> DriverResult<()> {
        if self.gate(cx, Ask::on(stream))? == Gate::Capture {
            let n = if workspace {
                NODES_WITH_WORKSPACE
            } else {
                NODES_DEFAULT_WORKSPACE
            };
            let mut nodes = vec![op];
            nodes.resize_with(n, || Op::Noop);
            self.capture_nodes(cx, nodes);
            return Ok(());
        }
        self.enqueue(cx, stream, op).map(|_| ())
    }
}
