//! `use zcompute::prelude::*;`: the op-set traits, so methods resolve on a concrete backend
//! (`CpuBackend`, `CudaBackend`) with one import. Code generic over `B: Ops<T>` needs none of
//! this: a bound brings its traits' methods with it.

pub use crate::attention::AttentionOps;
pub use crate::backend::Backend;
pub use crate::capture::Capture;
pub use crate::linear::LinearOps;
pub use crate::norm::NormOps;
pub use crate::ops::Ops;
pub use crate::optim::OptimOps;
pub use crate::pooled_loss::PooledLossOps;
pub use crate::precision::PrecisionOps;
pub use crate::random::RandomOps;
pub use crate::readback::ReadbackOps;
pub use crate::select::SelectOps;
pub use crate::step::StepOps;
