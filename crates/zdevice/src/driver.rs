//! The narrow `Driver` trait: the raw calls the workspace makes, and nothing else.
//!
//! Two implementations: [`CudaDriver`](crate::CudaDriver) over `cuda-sys`, and
//! [`SimDriver`](crate::SimDriver), a deterministic simulation measured against the real driver
//! (`docs/capture-rules.md`). The trait does no checking of its own: guards live
//! once, in [`Device`](crate::Device), so that they are tested over both drivers.

use std::time::Duration;

use crate::types::*;

/// A CUDA driver status code (`CUresult`), kept with its CUDA name.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CuCode(pub u32);

impl CuCode {
    /// `CUDA_ERROR_INVALID_VALUE`.
    pub const INVALID_VALUE: CuCode = CuCode(1);
    /// `CUDA_ERROR_OUT_OF_MEMORY`.
    pub const OUT_OF_MEMORY: CuCode = CuCode(2);
    /// `CUDA_ERROR_NOT_INITIALIZED`.
    pub const NOT_INITIALIZED: CuCode = CuCode(3);
    /// `CUDA_ERROR_NO_DEVICE`.
    pub const NO_DEVICE: CuCode = CuCode(100);
    /// `CUDA_ERROR_INVALID_DEVICE`.
    pub const INVALID_DEVICE: CuCode = CuCode(101);
    /// `CUDA_ERROR_INVALID_IMAGE`.
    pub const INVALID_IMAGE: CuCode = CuCode(200);
    /// `CUDA_ERROR_INVALID_PTX`.
    pub const INVALID_PTX: CuCode = CuCode(218);
    /// `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`.
    pub const UNSUPPORTED_PTX_VERSION: CuCode = CuCode(222);
    /// `CUDA_ERROR_INVALID_HANDLE`.
    pub const INVALID_HANDLE: CuCode = CuCode(400);
    /// `CUDA_ERROR_NOT_FOUND`.
    pub const NOT_FOUND: CuCode = CuCode(500);
    /// `CUDA_ERROR_NOT_READY`.
    pub const NOT_READY: CuCode = CuCode(600);
    /// `CUDA_ERROR_ILLEGAL_ADDRESS` (sticky: the context is unusable afterwards).
    pub const ILLEGAL_ADDRESS: CuCode = CuCode(700);
    /// `CUDA_ERROR_LAUNCH_FAILED` (sticky).
    pub const LAUNCH_FAILED: CuCode = CuCode(719);
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`.
    pub const STREAM_CAPTURE_UNSUPPORTED: CuCode = CuCode(900);
    /// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`.
    pub const STREAM_CAPTURE_INVALIDATED: CuCode = CuCode(901);
    /// `CUDA_ERROR_STREAM_CAPTURE_UNJOINED`: a capture ended with a forked stream not joined back.
    pub const STREAM_CAPTURE_UNJOINED: CuCode = CuCode(904);
    /// `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD`.
    pub const STREAM_CAPTURE_WRONG_THREAD: CuCode = CuCode(908);
    /// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`.
    pub const STREAM_CAPTURE_IMPLICIT: CuCode = CuCode(906);
    /// `CUDA_ERROR_ILLEGAL_STATE`.
    pub const ILLEGAL_STATE: CuCode = CuCode(401);
    /// `CUDA_ERROR_INVALID_CONTEXT`: no usable context for the call (CUDA's answer to opening,
    /// in the process that exported it, an IPC handle of its own).
    pub const INVALID_CONTEXT: CuCode = CuCode(201);
    /// `CUDA_ERROR_NOT_SUPPORTED`: the operation is not supported on this system or device.
    pub const NOT_SUPPORTED: CuCode = CuCode(801);

    /// The CUDA name of this code (`CUDA_ERROR_OUT_OF_MEMORY`), or `CUDA_ERROR_<unknown>`.
    #[must_use]
    pub fn name(self) -> &'static str {
        cuda_sys::cu_result_name(self.0)
    }

    /// Whether the code leaves the context unusable (every later call fails the same way).
    #[must_use]
    pub fn is_sticky(self) -> bool {
        // The codes CUDA documents as corrupting the context: "the process must terminate".
        matches!(
            self.0,
            700 | 701 | 702 | 710 | 714 | 715 | 716 | 717 | 718 | 719 | 999
        )
    }
}

