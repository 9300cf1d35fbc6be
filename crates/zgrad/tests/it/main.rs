//! zgrad's integration tests: one binary, one module per feature. Bodies that take a backend
//! run on the CPU, on the simulated device and (`gpu` modules, `--features gpu`) on CUDA
//! device 0.

/// A host backend with device-like memory rules (`SimBackend`).
mod common;
/// Shared by several features: the PyTorch fixtures, one trainer step against the oracle, a
/// model of the user's own (`mlp`) and the small XAsset the trainer tests use (`small`).
mod support {
    pub mod autocast_draws;
    pub mod autocast_error;
    pub mod fixtures;
    pub mod head;
    pub mod mlp;
    pub mod oracle_step;
    pub mod own_model_bf16;
    pub mod precision_step;
    pub mod small;
    pub mod steps;
    pub mod tasks;
}

/// The tape and every op's backward: finite differences, fused nodes against their
/// composites, gradients added into parameter buffers, invariants over random op chains.
mod autograd {
    mod accumulate;
    mod attention;
    mod gradcheck;
    mod linear;
    mod props;
    mod tape;
}
/// The examples, run small on the CPU and the simulated device (each example holds its own
/// copy of the examples' `common` module, as its binary does).
#[allow(clippy::duplicate_mod)]
mod examples;
/// Every loss and its gradient against the float64 oracle.
mod losses;
/// The ops models reach for and a user's own op (`CustomOp`), against PyTorch's float64
/// oracle, captured against eager.
mod model_ops;
/// zero_grad, the global norm, clipping, SGD, AdamW's device slot.
mod optim;
/// Loss, gradients and an AdamW step against the PyTorch oracle.
mod oracle;
/// The target contract: outputs, targets and losses checked against the model's task.
mod targets;
/// The trainer in both schedules, eager and captured: on a host backend, over flat parameter
/// buffers, from pinned memory, per sample over a device-resident batch, replayed on a
/// resident batch, through failing optimiser steps, and evaluating on the device.
mod trainer {
    mod eval_device;
    mod eval_tasks;
    mod flat_params;
    mod on_host;
    mod per_sample;
    mod per_sample_queued;
    mod pinned;
    mod planned;
    mod readback;
    mod replay;
    mod step_failures;
    mod verbs;
}
/// The trainer and the tape on the CUDA backend (simulated device; `gpu`: CUDA device 0),
/// and a model of the user's own through the trainer.
mod device;
/// Each device condition through the tape as its own typed error.
mod errors;
/// How much device work a step issues (graph nodes, launches), held under budgets.
mod work_budget {
    mod forward_backward;
    mod graph_nodes;
    mod optimiser;
}
/// Parameter files and checkpoints; a resumed run continues exactly.
mod checkpoint;
/// Memory plans against real runs.
mod memory_plan;
/// Precision policies: the CPU's emulated bf16 matrix product.
mod precision;
/// bf16 and f16 parameter files: exact load, rounded export, typed refusals.
mod reduced_precision_files;
/// Data-parallel training: simulated ranks, the collectives a step makes, and (`gpu`) NCCL
/// ranks as processes (the test re-runs this binary once per rank).
mod distributed {
    mod collective_calls;
    mod eval_tasks;
    #[cfg(feature = "gpu")]
    mod nccl;
    mod per_sample_queued;
    mod sgd;
    mod simulated;
}
