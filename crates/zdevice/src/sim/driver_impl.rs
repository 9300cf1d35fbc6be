//! `Driver` for `SimDriver`: each method names its CUDA function and hands its work to the
//! state under the lock (see `SimDriver::call` for what every call shares).

use std::time::Duration;

use super::SimDriver;
use super::calls as c;
use super::capture::Ask;
use super::memory::AllocKind;
use super::streams::SIM_PRIORITY_RANGE;
use crate::driver::{CuCode, Driver, DriverResult};
use crate::types::*;

/// The primary context of device 0, the only one the simulator has.
const PRIMARY: Context = Context(1);
/// `CUDA_ERROR_INVALID_CONTEXT`.
const INVALID_CONTEXT: CuCode = CuCode(201);

impl Driver for SimDriver {
    fn describe(&self) -> String {
        let st = self.lock();
        format!(
            "simulated CUDA driver {} ({}, {} bytes, sm_{}{})",
            st.cfg.driver_version,
            st.cfg.device_name,
            st.cfg.capacity,
            st.cfg.compute_capability.0,
            st.cfg.compute_capability.1
        )
    }

    fn now(&self) -> Duration {
        self.lock().now
    }

    fn pause(&self, d: Duration) {
        let mut st = self.lock();
        st.now = st.now.saturating_add(d);
    }

    fn is_virtual_time(&self) -> bool {
        !self.lock().cfg.real_time_stalls
    }

    fn init(&self) -> DriverResult<()> {
        self.call(c::INIT, None, |st, _| {
            st.initialized = true;
            Ok(())
        })
    }

    fn driver_version(&self) -> DriverResult<u32> {
        self.call(c::DRIVER_GET_VERSION, None, |st, cx| {
            st.gate(cx, Ask::none())?;
            Ok(st.cfg.driver_version)
        })
    }

    fn device_count(&self) -> DriverResult<u32> {
        self.call(c::DEVICE_GET_COUNT, None, |st, cx| {
            st.gate(cx, Ask::none()).map(|_| 1)
        })
    }

    fn device_name(&self, ordinal: u32) -> DriverResult<String> {
        self.call(c::DEVICE_GET_NAME, None, |st, cx| {
            st.gate(cx, Ask::none())?;
            st.check_ordinal(cx, ordinal)?;
            Ok(st.cfg.device_name.clone())
        })
    }

    fn device_total_mem(&self, ordinal: u32) -> DriverResult<u64> {
        self.call(c::DEVICE_TOTAL_MEM, None, |st, cx| {
            st.gate(cx, Ask::none())?;
            st.check_ordinal(cx, ordinal)?;
            Ok(st.cfg.capacity)
        })
    }

    fn compute_capability(&self, ordinal: u32) -> DriverResult<(u32, u32)> {
        self.call(c::DEVICE_GET_ATTRIBUTE, None, |st, cx| {
            st.gate(cx, Ask::none())?;
            st.check_ordinal(cx, ordinal)?;
            Ok(st.cfg.compute_capability)
        })
    }

    fn primary_ctx_retain(&self, ordinal: u32) -> DriverResult<Context> {
        self.call(c::PRIMARY_CTX_RETAIN, None, |st, cx| {
            st.gate(cx, Ask::none())?;
            st.check_ordinal(cx, ordinal)?;
            Ok(PRIMARY)
        })
    }

    fn primary_ctx_release(&self, ordinal: u32) -> DriverResult<()> {
        self.call(c::PRIMARY_CTX_RELEASE, None, |st, cx| {
            st.gate(cx, Ask::none())?;
            st.check_ordinal(cx, ordinal)
        })
    }

    fn ctx_set_current(&self, ctx: Context) -> DriverResult<()> {
        self.call(c::CTX_SET_CURRENT, None, |st, cx| {
            st.gate(cx, Ask::none())?;
            if ctx == PRIMARY || ctx == Context(0) {
                Ok(())
            } else {
                Err(cx.cuda(INVALID_CONTEXT))
            }
        })
    }

