//! The backend's pinned staging buffers (module docs of `transfer.rs`) and their sizes.

use zdevice::{Device, Driver, PinnedBuffer};

/// Bytes per staged piece.
pub(crate) const CHUNK: usize = 8 << 20;
/// Uploads up to this many bytes (a graph's per-sample inputs) go through the small ring.
pub(crate) const SMALL: usize = 64 << 10;
/// Buffers in the small ring: a per-sample loop refills two inputs per replay, so the host
/// can queue up to 8 samples before it waits for the GPU to finish reading a buffer (with
/// the two large buffers alone it waited on every sample, one replay behind, and the GPU
/// idled while the host woke up).
pub(crate) const SMALL_SLOTS: usize = 16;

/// The backend's pinned buffers, allocated on first use.
#[derive(Debug, Default)]
pub(crate) struct Staging {
    pub(in crate::cuda) up: [Option<PinnedBuffer>; 2],
    pub(in crate::cuda) next_up: usize,
    pub(in crate::cuda) small: [Option<PinnedBuffer>; SMALL_SLOTS],
    pub(in crate::cuda) next_small: usize,
    pub(in crate::cuda) down: Option<PinnedBuffer>,
    /// Buffers of finished queued downloads (`readback.rs`), kept for the next ones.
    pub(crate) reads: Vec<PinnedBuffer>,
}

impl Staging {
    /// Frees the buffers (each after its last transfer).
    pub(crate) fn release<D: Driver>(self, device: &Device<D>) {
        let [a, b] = self.up;
        let bufs = [a, b, self.down].into_iter().chain(self.small).flatten();
        for buf in bufs.chain(self.reads) {
            if let Err(e) = device.free_pinned(buf) {
                tracing::warn!(target: "zcompute.cuda.transfer", error = %e, "freeing a staging buffer");
            }
        }
    }
}
