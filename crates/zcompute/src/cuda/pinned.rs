//! The CUDA backend's pinned host memory (`PinnedHost`): one page-locked buffer per
//! allocation, lent to the caller in place and copied straight to the device on the backend's
//! stream, with no staging copy (compare `transfer.rs`, which copies a slice into its own
//! staging buffers first). Batches can also go on the backend's copy stream
//! (`upload_pinned_beside`), ordered against the engine stream by events only.

use super::lock;
use super::side_stream::SideStream;
use super::{CudaBackend, CudaTensor, device_error};
use crate::error::{ComputeError, Result};
use crate::pinned::{CopyMark, PinnedHost, PinnedSlice, pinned_range};
use zdevice::{Device, Driver, Event, PinnedBuffer};

/// The event behind a [`CopyMark`] of the CUDA backend, destroyed with the mark.
struct EventMark<D: Driver> {
    device: Device<D>,
    event: Event,
}

impl<D: Driver> Drop for EventMark<D> {
    fn drop(&mut self) {
        if let Err(e) = self.device.destroy_event(self.event) {
            tracing::warn!(target: "zcompute.cuda.pinned", error = %e, "destroying a copy mark");
        }
    }
}

/// `len` f32 of page-locked host memory, freed (after its last transfer) when dropped.
#[derive(Debug)]
pub struct CudaPinned<D: Driver> {
    device: Device<D>,
    buf: Option<PinnedBuffer>,
    len: usize,
}

impl<D: Driver> CudaPinned<D> {
    fn buf(&self, op: &'static str) -> Result<&PinnedBuffer> {
        self.buf.as_ref().ok_or(ComputeError::Unsupported {
            op,
            reason: "internal: pinned buffer missing".into(),
        })
    }
}

impl<D: Driver> Drop for CudaPinned<D> {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take()
            && let Err(e) = self.device.free_pinned(buf)
        {
            tracing::warn!(target: "zcompute.cuda.pinned", error = %e, "freeing a pinned batch");
        }
    }
}

impl<D: Driver> PinnedSlice<f32> for CudaPinned<D> {
    fn len(&self) -> usize {
        self.len
    }

    fn with_mut<R>(&mut self, f: impl FnOnce(&mut [f32]) -> R) -> Result<R> {
        const OP: &str = "pinned_with_mut";
        let Some(buf) = self.buf.as_mut() else {
            return Err(ComputeError::Unsupported {
                op: OP,
                reason: "internal: pinned buffer missing".into(),
            });
        };
        // The buffer may be longer (an empty one holds one word): lend `len` elements.
        let len = self.len;
        self.device
            .pinned_f32_mut(buf, |v| v.get_mut(..len).map(f))
            .map_err(|e| device_error(OP, e))?
            .ok_or_else(|| ComputeError::Unsupported {
                op: OP,
                reason: format!("internal: the pinned buffer lends fewer than {len} f32"),
            })
    }

