//! `Driver for FaultyDriver<D>`: every method, each through the fault plan, then the real
//! driver, then the ledger. A method added to [`Driver`] must be added here as well.

use std::time::Duration;

use super::{FaultyDriver, resource};
use crate::driver::{Driver, DriverResult};
use crate::sim::calls;
use crate::types::*;

impl<D: Driver> Driver for FaultyDriver<D> {
    fn describe(&self) -> String {
        format!("FaultyDriver over {}", self.inner.describe())
    }

    fn now(&self) -> Duration {
        self.inner.now()
    }

    fn pause(&self, d: Duration) {
        self.inner.pause(d);
    }

    fn is_virtual_time(&self) -> bool {
        self.inner.is_virtual_time()
    }

    // --- initialisation and context ---------------------------------------------------------

    fn init(&self) -> DriverResult<()> {
        self.sync_call(calls::INIT, |d| d.init())
    }

    fn driver_version(&self) -> DriverResult<u32> {
        self.sync_call(calls::DRIVER_GET_VERSION, |d| d.driver_version())
    }

    fn device_count(&self) -> DriverResult<u32> {
        self.sync_call(calls::DEVICE_GET_COUNT, |d| d.device_count())
    }

    fn device_name(&self, ordinal: u32) -> DriverResult<String> {
        self.sync_call(calls::DEVICE_GET_NAME, |d| d.device_name(ordinal))
    }

    fn device_total_mem(&self, ordinal: u32) -> DriverResult<u64> {
        self.sync_call(calls::DEVICE_TOTAL_MEM, |d| d.device_total_mem(ordinal))
    }

    fn compute_capability(&self, ordinal: u32) -> DriverResult<(u32, u32)> {
        self.sync_call(calls::DEVICE_GET_ATTRIBUTE, |d| {
            d.compute_capability(ordinal)
        })
    }

    fn primary_ctx_retain(&self, ordinal: u32) -> DriverResult<Context> {
        let ctx = self.sync_call(calls::PRIMARY_CTX_RETAIN, |d| d.primary_ctx_retain(ordinal))?;
        self.track(resource::CONTEXT, u64::from(ordinal), true);
        Ok(ctx)
    }

    fn primary_ctx_release(&self, ordinal: u32) -> DriverResult<()> {
        self.unload_spin();
        self.sync_call(calls::PRIMARY_CTX_RELEASE, |d| {
            d.primary_ctx_release(ordinal)
        })?;
        self.track(resource::CONTEXT, u64::from(ordinal), false);
        Ok(())
    }

    fn ctx_set_current(&self, ctx: Context) -> DriverResult<()> {
        self.sync_call(calls::CTX_SET_CURRENT, |d| d.ctx_set_current(ctx))?;
        self.load_spin();
        Ok(())
    }

    fn ctx_synchronize(&self) -> DriverResult<()> {
        let out = self.sync_call(calls::CTX_SYNCHRONIZE, |d| d.ctx_synchronize());
        let longest = {
            let st = self.ctl.lock();
            st.busy_streams.values().copied().max()
        };
        if let Some(until) = longest {
            self.inner.pause(until.saturating_sub(self.inner.now()));
        }
        let hung = !self.ctl.lock().hung_streams.is_empty();
        Self::refuse_hung(calls::CTX_SYNCHRONIZE, hung)?;
        self.surface(calls::CTX_SYNCHRONIZE, out)
    }

    // --- streams and events -----------------------------------------------------------------

    fn stream_create(&self, kind: StreamKind) -> DriverResult<Stream> {
        let s = self.sync_call(calls::STREAM_CREATE, |d| d.stream_create(kind))?;
        self.track(resource::STREAM, s.0, true);
        Ok(s)
    }

    fn stream_create_with_priority(&self, kind: StreamKind, priority: i32) -> DriverResult<Stream> {
        let s = self.sync_call(calls::STREAM_CREATE_WITH_PRIORITY, |d| {
            d.stream_create_with_priority(kind, priority)
        })?;
        self.track(resource::STREAM, s.0, true);
        Ok(s)
    }