    fn ctx_synchronize(&self) -> DriverResult<()> {
        self.call(c::CTX_SYNCHRONIZE, None, |st, cx| st.ctx_synchronize(cx))
    }

    fn stream_create(&self, kind: StreamKind) -> DriverResult<Stream> {
        self.call(c::STREAM_CREATE, None, |st, cx| st.stream_create(cx, kind))
    }

    fn stream_create_with_priority(&self, kind: StreamKind, priority: i32) -> DriverResult<Stream> {
        self.call(c::STREAM_CREATE_WITH_PRIORITY, None, |st, cx| {
            st.stream_create_with_priority(cx, kind, priority)
        })
    }

    fn stream_priority_range(&self) -> DriverResult<PriorityRange> {
        self.call(c::STREAM_PRIORITY_RANGE, None, |st, cx| {
            st.gate(cx, Ask::none())?;
            Ok(SIM_PRIORITY_RANGE)
        })
    }

    fn stream_destroy(&self, stream: Stream) -> DriverResult<()> {
        self.call(c::STREAM_DESTROY, Some(stream), |st, cx| {
            st.stream_destroy(cx, stream)
        })
    }

    fn stream_query(&self, stream: Stream) -> DriverResult<Readiness> {
        self.call(c::STREAM_QUERY, Some(stream), |st, cx| {
            st.stream_query(cx, stream)
        })
    }

    fn stream_synchronize(&self, stream: Stream) -> DriverResult<()> {
        self.call(c::STREAM_SYNCHRONIZE, Some(stream), |st, cx| {
            st.stream_synchronize(cx, stream)
        })
    }

    fn stream_wait_event(&self, stream: Stream, event: Event) -> DriverResult<()> {
        self.call(c::STREAM_WAIT_EVENT, Some(stream), |st, cx| {
            st.stream_wait_event(cx, stream, event)
        })
    }

    fn event_create(&self, timing: bool) -> DriverResult<Event> {
        self.call(c::EVENT_CREATE, None, |st, cx| st.event_create(cx, timing))
    }

    fn event_destroy(&self, event: Event) -> DriverResult<()> {
        self.call(c::EVENT_DESTROY, None, |st, cx| st.event_destroy(cx, event))
    }

    fn event_record(&self, event: Event, stream: Stream) -> DriverResult<()> {
        self.call(c::EVENT_RECORD, Some(stream), |st, cx| {
            st.event_record(cx, event, stream)
        })
    }

    fn event_query(&self, event: Event) -> DriverResult<Readiness> {
        self.call(c::EVENT_QUERY, None, |st, cx| st.event_query(cx, event))
    }

    fn event_synchronize(&self, event: Event) -> DriverResult<()> {
        self.call(c::EVENT_SYNCHRONIZE, None, |st, cx| {
            st.event_synchronize(cx, event)
        })
    }

    fn event_elapsed_ms(&self, start: Event, end: Event) -> DriverResult<f32> {
        self.call(c::EVENT_ELAPSED_TIME, None, |st, cx| {
            st.event_elapsed_ms(cx, start, end)
        })
    }

    fn mem_get_info(&self) -> DriverResult<(u64, u64)> {
        self.call(c::MEM_GET_INFO, None, |st, cx| st.mem_get_info(cx))
    }

    fn mem_alloc(&self, bytes: u64) -> DriverResult<DevicePtr> {
        self.call(c::MEM_ALLOC, None, |st, cx| {
            st.mem_alloc(cx, bytes, AllocKind::Device)
        })
    }

    fn mem_alloc_managed(&self, bytes: u64) -> DriverResult<DevicePtr> {
        self.call(c::MEM_ALLOC_MANAGED, None, |st, cx| {
            st.mem_alloc(cx, bytes, AllocKind::Managed)
        })
    }

