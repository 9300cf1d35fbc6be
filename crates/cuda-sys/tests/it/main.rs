//! cuda-sys integration tests: all run without CUDA installed.

mod loader;
mod names;
mod nccl;
