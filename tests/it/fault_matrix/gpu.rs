//! The matrix over `CudaDriver` on device 0, from `cargo xtask test-gpu`.

use std::cell::RefCell;
use std::collections::HashSet;
use std::time::Duration;

use zdevice::{AsyncStall, CudaDriver, DeviceConfig, Driver};

use super::child::{CHILD_CASE, in_child, run_child};
use super::{CaseResult, Fault, Settings, deadlines, matrix, small_arena};
use crate::common::TINY;

const TEST: &str = "fault_matrix::gpu::every_call_x_every_fault";

fn cuda() -> CudaDriver {
    CudaDriver::load().expect("the CUDA driver loads on a GPU machine")
}

fn settings() -> Settings {
    Settings {
        size: TINY,
        arena: small_arena(),
        // Waits and allocations 200 ms, module loads 1 s: every deadline at most 1 s.
        device: deadlines(
            DeviceConfig::default(),
            Duration::from_millis(200),
            Duration::from_secs(1),
        ),
        stall: Duration::from_millis(500),
        async_stall: AsyncStall::SpinKernel,
        // Captured and eager steps after a fallback agree to about 1e-7 on the GPU.
        tolerance: 1e-5,
    }
}

/// Every call the training workload makes x every fault, over `CudaDriver` on device 0;
/// sticky cases each in a fresh process. Prints the same markdown table as the sim's.
#[test]
fn every_call_x_every_fault() {
    let s = settings();
    if let Ok(spec) = std::env::var(CHILD_CASE) {
        run_child(&cuda, &spec, &s);
        return;
    }
    let name = cuda().describe();
    // A sticky case runs in a fresh process (its emulation refuses the frees, so its GPU
    // memory would stay allocated for the rest of the run); once per call, in the first mode
    // that makes it, to keep the matrix in a few minutes.
    let isolated = RefCell::new(HashSet::new());
    let isolate = |mode: super::Mode, call: &'static str, fault: Fault| {
        if fault != Fault::StickyAtNextSync {
            return None;
        }
        if !isolated.borrow_mut().insert(call) {
            return Some(CaseResult {
                outcome: "(in a child once per call: see above)".to_string(),
                after: "-".to_string(),
                broken: None,
            });
        }
        Some(in_child(TEST, mode, call, fault))
    };
    let (table, broken) = matrix(&cuda, &s, &isolate);
    println!("## GPU ({name}, tiny XAsset)\n{table}");
    assert!(
        broken.is_empty(),
        "{} cases broke a promise:\n{}",
        broken.len(),
        broken.join("\n")
    );
}
