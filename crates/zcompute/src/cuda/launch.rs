//! The one place zcompute uses `unsafe`: kernel launches and cuBLAS gemms on the backend's
//! stream. Every argument list is checked against the kernel-id table before the launch, and
//! every pointer comes from a block resolved (generation-checked) by the caller.

use super::kernels::{Args, Kernel};
use super::{CudaBackend, device_error};
use crate::error::{ComputeError, Result};
use zdevice::{Driver, GemmEx, GemmF32, LaunchConfig};

impl<D: Driver> CudaBackend<D> {
    /// Launches `kernel` on the backend's stream.
    pub(crate) fn launch(
        &self,
        op: &'static str,
        kernel: Kernel,
        config: LaunchConfig,
        args: &Args,
    ) -> Result<()> {
        if !kernel.accepts(args) {
            return Err(ComputeError::Unsupported {
                op,
                reason: format!(
                    "internal: arguments do not match {}'s parameters",
                    kernel.spec().name
                ),
            });
        }
        let function = self.inner.functions[kernel.index()];
        tracing::trace!(target: "zcompute.cuda.launch", kernel = kernel.spec().name, ?config);
        // SAFETY: `args` matches the kernel's parameter list in number and kind (checked just
        // above against the table, which mirrors the `extern "C"` signatures in kernels/*.cu).
        // Every pointer was resolved from a live, generation-checked block by the caller, and the
        // kernels touch only the ranges the caller's layouts reach, which `Tensor::from_parts`
        // keeps inside the storage. Memory is only reused in stream order (zmem frees, step
        // reclaims and held-region reuse all go through this same stream), so it stays valid
        // until the launch has run even if the caller drops its handles right after.
        unsafe {
            self.inner
                .device
                .launch(function, config, args, self.inner.stream)
        }
        .map_err(|e| device_error(op, e))
    }

    /// Runs a strided batched float32 gemm on the backend's stream.
    pub(crate) fn gemm(&self, op: &'static str, gemm: &GemmF32) -> Result<()> {
        // SAFETY: `matmul` builds `gemm` from resolved blocks and layouts it checked: each
        // operand's last element (batch stride, leading dimension and sizes included) lies
        // within its storage, and the output is a fresh block of exactly batch*m*n floats.
        // Stream ordering keeps the memory valid until the gemm has run (as for launches).
        unsafe { self.inner.device.gemm_f32(gemm, self.inner.stream) }
            .map_err(|e| device_error(op, e))
    }

    /// Runs a mixed-precision strided batched gemm (issue 42) on the backend's stream.
    pub(crate) fn gemm_ex(&self, op: &'static str, gemm: &GemmEx) -> Result<()> {
        // SAFETY: as `gemm`: `matmul` builds the descriptor from resolved blocks and layouts it
        // checked. Under bf16, A and B are the dense bf16 copies `bf16_operand` made, each a
        // block of at least 2 bytes per element the descriptor reaches (ld and batch stride
        // those of the dense copy), kept alive by the caller's `Operand` until queued; C is the
        // float32 output as for `gemm`. Stream ordering keeps the memory valid until it ran.
        unsafe { self.inner.device.gemm_ex(gemm, self.inner.stream) }
            .map_err(|e| device_error(op, e))
    }
}

impl CudaBackend<zdevice::SimDriver> {
    /// Launches `function`, a kernel registered on the simulator by a caller outside this
    /// crate, with `args` on the backend's stream. The public door is
    /// [`super::twins::launch_simulated`], in the simulator's module: the production backend
    /// has no such entry point.
    pub(super) fn launch_on_simulator(
        &self,
        op: &'static str,
        function: zdevice::Function,
        config: LaunchConfig,
        args: &[zdevice::KernelArg],
    ) -> Result<()> {
        self.launch_on_simulator_stream(op, function, config, args, self.inner.stream)
    }

    /// As `launch_on_simulator`, on `stream` (a side stream of this device: the public door is
    /// [`super::side_stream::SideStream::launch_simulated`]).
    pub(super) fn launch_on_simulator_stream(
        &self,
        op: &'static str,
        function: zdevice::Function,
        config: LaunchConfig,
        args: &[zdevice::KernelArg],
        stream: zdevice::Stream,
    ) -> Result<()> {
        tracing::trace!(target: "zcompute.cuda.launch", op, ?config, ?stream, "simulated kernel");
        // SAFETY: the simulator runs a kernel as a Rust closure that reads its arguments through
        // checked accessors (a wrong kind or count is a `KernelFault`) and reaches memory only
        // through `SimMemory`, which checks every address against its own allocation table
        // (an unmapped, stale or out-of-bounds access is a `KernelFault`, reported as a sticky
        // error at the next sync). No host memory is addressed, so no argument list can cause
        // undefined behaviour.
        unsafe { self.inner.device.launch(function, config, args, stream) }
            .map_err(|e| device_error(op, e))
    }
}
