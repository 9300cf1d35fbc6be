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
fn gpu_saved_and_kept_scratch_survive_step_ends() {
    bodies::saved_survives_step_end(&open(), true).unwrap();
}

#[test]
fn gpu_poison_makes_stale_reads_nan() {
    bodies::poison_reclaimed_scratch(&open(), true).unwrap();
    // Negative control on the device too: without poison the stale read sees old data.
    assert!(bodies::poison_reclaimed_scratch(&open(), false).is_err());
}