    fn stream_priority_range(&self) -> DriverResult<PriorityRange> {
        self.sync_call(calls::STREAM_PRIORITY_RANGE, |d| d.stream_priority_range())
    }

    fn stream_destroy(&self, stream: Stream) -> DriverResult<()> {
        self.sync_call(calls::STREAM_DESTROY, |d| d.stream_destroy(stream))?;
        self.track(resource::STREAM, stream.0, false);
        self.ctl.lock().busy_streams.remove(&stream.0);
        Ok(())
    }

    fn stream_query(&self, stream: Stream) -> DriverResult<Readiness> {
        let out = self.sync_call(calls::STREAM_QUERY, |d| d.stream_query(stream));
        let out = self.surface(calls::STREAM_QUERY, out)?;
        if out == Readiness::Ready
            && (self.stream_hung(stream.0) || !self.stream_busy_for(stream.0).is_zero())
        {
            return Ok(Readiness::NotReady);
        }
        Ok(out)
    }

    fn stream_synchronize(&self, stream: Stream) -> DriverResult<()> {
        let out = self.sync_call(calls::STREAM_SYNCHRONIZE, |d| d.stream_synchronize(stream));
        self.inner.pause(self.stream_busy_for(stream.0));
        Self::refuse_hung(calls::STREAM_SYNCHRONIZE, self.stream_hung(stream.0))?;
        self.surface(calls::STREAM_SYNCHRONIZE, out)
    }

    fn stream_wait_event(&self, stream: Stream, event: Event) -> DriverResult<()> {
        self.async_call(calls::STREAM_WAIT_EVENT, stream.0, |d| {
            d.stream_wait_event(stream, event)
        })?;
        let mut st = self.ctl.lock();
        if st.hung_events.contains(&event.0) {
            st.hung_streams.insert(stream.0);
        }
        if let Some(until) = st.busy_events.get(&event.0).copied() {
            let busy = st.busy_streams.entry(stream.0).or_default();
            *busy = (*busy).max(until);
        }
        Ok(())
    }

    fn event_create(&self, timing: bool) -> DriverResult<Event> {
        let e = self.sync_call(calls::EVENT_CREATE, |d| d.event_create(timing))?;
        self.track(resource::EVENT, e.0, true);
        Ok(e)
    }

    fn event_destroy(&self, event: Event) -> DriverResult<()> {
        self.sync_call(calls::EVENT_DESTROY, |d| d.event_destroy(event))?;
        self.track(resource::EVENT, event.0, false);
        self.ctl.lock().busy_events.remove(&event.0);
        Ok(())
    }

    fn event_record(&self, event: Event, stream: Stream) -> DriverResult<()> {
        self.async_call(calls::EVENT_RECORD, stream.0, |d| {
            d.event_record(event, stream)
        })?;
        // The event completes when the stream's work before it does, stalls included.
        let mut st = self.ctl.lock();
        if st.hung_streams.contains(&stream.0) {
            st.hung_events.insert(event.0);
        } else {
            st.hung_events.remove(&event.0);
        }
        match st.busy_streams.get(&stream.0).copied() {
            Some(until) => st.busy_events.insert(event.0, until),
            None => st.busy_events.remove(&event.0),
        };
        Ok(())
    }

    fn event_query(&self, event: Event) -> DriverResult<Readiness> {
        let out = self.sync_call(calls::EVENT_QUERY, |d| d.event_query(event));
        let out = self.surface(calls::EVENT_QUERY, out)?;
        if out == Readiness::Ready
            && (self.event_hung(event.0) || !self.event_busy_for(event.0).is_zero())
        {
            return Ok(Readiness::NotReady);
        }
        Ok(out)
    }

    fn event_synchronize(&self, event: Event) -> DriverResult<()> {
        let out = self.sync_call(calls::EVENT_SYNCHRONIZE, |d| d.event_synchronize(event));
        self.inner.pause(self.event_busy_for(event.0));
        Self::refuse_hung(calls::EVENT_SYNCHRONIZE, self.event_hung(event.0))?;
        self.surface(calls::EVENT_SYNCHRONIZE, out)
    }

