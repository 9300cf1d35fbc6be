//! Host <-> device transfers, staged through page-locked memory.
//!
//! Ownership: the caller's slice is copied into a pinned staging buffer before the call
//! returns, so it is free to reuse at once; the device copy then runs asynchronously on the
//! backend's stream. Two upload buffers alternate (a chunk is staged while the previous one is
//! in flight); a buffer is rewritten only after its last transfer completed (zdevice waits for
//! it, bounded by the sync deadline). Large transfers go in `CHUNK`-byte pieces, so pinned
//! memory stays bounded at three chunks per backend, plus a ring of `SMALL_SLOTS` small
//! buffers (1 MiB together) for small uploads, so refilling a graph's inputs sample after
//! sample rarely waits. Downloads wait for their copy (bounded).

use super::{CudaBackend, device_error, lock};
use crate::error::{ComputeError, Result};
use zdevice::{Device, DevicePtr, Driver, PinnedBuffer};

pub(super) mod staging;

use staging::{CHUNK, SMALL, SMALL_SLOTS};

fn ensure<'a, D: Driver>(
    slot: &'a mut Option<PinnedBuffer>,
    device: &Device<D>,
    op: &'static str,
    bytes: usize,
) -> Result<&'a PinnedBuffer> {
    if slot.is_none() {
        *slot = Some(
            device
                .alloc_pinned(bytes as u64)
                .map_err(|e| device_error(op, e))?,
        );
    }
    slot.as_ref().ok_or(ComputeError::Unsupported {
        op,
        reason: "internal: staging buffer missing".into(),
    })
}

impl<D: Driver> CudaBackend<D> {
    pub(crate) fn refuse_in_capture(&self, op: &'static str, why: &str) -> Result<()> {
        if self.capturing() {
            return Err(ComputeError::CaptureIllegal {
                op,
                why: why.to_string(),
            });
        }
        Ok(())
    }

    /// Queues a copy of `data` into the dense device range at `dst`.
    pub(crate) fn stage_upload(
        &self,
        op: &'static str,
        data: &[f32],
        dst: DevicePtr,
    ) -> Result<()> {
        self.refuse_in_capture(
            op,
            "a captured host copy would re-read host memory at every replay; upload before the capture, or into the graph's input tensors between replays",
        )?;
        let device = &self.inner.device;
        let mut st = lock(&self.inner.staging);
        for (i, chunk) in data.chunks(CHUNK / 4).enumerate() {
            let buf = if chunk.len() * 4 <= SMALL {
                let k = st.next_small;
                st.next_small = (k + 1) % SMALL_SLOTS;
                ensure(&mut st.small[k], device, op, SMALL)?
            } else {
                let k = st.next_up;
                st.next_up ^= 1;
                ensure(&mut st.up[k], device, op, CHUNK)?
            };
            let bytes: Vec<u8> = chunk.iter().flat_map(|v| v.to_le_bytes()).collect();
            device
                .write_pinned(buf, &bytes)
                .map_err(|e| device_error(op, e))?;
            device
                .upload_async(
                    dst.offset((i * CHUNK) as u64),
                    buf,
                    bytes.len() as u64,
                    self.inner.stream,
                )
                .map_err(|e| device_error(op, e))?;
        }
        Ok(())
    }

    /// Copies `n` floats from the dense device range at `src` to the host, waiting (bounded)
    /// for the copy and everything queued before it.
    pub(crate) fn stage_download(
        &self,
        op: &'static str,
        src: DevicePtr,
        n: usize,
    ) -> Result<Vec<f32>> {
        self.refuse_in_capture(op, "download after the capture, or after a replay")?;
        let device = &self.inner.device;
        let mut st = lock(&self.inner.staging);
        let buf = ensure(&mut st.down, device, op, CHUNK)?;
        let mut out = Vec::with_capacity(n);
        let mut bytes = vec![0u8; CHUNK.min(n * 4)];
        let mut done = 0usize;
        while done < n {
            let count = (n - done).min(CHUNK / 4);
            let piece = &mut bytes[..count * 4];
            device
                .download_async(
                    buf,
                    src.offset((done * 4) as u64),
                    piece.len() as u64,
                    self.inner.stream,
                )
                .map_err(|e| device_error(op, e))?;
            device
                .read_pinned(buf, piece)
                .map_err(|e| device_error(op, e))?;
            out.extend(
                piece
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            );
            done += count;
        }
        Ok(out)
    }
}
