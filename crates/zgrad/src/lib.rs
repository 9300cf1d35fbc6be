//! zgrad: the autograd tape, losses, optimisers, the `Model` trait, the XAsset model and the
//! trainer for any model, generic over zcompute's `Backend` (the CPU backend here, the CUDA
//! backend on the GPU). See README.md.
//!
//! Memory policy (failure class C of ARCHITECTURE.md): tensors an op saves for backward are
//! owned by the tape in zmem's `Saved` class and carry a version; parameters, gradients and
//! optimiser state are `Persistent`; backward temporaries are `Scratch`; the trainer opens and
//! closes a step around every sample (or batch) so scratch memory is reclaimed without the
//! user doing anything.
#![forbid(unsafe_code)]

mod batch;
pub mod checkpoint;
mod error;
pub mod file_dtype;
mod grad_sync;
pub mod io;
mod leaf_grads;
pub mod loss;
mod memory;
mod metrics;
pub mod model;
pub mod nn;
mod ops;
pub mod optim;
pub mod plan;
pub mod precision;
pub mod rng;
pub mod schedule;
mod shard;
mod tape;
mod task;
mod trainer;
mod var;
mod weight_shadow;
pub mod xasset;
mod xasset_init;

pub use checkpoint::{CheckpointFile, PRECISION_KEY, STEP_KEY, check_precision};
pub use error::{Applied, GradError, NonFiniteKind, Result};
pub use file_dtype::FileDtype;
pub use io::{HostTensor, TensorFile, read_tensors, write_tensors, write_tensors_as};
pub use loss::one_hot;
pub use memory::in_step;
pub use metrics::{EvalReport, RegressionMetrics};
pub use model::{Model, ParameterBuilder};
pub use ops::CustomOp;
pub use optim::{
    AdamW, AdamWHyper, AdamWState, DecayGroups, MomentumBuffer, Optimizer, OptimizerKind,
    OptimizerState, ParameterSet, Sgd, SgdHyper, SgdState, clip_grad_norm, grad_norm, zero_grad,
};
pub use plan::{MemoryPlan, PlanRequest, SchedulePlan, plan};
pub use precision::Precision;
pub use schedule::{LrDecay, LrSchedule};
pub use shard::shard;
pub use tape::Tape;
pub use task::{Target, Task};
pub use trainer::{
    CapturedGraphs, ChunkedEval, DEFAULT_BUCKET_BYTES, EvalSource, GradSync, HostPhases, Load,
    PinnedBatch, ReplayMark, StepReport, StepSource, TrainSchedule, Trainer, TrainerConfig,
    TrainerStatus, device_data_bytes, max_device_rows, step_table_bytes, validation_data_bytes,
};
pub use var::Var;
pub use xasset::{PARAMETER_NAMES, XAsset, XAssetConfig};