impl std::fmt::Debug for CuCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

impl std::fmt::Display for CuCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// What a raw driver call can answer besides success.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DriverError {
    /// The CUDA driver (or NVRTC) returned a status other than success.
    #[error("{call} returned {code}")]
    Cuda {
        /// The CUDA function, e.g. `cuMemAlloc_v2`.
        call: &'static str,
        /// Its status.
        code: CuCode,
    },
    /// cuBLAS returned a status other than `CUBLAS_STATUS_SUCCESS`.
    #[error("{call} returned {name} ({status})")]
    Cublas {
        /// The cuBLAS function.
        call: &'static str,
        /// The raw `cublasStatus_t`.
        status: u32,
        /// Its cuBLAS name.
        name: &'static str,
    },
    /// A library or symbol could not be loaded.
    #[error(transparent)]
    Load(#[from] cuda_sys::LoadError),
    /// The simulated driver does not know what the real driver answers to this call while a
    /// stream captures, so it refuses it rather than guess (see docs/capture-rules.md).
    #[error(
        "{call} during stream capture is not covered by docs/capture-rules.md; the simulated driver refuses it"
    )]
    NotModelled {
        /// The CUDA function that was refused.
        call: &'static str,
    },
    /// An argument was rejected before reaching the driver (for example a size that overflows).
    #[error("{call}: invalid argument: {reason}")]
    InvalidArgument {
        /// The function.
        call: &'static str,
        /// What was wrong.
        reason: String,
    },
}

