//! On the CPU backend (bf16 products emulated): one bf16 step per oracle fixture and schedule,
//! each tensor's error against the float64 oracle within twice PyTorch autocast's on the H200
//! (support/autocast_error.rs; device.rs runs the same check on the simulated device and GPU).

use crate::support::autocast_error::bf16_step_is_within_twice_autocast_error;
use zcompute::CpuBackend;

#[test]
fn a_bf16_step_on_the_cpu_is_within_twice_autocast_error() {
    bf16_step_is_within_twice_autocast_error(&CpuBackend);
}

/// The same over 32 draws of each fixture's batch, per tensor by its mean error
/// (support/autocast_draws.rs).
#[test]
fn a_bf16_step_on_the_cpu_is_within_twice_autocast_mean_error_over_draws() {
    crate::support::autocast_draws::bf16_mean_error_over_draws_is_within_twice_autocast(
        &CpuBackend,
    );
}
