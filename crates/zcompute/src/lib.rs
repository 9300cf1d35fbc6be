//! zcompute: tensors, CPU and CUDA backends, kernels and graph capture. See ARCHITECTURE.md.