    fn mem_free(&self, ptr: DevicePtr) -> DriverResult<()> {
        self.call(c::MEM_FREE, None, |st, cx| st.mem_free(cx, ptr))
    }

    fn mem_alloc_host(&self, bytes: u64) -> DriverResult<HostPtr> {
        self.call(c::MEM_ALLOC_HOST, None, |st, cx| {
            st.mem_alloc_host(cx, bytes)
        })
    }

    fn mem_free_host(&self, ptr: HostPtr) -> DriverResult<()> {
        self.call(c::MEM_FREE_HOST, None, |st, cx| st.mem_free_host(cx, ptr))
    }

    /// Plain host memory: no driver call, so no capture rule, log entry or sticky error.
    fn host_read(&self, src: HostPtr, dst: &mut [u8]) -> DriverResult<()> {
        let st = self.lock();
        let data = st.mem.host_read(src, dst.len() as u64).ok_or_else(|| {
            crate::driver::DriverError::InvalidArgument {
                call: "host_read",
                reason: format!("{src:?} + {} bytes is not page-locked memory", dst.len()),
            }
        })?;
        dst.copy_from_slice(&data);
        Ok(())
    }

    /// Plain host memory, as `host_read`.
    fn host_write(&self, dst: HostPtr, src: &[u8]) -> DriverResult<()> {
        self.lock().mem.host_write(dst, src).ok_or_else(|| {
            crate::driver::DriverError::InvalidArgument {
                call: "host_write",
                reason: format!("{dst:?} + {} bytes is not page-locked memory", src.len()),
            }
        })
    }

    /// Plain host memory, as `host_read`. The simulator's host memory lives in its state, so
    /// the range is copied out, lent, and written back (the driver is not locked while `f`
    /// runs, so `f` may call the driver); a real driver lends the memory itself.
    fn host_lend_f32(
        &self,
        ptr: HostPtr,
        words: usize,
        f: &mut dyn FnMut(&mut [f32]),
    ) -> DriverResult<()> {
        let bytes = words.checked_mul(4).map(|b| b as u64);
        let data = bytes
            .filter(|_| ptr.0.is_multiple_of(4))
            .and_then(|b| self.lock().mem.host_read(ptr, b))
            .ok_or_else(|| crate::driver::DriverError::InvalidArgument {
                call: "host_lend_f32",
                reason: format!("{ptr:?} + {words} f32 is not aligned page-locked memory"),
            })?;
        let mut view: Vec<f32> = data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        f(&mut view);
        let back: Vec<u8> = view.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.host_write(ptr, &back)
    }

    fn mem_alloc_async(&self, bytes: u64, stream: Stream) -> DriverResult<DevicePtr> {
        self.call(c::MEM_ALLOC_ASYNC, Some(stream), |st, cx| {
            st.mem_alloc_async(cx, bytes, stream)
        })
    }

    fn mem_free_async(&self, ptr: DevicePtr, stream: Stream) -> DriverResult<()> {
        self.call(c::MEM_FREE_ASYNC, Some(stream), |st, cx| {
            st.mem_free_async(cx, ptr, stream)
        })
    }

    fn mem_pool_create(&self, props: PoolProps) -> DriverResult<MemPool> {
        self.call(c::MEM_POOL_CREATE, None, |st, cx| {
            st.mem_pool_create(cx, props)
        })
    }

    fn mem_pool_destroy(&self, pool: MemPool) -> DriverResult<()> {
        self.call(c::MEM_POOL_DESTROY, None, |st, cx| {
            st.mem_pool_destroy(cx, pool)
        })
    }

    fn mem_pool_set_release_threshold(&self, pool: MemPool, bytes: u64) -> DriverResult<()> {
        self.call(c::MEM_POOL_SET_ATTRIBUTE, None, |st, cx| {
            st.mem_pool_set_release_threshold(cx, pool, bytes)
        })
    }

