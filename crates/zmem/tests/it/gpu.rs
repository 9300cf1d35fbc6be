//! The GPU twins of the mock scenarios: same bodies, on CUDA device 0. A missing GPU fails.

use zdevice::{CudaDriver, Device, DeviceConfig};

use crate::bodies;
use crate::util::Logs;

fn open() -> Device<CudaDriver> {
    let driver = CudaDriver::load().expect("the CUDA driver loads on a GPU machine");
    let dev = Device::open(driver, DeviceConfig::default()).expect("CUDA device 0 opens");
    tracing::info!(target: "zmem.test.gpu", device = %dev.info().name, "opened");
    dev
}

#[test]
fn gpu_overflow_loop_completes_and_warns_once() {
    bodies::overflow_loop(&open(), &Logs::default()).unwrap();
}

#[test]
fn gpu_capture_allocates_from_its_reservation_and_replays() {
    bodies::capture_from_reservation(&open()).unwrap();
}

#[test]
fn gpu_lent_scratch_keeps_every_live_block() {
    bodies::lent_scratch_keeps_every_live_block(&open(), true).unwrap();
}

#[test]
fn gpu_saved_and_kept_scratch_survive_step_ends() {
    bodies::saved_survives_step_end(&open(), true).unwrap();
}

#[test]
fn gpu_poison_makes_stale_reads_nan() {
    if zmem::sanitize_forced().unwrap() {
        // Sanitizer mode (`ZMEM_SANITIZE=1`, `cargo xtask test-gpu --sanitize`) gives reclaimed
        // scratch back to the driver: the stale read below would be a use after free, which
        // the sanitizer is there to report, not this test. Its simulated twin is
        // `sanitize::a_stale_read_of_reclaimed_scratch_is_a_use_after_free`.
        let dev = open();
        let arena = zmem::Arena::new(dev, zmem::ArenaConfig::default()).unwrap();
        assert!(arena.diagnostics().sanitize);
        return;
    }
    bodies::poison_reclaimed_scratch(&open(), true).unwrap();
    // Negative control on the device too: without poison the stale read sees old data.
    assert!(bodies::poison_reclaimed_scratch(&open(), false).is_err());
}

/// The sanitizer's negative control, planted only when `ZMEM_PLANT_OOB=1`: zdevice's fill
/// kernel writes 3 KiB past a 1 KiB block. `cargo xtask test-gpu --sanitize` (and the bundle's
/// `sanitize.sh`) run this test alone under memcheck twice, with `ZMEM_SANITIZE=1` and `=0`, and
/// fail unless memcheck reports the write in sanitizer mode and not in the default mode. Without
/// `ZMEM_PLANT_OOB` (every ordinary run) the fill stays inside the block and must be clean.
#[test]
fn gpu_planted_out_of_bounds_write_inside_a_block() {
    let sanitize = zmem::sanitize_forced().unwrap();
    let plant = std::env::var("ZMEM_PLANT_OOB").is_ok_and(|v| v == "1");
    let floats = if plant {
        1024
    } else {
        bodies::PLANT_BLOCK_FLOATS
    };
    let synced = bodies::planted_oob_write(&open(), sanitize, floats).unwrap();
    if !plant || !sanitize {
        // In bounds, or planted inside the arena's own segment: nothing can see it.
        synced.unwrap();
    } else {
        // Past the block's own allocation: memcheck reports it (the xtask counts that); without
        // memcheck the GPU may or may not fault, so the outcome is only shown.
        tracing::warn!(target: "zmem.test.gpu", ?synced, "planted write in sanitizer mode");
    }
}

#[test]
fn gpu_graph_pool_members_replay_alternately_through_one_memory() {
    bodies::pool_members_alternate(&open()).unwrap();
}