    fn event_elapsed_ms(&self, start: Event, end: Event) -> DriverResult<f32> {
        self.sync_call(calls::EVENT_ELAPSED_TIME, |d| {
            d.event_elapsed_ms(start, end)
        })
    }

    // --- memory -----------------------------------------------------------------------------

    fn mem_get_info(&self) -> DriverResult<(u64, u64)> {
        self.sync_call(calls::MEM_GET_INFO, |d| d.mem_get_info())
    }

    fn mem_alloc(&self, bytes: u64) -> DriverResult<DevicePtr> {
        let p = self.sync_call(calls::MEM_ALLOC, |d| d.mem_alloc(bytes))?;
        self.track(resource::DEVICE_MEMORY, p.0, true);
        Ok(p)
    }

    fn mem_alloc_managed(&self, bytes: u64) -> DriverResult<DevicePtr> {
        let p = self.sync_call(calls::MEM_ALLOC_MANAGED, |d| d.mem_alloc_managed(bytes))?;
        self.track(resource::DEVICE_MEMORY, p.0, true);
        Ok(p)
    }

    fn mem_free(&self, ptr: DevicePtr) -> DriverResult<()> {
        self.sync_call(calls::MEM_FREE, |d| d.mem_free(ptr))?;
        self.track(resource::DEVICE_MEMORY, ptr.0, false);
        Ok(())
    }

    fn mem_alloc_host(&self, bytes: u64) -> DriverResult<HostPtr> {
        let p = self.sync_call(calls::MEM_ALLOC_HOST, |d| d.mem_alloc_host(bytes))?;
        self.track(resource::HOST_MEMORY, p.0, true);
        Ok(p)
    }

    fn mem_free_host(&self, ptr: HostPtr) -> DriverResult<()> {
        self.sync_call(calls::MEM_FREE_HOST, |d| d.mem_free_host(ptr))?;
        self.track(resource::HOST_MEMORY, ptr.0, false);
        Ok(())
    }

    fn host_read(&self, src: HostPtr, dst: &mut [u8]) -> DriverResult<()> {
        // Not a driver call (plain host memory): no fault applies, as on the simulator.
        self.inner.host_read(src, dst)
    }

    fn host_write(&self, dst: HostPtr, src: &[u8]) -> DriverResult<()> {
        self.inner.host_write(dst, src)
    }

    fn host_lend_f32(
        &self,
        ptr: HostPtr,
        words: usize,
        f: &mut dyn FnMut(&mut [f32]),
    ) -> DriverResult<()> {
        // Plain host memory as well: no fault applies (and it is in no fault matrix list).
        self.inner.host_lend_f32(ptr, words, f)
    }

    fn mem_alloc_async(&self, bytes: u64, stream: Stream) -> DriverResult<DevicePtr> {
        let p = self.async_call(calls::MEM_ALLOC_ASYNC, stream.0, |d| {
            d.mem_alloc_async(bytes, stream)
        })?;
        self.track(resource::DEVICE_MEMORY, p.0, true);
        Ok(p)
    }

    fn mem_free_async(&self, ptr: DevicePtr, stream: Stream) -> DriverResult<()> {
        self.async_call(calls::MEM_FREE_ASYNC, stream.0, |d| {
            d.mem_free_async(ptr, stream)
        })?;
        self.track(resource::DEVICE_MEMORY, ptr.0, false);
        Ok(())
    }

    fn mem_pool_create(&self, props: PoolProps) -> DriverResult<MemPool> {
        let p = self.sync_call(calls::MEM_POOL_CREATE, |d| d.mem_pool_create(props))?;
        self.track(resource::POOL, p.0, true);
        Ok(p)
    }

    fn mem_pool_destroy(&self, pool: MemPool) -> DriverResult<()> {
        self.sync_call(calls::MEM_POOL_DESTROY, |d| d.mem_pool_destroy(pool))?;
        self.track(resource::POOL, pool.0, false);
        Ok(())
    }

    fn mem_pool_set_release_threshold(&self, pool: MemPool, bytes: u64) -> DriverResult<()> {
        self.sync_call(calls::MEM_POOL_SET_ATTRIBUTE, |d| {
            d.mem_pool_set_release_threshold(pool, bytes)
        })
    }

