//! The CUDA / cuBLAS function names the simulated driver answers to.
//!
//! They are the `call` of every [`DriverError`](crate::DriverError) the simulator returns, the
//! keys of the fault plan and the names in the op log, so tests and the device layer can name a
//! call once, the way the real driver's errors name it.

/// `cuInit`.
pub const INIT: &str = "cuInit";
/// `cuDriverGetVersion`.
pub const DRIVER_GET_VERSION: &str = "cuDriverGetVersion";
/// `cuDeviceGetCount`.
pub const DEVICE_GET_COUNT: &str = "cuDeviceGetCount";
/// `cuDeviceGetName`.
pub const DEVICE_GET_NAME: &str = "cuDeviceGetName";
/// `cuDeviceTotalMem_v2`.
pub const DEVICE_TOTAL_MEM: &str = "cuDeviceTotalMem_v2";
/// `cuDeviceGetAttribute` (compute capability).
pub const DEVICE_GET_ATTRIBUTE: &str = "cuDeviceGetAttribute";
/// `cuDevicePrimaryCtxRetain`.
pub const PRIMARY_CTX_RETAIN: &str = "cuDevicePrimaryCtxRetain";
/// `cuDevicePrimaryCtxRelease_v2`.
pub const PRIMARY_CTX_RELEASE: &str = "cuDevicePrimaryCtxRelease_v2";
/// `cuCtxSetCurrent`.
pub const CTX_SET_CURRENT: &str = "cuCtxSetCurrent";
/// `cuCtxSynchronize`.
pub const CTX_SYNCHRONIZE: &str = "cuCtxSynchronize";

/// `cuStreamCreate`.
pub const STREAM_CREATE: &str = "cuStreamCreate";
/// `cuStreamCreateWithPriority`.
pub const STREAM_CREATE_WITH_PRIORITY: &str = "cuStreamCreateWithPriority";
/// `cuCtxGetStreamPriorityRange`.
pub const STREAM_PRIORITY_RANGE: &str = "cuCtxGetStreamPriorityRange";
/// `cuStreamDestroy_v2`.
pub const STREAM_DESTROY: &str = "cuStreamDestroy_v2";
/// `cuStreamQuery`.
pub const STREAM_QUERY: &str = "cuStreamQuery";
/// `cuStreamSynchronize`.
pub const STREAM_SYNCHRONIZE: &str = "cuStreamSynchronize";
/// `cuStreamWaitEvent`.
pub const STREAM_WAIT_EVENT: &str = "cuStreamWaitEvent";
/// `cuEventCreate`.
pub const EVENT_CREATE: &str = "cuEventCreate";
/// `cuEventDestroy_v2`.
pub const EVENT_DESTROY: &str = "cuEventDestroy_v2";
/// `cuEventRecord`.
pub const EVENT_RECORD: &str = "cuEventRecord";
/// `cuEventQuery`.
pub const EVENT_QUERY: &str = "cuEventQuery";
/// `cuEventSynchronize`.
pub const EVENT_SYNCHRONIZE: &str = "cuEventSynchronize";
/// `cuEventElapsedTime_v2`.
pub const EVENT_ELAPSED_TIME: &str = "cuEventElapsedTime_v2";

/// `cuMemGetInfo_v2`.
pub const MEM_GET_INFO: &str = "cuMemGetInfo_v2";
/// `cuMemAlloc_v2`.
pub const MEM_ALLOC: &str = "cuMemAlloc_v2";
/// `cuMemAllocManaged`.
pub const MEM_ALLOC_MANAGED: &str = "cuMemAllocManaged";
/// `cuMemFree_v2`.
pub const MEM_FREE: &str = "cuMemFree_v2";
/// `cuMemAllocHost_v2`.
pub const MEM_ALLOC_HOST: &str = "cuMemAllocHost_v2";
/// `cuMemFreeHost`.
pub const MEM_FREE_HOST: &str = "cuMemFreeHost";
/// `cuMemHostGetDevicePointer_v2` (`Driver::host_device_ptr`).
pub const MEM_HOST_GET_DEVICE_POINTER: &str = "cuMemHostGetDevicePointer_v2";
/// `cuMemAllocAsync`.
pub const MEM_ALLOC_ASYNC: &str = "cuMemAllocAsync";
/// `cuMemFreeAsync`.
pub const MEM_FREE_ASYNC: &str = "cuMemFreeAsync";
/// `cuMemPoolCreate`.
pub const MEM_POOL_CREATE: &str = "cuMemPoolCreate";
/// `cuMemPoolDestroy`.
pub const MEM_POOL_DESTROY: &str = "cuMemPoolDestroy";
/// `cuMemPoolSetAttribute` (release threshold).
pub const MEM_POOL_SET_ATTRIBUTE: &str = "cuMemPoolSetAttribute";
/// `cuMemPoolGetAttribute` (reserved bytes).
pub const MEM_POOL_GET_ATTRIBUTE: &str = "cuMemPoolGetAttribute";
/// `cuMemPoolTrimTo`.
pub const MEM_POOL_TRIM_TO: &str = "cuMemPoolTrimTo";
/// `cuMemAllocFromPoolAsync`.
pub const MEM_ALLOC_FROM_POOL_ASYNC: &str = "cuMemAllocFromPoolAsync";

