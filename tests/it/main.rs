//! The failure classes of ARCHITECTURE.md as end-to-end training runs: zdevice, zmem, zcompute and
//! zgrad together. Each body is generic over the driver and expanded for the simulated device (tiny
//! XAsset) and, under `gpu`, for CUDA device 0 (default XAsset size).

mod a_overflow;
mod b_capture;
mod c_saved;
mod common;
mod fault_matrix;
