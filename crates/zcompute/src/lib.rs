//! zcompute: tensors as strided views over pluggable storage, and the op set: the primitives
//! behind the `Backend` trait and the families (`LinearOps`, `NormOps`, `AttentionOps`,
//! `PooledLossOps`, `SelectOps`, `RandomOps`, `OptimOps`, the training step's `StepOps`, the
//! queued downloads' `ReadbackOps`), whose methods are provided as composites of the
//! primitives; `Ops` is all of them in one bound, and `prelude` imports them all. `CpuBackend` implements them in f32
//! and f64 (the f64 run is the reference); `CudaBackend` in f32 over zmem blocks on any
//! `zdevice::Driver` (the real GPU, or the simulated device in CI), with the one capture entry
//! point (`Capture`).
//!
//! The heart is `Layout` (shape, strides, offset): views are layout rewrites, data movement is
//! explicit (`Backend::contiguous`, `Backend::copy_into`).
//!
//! Start from [`Engine`]: `Engine::cuda(ordinal)?`, `Engine::sim(capacity)?` or
//! `Engine::cpu()`, with arena settings from one [`EngineConfig`].

pub mod attention;
pub mod backend;
pub mod capture;
pub mod cpu;
pub mod cuda;
mod descriptors;
pub mod element;
pub mod engine;
pub mod error;
mod fastmath;
mod host_pool;
pub mod layout;
pub mod linear;
pub mod norm;
pub mod ops;
pub mod optim;
pub mod pinned;
pub mod pooled_loss;
pub mod precision;
pub mod prelude;
pub mod random;
pub mod readback;
pub mod select;
pub mod step;
pub mod storage;
pub mod tensor;
mod validate;

pub use attention::{
    AttentionOps, KeyPaddingAttention, KeyPaddingAttentionGrads, QkNorm, QkNormAttentionGrads,
    QkNormAttentionGradsInto,
};
pub use backend::{
    ADAMW_SLOT_GATE, ADAMW_SLOT_LR, ADAMW_SLOT_STEP, AdamWConfig, AllocClass, BTensor, Backend,
    BinaryOp, LayerNormBackward, LayerNormGrads, LayerNormOut, MatmulOpts, ReduceOp, ScalarSide,
    UnaryOp,
};
pub use capture::Capture;
pub use cpu::{CpuBackend, CpuGraph};
pub use cuda::{CudaBackend, CudaGraph, CudaStorage, CudaTensor};
pub use element::{DType, Element};
pub use engine::{
    ArenaOverrides, ArenaSetting, CudaDriver, Driver, Engine, EngineConfig, SimConfig, SimDriver,
    StreamPriority,
};
pub use error::{ComputeError, Result};
pub use layout::{Dims, Layout, Offsets, broadcast_shapes, checked_numel, contiguous_strides};
pub use linear::{Activation, LinearOps};
pub use norm::{AddLayerNormOut, NormOps};
pub use ops::Ops;
pub use optim::{OptimOps, SgdConfig};
pub use pinned::{CopyMark, HostVec, PinnedHost, PinnedSlice};
pub use pooled_loss::{PoolHeadBceGrads, PoolHeadBceOut, PooledLossOps};
pub use precision::{BBf16, Bf16Copy, MathMode, PrecisionOps};
pub use random::{RandomOps, philox4x32_10};
pub use readback::{Readback, ReadbackOps};
pub use select::SelectOps;
pub use step::{HistoryRows, StepOps};
pub use storage::{CpuStorage, Storage};
pub use tensor::{CpuTensor, Tensor};
/// zmem's items an engine's user reads (the arena's step records and errors, byte units), so
/// that a crate above needs no dependency on zmem for them.
pub use zmem::{ArenaConfig, GraphPool, MemError, StepRecord, units};
