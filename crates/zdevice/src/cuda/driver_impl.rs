//! `impl Driver for CudaDriver`: one checked CUDA call per method, each in the module of its
//! kind as the inherent method `cu_<name>` (`context.rs`, `streams.rs`, `memory.rs`, `ipc.rs`,
//! `copies.rs`, `kernels.rs`, `graphs.rs`; cuBLAS's in `blas.rs`). The few methods without a
//! CUDA call are here.

use std::time::Duration;

use super::CudaDriver;
use crate::driver::{Driver, DriverResult};
use crate::types::*;

impl Driver for CudaDriver {
    fn describe(&self) -> String {
        match self.version {
            Some(v) => format!(
                "CudaDriver (libcuda, driver API {}.{})",
                v / 1000,
                (v % 1000) / 10
            ),
            None => "CudaDriver (libcuda, driver version unknown)".to_string(),
        }
    }

    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    fn pause(&self, d: Duration) {
        std::thread::sleep(d);
    }

    fn is_virtual_time(&self) -> bool {
        false
    }

    fn init(&self) -> DriverResult<()> {
        self.cu_init()
    }

    fn driver_version(&self) -> DriverResult<u32> {
        self.cu_driver_version()
    }

    fn device_count(&self) -> DriverResult<u32> {
        self.cu_device_count()
    }

    fn device_name(&self, ordinal: u32) -> DriverResult<String> {
        self.cu_device_name(ordinal)
    }

    fn device_total_mem(&self, ordinal: u32) -> DriverResult<u64> {
        self.cu_device_total_mem(ordinal)
    }

    fn compute_capability(&self, ordinal: u32) -> DriverResult<(u32, u32)> {
        self.cu_compute_capability(ordinal)
    }

    fn primary_ctx_retain(&self, ordinal: u32) -> DriverResult<Context> {
        self.cu_primary_ctx_retain(ordinal)
    }

    fn primary_ctx_release(&self, ordinal: u32) -> DriverResult<()> {
        self.cu_primary_ctx_release(ordinal)
    }

    fn ctx_set_current(&self, ctx: Context) -> DriverResult<()> {
        self.cu_ctx_set_current(ctx)
    }

    fn ctx_synchronize(&self) -> DriverResult<()> {
        self.cu_ctx_synchronize()
    }

    fn stream_create(&self, kind: StreamKind) -> DriverResult<Stream> {
        self.cu_stream_create(kind)
    }

    fn stream_create_with_priority(&self, kind: StreamKind, priority: i32) -> DriverResult<Stream> {
        self.cu_stream_create_with_priority(kind, priority)
    }

    fn stream_priority_range(&self) -> DriverResult<PriorityRange> {
        self.cu_stream_priority_range()
    }

    fn stream_destroy(&self, s: Stream) -> DriverResult<()> {
        self.cu_stream_destroy(s)
    }

    fn stream_query(&self, s: Stream) -> DriverResult<Readiness> {
        self.cu_stream_query(s)
    }

    fn stream_synchronize(&self, s: Stream) -> DriverResult<()> {
        self.cu_stream_synchronize(s)
    }

    fn stream_wait_event(&self, s: Stream, e: Event) -> DriverResult<()> {
        self.cu_stream_wait_event(s, e)
    }

    fn event_create(&self, timing: bool) -> DriverResult<Event> {
        self.cu_event_create(timing)
    }

    fn event_destroy(&self, e: Event) -> DriverResult<()> {
        self.cu_event_destroy(e)
    }

    fn event_record(&self, e: Event, s: Stream) -> DriverResult<()> {
        self.cu_event_record(e, s)
    }

    fn event_query(&self, e: Event) -> DriverResult<Readiness> {
        self.cu_event_query(e)
    }

    fn event_synchronize(&self, e: Event) -> DriverResult<()> {
        self.cu_event_synchronize(e)
    }

    fn event_elapsed_ms(&self, start: Event, end: Event) -> DriverResult<f32> {
        self.cu_event_elapsed_ms(start, end)
    }

    fn mem_get_info(&self) -> DriverResult<(u64, u64)> {
        self.cu_mem_get_info()
    }

    fn mem_alloc(&self, bytes: u64) -> DriverResult<DevicePtr> {
        self.cu_mem_alloc(bytes)
    }

    fn mem_alloc_managed(&self, bytes: u64) -> DriverResult<DevicePtr> {
        self.cu_mem_alloc_managed(bytes)
    }

    fn mem_free(&self, p: DevicePtr) -> DriverResult<()> {
        self.cu_mem_free(p)
    }