    fn mem_pool_reserved(&self, pool: MemPool) -> DriverResult<u64> {
        self.call(c::MEM_POOL_GET_ATTRIBUTE, None, |st, cx| {
            st.mem_pool_reserved(cx, pool)
        })
    }

    fn mem_pool_trim_to(&self, pool: MemPool, keep_bytes: u64) -> DriverResult<()> {
        self.call(c::MEM_POOL_TRIM_TO, None, |st, cx| {
            st.mem_pool_trim_to(cx, pool, keep_bytes)
        })
    }

    fn mem_alloc_from_pool_async(
        &self,
        bytes: u64,
        pool: MemPool,
        stream: Stream,
    ) -> DriverResult<DevicePtr> {
        self.call(c::MEM_ALLOC_FROM_POOL_ASYNC, Some(stream), |st, cx| {
            st.mem_alloc_from_pool_async(cx, bytes, pool, stream)
        })
    }

    fn ipc_get_mem_handle(&self, ptr: DevicePtr) -> DriverResult<IpcMemHandle> {
        self.call(c::IPC_GET_MEM_HANDLE, None, |st, cx| {
            st.ipc_get_mem_handle(cx, ptr)
        })
    }

    fn ipc_open_mem_handle(&self, handle: &IpcMemHandle) -> DriverResult<DevicePtr> {
        self.call(c::IPC_OPEN_MEM_HANDLE, None, |st, cx| {
            st.ipc_open_mem_handle(cx, handle)
        })
    }

    fn ipc_close_mem_handle(&self, ptr: DevicePtr) -> DriverResult<()> {
        self.call(c::IPC_CLOSE_MEM_HANDLE, None, |st, cx| {
            st.ipc_close_mem_handle(cx, ptr)
        })
    }

    fn memcpy_htod(&self, dst: DevicePtr, src: &[u8]) -> DriverResult<()> {
        self.call(c::MEMCPY_HTOD, None, |st, cx| st.memcpy_htod(cx, dst, src))
    }

    fn memcpy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> DriverResult<()> {
        self.call(c::MEMCPY_DTOH, None, |st, cx| st.memcpy_dtoh(cx, dst, src))
    }

    fn memcpy_dtod(&self, dst: DevicePtr, src: DevicePtr, bytes: u64) -> DriverResult<()> {
        self.call(c::MEMCPY_DTOD, None, |st, cx| {
            st.memcpy_dtod(cx, dst, src, bytes)
        })
    }

    fn memset_d8(&self, dst: DevicePtr, value: u8, bytes: u64) -> DriverResult<()> {
        self.call(c::MEMSET_D8, None, |st, cx| {
            st.memset_d8(cx, dst, value, bytes)
        })
    }

    fn memset_d32(&self, dst: DevicePtr, value: u32, count: u64) -> DriverResult<()> {
        self.call(c::MEMSET_D32, None, |st, cx| {
            st.memset_d32(cx, dst, value, count)
        })
    }