impl DriverError {
    /// The CUDA status, when there is one.
    #[must_use]
    pub fn cuda_code(&self) -> Option<CuCode> {
        match self {
            DriverError::Cuda { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// Result of a raw driver call.
pub type DriverResult<T> = Result<T, DriverError>;

/// The raw calls the workspace makes. All methods take `&self`; implementations synchronise
/// internally, so a driver can be shared between threads (`Send + Sync`).
///
/// Nothing here checks capture state, deadlines or lost devices: that is [`Device`](crate::Device)'s
/// job. Methods are `unsafe` where the real driver would read or write memory the caller must keep
/// valid (host pointers of asynchronous copies, kernel argument lists, cuBLAS operands).
///
/// # Adding a method
/// Whoever adds a method here adds it to every implementation in this crate in the same change:
/// [`CudaDriver`](crate::CudaDriver), [`SimDriver`](crate::SimDriver) (with its answer during
/// capture, from docs/capture-rules.md) and the fault-injecting wrapper
/// [`FaultyDriver`](crate::FaultyDriver) (through its fault plan, with the call's name in
/// [`sim::calls`](crate::sim::calls), and in its ledger if the call acquires or releases a
/// resource), so that the fault matrix covers the new call on both drivers.
pub trait Driver: Send + Sync + 'static {
    /// A one-line description of the implementation (for logs).
    fn describe(&self) -> String;

    // --- time -------------------------------------------------------------------------------

    /// Monotonic time since the driver was created. Virtual for the simulated driver.
    fn now(&self) -> Duration;
    /// Lets `d` pass: a real sleep, or an advance of the virtual clock.
    fn pause(&self, d: Duration);
    /// Whether time is virtual (then a blocking call cannot outlive a watchdog in real time, and
    /// deadlines are judged on [`Driver::now`] alone).
    fn is_virtual_time(&self) -> bool;

    // --- initialisation and context ---------------------------------------------------------

    /// `cuInit(0)`.
    fn init(&self) -> DriverResult<()>;
    /// `cuDriverGetVersion` (e.g. 13000 for CUDA 13.0).
    fn driver_version(&self) -> DriverResult<u32>;
    /// `cuDeviceGetCount`.
    fn device_count(&self) -> DriverResult<u32>;
    /// `cuDeviceGetName`.
    fn device_name(&self, ordinal: u32) -> DriverResult<String>;
    /// `cuDeviceTotalMem_v2`.
    fn device_total_mem(&self, ordinal: u32) -> DriverResult<u64>;
    /// `cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR/MINOR)`.
    fn compute_capability(&self, ordinal: u32) -> DriverResult<(u32, u32)>;
    /// `cuDevicePrimaryCtxRetain`.
    fn primary_ctx_retain(&self, ordinal: u32) -> DriverResult<Context>;
    /// `cuDevicePrimaryCtxRelease_v2`.
    fn primary_ctx_release(&self, ordinal: u32) -> DriverResult<()>;
    /// `cuCtxSetCurrent` (per calling thread).
    fn ctx_set_current(&self, ctx: Context) -> DriverResult<()>;
    /// `cuCtxSynchronize`.
    fn ctx_synchronize(&self) -> DriverResult<()>;

    // --- streams and events -----------------------------------------------------------------

    /// `cuStreamCreate`.
    fn stream_create(&self, kind: StreamKind) -> DriverResult<Stream>;
    /// `cuStreamCreateWithPriority`: the driver clamps a priority outside
    /// [`Driver::stream_priority_range`] to it.
    fn stream_create_with_priority(&self, kind: StreamKind, priority: i32) -> DriverResult<Stream>;
    /// `cuCtxGetStreamPriorityRange` of the current context.
    fn stream_priority_range(&self) -> DriverResult<PriorityRange>;
    /// `cuStreamDestroy_v2`.
    fn stream_destroy(&self, stream: Stream) -> DriverResult<()>;
    /// `cuStreamQuery`.
    fn stream_query(&self, stream: Stream) -> DriverResult<Readiness>;
    /// `cuStreamSynchronize` (blocks; the device layer never calls it, it polls instead).
    fn stream_synchronize(&self, stream: Stream) -> DriverResult<()>;
    /// `cuStreamWaitEvent`.
    fn stream_wait_event(&self, stream: Stream, event: Event) -> DriverResult<()>;
    /// `cuEventCreate` (timing disabled unless `timing`).
    fn event_create(&self, timing: bool) -> DriverResult<Event>;
    /// `cuEventDestroy_v2`.
    fn event_destroy(&self, event: Event) -> DriverResult<()>;
    /// `cuEventRecord`.
    fn event_record(&self, event: Event, stream: Stream) -> DriverResult<()>;
    /// `cuEventQuery`.
    fn event_query(&self, event: Event) -> DriverResult<Readiness>;
    /// `cuEventSynchronize` (blocks; the device layer polls instead).
    fn event_synchronize(&self, event: Event) -> DriverResult<()>;
    /// `cuEventElapsedTime` in milliseconds.
    fn event_elapsed_ms(&self, start: Event, end: Event) -> DriverResult<f32>;

    // --- memory -----------------------------------------------------------------------------

    /// `cuMemGetInfo_v2`: (free, total) bytes.
    fn mem_get_info(&self) -> DriverResult<(u64, u64)>;
    /// `cuMemAlloc_v2`.
    fn mem_alloc(&self, bytes: u64) -> DriverResult<DevicePtr>;
    /// `cuMemAllocManaged` (global attach).
    fn mem_alloc_managed(&self, bytes: u64) -> DriverResult<DevicePtr>;
    /// `cuMemFree_v2`.
    fn mem_free(&self, ptr: DevicePtr) -> DriverResult<()>;
    /// `cuMemAllocHost_v2`: page-locked host memory.
    fn mem_alloc_host(&self, bytes: u64) -> DriverResult<HostPtr>;
    /// `cuMemFreeHost`.
    fn mem_free_host(&self, ptr: HostPtr) -> DriverResult<()>;
    /// Reads `dst.len()` bytes of page-locked host memory at `src` (no driver call; host memory).
    fn host_read(&self, src: HostPtr, dst: &mut [u8]) -> DriverResult<()>;
    /// Writes `src` into page-locked host memory at `dst` (no driver call; host memory).
    fn host_write(&self, dst: HostPtr, src: &[u8]) -> DriverResult<()>;
    /// Lends `words` f32 of page-locked host memory at `ptr` to `f` as one mutable slice, so
    /// that the caller fills (or reads) it in place (no driver call; host memory). Refused with
    /// `InvalidArgument` when the range is not inside one live page-locked allocation, is not
    /// 4-byte aligned, or its allocation is lent already; while it is lent, `host_read`,
    /// `host_write`, host copies and `mem_free_host` of that allocation are refused. The caller
    /// makes sure no transfer uses the range meanwhile ([`Device::pinned_f32_mut`] waits for
    /// the last one first).
    ///
    /// [`Device::pinned_f32_mut`]: crate::Device::pinned_f32_mut
    fn host_lend_f32(
        &self,
        ptr: HostPtr,
        words: usize,
        f: &mut dyn FnMut(&mut [f32]),
    ) -> DriverResult<()>;
    /// `cuMemAllocAsync` from the device's default pool.
    fn mem_alloc_async(&self, bytes: u64, stream: Stream) -> DriverResult<DevicePtr>;
    /// `cuMemFreeAsync`.
    fn mem_free_async(&self, ptr: DevicePtr, stream: Stream) -> DriverResult<()>;
    /// `cuMemPoolCreate` for device memory.
    fn mem_pool_create(&self, props: PoolProps) -> DriverResult<MemPool>;
    /// `cuMemPoolDestroy`.
    fn mem_pool_destroy(&self, pool: MemPool) -> DriverResult<()>;
    /// `cuMemPoolSetAttribute(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)`.
    fn mem_pool_set_release_threshold(&self, pool: MemPool, bytes: u64) -> DriverResult<()>;
    /// `cuMemPoolGetAttribute(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)`.
    fn mem_pool_reserved(&self, pool: MemPool) -> DriverResult<u64>;
    /// `cuMemPoolTrimTo`.
    fn mem_pool_trim_to(&self, pool: MemPool, keep_bytes: u64) -> DriverResult<()>;
    /// `cuMemAllocFromPoolAsync`.
    fn mem_alloc_from_pool_async(
        &self,
        bytes: u64,
        pool: MemPool,
        stream: Stream,
    ) -> DriverResult<DevicePtr>;

    // --- interprocess memory (legacy CUDA IPC) ----------------------------------------------

    /// `cuIpcGetMemHandle`: a handle to an allocation made by [`Driver::mem_alloc`] that
    /// another process on the same host can open. An address inside the allocation names all
    /// of it (the handle is the base's); freed, pool and null addresses are
    /// `CUDA_ERROR_INVALID_VALUE`. The allocation stays this process's (importers close their
    /// mapping before it is freed with [`Driver::mem_free`]).
    fn ipc_get_mem_handle(&self, ptr: DevicePtr) -> DriverResult<IpcMemHandle>;
    /// `cuIpcOpenMemHandle_v2` with `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`, in the current
    /// context: maps an allocation another process exported. The returned address is valid in
    /// this process until [`Driver::ipc_close_mem_handle`]. Opening a handle twice in one
    /// context returns the same address and counts one more open; CUDA refuses a handle that
    /// the calling process exported itself (`CUDA_ERROR_INVALID_CONTEXT`).
    fn ipc_open_mem_handle(&self, handle: &IpcMemHandle) -> DriverResult<DevicePtr>;
    /// `cuIpcCloseMemHandle`: closes one open of an address from
    /// [`Driver::ipc_open_mem_handle`] (the mapping goes with the last one).
    fn ipc_close_mem_handle(&self, ptr: DevicePtr) -> DriverResult<()>;

    // --- copies and memsets -----------------------------------------------------------------

    /// `cuMemcpyHtoD_v2` (synchronous).
    fn memcpy_htod(&self, dst: DevicePtr, src: &[u8]) -> DriverResult<()>;
    /// `cuMemcpyDtoH_v2` (synchronous).
    fn memcpy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> DriverResult<()>;
    /// `cuMemcpyDtoD_v2` (synchronous).
    fn memcpy_dtod(&self, dst: DevicePtr, src: DevicePtr, bytes: u64) -> DriverResult<()>;
    /// `cuMemsetD8_v2` (synchronous).
    fn memset_d8(&self, dst: DevicePtr, value: u8, bytes: u64) -> DriverResult<()>;
    /// `cuMemsetD32_v2` (synchronous), `count` 32-bit words.
    fn memset_d32(&self, dst: DevicePtr, value: u32, count: u64) -> DriverResult<()>;
    /// `cuMemcpyDtoDAsync_v2`.
    fn memcpy_dtod_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
        stream: Stream,
    ) -> DriverResult<()>;
    /// `cuMemsetD8Async`.
    fn memset_d8_async(
        &self,
        dst: DevicePtr,
        value: u8,
        bytes: u64,
        stream: Stream,
    ) -> DriverResult<()>;
    /// `cuMemsetD32Async`, `count` 32-bit words.
    fn memset_d32_async(
        &self,
        dst: DevicePtr,
        value: u32,
        count: u64,
        stream: Stream,
    ) -> DriverResult<()>;
    /// `cuMemcpyHtoDAsync_v2` from page-locked host memory.
    ///
    /// # Safety
    /// `src..src+bytes` must be live page-locked memory from [`Driver::mem_alloc_host`] and stay
    /// allocated and unmodified until the copy has executed (and, if captured, for as long as the
    /// graph may be launched).
    unsafe fn memcpy_htod_async(
        &self,
        dst: DevicePtr,
        src: HostPtr,
        bytes: u64,
        stream: Stream,
    ) -> DriverResult<()>;
    /// `cuMemcpyDtoHAsync_v2` into page-locked host memory.
    ///
    /// # Safety
    /// `dst..dst+bytes` must be live page-locked memory from [`Driver::mem_alloc_host`], not read
    /// or freed until the copy has executed.
    unsafe fn memcpy_dtoh_async(
        &self,
        dst: HostPtr,
        src: DevicePtr,
        bytes: u64,
        stream: Stream,
    ) -> DriverResult<()>;
    /// `cuMemcpyHtoDAsync_v2` from pageable memory (the driver stages it before returning when
    /// eager; a captured node keeps the address and reads it again at every launch).
    ///
    /// # Safety
    /// If the stream is capturing, `src` must outlive every launch of the resulting graph.
    unsafe fn memcpy_htod_async_pageable(
        &self,
        dst: DevicePtr,
        src: &[u8],
        stream: Stream,
    ) -> DriverResult<()>;

    // --- modules and launches ---------------------------------------------------------------

    /// `cuModuleLoadData` with a NUL-free PTX text.
    fn module_load_ptx(&self, ptx: &str) -> DriverResult<Module>;
    /// `cuModuleUnload`.
    fn module_unload(&self, module: Module) -> DriverResult<()>;
    /// `cuModuleGetFunction`.
    fn module_get_function(&self, module: Module, name: &str) -> DriverResult<Function>;
    /// `cuLaunchKernel`.
    ///
    /// # Safety
    /// `args` must match the kernel's parameter list in number and type, and every address the
    /// kernel touches must be live device memory for as long as the launch runs.
    unsafe fn launch_kernel(
        &self,
        function: Function,
        config: LaunchConfig,
        args: &[KernelArg],
        stream: Stream,
    ) -> DriverResult<()>;

    // --- capture and graphs -----------------------------------------------------------------

    /// `cuStreamBeginCapture_v2`.
    fn stream_begin_capture(&self, stream: Stream, mode: CaptureMode) -> DriverResult<()>;
    /// `cuStreamEndCapture`. Returns 901 when the capture was invalidated (capture still ends).
    fn stream_end_capture(&self, stream: Stream) -> DriverResult<Graph>;
    /// `cuStreamIsCapturing`.
    fn stream_is_capturing(&self, stream: Stream) -> DriverResult<CaptureStatus>;
    /// `cuGraphGetNodes` (count only).
    fn graph_node_count(&self, graph: Graph) -> DriverResult<usize>;
    /// `cuGraphDestroy`.
    fn graph_destroy(&self, graph: Graph) -> DriverResult<()>;
    /// `cuGraphInstantiateWithFlags`.
    fn graph_instantiate(&self, graph: Graph, flags: InstantiateFlags) -> DriverResult<GraphExec>;
    /// `cuGraphLaunch`.
    fn graph_launch(&self, exec: GraphExec, stream: Stream) -> DriverResult<()>;
    /// `cuGraphExecDestroy`.
    fn graph_exec_destroy(&self, exec: GraphExec) -> DriverResult<()>;

    // --- cuBLAS -----------------------------------------------------------------------------

    /// `cublasCreate_v2` (uses the current context, the primary one).
    fn blas_create(&self) -> DriverResult<BlasHandle>;
    /// `cublasDestroy_v2`.
    fn blas_destroy(&self, handle: BlasHandle) -> DriverResult<()>;
    /// `cublasSetStream_v2`.
    fn blas_set_stream(&self, handle: BlasHandle, stream: Stream) -> DriverResult<()>;
    /// `cublasSetWorkspace_v2`: cuBLAS uses this memory instead of allocating its own.
    fn blas_set_workspace(
        &self,
        handle: BlasHandle,
        workspace: DevicePtr,
        bytes: u64,
    ) -> DriverResult<()>;
    /// `cublasSetMathMode`: TF32 tensor-op math when `tf32`, else pedantic float32.
    fn blas_set_tf32(&self, handle: BlasHandle, tf32: bool) -> DriverResult<()>;
    /// `cublasSgemmStridedBatched` on the handle's stream.
    ///
    /// # Safety
    /// Every operand described by `gemm` must lie in live device memory.
    unsafe fn gemm_strided_batched_f32(
        &self,
        handle: BlasHandle,
        gemm: &GemmF32,
    ) -> DriverResult<()>;

    // --- mixed-precision gemm (issue 42) -----------------------------------------------------

    /// `cublasGemmStridedBatchedEx` on the handle's stream: `gemm.gemm` under `gemm.math`
    /// (float32, TF32 or bf16 operands; float32 accumulation and C in every mode). The
    /// compute type comes from the mode, not from the handle's math mode
    /// ([`Driver::blas_set_tf32`] does not change what this call computes).
    ///
    /// During stream capture it behaves as `cublasSgemmStridedBatched` does on a handle whose
    /// workspace was set before the capture (docs/capture-rules.md): captured as the product's
    /// nodes, allocating nothing. The simulated driver models exactly that (2 nodes with a set
    /// workspace, 4 with cuBLAS's own); an H200 answered 2 nodes with a set workspace in every
    /// capture mode (zdevice's `capture_rules_gemm_ex_row`).
    ///
    /// # Safety
    /// Every operand described by `gemm` must lie in live device memory, A and B holding
    /// elements of `gemm.math.operand_bytes()` bytes and C float32 elements.
    unsafe fn gemm_strided_batched_ex(&self, handle: BlasHandle, gemm: &GemmEx)
    -> DriverResult<()>;

    // --- device-mapped host flags (issue 44) ------------------------------------------------
    // A flag a kernel polls while it waits on the device (a peer exchange's give-up flag):
    // written by the host with a plain store, never through a stream, so a stream stuck
    // behind the kernel that polls it cannot delay it.

    /// The address kernels reach page-locked host memory at `ptr` (from `mem_alloc_host`)
    /// through, as `cuMemHostGetDevicePointer_v2` answers: with unified addressing (every
    /// 64-bit Linux system and every GPU this project targets) memory from `cuMemAllocHost`
    /// is mapped into every context and the answer is the host address itself. No stream is
    /// involved, so it is answered the same during a capture (measured on an H200: the call
    /// neither joins nor invalidates a capture, docs/capture-rules.md).
    /// `InvalidArgument` for an address no page-locked allocation holds (the simulator) or a
    /// null one; `NOT_SUPPORTED` on a device without unified addressing.
    fn host_device_ptr(&self, ptr: HostPtr) -> DriverResult<DevicePtr>;
    /// Stores `value` at `dst` (page-locked, 4-byte aligned) as one atomic 32-bit store with
    /// release ordering, which a kernel polling the mapped address (`ld.relaxed.sys`) sees
    /// within microseconds on the GPU. Not a driver call (plain host memory): no stream, no
    /// capture rule, no sticky error, and it works after the device was marked lost, which is
    /// when a teardown needs it.
    fn host_store_u32(&self, dst: HostPtr, value: u32) -> DriverResult<()>;
}
