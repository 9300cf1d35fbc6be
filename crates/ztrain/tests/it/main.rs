//! ztrain's integration tests: one binary, one module per feature. Most run the built `ztrain`
//! command as a user would (`common`), each in a process of its own.

/// Running the built `ztrain` binary on tiny sizes.
mod common;

/// The command's options, runs, resumes and reports on the CPU and the simulated device.
mod cli;
/// `--gpus N`: ranks as processes, a rank killed or stalled, launcher variables.
mod distributed;
/// The whole cause chain of an error, each condition distinct.
mod errors;
/// `ztrain::fit`: the run loop for a model of a user's own (checkpoint, SIGINT, resume, ranks).
mod fit;
/// The examples of `docs/guide.md`, compiled and run.
mod guide;
/// `ztrain --plan`: the memory plan before the run.
mod plan;
/// Hostile use: outputs that would destroy data, inputs that would hang, signals, soak.
mod reliability;

/// GPU twins of the CLI tests (a missing GPU fails them).
#[cfg(feature = "gpu")]
mod gpu;
