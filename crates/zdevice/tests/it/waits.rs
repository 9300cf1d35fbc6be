//! How soon a wait sees its work done. A training step of under a millisecond is waited for
//! once per step (the loss read back, an event's timing); a wait that sleeps between polls,
//! doubling its sleep, sees a 0.6 ms step done at about 1.1 ms, and two ranks of a
//! data-parallel job at different moments. On a driver whose time is real the first
//! millisecond of a wait polls without sleeping.
//!
//! The simulated driver with `real_time_stalls` says its time is real; its clock is still
//! virtual (each call costs `call_time`, each queued operation `op_time`), so how late a wait
//! returns is read off that clock, the same on any machine.

use std::time::Duration;
use zdevice::{DeviceConfig, Driver, MockDevice, SimConfig, SimDriver};

const STEP: Duration = Duration::from_micros(600);
const CALL: Duration = Duration::from_micros(10);

/// A device whose queued operations each take `STEP` of virtual time.
fn device(real_time: bool) -> MockDevice {
    let sim = SimDriver::new(SimConfig {
        real_time_stalls: real_time,
        call_time: CALL,
        op_time: STEP,
        ..SimConfig::default()
    });
    MockDevice::open(sim, DeviceConfig::default()).expect("the simulated device opens")
}

/// Virtual time from the queued operation's end to the wait's return.
fn lateness(dev: &MockDevice) -> Duration {
    let p = dev.alloc(256).expect("alloc");
    let done = dev.create_event(false).expect("event");
    let stream = dev.stream();
    dev.memset_d32_async(p, 0, 64, stream).expect("memset");
    dev.record_event(done, stream).expect("record");
    let queued = dev.driver().now();
    dev.wait_event(done).expect("wait");
    let returned = dev.driver().now();
    dev.destroy_event(done).expect("destroy");
    dev.free(p).expect("free");
    returned.saturating_sub(queued + STEP)
}

/// On a driver whose time is real, a wait for 0.6 ms of work returns within two of its own
/// polls (each costs 10 us here) of the work's end: it polled without sleeping.
#[test]
fn a_wait_under_a_millisecond_returns_as_the_work_ends() {
    let late = lateness(&device(true));
    assert!(late <= 2 * CALL, "returned {late:?} after the work ended");
}

/// On a virtual clock a wait sleeps between polls from the start (spinning would not move
/// the clock); its sleeps double, so it returns well after the work ends: the behaviour the
/// real-time driver no longer has.
#[test]
fn on_a_virtual_clock_a_wait_sleeps_between_polls() {
    let late = lateness(&device(false));
    assert!(late > 2 * CALL, "returned {late:?} after the work ended");
}
