//! zgrad: autograd tape, optimisers and the trainer. See ARCHITECTURE.md.
#![forbid(unsafe_code)]
