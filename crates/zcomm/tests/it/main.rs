//! zcomm's integration tests: one binary, one module per feature.

/// The launcher variables and the job secret.
mod env;
/// The launcher: ranks as processes, failures and stops named.
mod launch;
/// Rank 0 hands out the communicator id over TCP; what a hostile peer tries.
mod rendezvous;
/// The simulated communicator, ranks as threads.
mod sim;

/// NCCL on the machine's GPUs, one process per rank (re-runs this binary per rank).
#[cfg(feature = "gpu")]
mod nccl;
