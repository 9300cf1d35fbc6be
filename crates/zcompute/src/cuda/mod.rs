//! The CUDA backend: `Backend<f32>` and `Capture<f32>` over a zmem `Arena` on any
//! `zdevice::Driver`. On `SimDriver` (MockDevice) every kernel runs as its Rust twin
//! (`twins.rs`, registered on the simulator by whoever builds it: `Engine::sim` does), so the
//! whole op suite runs in CI; on `CudaDriver` it runs the PTX of `kernels/*.cu` and cuBLAS.
//!
//! Rules it keeps:
//! - Every op is queued on the device's engine stream; nothing synchronises the device except
//!   `download` and `synchronize`, which wait on that stream with the device's deadline.
//! - Outputs are allocated in the backend's allocation class: `Scratch` from the open step
//!   (`begin_step`/`end_step` drive a zmem `OwnedStep`; with no step open a scratch
//!   allocation is the typed error `NoOpenStep`, never a silent fallback), `Saved` and
//!   `Persistent` from zmem's held region. Temporaries (a contiguous copy of a strided
//!   operand) are held memory returned when dropped. The default class is `Persistent`.
//! - Every pointer is resolved through zmem's generation check, so a tensor whose scratch was
//!   reclaimed fails with `UseAfterReclaim` at the op that used it.
//! - Inside `capture` every allocation comes from the graph's reservation, and uploads,
//!   downloads, syncs and step changes are refused (`capture.rs`). Where a capture is (warm-up,
//!   reserved, capturing) is the device's capture session's phase, read, never mirrored here;
//!   the backend keeps only what its own capture collects (`CaptureLog`).

mod accumulate;
mod attention;
mod backward;
mod capture;
mod exchange;
mod flat;
pub(crate) mod fused;
mod indexed;
mod kernels;
mod key_padding;
mod launch;
mod linear;
mod linear_backward;
mod matmul;
mod norm_params;
mod ops;
mod optim;
mod pinned;
mod precision;
mod readback;
mod rows;
mod select;
mod side_stream;
mod state;
mod step;
mod storage;
mod support;
mod transfer;
pub mod twins;

pub use capture::CudaGraph;
pub use exchange::{EXCHANGE_MAX_RANKS, PeerExchange};
pub use kernels::Kernel;
pub use linear::LINEAR_ROW_LIMIT;
pub use pinned::CudaPinned;
pub use side_stream::SideStream;
pub(crate) use state::CaptureLog;
pub use state::CudaBackend;
pub use storage::{CudaStorage, CudaTensor};
pub(crate) use support::{device_error, lock, mem_error};
