//! The CUDA backend's pinned host memory (`PinnedHost`): one page-locked buffer per
//! allocation, lent to the caller in place and copied straight to the device on the backend's
//! stream, with no staging copy (compare `transfer.rs`, which copies a slice into its own
//! staging buffers first).

use super::{CudaBackend, CudaTensor, device_error};
use crate::error::{ComputeError, Result};
use crate::pinned::{PinnedHost, PinnedSlice, pinned_range};
use zdevice::{Device, Driver, PinnedBuffer};

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
}

#[cfg(test)]
mod tests {
    use crate::pinned::{PinnedHost, PinnedSlice};
    use crate::{Backend, ComputeError, CpuBackend, Engine};

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