    fn mem_pool_reserved(&self, pool: MemPool) -> DriverResult<u64> {
        self.sync_call(calls::MEM_POOL_GET_ATTRIBUTE, |d| d.mem_pool_reserved(pool))
    }

    fn mem_pool_trim_to(&self, pool: MemPool, keep_bytes: u64) -> DriverResult<()> {
        self.sync_call(calls::MEM_POOL_TRIM_TO, |d| {
            d.mem_pool_trim_to(pool, keep_bytes)
        })
    }

    fn mem_alloc_from_pool_async(
        &self,
        bytes: u64,
        pool: MemPool,
        stream: Stream,
    ) -> DriverResult<DevicePtr> {
        let p = self.async_call(calls::MEM_ALLOC_FROM_POOL_ASYNC, stream.0, |d| {
            d.mem_alloc_from_pool_async(bytes, pool, stream)
        })?;
        self.track(resource::DEVICE_MEMORY, p.0, true);
        Ok(p)
    }

    // --- interprocess memory ---------------------------------------------------------------

    fn ipc_get_mem_handle(&self, ptr: DevicePtr) -> DriverResult<IpcMemHandle> {
        // Exporting acquires nothing: the allocation stays in the ledger as device memory.
        self.sync_call(calls::IPC_GET_MEM_HANDLE, |d| d.ipc_get_mem_handle(ptr))
    }

    fn ipc_open_mem_handle(&self, handle: &IpcMemHandle) -> DriverResult<DevicePtr> {
        let p = self.sync_call(calls::IPC_OPEN_MEM_HANDLE, |d| {
            d.ipc_open_mem_handle(handle)
        })?;
        self.track_ipc(p.0, true);
        Ok(p)
    }

    fn ipc_close_mem_handle(&self, ptr: DevicePtr) -> DriverResult<()> {
        self.sync_call(calls::IPC_CLOSE_MEM_HANDLE, |d| d.ipc_close_mem_handle(ptr))?;
        self.track_ipc(ptr.0, false);
        Ok(())
    }

    // --- copies and memsets -----------------------------------------------------------------

    fn memcpy_htod(&self, dst: DevicePtr, src: &[u8]) -> DriverResult<()> {
        self.sync_call(calls::MEMCPY_HTOD, |d| d.memcpy_htod(dst, src))
    }

    fn memcpy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> DriverResult<()> {
        self.sync_call(calls::MEMCPY_DTOH, |d| d.memcpy_dtoh(dst, src))
    }

    fn memcpy_dtod(&self, dst: DevicePtr, src: DevicePtr, bytes: u64) -> DriverResult<()> {
        self.sync_call(calls::MEMCPY_DTOD, |d| d.memcpy_dtod(dst, src, bytes))
    }

    fn memset_d8(&self, dst: DevicePtr, value: u8, bytes: u64) -> DriverResult<()> {
        self.sync_call(calls::MEMSET_D8, |d| d.memset_d8(dst, value, bytes))
    }

    fn memset_d32(&self, dst: DevicePtr, value: u32, count: u64) -> DriverResult<()> {
        self.sync_call(calls::MEMSET_D32, |d| d.memset_d32(dst, value, count))
    }

