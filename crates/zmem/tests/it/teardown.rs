//! Teardown while the stream is still busy: an arena whose drain times out (the device not
//! lost) hands its memory to the device, which frees it once the stream has drained, never
//! before, and never leaves it to the process.

use std::time::Duration;

use rstest::rstest;
use zdevice::faulty::resource;
use zdevice::sim::calls;
use zdevice::{
    AsyncStall, Device, DeviceConfig, DeviceError, FaultController, FaultyDriver, SimConfig,
    SimDriver,
};
use zmem::{Arena, MemError};

use crate::util::{sanitized, small};

/// 1 s deadlines in virtual time, so a stall of a few seconds outlasts each wait.
fn faulty_device() -> (Device<FaultyDriver<SimDriver>>, FaultController) {
    let driver = FaultyDriver::new(SimDriver::new(SimConfig::with_capacity(1 << 30)));
    let ctl = driver.controller();
    ctl.set_async_stall(AsyncStall::Emulated);
    let device = Device::open(
        driver,
        DeviceConfig {
            sync_deadline: Duration::from_secs(1),
            alloc_deadline: Duration::from_secs(1),
            blas_workspace_bytes: 0,
            ..DeviceConfig::default()
        },
    )
    .expect("the simulated device opens");
    (device, ctl)
}

fn held(ctl: &FaultController, kind: &str) -> usize {
    ctl.live_resources()
        .iter()
        .find(|(k, _)| *k == kind)
        .map_or(0, |(_, n)| *n)
}

/// Arena memory and pools the driver still holds.
fn arena_held(ctl: &FaultController) -> (usize, usize) {
    (
        held(ctl, resource::DEVICE_MEMORY),
        held(ctl, resource::POOL),
    )
}

#[rstest]
fn a_teardown_whose_drain_times_out_frees_after_the_stream_drains(
    #[values(false, true)] sanitize: bool,
) {
    let (device, ctl) = faulty_device();
    let arena = sanitized(sanitize, || Arena::new(device.clone(), small(1 << 20))).unwrap();
    let block = arena.alloc_persistent(4096).unwrap();
    let ptr = block.ptr().unwrap();
    // Queued work that reads the arena's memory and keeps the stream busy for 3 s: longer
    // than the teardown's drain (1 s).
    ctl.stall(calls::MEMSET_D8_ASYNC, 1, Duration::from_secs(3));
    device
        .memset_d8_async(ptr, 7, 4096, device.stream())
        .unwrap();
    drop(block);
    drop(arena);
    assert_eq!(device.lost_reason(), None);
    // In sanitizer mode the block went back in stream order when it dropped; the pools stay.
    let (mem, pools) = arena_held(&ctl);
    assert!(
        (mem > 0 || sanitize) && pools > 0,
        "the queued memset may still touch the arena's memory: nothing may be freed yet ({:?})",
        ctl.live_resources()
    );
    // The first wait still times out; a later successful one performs the releases.
    let first = device.synchronize(device.stream());
    assert!(
        matches!(first, Err(DeviceError::Timeout { .. })),
        "{first:?}"
    );
    assert_eq!(
        arena_held(&ctl),
        (mem, pools),
        "freed before the stream drained"
    );
    device.synchronize(device.stream()).unwrap();
    assert_eq!(
        arena_held(&ctl),
        (0, 0),
        "after the stream drained, the arena's memory is still held: {:?}",
        ctl.live_resources()
    );
    drop(device);
    assert_eq!(ctl.live_resources(), vec![]);
}

/// `Arena::new` fails on a timed-out wait (the device is not lost); its teardown's drain times
/// out too. Closing the device drains once more (bounded) and frees what the arena had made.
#[rstest]
fn a_failed_arena_new_leaves_nothing_once_the_device_closes(
    #[values(calls::MEM_FREE_ASYNC, calls::MEM_ALLOC_FROM_POOL_ASYNC)] call: &'static str,
    #[values(false, true)] sanitize: bool,
) {
    let (device, ctl) = faulty_device();
    // Outlasts the pool's fill (1 s) and the teardown's drain (1 s); the close's drain sees
    // the stream finish.
    ctl.stall(call, 1, Duration::from_millis(2500));
    let err = sanitized(sanitize, || Arena::new(device.clone(), small(1 << 20))).unwrap_err();
    assert!(
        matches!(err, MemError::Device(DeviceError::Timeout { .. })),
        "{err:?}"
    );
    assert_eq!(device.lost_reason(), None);
    drop(device);
    assert_eq!(ctl.live_resources(), vec![], "left to the process");
}

/// A stream that never drains before the device closes: the close waits once (bounded) and
/// leaves what it could not free to the process with a warning, instead of hanging.
#[test]
fn a_close_whose_drain_times_out_does_not_wait_without_bound() {
    let (device, ctl) = faulty_device();
    let arena = Arena::new(device.clone(), small(1 << 20)).unwrap();
    let block = arena.alloc_persistent(4096).unwrap();
    ctl.stall(calls::MEMSET_D8_ASYNC, 1, Duration::from_secs(3600));
    device
        .memset_d8_async(block.ptr().unwrap(), 7, 4096, device.stream())
        .unwrap();
    drop(block);
    drop(arena);
    drop(device);
    assert!(arena_held(&ctl).0 > 0, "freed while queued work may run");
}
