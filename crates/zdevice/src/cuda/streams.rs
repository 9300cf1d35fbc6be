//! The stream and event calls of `CudaDriver`.
//!
//! Every `unsafe` block below calls one libcuda/cuBLAS entry point resolved by cuda-sys with the
//! signature of the pinned 13.0 header. Out-pointers are always live locals; handles are ones
//! this driver returned earlier (a stale or foreign handle is the driver's to reject, and its
//! status is checked); host buffers are Rust slices whose length is the count passed.

use std::ptr;

use cuda_sys::driver as cu;

use super::{CudaDriver, check, readiness};
use crate::driver::DriverResult;
use crate::types::*;

pub(super) fn stream(s: Stream) -> cu::CUstream {
    s.0 as cu::CUstream
}

pub(super) fn event(e: Event) -> cu::CUevent {
    e.0 as cu::CUevent
}

fn stream_flags(kind: StreamKind) -> u32 {
    match kind {
        StreamKind::NonBlocking => cu::CU_STREAM_NON_BLOCKING,
        StreamKind::Blocking => cu::CU_STREAM_DEFAULT,
    }
}

impl CudaDriver {
    pub(super) fn cu_stream_create(&self, kind: StreamKind) -> DriverResult<Stream> {
        self.bind()?;
        let flags = stream_flags(kind);
        let mut s: cu::CUstream = ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check("cuStreamCreate", unsafe {
            self.cu.cuStreamCreate(&mut s, flags)
        })?;
        Ok(Stream(s as u64))
    }

    pub(super) fn cu_stream_create_with_priority(
        &self,
        kind: StreamKind,
        priority: i32,
    ) -> DriverResult<Stream> {
        self.bind()?;
        let flags = stream_flags(kind);
        let mut s: cu::CUstream = ptr::null_mut();
        // SAFETY: out-pointer to a local; any priority is accepted (the driver clamps it).
        check("cuStreamCreateWithPriority", unsafe {
            self.cu.cuStreamCreateWithPriority(&mut s, flags, priority)
        })?;
        Ok(Stream(s as u64))
    }

    pub(super) fn cu_stream_priority_range(&self) -> DriverResult<PriorityRange> {
        self.bind()?;
        let (mut least, mut greatest) = (0i32, 0i32);
        // SAFETY: out-pointers to locals.
        check("cuCtxGetStreamPriorityRange", unsafe {
            self.cu
                .cuCtxGetStreamPriorityRange(&mut least, &mut greatest)
        })?;
        Ok(PriorityRange { least, greatest })
    }

    pub(super) fn cu_stream_destroy(&self, s: Stream) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: see the module comment on handles.
        check("cuStreamDestroy_v2", unsafe {
            self.cu.cuStreamDestroy_v2(stream(s))
        })
    }

    pub(super) fn cu_stream_query(&self, s: Stream) -> DriverResult<Readiness> {
        self.bind()?;
        // SAFETY: see the module comment on handles.
        readiness("cuStreamQuery", unsafe { self.cu.cuStreamQuery(stream(s)) })
    }

    pub(super) fn cu_stream_synchronize(&self, s: Stream) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: see the module comment on handles.
        check("cuStreamSynchronize", unsafe {
            self.cu.cuStreamSynchronize(stream(s))
        })
    }

    pub(super) fn cu_stream_wait_event(&self, s: Stream, e: Event) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: see the module comment on handles; flags 0 is the only documented value.
        check("cuStreamWaitEvent", unsafe {
            self.cu.cuStreamWaitEvent(stream(s), event(e), 0)
        })
    }

    pub(super) fn cu_event_create(&self, timing: bool) -> DriverResult<Event> {
        self.bind()?;
        let flags = if timing {
            cu::CU_EVENT_DEFAULT
        } else {
            cu::CU_EVENT_DISABLE_TIMING
        };
        let mut e: cu::CUevent = ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check("cuEventCreate", unsafe {
            self.cu.cuEventCreate(&mut e, flags)
        })?;
        Ok(Event(e as u64))
    }

    pub(super) fn cu_event_destroy(&self, e: Event) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: see the module comment on handles.
        check("cuEventDestroy_v2", unsafe {
            self.cu.cuEventDestroy_v2(event(e))
        })
    }

    pub(super) fn cu_event_record(&self, e: Event, s: Stream) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: see the module comment on handles.
        check("cuEventRecord", unsafe {
            self.cu.cuEventRecord(event(e), stream(s))
        })
    }

    pub(super) fn cu_event_query(&self, e: Event) -> DriverResult<Readiness> {
        self.bind()?;
        // SAFETY: see the module comment on handles.
        readiness("cuEventQuery", unsafe { self.cu.cuEventQuery(event(e)) })
    }

    pub(super) fn cu_event_synchronize(&self, e: Event) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: see the module comment on handles.
        check("cuEventSynchronize", unsafe {
            self.cu.cuEventSynchronize(event(e))
        })
    }

    pub(super) fn cu_event_elapsed_ms(&self, start: Event, end: Event) -> DriverResult<f32> {
        self.bind()?;
        let mut ms = 0f32;
        // SAFETY: out-pointer to a local; see the module comment on handles.
        check("cuEventElapsedTime_v2", unsafe {
            self.cu
                .cuEventElapsedTime_v2(&mut ms, event(start), event(end))
        })?;
        Ok(ms)
    }
}
