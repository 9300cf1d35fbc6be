//! The memory calls: allocation and free (synchronous, stream-ordered, pooled, host), and
//! memory information.

use super::capture::{Ask, FreeTarget, Gate};
use super::memory::{AllocError, AllocKind, DEFAULT_POOL};
use super::ops::Op;
use super::state::{Cx, State};
use crate::driver::{CuCode, DriverError, DriverResult};
use crate::types::{DevicePtr, HostPtr, MemPool, PoolProps, Stream};

impl State {
    fn alloc_error(&self, cx: &Cx, e: AllocError, bytes: u64) -> DriverError {
        match e {
            AllocError::Invalid => cx.cuda(CuCode::INVALID_VALUE),
            AllocError::OutOfMemory => {
                // The real driver answers 2 either way; the capacity in cuMemGetInfo tells a
                // request that can never fit from one that does not fit now.
                let never = bytes > self.mem.capacity;
                tracing::debug!(
                    call = cx.call,
                    bytes,
                    free = self.mem.capacity - self.mem.used,
                    capacity = self.mem.capacity,
                    never_fits = never,
                    "simulated out of memory"
                );
                cx.cuda(CuCode::OUT_OF_MEMORY)
            }
        }
    }

    pub(crate) fn mem_get_info(&mut self, cx: &mut Cx) -> DriverResult<(u64, u64)> {
        self.gate(cx, Ask::none())?;
        Ok((self.mem.capacity - self.mem.used, self.mem.capacity))
    }

    pub(crate) fn mem_alloc(
        &mut self,
        cx: &mut Cx,
        bytes: u64,
        kind: AllocKind,
    ) -> DriverResult<DevicePtr> {
        self.gate(cx, Ask::none())?;
        self.mem
            .alloc(bytes, kind)
            .map_err(|e| self.alloc_error(cx, e, bytes))
    }

    /// What a free names, for the capture table.
    fn free_target(&self, ptr: DevicePtr) -> FreeTarget {
        if let Some(c) = &self.capture
            && c.allocs.contains(&ptr)
        {
            return if c.freed.contains(&ptr) {
                FreeTarget::Unknown
            } else {
                FreeTarget::CapturedAlloc
            };
        }
        match self.mem.find_base(ptr) {
            Some((_, a)) if !a.free_pending => FreeTarget::Live,
            _ => FreeTarget::Unknown,
        }
    }

    /// `cuMemFree` synchronises with queued work first (so that work still sees the memory)
    /// and may return an error from it, as the real call does.
    pub(crate) fn mem_free(&mut self, cx: &mut Cx, ptr: DevicePtr) -> DriverResult<()> {
        self.gate(cx, Ask::free(self.free_target(ptr), None))?;
        if self.free_target(ptr) != FreeTarget::Live {
            return Err(cx.cuda(CuCode::INVALID_VALUE));
        }
        let busy = self
            .streams
            .values()
            .map(|s| s.busy_until)
            .max()
            .unwrap_or_default();
        self.now = self.now.max(busy);
        self.drain_everything();
        self.release_device(ptr);
        self.surface(cx)
    }

    pub(crate) fn mem_alloc_host(&mut self, cx: &mut Cx, bytes: u64) -> DriverResult<HostPtr> {
        self.gate(cx, Ask::none())?;
        self.mem
            .alloc_host(bytes)
            .map_err(|e| self.alloc_error(cx, e, bytes))
    }

    /// `cuMemHostGetDevicePointer_v2` over unified addressing: the host address itself.
    pub(crate) fn mem_host_device_ptr(
        &mut self,
        cx: &mut Cx,
        ptr: HostPtr,
    ) -> DriverResult<DevicePtr> {
        self.gate(cx, Ask::none())?;
        self.mem
            .host_device_ptr(ptr)
            .ok_or_else(|| cx.cuda(CuCode::INVALID_VALUE))
    }

    pub(crate) fn mem_free_host(&mut self, cx: &mut Cx, ptr: HostPtr) -> DriverResult<()> {
        self.gate(cx, Ask::none())?;
        if self.mem.free_host(ptr) {
            Ok(())
        } else {
            Err(cx.cuda(CuCode::INVALID_VALUE))
        }
    }

