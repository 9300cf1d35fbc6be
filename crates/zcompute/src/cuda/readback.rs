//! The CUDA backend's queued downloads (`ReadbackOps::queue_download`): a copy into a page-locked
//! buffer of the backend's own on its stream, with the event zdevice records after it; the
//! host waits for that event alone when it reads the values (compare `stage_download`, which
//! waits at once). Buffers come back to a small free list when read (or dropped unread), so
//! a loop that reads a window back every N steps allocates page-locked memory twice at most.

use super::{CudaBackend, CudaTensor, device_error, lock};
use crate::error::{ComputeError, Result};
use crate::readback::{QueuedRead, Readback, ReadbackOps};
use zdevice::{Driver, PinnedBuffer};

/// Free read-back buffers kept; more are freed (a loop keeps two copies in flight at most).
const KEPT: usize = 4;
/// The smallest buffer made, so windows of different widths reuse one.
const MIN_BYTES: usize = 64 << 10;

/// A copy queued into `buf`; `source` keeps a dense temporary (of a strided view) alive
/// until the copy has run.
struct QueuedCopy<D: Driver> {
    backend: CudaBackend<D>,
    buf: Option<PinnedBuffer>,
    n: usize,
    _source: CudaTensor,
}

impl<D: Driver> QueuedCopy<D> {
    fn buf(&self) -> Result<&PinnedBuffer> {
        self.buf.as_ref().ok_or(ComputeError::Unsupported {
            op: "queue_download",
            reason: "internal: read-back buffer missing".into(),
        })
    }
}

impl<D: Driver> QueuedRead<f32> for QueuedCopy<D> {
    fn ready(&self) -> Result<bool> {
        let device = &self.backend.inner.device;
        device
            .pinned_settled(self.buf()?)
            .map_err(|e| device_error("readback_ready", e))
    }

    fn wait(self: Box<Self>) -> Result<Vec<f32>> {
        let mut bytes = vec![0u8; self.n * 4];
        // `read_pinned` waits for the event recorded after the copy, not for the stream.
        self.backend
            .inner
            .device
            .read_pinned(self.buf()?, &mut bytes)
            .map_err(|e| device_error("readback_wait", e))?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

impl<D: Driver> Drop for QueuedCopy<D> {
    fn drop(&mut self) {
        let Some(buf) = self.buf.take() else {
            return;
        };
        let inner = &self.backend.inner;
        let mut staging = lock(&inner.staging);
        if staging.reads.len() < KEPT {
            // Still pending is fine: the next copy into it waits for this one first.
            staging.reads.push(buf);
            return;
        }
        drop(staging);
        if let Err(e) = inner.device.free_pinned(buf) {
            tracing::warn!(target: "zcompute.cuda.readback", error = %e, "freeing a read-back buffer");
        }
    }
}

impl<D: Driver> ReadbackOps<f32> for CudaBackend<D> {
    /// `x` (made dense on the stream if it is a view) copied into a free read-back buffer, or
    /// a new one.
    fn queue_download(&self, x: &CudaTensor) -> Result<Readback<f32>> {
        const OP: &str = "queue_download";
        self.refuse_in_capture(OP, "queue downloads after the capture or after a replay")?;
        let n = x.numel();
        if n == 0 {
            return Ok(Readback::done(Vec::new()));
        }
        let source = self.dense(OP, x)?;
        let bytes = n * 4;
        let device = &self.inner.device;
        let spare = {
            let mut staging = lock(&self.inner.staging);
            let fit = staging.reads.iter().position(|b| b.len() >= bytes as u64);
            fit.map(|i| staging.reads.swap_remove(i))
        };
        let buf = match spare {
            Some(buf) => buf,
            None => device
                .alloc_pinned(bytes.max(MIN_BYTES) as u64)
                .map_err(|e| device_error(OP, e))?,
        };
        let copy = QueuedCopy {
            backend: self.clone(),
            buf: Some(buf),
            n,
            _source: source.clone(),
        };
        device
            .download_async(
                copy.buf()?,
                self.ptr(OP, &source)?,
                bytes as u64,
                self.inner.stream,
            )
            .map_err(|e| device_error(OP, e))?;
        Ok(Readback::queued(Box::new(copy)))
    }
}

#[cfg(test)]
mod tests {
    use crate::{Backend, CpuBackend, Engine, ReadbackOps};

    /// A queued download reads the values as the stream left them at the copy, in logical
    /// order (a strided view too), while the work queued after it stays queued: waiting for
    /// the read-back does not drain the stream (the simulator runs a stream's work only when
    /// something waits for it). The CPU's default reads at once, the same values.
    #[test]
    fn a_queued_download_waits_for_its_copy_only() {
        let gpu = Engine::sim(256 << 20).unwrap();
        let values: Vec<f32> = (0..6).map(|i| i as f32 + 0.5).collect();
        let x = gpu.upload(&values, &[2, 3]).unwrap();
        let column = x.narrow(1, 1, 1).unwrap();
        let dense = gpu.queue_download(&x).unwrap();
        let strided = gpu.queue_download(&column).unwrap();
        let engine = gpu.device().stream();
        assert!(
            gpu.device().driver().pending_ops(engine) > 0,
            "queued, not waited for"
        );
        // Work after the copies: it must not show in what they read, nor run for the wait.
        gpu.fill(&x, 7.0).unwrap();
        assert_eq!(dense.wait().unwrap(), values);
        assert_eq!(strided.wait().unwrap(), vec![1.5, 4.5]);
        assert!(
            gpu.device().driver().pending_ops(engine) > 0,
            "the fill after the copies is still queued"
        );
        let later = gpu.queue_download(&x).unwrap();
        assert_eq!(later.wait().unwrap(), vec![7.0; 6]);
        let empty = gpu.queue_download(&x.narrow(0, 0, 0).unwrap()).unwrap();
        assert!(empty.is_ready().unwrap());
        assert_eq!(empty.wait().unwrap(), Vec::<f32>::new());
        let cpu = CpuBackend;
        let c = cpu.upload(&values, &[2, 3]).unwrap();
        let read = cpu.queue_download(&c.narrow(1, 1, 1).unwrap()).unwrap();
        assert!(read.is_ready().unwrap());
        assert_eq!(read.wait().unwrap(), vec![1.5, 4.5]);
    }

    /// A read-back's buffer goes back to the backend when read or dropped unread, and the
    /// next read-back reuses it (no new page-locked allocation), also while the dropped copy
    /// is still queued (the next copy into the buffer waits for it first).
    #[test]
    fn read_back_buffers_are_reused() {
        let gpu = Engine::sim(256 << 20).unwrap();
        let x = gpu.upload(&[1.0, 2.0], &[2]).unwrap();
        let allocs = || {
            gpu.device()
                .driver()
                .op_log()
                .iter()
                .filter(|r| r.call == "cuMemAllocHost_v2")
                .count()
        };
        gpu.queue_download(&x).unwrap().wait().unwrap();
        let before = allocs();
        drop(gpu.queue_download(&x).unwrap());
        for _ in 0..3 {
            assert_eq!(gpu.queue_download(&x).unwrap().wait().unwrap(), [1.0, 2.0]);
        }
        assert_eq!(
            allocs(),
            before,
            "no page-locked allocation after the first"
        );
    }
}
