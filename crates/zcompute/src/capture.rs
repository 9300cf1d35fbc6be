//! The one capture entry point: [`Capture`], a sequence of ops recorded once and replayed
//! (a CUDA graph on the device, the recorded body on the host). Beside the op set rather than
//! inside `backend.rs`: a backend that captures runs every family (`Ops`), so this trait sits
//! above them all, and the primitives' file never names the families.

use crate::element::Element;
use crate::error::Result;

/// A sequence of ops recorded once and replayed. The contract is the same on every backend, so
/// code that captures (the trainer) is tested on the CPU too. A backend that captures runs the
/// whole op set (`Ops`: primitives and every family), so code bounded by `Capture` calls any op.
///
/// - `capture` runs `body` exactly once for real (the warm-up that sizes a device graph's memory)
///   and returns a graph; each `replay` runs the same work once more.
/// - Inputs change between replays only through the tensors `body` reads, refilled with
///   [`crate::Backend::upload_into`] or [`crate::Backend::copy_into`] before `replay`.
/// - A failure inside `capture` leaves the backend usable for eager execution.
/// - Tensors the body allocates and stores outside (in an `Rc<RefCell<…>>` it captured, say)
///   hold, once `capture` returns, the result of the one real run (the warm-up), on every
///   backend; after each `replay` they hold that replay's result. (A device graph's tensors are
///   not the warm-up's: the CUDA backend copies the warm-up's values into them before
///   `capture` returns, pairing the two runs' allocations in order, and refuses a body whose
///   two runs allocate differently with `CaptureFailed`.) Writing results into tensors
///   allocated before `capture` (refilled slots, as the trainer does) needs none of this.
pub trait Capture<T: Element>: crate::Ops<T> {
    /// What `capture` returns: a device graph, or the recorded body on the host.
    type Graph;

    fn capture(&self, body: Box<dyn FnMut() -> Result<()>>) -> Result<Self::Graph>;

    /// `capture`, with the graph's memory shared with the other members of `pool`: graphs
    /// that the caller replays one at a time on this backend and whose outputs live outside
    /// the capture (the promise `zmem::GraphPool` documents). A backend without device memory
    /// (the CPU) captures as `capture` does.
    fn capture_in_pool(
        &self,
        pool: &zmem::GraphPool,
        body: Box<dyn FnMut() -> Result<()>>,
    ) -> Result<Self::Graph> {
        let _ = pool;
        self.capture(body)
    }

    fn replay(&self, graph: &mut Self::Graph) -> Result<()>;
}
