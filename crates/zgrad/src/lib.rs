//! zgrad: the autograd tape, losses, optimisers, the XAsset model and its trainer, generic over
//! zcompute's `Backend` (the CPU backend here, the CUDA backend on the GPU). See README.md.
//!
//! Memory policy (failure class C of the design brief): tensors an op saves for backward are
//! owned by the tape in zmem's `Saved` class and carry a version; parameters, gradients and
//! optimiser state are `Persistent`; backward temporaries are `Scratch`; the trainer opens and
//! closes a step around every sample (or batch) so scratch memory is reclaimed without the
//! user doing anything.
#![forbid(unsafe_code)]

mod error;
mod memory;
mod ops;
pub mod rng;
mod tape;
mod var;

pub use error::{GradError, NonFiniteKind, Result};
pub use tape::Tape;
pub use var::Var;
