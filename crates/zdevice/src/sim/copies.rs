//! Copies and memsets, synchronous and stream-ordered.
//!
//! Synchronous calls are ordered with the legacy stream only: they wait for blocking streams'
//! work and run at once, and they do not wait for non-blocking streams (faithful: on a GPU that
//! is a race; here it deterministically reads the data as it was). Addresses are checked at call
//! time (a bad one is `CUDA_ERROR_INVALID_VALUE`); queued work is checked again when it runs
//! (the memory may have been freed meanwhile: then a sticky 700).

use std::sync::Arc;

use super::capture::{Ask, Gate};
use super::ops::Op;
use super::state::{Cx, State};
use crate::driver::{CuCode, DriverResult};
use crate::types::{DevicePtr, HostPtr, Stream};

impl State {
    fn check_device(&self, cx: &Cx, ptr: DevicePtr, bytes: u64) -> DriverResult<()> {
        self.mem
            .resolve(ptr, bytes)
            .map(|_| ())
            .map_err(|_| cx.cuda(CuCode::INVALID_VALUE))
    }

    fn check_host(&self, cx: &Cx, ptr: HostPtr, bytes: u64) -> DriverResult<()> {
        if self.mem.host_valid(ptr, bytes) {
            Ok(())
        } else {
            Err(cx.cuda(CuCode::INVALID_VALUE))
        }
    }

    /// Runs a synchronous data operation: after the legacy stream's implicit wait, now, and
    /// charging its duration to the clock. Returns errors from earlier asynchronous work.
    fn run_sync(&mut self, cx: &mut Cx, op: Op) -> DriverResult<()> {
        self.gate(cx, Ask::none())?;
        self.drain_blocking();
        self.now = self.now.saturating_add(op.duration(&self.cfg));
        if let Some(Err(fault)) = op.run_data(&mut self.mem, self.cfg.accounting_only) {
            tracing::debug!(%fault, call = cx.call, "synchronous copy rejected");
            return Err(cx.cuda(CuCode::INVALID_VALUE));
        }
        self.surface(cx)
    }

    /// Queues `op` on `s`, or adds it to the graph when `s` is capturing.
    fn run_async(&mut self, cx: &mut Cx, s: Stream, op: Op) -> DriverResult<()> {
        if self.gate(cx, Ask::on(s))? == Gate::Capture {
            self.capture_nodes(cx, vec![op]);
            return Ok(());
        }
        self.enqueue(cx, s, op).map(|_| ())
    }

    pub(crate) fn memcpy_htod(
        &mut self,
        cx: &mut Cx,
        dst: DevicePtr,
        src: &[u8],
    ) -> DriverResult<()> {
        self.check_device(cx, dst, src.len() as u64)?;
        self.run_sync(
            cx,
            Op::CopyBytesHtoD {
                dst,
                data: Arc::from(src),
            },
        )
    }

    pub(crate) fn memcpy_dtoh(
        &mut self,
        cx: &mut Cx,
        dst: &mut [u8],
        src: DevicePtr,
    ) -> DriverResult<()> {
        self.check_device(cx, src, dst.len() as u64)?;
        self.gate(cx, Ask::none())?;
        self.drain_blocking();
        let bytes = dst.len() as u64;
        self.now = self
            .now
            .saturating_add(super::ops::transfer_time(&self.cfg, bytes));
        let data = self
            .mem
            .read(src, bytes)
            .map_err(|_| cx.cuda(CuCode::INVALID_VALUE))?;
        dst.copy_from_slice(&data);
        self.surface(cx)
    }

    pub(crate) fn memcpy_dtod(
        &mut self,
        cx: &mut Cx,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
    ) -> DriverResult<()> {
        self.check_device(cx, src, bytes)?;
        self.check_device(cx, dst, bytes)?;
        self.run_sync(cx, Op::CopyDtoD { dst, src, bytes })
    }

    pub(crate) fn memset_d8(
        &mut self,
        cx: &mut Cx,
        dst: DevicePtr,
        value: u8,
        bytes: u64,
    ) -> DriverResult<()> {
        self.check_device(cx, dst, bytes)?;
        self.run_sync(cx, Op::Set8 { dst, value, bytes })
    }

    pub(crate) fn memset_d32(
        &mut self,
        cx: &mut Cx,
        dst: DevicePtr,
        value: u32,
        count: u64,
    ) -> DriverResult<()> {
        self.check_words(cx, dst, count)?;
        self.run_sync(cx, Op::Set32 { dst, value, count })
    }

    /// `count` 32-bit words at a 4-byte aligned `dst`, inside one live allocation.
    fn check_words(&mut self, cx: &mut Cx, dst: DevicePtr, count: u64) -> DriverResult<()> {
        let bytes = count.checked_mul(4).ok_or(cx.cuda(CuCode::INVALID_VALUE))?;
        self.check_device(cx, dst, bytes)?;
        if !dst.0.is_multiple_of(4) {
            return Err(cx.cuda(CuCode::INVALID_VALUE));
        }
        Ok(())
    }

    pub(crate) fn memcpy_dtod_async(
        &mut self,
        cx: &mut Cx,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
        s: Stream,
    ) -> DriverResult<()> {
        self.check_device(cx, src, bytes)?;
        self.check_device(cx, dst, bytes)?;
        self.run_async(cx, s, Op::CopyDtoD { dst, src, bytes })
    }

    pub(crate) fn memset_d8_async(
        &mut self,
        cx: &mut Cx,
        dst: DevicePtr,
        value: u8,
        bytes: u64,
        s: Stream,
    ) -> DriverResult<()> {
        self.check_device(cx, dst, bytes)?;
        self.run_async(cx, s, Op::Set8 { dst, value, bytes })
    }

    pub(crate) fn memset_d32_async(
        &mut self,
        cx: &mut Cx,
        dst: DevicePtr,
        value: u32,
        count: u64,
        s: Stream,
    ) -> DriverResult<()> {
        self.check_words(cx, dst, count)?;
        self.run_async(cx, s, Op::Set32 { dst, value, count })
    }

    pub(crate) fn memcpy_htod_async(
        &mut self,
        cx: &mut Cx,
        dst: DevicePtr,
        src: HostPtr,
        bytes: u64,
        s: Stream,
    ) -> DriverResult<()> {
        self.check_device(cx, dst, bytes)?;
        self.check_host(cx, src, bytes)?;
        self.run_async(cx, s, Op::CopyHtoD { dst, src, bytes })
    }

    pub(crate) fn memcpy_dtoh_async(
        &mut self,
        cx: &mut Cx,
        dst: HostPtr,
        src: DevicePtr,
        bytes: u64,
        s: Stream,
    ) -> DriverResult<()> {
        self.check_device(cx, src, bytes)?;
        self.check_host(cx, dst, bytes)?;
        self.run_async(cx, s, Op::CopyDtoH { dst, src, bytes })
    }

    /// The bytes are taken now (see `Op::CopyBytesHtoD`).
    pub(crate) fn memcpy_htod_async_pageable(
        &mut self,
        cx: &mut Cx,
        dst: DevicePtr,
        src: &[u8],
        s: Stream,
    ) -> DriverResult<()> {
        self.check_device(cx, dst, src.len() as u64)?;
        self.run_async(
            cx,
            s,
            Op::CopyBytesHtoD {
                dst,
                data: Arc::from(src),
            },
        )
    }
}