    fn memcpy_dtod_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
        stream: Stream,
    ) -> DriverResult<()> {
        self.async_call(calls::MEMCPY_DTOD_ASYNC, stream.0, |d| {
            d.memcpy_dtod_async(dst, src, bytes, stream)
        })
    }

    fn memset_d8_async(
        &self,
        dst: DevicePtr,
        value: u8,
        bytes: u64,
        stream: Stream,
    ) -> DriverResult<()> {
        self.async_call(calls::MEMSET_D8_ASYNC, stream.0, |d| {
            d.memset_d8_async(dst, value, bytes, stream)
        })
    }

    fn memset_d32_async(
        &self,
        dst: DevicePtr,
        value: u32,
        count: u64,
        stream: Stream,
    ) -> DriverResult<()> {
        self.async_call(calls::MEMSET_D32_ASYNC, stream.0, |d| {
            d.memset_d32_async(dst, value, count, stream)
        })
    }

    unsafe fn memcpy_htod_async(
        &self,
        dst: DevicePtr,
        src: HostPtr,
        bytes: u64,
        stream: Stream,
    ) -> DriverResult<()> {
        self.async_call(calls::MEMCPY_HTOD_ASYNC, stream.0, |d| {
            // SAFETY: forwarded unchanged; the caller upholds the trait method's contract.
            unsafe { d.memcpy_htod_async(dst, src, bytes, stream) }
        })
    }

    unsafe fn memcpy_dtoh_async(
        &self,
        dst: HostPtr,
        src: DevicePtr,
        bytes: u64,
        stream: Stream,
    ) -> DriverResult<()> {
        self.async_call(calls::MEMCPY_DTOH_ASYNC, stream.0, |d| {
            // SAFETY: forwarded unchanged; the caller upholds the trait method's contract.
            unsafe { d.memcpy_dtoh_async(dst, src, bytes, stream) }
        })
    }

    unsafe fn memcpy_htod_async_pageable(
        &self,
        dst: DevicePtr,
        src: &[u8],
        stream: Stream,
    ) -> DriverResult<()> {
        self.async_call(calls::MEMCPY_HTOD_ASYNC, stream.0, |d| {
            // SAFETY: forwarded unchanged; the caller upholds the trait method's contract.
            unsafe { d.memcpy_htod_async_pageable(dst, src, stream) }
        })
    }

    // --- modules and launches ---------------------------------------------------------------

    fn module_load_ptx(&self, ptx: &str) -> DriverResult<Module> {
        let m = self.sync_call(calls::MODULE_LOAD_DATA, |d| d.module_load_ptx(ptx))?;
        self.track(resource::MODULE, m.0, true);
        Ok(m)
    }

    fn module_unload(&self, module: Module) -> DriverResult<()> {
        self.sync_call(calls::MODULE_UNLOAD, |d| d.module_unload(module))?;
        self.track(resource::MODULE, module.0, false);
        Ok(())
    }

    fn module_get_function(&self, module: Module, name: &str) -> DriverResult<Function> {
        self.sync_call(calls::MODULE_GET_FUNCTION, |d| {
            d.module_get_function(module, name)
        })
    }

    unsafe fn launch_kernel(
        &self,
        function: Function,
        config: LaunchConfig,
        args: &[KernelArg],
        stream: Stream,
    ) -> DriverResult<()> {
        self.async_call(calls::LAUNCH_KERNEL, stream.0, |d| {
            // SAFETY: forwarded unchanged; the caller upholds the trait method's contract.
            unsafe { d.launch_kernel(function, config, args, stream) }
        })
    }

    // --- capture and graphs -----------------------------------------------------------------

    fn stream_begin_capture(&self, stream: Stream, mode: CaptureMode) -> DriverResult<()> {
        self.sync_call(calls::STREAM_BEGIN_CAPTURE, |d| {
            d.stream_begin_capture(stream, mode)
        })
    }

    fn stream_end_capture(&self, stream: Stream) -> DriverResult<Graph> {
        let g = self.sync_call(calls::STREAM_END_CAPTURE, |d| d.stream_end_capture(stream))?;
        self.track(resource::GRAPH, g.0, true);
        Ok(g)
    }

    fn stream_is_capturing(&self, stream: Stream) -> DriverResult<CaptureStatus> {
        self.sync_call(calls::STREAM_IS_CAPTURING, |d| {
            d.stream_is_capturing(stream)
        })
    }

    fn graph_node_count(&self, graph: Graph) -> DriverResult<usize> {
        self.sync_call(calls::GRAPH_GET_NODES, |d| d.graph_node_count(graph))
    }

    fn graph_destroy(&self, graph: Graph) -> DriverResult<()> {
        self.sync_call(calls::GRAPH_DESTROY, |d| d.graph_destroy(graph))?;
        self.track(resource::GRAPH, graph.0, false);
        Ok(())
    }

    fn graph_instantiate(&self, graph: Graph, flags: InstantiateFlags) -> DriverResult<GraphExec> {
        let e = self.sync_call(calls::GRAPH_INSTANTIATE, |d| {
            d.graph_instantiate(graph, flags)
        })?;
        self.track(resource::GRAPH_EXEC, e.0, true);
        Ok(e)
    }

    fn graph_launch(&self, exec: GraphExec, stream: Stream) -> DriverResult<()> {
        self.async_call(calls::GRAPH_LAUNCH, stream.0, |d| {
            d.graph_launch(exec, stream)
        })
    }

    fn graph_exec_destroy(&self, exec: GraphExec) -> DriverResult<()> {
        self.sync_call(calls::GRAPH_EXEC_DESTROY, |d| d.graph_exec_destroy(exec))?;
        self.track(resource::GRAPH_EXEC, exec.0, false);
        Ok(())
    }

    // --- cuBLAS -----------------------------------------------------------------------------

    fn blas_create(&self) -> DriverResult<BlasHandle> {
        let h = self.sync_call(calls::BLAS_CREATE, |d| d.blas_create())?;
        self.track(resource::BLAS, h.0, true);
        Ok(h)
    }

    fn blas_destroy(&self, handle: BlasHandle) -> DriverResult<()> {
        self.sync_call(calls::BLAS_DESTROY, |d| d.blas_destroy(handle))?;
        self.track(resource::BLAS, handle.0, false);
        self.ctl.lock().blas_streams.remove(&handle.0);
        Ok(())
    }

    fn blas_set_stream(&self, handle: BlasHandle, stream: Stream) -> DriverResult<()> {
        self.sync_call(calls::BLAS_SET_STREAM, |d| {
            d.blas_set_stream(handle, stream)
        })?;
        self.ctl.lock().blas_streams.insert(handle.0, stream.0);
        Ok(())
    }

    fn blas_set_workspace(
        &self,
        handle: BlasHandle,
        workspace: DevicePtr,
        bytes: u64,
    ) -> DriverResult<()> {
        self.sync_call(calls::BLAS_SET_WORKSPACE, |d| {
            d.blas_set_workspace(handle, workspace, bytes)
        })
    }

    fn blas_set_tf32(&self, handle: BlasHandle, tf32: bool) -> DriverResult<()> {
        self.sync_call(calls::BLAS_SET_MATH_MODE, |d| d.blas_set_tf32(handle, tf32))
    }

    unsafe fn gemm_strided_batched_f32(
        &self,
        handle: BlasHandle,
        gemm: &GemmF32,
    ) -> DriverResult<()> {
        // cuBLAS queues on the handle's stream (the legacy stream until one is set).
        let stream = self.blas_stream(handle);
        self.async_call(calls::GEMM_STRIDED_BATCHED, stream, |d| {
            // SAFETY: forwarded unchanged; the caller upholds the trait method's contract.
            unsafe { d.gemm_strided_batched_f32(handle, gemm) }
        })
    }

    // --- mixed-precision gemm (issue 42) -----------------------------------------------------

    unsafe fn gemm_strided_batched_ex(
        &self,
        handle: BlasHandle,
        gemm: &GemmEx,
    ) -> DriverResult<()> {
        // Queued on the handle's stream, as the float32 gemm is.
        let stream = self.blas_stream(handle);
        self.async_call(calls::GEMM_STRIDED_BATCHED_EX, stream, |d| {
            // SAFETY: forwarded unchanged; the caller upholds the trait method's contract.
            unsafe { d.gemm_strided_batched_ex(handle, gemm) }
        })
    }

    // --- device-mapped host flags (issue 44) ---------------------------------------------

    fn host_device_ptr(&self, ptr: HostPtr) -> DriverResult<DevicePtr> {
        self.sync_call(calls::MEM_HOST_GET_DEVICE_POINTER, |d| {
            d.host_device_ptr(ptr)
        })
    }

    fn host_store_u32(&self, dst: HostPtr, value: u32) -> DriverResult<()> {
        // Not a driver call (plain host memory): no fault applies, as for host_write.
        self.inner.host_store_u32(dst, value)
    }
}