    /// From the default pool; on the capturing stream, a memory-allocation node whose address
    /// is fixed now and owned by the graph.
    pub(crate) fn mem_alloc_async(
        &mut self,
        cx: &mut Cx,
        bytes: u64,
        s: Stream,
    ) -> DriverResult<DevicePtr> {
        if self.gate(cx, Ask::on(s))? == Gate::Capture {
            let ptr = self
                .mem
                .alloc(bytes, AllocKind::Graph)
                .map_err(|e| self.alloc_error(cx, e, bytes))?;
            if let Some(c) = self.capture.as_mut() {
                c.allocs.push(ptr);
            }
            self.capture_nodes(cx, vec![Op::AllocNode { ptr }]);
            return Ok(ptr);
        }
        self.stream_exists(cx, s)?;
        self.mem
            .alloc(bytes, AllocKind::Pool(DEFAULT_POOL))
            .map_err(|e| self.alloc_error(cx, e, bytes))
    }

    pub(crate) fn mem_alloc_from_pool_async(
        &mut self,
        cx: &mut Cx,
        bytes: u64,
        pool: MemPool,
        s: Stream,
    ) -> DriverResult<DevicePtr> {
        self.gate(cx, Ask::on(s))?;
        self.stream_exists(cx, s)?;
        if pool.0 == DEFAULT_POOL {
            return Err(cx.cuda(CuCode::INVALID_VALUE));
        }
        self.mem
            .alloc(bytes, AllocKind::Pool(pool.0))
            .map_err(|e| self.alloc_error(cx, e, bytes))
    }

    /// Releases the memory when the stream reaches the free. Inside a capture, only memory from
    /// this capture's allocation nodes can be freed (a free node).
    pub(crate) fn mem_free_async(
        &mut self,
        cx: &mut Cx,
        ptr: DevicePtr,
        s: Stream,
    ) -> DriverResult<()> {
        let target = self.free_target(ptr);
        if self.gate(cx, Ask::free(target, Some(s)))? == Gate::Capture {
            if let Some(c) = self.capture.as_mut() {
                c.freed.push(ptr);
            }
            self.capture_nodes(cx, vec![Op::FreeNode { ptr }]);
            return Ok(());
        }
        self.stream_exists(cx, s)?;
        if target != FreeTarget::Live {
            return Err(cx.cuda(CuCode::INVALID_VALUE));
        }
        if let Some((base, _)) = self.mem.find_base(ptr)
            && let Some(a) = self.mem.alloc_mut(base)
        {
            a.free_pending = true;
        }
        self.enqueue(cx, s, Op::Free { ptr })?;
        Ok(())
    }

    fn pool_exists(&self, cx: &Cx, pool: MemPool) -> DriverResult<()> {
        match self.mem.pools.get(&pool.0) {
            Some(p) if !p.destroyed && pool.0 != DEFAULT_POOL => Ok(()),
            _ => Err(cx.cuda(CuCode::INVALID_VALUE)),
        }
    }

    pub(crate) fn mem_pool_create(
        &mut self,
        cx: &mut Cx,
        props: PoolProps,
    ) -> DriverResult<MemPool> {
        self.gate(cx, Ask::none())?;
        if props.ordinal != 0 {
            return Err(cx.cuda(CuCode::INVALID_DEVICE));
        }
        let id = self.handle();
        let pool = super::memory::Pool {
            max_size: props.max_size,
            ..Default::default()
        };
        self.mem.pools.insert(id, pool);
        Ok(MemPool(id))
    }

    /// Outstanding allocations stay valid; the pool goes once they are all freed (CUDA
    /// semantics). Its idle reservation is released now.
    pub(crate) fn mem_pool_destroy(&mut self, cx: &mut Cx, pool: MemPool) -> DriverResult<()> {
        self.gate(cx, Ask::none())?;
        self.pool_exists(cx, pool)?;
        if let Some(p) = self.mem.pools.get_mut(&pool.0) {
            p.destroyed = true;
        }
        self.mem.pool_trim(pool.0, 0);
        Ok(())
    }

    pub(crate) fn mem_pool_set_release_threshold(
        &mut self,
        cx: &mut Cx,
        pool: MemPool,
        bytes: u64,
    ) -> DriverResult<()> {
        self.gate(cx, Ask::none())?;
        self.pool_exists(cx, pool)?;
        if let Some(p) = self.mem.pools.get_mut(&pool.0) {
            p.threshold = bytes;
        }
        Ok(())
    }

    pub(crate) fn mem_pool_reserved(&mut self, cx: &mut Cx, pool: MemPool) -> DriverResult<u64> {
        self.gate(cx, Ask::none())?;
        self.pool_exists(cx, pool)?;
        Ok(self.mem.pools.get(&pool.0).map_or(0, |p| p.reserved))
    }

    pub(crate) fn mem_pool_trim_to(
        &mut self,
        cx: &mut Cx,
        pool: MemPool,
        keep: u64,
    ) -> DriverResult<()> {
        self.gate(cx, Ask::none())?;
        self.pool_exists(cx, pool)?;
        self.mem.pool_trim(pool.0, keep);
        Ok(())
    }
}