    fn mem_alloc_host(&self, bytes: u64) -> DriverResult<HostPtr> {
        self.cu_mem_alloc_host(bytes)
    }

    fn mem_free_host(&self, p: HostPtr) -> DriverResult<()> {
        self.cu_mem_free_host(p)
    }

    fn host_read(&self, src: HostPtr, dst: &mut [u8]) -> DriverResult<()> {
        self.cu_host_read(src, dst)
    }

    fn host_write(&self, dst: HostPtr, src: &[u8]) -> DriverResult<()> {
        self.cu_host_write(dst, src)
    }

    fn host_lend_f32(
        &self,
        ptr: HostPtr,
        words: usize,
        f: &mut dyn FnMut(&mut [f32]),
    ) -> DriverResult<()> {
        self.lend_f32(ptr, words, f)
    }

    fn mem_alloc_async(&self, bytes: u64, s: Stream) -> DriverResult<DevicePtr> {
        self.cu_mem_alloc_async(bytes, s)
    }

    fn mem_free_async(&self, p: DevicePtr, s: Stream) -> DriverResult<()> {
        self.cu_mem_free_async(p, s)
    }

    fn mem_pool_create(&self, props: PoolProps) -> DriverResult<MemPool> {
        self.cu_mem_pool_create(props)
    }

    fn mem_pool_destroy(&self, pool: MemPool) -> DriverResult<()> {
        self.cu_mem_pool_destroy(pool)
    }

    fn mem_pool_set_release_threshold(&self, pool: MemPool, bytes: u64) -> DriverResult<()> {
        self.cu_mem_pool_set_release_threshold(pool, bytes)
    }

    fn mem_pool_reserved(&self, pool: MemPool) -> DriverResult<u64> {
        self.cu_mem_pool_reserved(pool)
    }

    fn mem_pool_trim_to(&self, pool: MemPool, keep_bytes: u64) -> DriverResult<()> {
        self.cu_mem_pool_trim_to(pool, keep_bytes)
    }

    fn mem_alloc_from_pool_async(
        &self,
        bytes: u64,
        pool: MemPool,
        s: Stream,
    ) -> DriverResult<DevicePtr> {
        self.cu_mem_alloc_from_pool_async(bytes, pool, s)
    }

    fn ipc_get_mem_handle(&self, ptr: DevicePtr) -> DriverResult<IpcMemHandle> {
        self.cu_ipc_get_mem_handle(ptr)
    }

    fn ipc_open_mem_handle(&self, handle: &IpcMemHandle) -> DriverResult<DevicePtr> {
        self.cu_ipc_open_mem_handle(handle)
    }

    fn ipc_close_mem_handle(&self, ptr: DevicePtr) -> DriverResult<()> {
        self.cu_ipc_close_mem_handle(ptr)
    }

    fn memcpy_htod(&self, dst: DevicePtr, src: &[u8]) -> DriverResult<()> {
        self.cu_memcpy_htod(dst, src)
    }

    fn memcpy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> DriverResult<()> {
        self.cu_memcpy_dtoh(dst, src)
    }

    fn memcpy_dtod(&self, dst: DevicePtr, src: DevicePtr, bytes: u64) -> DriverResult<()> {
        self.cu_memcpy_dtod(dst, src, bytes)
    }

    fn memset_d8(&self, dst: DevicePtr, value: u8, bytes: u64) -> DriverResult<()> {
        self.cu_memset_d8(dst, value, bytes)
    }

    fn memset_d32(&self, dst: DevicePtr, value: u32, count: u64) -> DriverResult<()> {
        self.cu_memset_d32(dst, value, count)
    }

