//! The matrix on the simulated driver (virtual time), in CI.

use std::time::Duration;

use zdevice::{AsyncStall, DeviceConfig, SimConfig, SimDriver, sim::calls};

use super::case::{case, record};
use super::child::{CHILD_CASE, in_child, run_child};
use super::{Fault, MODES, Settings, deadlines, matrix, small_arena};
use crate::common::{TINY, initial_parameters};

fn sim() -> SimDriver {
    let sim = SimDriver::new(SimConfig {
        poison_on_free: true,
        ..SimConfig::with_capacity(1 << 30)
    });
    // The kernels' Rust twins, registered explicitly: the backend under the fault wrapper
    // resolves them from the simulator it wraps.
    zcompute::cuda::twins::register(&sim);
    sim
}

/// 1 s deadlines and 3 s stalls, in virtual time.
fn settings() -> Settings {
    Settings {
        size: TINY,
        arena: small_arena(),
        device: deadlines(
            DeviceConfig {
                blas_workspace_bytes: 0,
                ..DeviceConfig::default()
            },
            Duration::from_secs(1),
            Duration::from_secs(1),
        ),
        stall: Duration::from_secs(3),
        async_stall: AsyncStall::Emulated,
        tolerance: 1e-6,
    }
}

/// Every call the training workload makes x every fault, on the simulated driver.
#[test]
fn every_call_x_every_fault() {
    let (table, broken) = matrix(&sim, &settings(), &|_, _, _| None);
    println!("## Simulated driver (SimDriver, tiny XAsset)\n{table}");
    assert!(
        broken.is_empty(),
        "{} cases broke a promise:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

/// The GPU matrix runs sticky cases in a fresh process; this runs one that way on the
/// simulator and checks the child reports what the same case reports in-process.
#[test]
fn a_case_in_a_fresh_process_reports_as_in_process() {
    const TEST: &str = "fault_matrix::sim::a_case_in_a_fresh_process_reports_as_in_process";
    let s = settings();
    if let Ok(spec) = std::env::var(CHILD_CASE) {
        run_child(&sim, &spec, &s);
        return;
    }
    let mode = MODES[3];
    let params = initial_parameters(&s.size);
    let (_, reference) = record(&sim, &s, mode, &params);
    for fault in [Fault::StickyAtNextSync, Fault::Now] {
        let here = case(
            &sim,
            &s,
            mode,
            &params,
            &reference,
            calls::LAUNCH_KERNEL,
            true,
            fault,
        );
        let there = in_child(TEST, mode, calls::LAUNCH_KERNEL, fault);
        assert_eq!(there.broken, None);
        assert_eq!(
            (there.outcome.as_str(), there.after.as_str()),
            (here.outcome.as_str(), here.after.as_str()),
            "{}",
            fault.header()
        );
    }
}