/// `cuIpcGetMemHandle`.
pub const IPC_GET_MEM_HANDLE: &str = "cuIpcGetMemHandle";
/// `cuIpcOpenMemHandle_v2`.
pub const IPC_OPEN_MEM_HANDLE: &str = "cuIpcOpenMemHandle_v2";
/// `cuIpcCloseMemHandle`.
pub const IPC_CLOSE_MEM_HANDLE: &str = "cuIpcCloseMemHandle";

/// `cuMemcpyHtoD_v2` (synchronous).
pub const MEMCPY_HTOD: &str = "cuMemcpyHtoD_v2";
/// `cuMemcpyDtoH_v2` (synchronous).
pub const MEMCPY_DTOH: &str = "cuMemcpyDtoH_v2";
/// `cuMemcpyDtoD_v2` (synchronous).
pub const MEMCPY_DTOD: &str = "cuMemcpyDtoD_v2";
/// `cuMemsetD8_v2` (synchronous).
pub const MEMSET_D8: &str = "cuMemsetD8_v2";
/// `cuMemsetD32_v2` (synchronous).
pub const MEMSET_D32: &str = "cuMemsetD32_v2";
/// `cuMemcpyDtoDAsync_v2`.
pub const MEMCPY_DTOD_ASYNC: &str = "cuMemcpyDtoDAsync_v2";
/// `cuMemsetD8Async`.
pub const MEMSET_D8_ASYNC: &str = "cuMemsetD8Async";
/// `cuMemsetD32Async`.
pub const MEMSET_D32_ASYNC: &str = "cuMemsetD32Async";
/// `cuMemcpyHtoDAsync_v2` (pinned or pageable source: one CUDA function).
pub const MEMCPY_HTOD_ASYNC: &str = "cuMemcpyHtoDAsync_v2";
/// `cuMemcpyDtoHAsync_v2`.
pub const MEMCPY_DTOH_ASYNC: &str = "cuMemcpyDtoHAsync_v2";

/// `cuModuleLoadData`.
pub const MODULE_LOAD_DATA: &str = "cuModuleLoadData";
/// `cuModuleUnload`.
pub const MODULE_UNLOAD: &str = "cuModuleUnload";
/// `cuModuleGetFunction`.
pub const MODULE_GET_FUNCTION: &str = "cuModuleGetFunction";
/// `cuLaunchKernel`.
pub const LAUNCH_KERNEL: &str = "cuLaunchKernel";

/// `cuStreamBeginCapture_v2`.
pub const STREAM_BEGIN_CAPTURE: &str = "cuStreamBeginCapture_v2";
/// `cuStreamEndCapture`.
pub const STREAM_END_CAPTURE: &str = "cuStreamEndCapture";
/// `cuStreamIsCapturing`.
pub const STREAM_IS_CAPTURING: &str = "cuStreamIsCapturing";
/// `cuGraphGetNodes`.
pub const GRAPH_GET_NODES: &str = "cuGraphGetNodes";
/// `cuGraphDestroy`.
pub const GRAPH_DESTROY: &str = "cuGraphDestroy";
/// `cuGraphInstantiateWithFlags`.
pub const GRAPH_INSTANTIATE: &str = "cuGraphInstantiateWithFlags";
/// `cuGraphLaunch`.
pub const GRAPH_LAUNCH: &str = "cuGraphLaunch";
/// `cuGraphExecDestroy`.
pub const GRAPH_EXEC_DESTROY: &str = "cuGraphExecDestroy";

/// `cublasCreate_v2`.
pub const BLAS_CREATE: &str = "cublasCreate_v2";
/// `cublasDestroy_v2`.
pub const BLAS_DESTROY: &str = "cublasDestroy_v2";
/// `cublasSetStream_v2`.
pub const BLAS_SET_STREAM: &str = "cublasSetStream_v2";
/// `cublasSetWorkspace_v2`.
pub const BLAS_SET_WORKSPACE: &str = "cublasSetWorkspace_v2";
/// `cublasSetMathMode`.
pub const BLAS_SET_MATH_MODE: &str = "cublasSetMathMode";
/// `cublasSgemmStridedBatched`.
pub const GEMM_STRIDED_BATCHED: &str = "cublasSgemmStridedBatched";
/// `cublasGemmStridedBatchedEx` (issue 42: the mixed-precision gemm).
pub const GEMM_STRIDED_BATCHED_EX: &str = "cublasGemmStridedBatchedEx";

/// Whether `call` is a cuBLAS function (its failures are `DriverError::Cublas`).
#[must_use]
pub fn is_blas(call: &str) -> bool {
    call.starts_with("cublas")
}