    fn memcpy_dtod_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
        s: Stream,
    ) -> DriverResult<()> {
        self.cu_memcpy_dtod_async(dst, src, bytes, s)
    }

    fn memset_d8_async(
        &self,
        dst: DevicePtr,
        value: u8,
        bytes: u64,
        s: Stream,
    ) -> DriverResult<()> {
        self.cu_memset_d8_async(dst, value, bytes, s)
    }

    fn memset_d32_async(
        &self,
        dst: DevicePtr,
        value: u32,
        count: u64,
        s: Stream,
    ) -> DriverResult<()> {
        self.cu_memset_d32_async(dst, value, count, s)
    }

    unsafe fn memcpy_htod_async(
        &self,
        dst: DevicePtr,
        src: HostPtr,
        bytes: u64,
        s: Stream,
    ) -> DriverResult<()> {
        // SAFETY: the caller's contract, forwarded unchanged.
        unsafe { self.cu_memcpy_htod_async(dst, src, bytes, s) }
    }

    unsafe fn memcpy_dtoh_async(
        &self,
        dst: HostPtr,
        src: DevicePtr,
        bytes: u64,
        s: Stream,
    ) -> DriverResult<()> {
        // SAFETY: the caller's contract, forwarded unchanged.
        unsafe { self.cu_memcpy_dtoh_async(dst, src, bytes, s) }
    }

    unsafe fn memcpy_htod_async_pageable(
        &self,
        dst: DevicePtr,
        src: &[u8],
        s: Stream,
    ) -> DriverResult<()> {
        // SAFETY: the caller's contract, forwarded unchanged.
        unsafe { self.cu_memcpy_htod_async_pageable(dst, src, s) }
    }

    fn module_load_ptx(&self, ptx: &str) -> DriverResult<Module> {
        self.cu_module_load_ptx(ptx)
    }

    fn module_unload(&self, module: Module) -> DriverResult<()> {
        self.cu_module_unload(module)
    }

    fn module_get_function(&self, module: Module, name: &str) -> DriverResult<Function> {
        self.cu_module_get_function(module, name)
    }

    unsafe fn launch_kernel(
        &self,
        function: Function,
        config: LaunchConfig,
        args: &[KernelArg],
        s: Stream,
    ) -> DriverResult<()> {
        // SAFETY: the caller's contract, forwarded unchanged.
        unsafe { self.cu_launch_kernel(function, config, args, s) }
    }

    fn stream_begin_capture(&self, s: Stream, mode: CaptureMode) -> DriverResult<()> {
        self.cu_stream_begin_capture(s, mode)
    }

    fn stream_end_capture(&self, s: Stream) -> DriverResult<Graph> {
        self.cu_stream_end_capture(s)
    }

    fn stream_is_capturing(&self, s: Stream) -> DriverResult<CaptureStatus> {
        self.cu_stream_is_capturing(s)
    }

    fn graph_node_count(&self, graph: Graph) -> DriverResult<usize> {
        self.cu_graph_node_count(graph)
    }

    fn graph_destroy(&self, graph: Graph) -> DriverResult<()> {
        self.cu_graph_destroy(graph)
    }

    fn graph_instantiate(&self, graph: Graph, flags: InstantiateFlags) -> DriverResult<GraphExec> {
        self.cu_graph_instantiate(graph, flags)
    }

    fn graph_launch(&self, exec: GraphExec, s: Stream) -> DriverResult<()> {
        self.cu_graph_launch(exec, s)
    }

    fn graph_exec_destroy(&self, exec: GraphExec) -> DriverResult<()> {
        self.cu_graph_exec_destroy(exec)
    }

    fn blas_create(&self) -> DriverResult<BlasHandle> {
        super::blas::create(self)
    }

    fn blas_destroy(&self, handle: BlasHandle) -> DriverResult<()> {
        super::blas::destroy(self, handle)
    }

    fn blas_set_stream(&self, handle: BlasHandle, s: Stream) -> DriverResult<()> {
        super::blas::set_stream(self, handle, s)
    }

    fn blas_set_workspace(
        &self,
        handle: BlasHandle,
        workspace: DevicePtr,
        bytes: u64,
    ) -> DriverResult<()> {
        super::blas::set_workspace(self, handle, workspace, bytes)
    }

    fn blas_set_tf32(&self, handle: BlasHandle, tf32: bool) -> DriverResult<()> {
        super::blas::set_tf32(self, handle, tf32)
    }

    unsafe fn gemm_strided_batched_f32(
        &self,
        handle: BlasHandle,
        gemm: &GemmF32,
    ) -> DriverResult<()> {
        // SAFETY: forwarded contract: every operand lies in live device memory.
        unsafe { super::blas::sgemm_strided_batched(self, handle, gemm) }
    }

    // --- mixed-precision gemm (issue 42) -----------------------------------------------------

    unsafe fn gemm_strided_batched_ex(
        &self,
        handle: BlasHandle,
        gemm: &GemmEx,
    ) -> DriverResult<()> {
        // SAFETY: forwarded contract: every operand lies in live device memory, of the mode's
        // element types.
        unsafe { super::blas::gemm_strided_batched_ex(self, handle, gemm) }
    }

    // --- device-mapped host flags (issue 44) ---------------------------------------------

    fn host_device_ptr(&self, p: HostPtr) -> DriverResult<DevicePtr> {
        self.cu_host_device_ptr(p)
    }

    fn host_store_u32(&self, dst: HostPtr, value: u32) -> DriverResult<()> {
        self.cu_host_store_u32(dst, value)
    }
}