    fn read(&self, start: usize, len: usize) -> Result<Vec<f32>> {
        const OP: &str = "pinned_read";
        let r = pinned_range(OP, self.len, start, len)?;
        let mut bytes = vec![0u8; r.end * 4];
        self.device
            .read_pinned(self.buf(OP)?, &mut bytes)
            .map_err(|e| device_error(OP, e))?;
        Ok(bytes[r.start * 4..]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

impl<D: Driver> CudaBackend<D> {
    /// The event of a mark this backend made.
    fn mark_event(op: &'static str, mark: &CopyMark) -> Result<Option<Event>> {
        match mark.get::<EventMark<D>>() {
            Some(m) => Ok(Some(m.event)),
            None if mark.is_none() => Ok(None),
            None => Err(ComputeError::Unsupported {
                op,
                reason: "a copy mark of another backend".into(),
            }),
        }
    }

    /// Queues on the copy stream (the backend's side stream for copies, made at first use):
    /// wait for `after`, the copy; then joins it to the engine stream. Should the join fail to
    /// be queued, the host waits for the copy stream instead (the engine stream must never
    /// read a copy in flight).
    fn copy_beside(
        &self,
        op: &'static str,
        src: &CudaPinned<D>,
        r: std::ops::Range<usize>,
        dst: &CudaTensor,
        after: Option<Event>,
    ) -> Result<()> {
        let mut slot = lock(&self.inner.copy_lane);
        let lane = match slot.take() {
            Some(lane) => lane,
            None => SideStream::new(self)?,
        };
        let lane = slot.insert(lane);
        let device = &self.inner.device;
        let p = self.ptr(op, dst)?;
        if let Some(event) = after {
            device
                .stream_wait_event(lane.stream(), event)
                .map_err(|e| device_error(op, e))?;
        }
        let (offset, bytes) = (r.start as u64 * 4, r.len() as u64 * 4);
        device
            .upload_range_async(p, src.buf(op)?, offset, bytes, lane.stream())
            .map_err(|e| device_error(op, e))?;
        if let Err(e) = lane.join() {
            let _ = lane.synchronize();
            return Err(e);
        }
        Ok(())
    }
}

impl<D: Driver> PinnedHost<f32> for CudaBackend<D> {
    type Pinned = CudaPinned<D>;

    fn alloc_pinned(&self, len: usize) -> Result<CudaPinned<D>> {
        const OP: &str = "alloc_pinned";
        self.refuse_in_capture(OP, "allocate pinned batches before the capture")?;
        let bytes = len
            .checked_mul(4)
            .ok_or_else(|| ComputeError::Unsupported {
                op: OP,
                reason: format!("{len} f32 overflow a size"),
            })?;
        let device = self.inner.device.clone();
        // At least one byte: the driver refuses empty page-locked allocations.
        let buf = device
            .alloc_pinned(bytes.max(4) as u64)
            .map_err(|e| device_error(OP, e))?;
        let mut pinned = CudaPinned {
            device,
            buf: Some(buf),
            len,
        };
        // Page-locked memory comes uninitialised; the trait promises zeros.
        pinned.with_mut(|v| v.fill(0.0))?;
        Ok(pinned)
    }

    fn upload_pinned(&self, src: &CudaPinned<D>, start: usize, dst: &CudaTensor) -> Result<()> {
        const OP: &str = "upload_pinned";
        let r = pinned_range(OP, src.len, start, dst.numel())?;
        crate::validate::upload_into(r.len(), dst)?;
        self.refuse_in_capture(
            OP,
            "refill the graph's inputs between replays, not inside the capture",
        )?;
        if r.is_empty() {
            return Ok(());
        }
        let copy = |to: &CudaTensor| {
            let p = self.ptr(OP, to)?;
            self.inner
                .device
                .upload_range_async(
                    p,
                    src.buf(OP)?,
                    r.start as u64 * 4,
                    r.len() as u64 * 4,
                    self.inner.stream,
                )
                .map_err(|e| device_error(OP, e))
        };
        if dst.is_contiguous() {
            return copy(dst);
        }
        let tmp = self.alloc_temp(OP, dst.shape())?;
        copy(&tmp)?;
        self.copy_view(OP, &tmp, dst)
    }

    fn copy_mark(&self) -> Result<CopyMark> {
        const OP: &str = "copy_mark";
        self.refuse_in_capture(OP, "make copy marks before the capture")?;
        let device = self.inner.device.clone();
        let event = device
            .create_event(false)
            .map_err(|e| device_error(OP, e))?;
        Ok(CopyMark::of(EventMark { device, event }))
    }

    fn timing_mark(&self) -> Result<CopyMark> {
        const OP: &str = "timing_mark";
        self.refuse_in_capture(OP, "make timing marks before the capture")?;
        let device = self.inner.device.clone();
        let event = device.create_event(true).map_err(|e| device_error(OP, e))?;
        Ok(CopyMark::of(EventMark { device, event }))
    }

    fn elapsed_ms(&self, start: &CopyMark, end: &CopyMark) -> Result<Option<f64>> {
        const OP: &str = "elapsed_ms";
        match (Self::mark_event(OP, start)?, Self::mark_event(OP, end)?) {
            (Some(a), Some(b)) => self
                .inner
                .device
                .elapsed_ms(a, b)
                .map(|ms| Some(f64::from(ms)))
                .map_err(|e| device_error(OP, e)),
            _ => Ok(None),
        }
    }

    fn mark_passed(&self, mark: &CopyMark) -> Result<bool> {
        const OP: &str = "mark_passed";
        match Self::mark_event(OP, mark)? {
            Some(event) => self
                .inner
                .device
                .event_done(event)
                .map_err(|e| device_error(OP, e)),
            None => Ok(true),
        }
    }

    fn mark_engine(&self, mark: &CopyMark) -> Result<()> {
        const OP: &str = "mark_engine";
        self.refuse_in_capture(OP, "mark the engine stream between replays")?;
        match Self::mark_event(OP, mark)? {
            Some(event) => self
                .inner
                .device
                .record_event(event, self.inner.stream)
                .map_err(|e| device_error(OP, e)),
            None => Ok(()),
        }
    }

    fn upload_pinned_beside(
        &self,
        src: &CudaPinned<D>,
        start: usize,
        dst: &CudaTensor,
        after: &CopyMark,
    ) -> Result<()> {
        const OP: &str = "upload_pinned_beside";
        let r = pinned_range(OP, src.len, start, dst.numel())?;
        crate::validate::upload_into(r.len(), dst)?;
        self.refuse_in_capture(
            OP,
            "stage the graph's inputs between replays, not inside the capture",
        )?;
        let after = Self::mark_event(OP, after)?;
        if r.is_empty() {
            return Ok(());
        }
        if !dst.is_contiguous() {
            return self.upload_pinned(src, start, dst);
        }
        self.copy_beside(OP, src, r, dst, after)
    }
}

#[cfg(test)]
mod tests {
    use crate::pinned::{CopyMark, PinnedHost, PinnedSlice};
    use crate::{Backend, ComputeError, CpuBackend, Engine};

    /// A copy on the copy stream (the simulator runs a stream's work only when something
    /// waits for it) lands before the engine-stream work queued after it, into a dense
    /// tensor and (on the engine stream) into a strided view; on the CPU the default runs it
    /// in call order. The copy waits for the mark, not for the engine stream: it is still
    /// queued when the call returns, and only the engine's wait runs it.
    #[test]
    fn a_copy_beside_the_engine_stream_lands_before_its_later_work() {
        let gpu = Engine::sim(256 << 20).unwrap();
        let cpu = CpuBackend;
        let mut g = gpu.alloc_pinned(6).unwrap();
        let mut c = <CpuBackend as PinnedHost<f32>>::alloc_pinned(&cpu, 6).unwrap();
        let values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        g.with_mut(|v| v.copy_from_slice(&values)).unwrap();
        c.with_mut(|v| v.copy_from_slice(&values)).unwrap();
        let free = gpu.copy_mark().unwrap();
        gpu.mark_engine(&free).unwrap();
        let (landing, out) = (gpu.zeros(&[2, 3]).unwrap(), gpu.zeros(&[2, 3]).unwrap());
        gpu.upload_pinned_beside(&g, 0, &landing, &free).unwrap();
        let engine = gpu.device().stream();
        let side = gpu
            .device()
            .driver()
            .op_log()
            .iter()
            .rev()
            .find(|r| r.call == "cuMemcpyHtoDAsync_v2")
            .and_then(|r| r.stream)
            .unwrap();
        assert_ne!(side, engine, "the copy is on its own stream");
        assert!(
            gpu.device().driver().pending_ops(side) > 0,
            "queued, not waited for"
        );
        gpu.copy_into(&landing, &out).unwrap();
        assert_eq!(gpu.download(&out).unwrap(), values);
        let view = gpu.zeros(&[3, 2]).unwrap();
        gpu.upload_pinned_beside(&g, 3, &view.narrow(1, 1, 1).unwrap(), &free)
            .unwrap();
        assert_eq!(
            gpu.download(&view).unwrap(),
            vec![0.0, 4.0, 0.0, 5.0, 0.0, 6.0]
        );
        let dense_c = cpu.zeros(&[2, 3]).unwrap();
        cpu.upload_pinned_beside(&c, 0, &dense_c, &CopyMark::none())
            .unwrap();
        assert_eq!(cpu.download(&dense_c).unwrap(), values);
        let r = gpu.upload_pinned_beside(&g, 4, &landing, &free);
        assert!(
            matches!(r, Err(ComputeError::LengthMismatch { .. })),
            "{r:?}"
        );
    }

    /// The same pinned data lands the same on the simulated device as on the CPU: a range
    /// from the middle into a dense tensor and into a strided view; a range past the end is
    /// a `LengthMismatch` on both.
    #[test]
    fn pinned_ranges_upload_into_dense_tensors_and_views_as_on_the_cpu() {
        let gpu = Engine::sim(256 << 20).unwrap();
        let cpu = CpuBackend;
        let mut g = gpu.alloc_pinned(12).unwrap();
        let mut c = <CpuBackend as PinnedHost<f32>>::alloc_pinned(&cpu, 12).unwrap();
        assert_eq!(g.read(0, 12).unwrap(), vec![0.0; 12], "zeroed");
        let fill = |v: &mut [f32]| {
            for (i, x) in v.iter_mut().enumerate() {
                *x = i as f32 + 0.5;
            }
        };
        g.with_mut(fill).unwrap();
        c.with_mut(fill).unwrap();
        let dense_g = gpu.zeros(&[2, 3]).unwrap();
        let dense_c = cpu.zeros(&[2, 3]).unwrap();
        gpu.upload_pinned(&g, 4, &dense_g).unwrap();
        cpu.upload_pinned(&c, 4, &dense_c).unwrap();
        assert_eq!(
            gpu.download(&dense_g).unwrap(),
            vec![4.5, 5.5, 6.5, 7.5, 8.5, 9.5]
        );
        assert_eq!(
            cpu.download(&dense_c).unwrap(),
            gpu.download(&dense_g).unwrap()
        );
        // Column 1 of a [3, 2] table: a strided view.
        let table_g = gpu.zeros(&[3, 2]).unwrap();
        let table_c = cpu.zeros(&[3, 2]).unwrap();
        gpu.upload_pinned(&g, 9, &table_g.narrow(1, 1, 1).unwrap())
            .unwrap();
        cpu.upload_pinned(&c, 9, &table_c.narrow(1, 1, 1).unwrap())
            .unwrap();
        assert_eq!(
            gpu.download(&table_g).unwrap(),
            vec![0.0, 9.5, 0.0, 10.5, 0.0, 11.5]
        );
        assert_eq!(
            cpu.download(&table_c).unwrap(),
            gpu.download(&table_g).unwrap()
        );
        for r in [
            gpu.upload_pinned(&g, 7, &dense_g),
            cpu.upload_pinned(&c, 7, &dense_c),
        ] {
            assert!(
                matches!(r, Err(ComputeError::LengthMismatch { .. })),
                "{r:?}"
            );
        }
        assert_eq!(g.read(10, 2).unwrap(), vec![10.5, 11.5]);
        let mut empty = gpu.alloc_pinned(0).unwrap();
        assert_eq!(empty.with_mut(|v| v.len()).unwrap(), 0);
    }
}
