//! The read-back family: [`ReadbackOps`], device-to-host copies the host reads later
//! ([`ReadbackOps::queue_download`]): the copy is queued on the backend's stream behind the
//! work that writes its source, and the host waits for that copy alone when it wants the
//! values, long after it finished in the steady state of a training loop that reads a window
//! of steps back while the next window runs.

use crate::backend::{BTensor, Backend};
use crate::element::Element;
use crate::error::Result;

/// Downloads queued for later. The provided `queue_download` downloads at once (right for a
/// backend whose work runs in call order, the CPU's); a device backend queues the copy on its
/// stream (the CUDA backend: `cuda/readback.rs`).
pub trait ReadbackOps<T: Element>: Backend<T> {
    /// Queues a download of `x` (logical row-major order) behind the work queued so far and
    /// returns at once: [`Readback::wait`] waits for that copy only, so a host that reads it
    /// after queueing more work never drains the stream. Refused while capturing. The default
    /// downloads now, which is the same for a backend whose work runs in call order (the
    /// CPU's).
    fn queue_download(&self, x: &BTensor<Self, T>) -> Result<Readback<T>> {
        self.download(x).map(Readback::done)
    }
}

/// A backend's copy in flight: polled without waiting, or waited for (that copy only, not
/// the rest of the stream) and read.
pub(crate) trait QueuedRead<T> {
    /// Whether the copy has run.
    fn ready(&self) -> Result<bool>;

    /// Waits (bounded by the device's sync deadline) for the copy and returns the values.
    fn wait(self: Box<Self>) -> Result<Vec<T>>;
}

/// Values on their way to the host: read already (a backend whose work runs in call order,
/// the CPU's) or a queued copy. Dropped unread, a device copy's buffer goes back to its
/// backend once the copy has run.
pub struct Readback<T>(Inner<T>);

enum Inner<T> {
    Done(Vec<T>),
    Queued(Box<dyn QueuedRead<T>>),
}

impl<T> Readback<T> {
    /// Values the host holds already.
    #[must_use]
    pub fn done(values: Vec<T>) -> Self {
        Readback(Inner::Done(values))
    }

    /// A copy a backend queued.
    pub(crate) fn queued(read: Box<dyn QueuedRead<T>>) -> Self {
        Readback(Inner::Queued(read))
    }

    /// Whether [`Readback::wait`] would return without waiting for the device.
    pub fn is_ready(&self) -> Result<bool> {
        match &self.0 {
            Inner::Done(_) => Ok(true),
            Inner::Queued(read) => read.ready(),
        }
    }

    /// The values, after waiting (bounded) for their copy, and only for it: work queued on
    /// the stream after the copy is not waited for.
    pub fn wait(self) -> Result<Vec<T>> {
        match self.0 {
            Inner::Done(values) => Ok(values),
            Inner::Queued(read) => read.wait(),
        }
    }
}

impl<T> std::fmt::Debug for Readback<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.0 {
            Inner::Done(_) => "done",
            Inner::Queued(_) => "queued",
        };
        f.debug_tuple("Readback").field(&state).finish()
    }
}