    fn memcpy_dtod_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
        stream: Stream,
    ) -> DriverResult<()> {
        self.call(c::MEMCPY_DTOD_ASYNC, Some(stream), |st, cx| {
            st.memcpy_dtod_async(cx, dst, src, bytes, stream)
        })
    }

    fn memset_d8_async(
        &self,
        dst: DevicePtr,
        value: u8,
        bytes: u64,
        stream: Stream,
    ) -> DriverResult<()> {
        self.call(c::MEMSET_D8_ASYNC, Some(stream), |st, cx| {
            st.memset_d8_async(cx, dst, value, bytes, stream)
        })
    }

    fn memset_d32_async(
        &self,
        dst: DevicePtr,
        value: u32,
        count: u64,
        stream: Stream,
    ) -> DriverResult<()> {
        self.call(c::MEMSET_D32_ASYNC, Some(stream), |st, cx| {
            st.memset_d32_async(cx, dst, value, count, stream)
        })
    }

    /// Host memory is the simulator's own, so nothing here needs the caller's promise.
    unsafe fn memcpy_htod_async(
        &self,
        dst: DevicePtr,
        src: HostPtr,
        bytes: u64,
        stream: Stream,
    ) -> DriverResult<()> {
        self.call(c::MEMCPY_HTOD_ASYNC, Some(stream), |st, cx| {
            st.memcpy_htod_async(cx, dst, src, bytes, stream)
        })
    }

    unsafe fn memcpy_dtoh_async(
        &self,
        dst: HostPtr,
        src: DevicePtr,
        bytes: u64,
        stream: Stream,
    ) -> DriverResult<()> {
        self.call(c::MEMCPY_DTOH_ASYNC, Some(stream), |st, cx| {
            st.memcpy_dtoh_async(cx, dst, src, bytes, stream)
        })
    }

    unsafe fn memcpy_htod_async_pageable(
        &self,
        dst: DevicePtr,
        src: &[u8],
        stream: Stream,
    ) -> DriverResult<()> {
        self.call(c::MEMCPY_HTOD_ASYNC, Some(stream), |st, cx| {
            st.memcpy_htod_async_pageable(cx, dst, src, stream)
        })
    }

    fn module_load_ptx(&self, ptx: &str) -> DriverResult<Module> {
        self.call(c::MODULE_LOAD_DATA, None, |st, cx| {
            st.module_load_ptx(cx, ptx)
        })
    }

    fn module_unload(&self, module: Module) -> DriverResult<()> {
        self.call(c::MODULE_UNLOAD, None, |st, cx| {
            st.module_unload(cx, module)
        })
    }

    fn module_get_function(&self, module: Module, name: &str) -> DriverResult<Function> {
        self.call(c::MODULE_GET_FUNCTION, None, |st, cx| {
            st.module_get_function(cx, module, name)
        })
    }

    /// Arguments are copied; memory is reached only through the checked accessor.
    unsafe fn launch_kernel(
        &self,
        function: Function,
        config: LaunchConfig,
        args: &[KernelArg],
        stream: Stream,
    ) -> DriverResult<()> {
        self.launching(c::LAUNCH_KERNEL, stream, |st, cx| {
            st.launch_kernel(cx, function, config, args, stream)
        })
    }

    fn stream_begin_capture(&self, stream: Stream, mode: CaptureMode) -> DriverResult<()> {
        self.call(c::STREAM_BEGIN_CAPTURE, Some(stream), |st, cx| {
            st.begin_capture(cx, stream, mode)
        })
    }

    fn stream_end_capture(&self, stream: Stream) -> DriverResult<Graph> {
        self.call(c::STREAM_END_CAPTURE, Some(stream), |st, cx| {
            st.end_capture(cx, stream)
        })
    }

    fn stream_is_capturing(&self, stream: Stream) -> DriverResult<CaptureStatus> {
        self.call(c::STREAM_IS_CAPTURING, Some(stream), |st, cx| {
            st.is_capturing(cx, stream)
        })
    }

    fn graph_node_count(&self, graph: Graph) -> DriverResult<usize> {
        self.call(c::GRAPH_GET_NODES, None, |st, cx| {
            st.graph_node_count(cx, graph)
        })
    }

    fn graph_destroy(&self, graph: Graph) -> DriverResult<()> {
        self.call(c::GRAPH_DESTROY, None, |st, cx| st.graph_destroy(cx, graph))
    }

    fn graph_instantiate(&self, graph: Graph, flags: InstantiateFlags) -> DriverResult<GraphExec> {
        self.call(c::GRAPH_INSTANTIATE, None, |st, cx| {
            st.graph_instantiate(cx, graph, flags)
        })
    }

    fn graph_launch(&self, exec: GraphExec, stream: Stream) -> DriverResult<()> {
        self.launching(c::GRAPH_LAUNCH, stream, |st, cx| {
            st.graph_launch(cx, exec, stream)
        })
    }

    fn graph_exec_destroy(&self, exec: GraphExec) -> DriverResult<()> {
        self.call(c::GRAPH_EXEC_DESTROY, None, |st, cx| {
            st.graph_exec_destroy(cx, exec)
        })
    }

    fn blas_create(&self) -> DriverResult<BlasHandle> {
        self.call(c::BLAS_CREATE, None, |st, cx| st.blas_create(cx))
    }

    fn blas_destroy(&self, handle: BlasHandle) -> DriverResult<()> {
        self.call(c::BLAS_DESTROY, None, |st, cx| st.blas_destroy(cx, handle))
    }

    fn blas_set_stream(&self, handle: BlasHandle, stream: Stream) -> DriverResult<()> {
        self.call(c::BLAS_SET_STREAM, Some(stream), |st, cx| {
            st.blas_set_stream(cx, handle, stream)
        })
    }

    fn blas_set_workspace(
        &self,
        handle: BlasHandle,
        workspace: DevicePtr,
        bytes: u64,
    ) -> DriverResult<()> {
        self.call(c::BLAS_SET_WORKSPACE, None, |st, cx| {
            st.blas_set_workspace(cx, handle, workspace, bytes)
        })
    }

    fn blas_set_tf32(&self, handle: BlasHandle, tf32: bool) -> DriverResult<()> {
        self.call(c::BLAS_SET_MATH_MODE, None, |st, cx| {
            st.blas_set_tf32(cx, handle, tf32)
        })
    }

    /// Operands are reached through the checked accessor when the product runs.
    unsafe fn gemm_strided_batched_f32(
        &self,
        handle: BlasHandle,
        gemm: &GemmF32,
    ) -> DriverResult<()> {
        self.call(c::GEMM_STRIDED_BATCHED, None, |st, cx| {
            st.gemm(cx, handle, gemm)
        })
    }

    // --- mixed-precision gemm (issue 42) -----------------------------------------------------

    /// Emulated in `sim/gemm_ex.rs` (operands rounded as the mode says, float32 accumulation);
    /// captured like `cublasSgemmStridedBatched`.
    unsafe fn gemm_strided_batched_ex(
        &self,
        handle: BlasHandle,
        gemm: &GemmEx,
    ) -> DriverResult<()> {
        self.call(c::GEMM_STRIDED_BATCHED_EX, None, |st, cx| {
            st.gemm_ex(cx, handle, gemm)
        })
    }

    // --- device-mapped host flags (issue 44) ---------------------------------------------

    /// A driver call with no stream: logged, under the fault plan, answered during a capture
    /// as outside one (`sim/capture.rs`'s row; expected of the GPU, not measured yet), and
    /// `CUDA_ERROR_INVALID_VALUE` for an address outside page-locked memory. Kernels then read and
    /// write the memory at that address (`SimMemory`), as over unified addressing.
    fn host_device_ptr(&self, ptr: HostPtr) -> DriverResult<DevicePtr> {
        self.call(c::MEM_HOST_GET_DEVICE_POINTER, None, |st, cx| {
            st.mem_host_device_ptr(cx, ptr)
        })
    }

    /// Plain host memory, as `host_write`: no driver call, so no capture rule, log entry or
    /// sticky error; it lands whatever the streams hold.
    fn host_store_u32(&self, dst: HostPtr, value: u32) -> DriverResult<()> {
        if !dst.0.is_multiple_of(4) {
            return Err(crate::driver::DriverError::InvalidArgument {
                call: "host_store_u32",
                reason: format!("{:#x} is not 4-byte aligned", dst.0),
            });
        }
        self.lock()
            .mem
            .host_write(dst, &value.to_le_bytes())
            .ok_or_else(|| crate::driver::DriverError::InvalidArgument {
                call: "host_store_u32",
                reason: format!("{dst:?} + 4 bytes is not page-locked memory"),
            })
    }
}
