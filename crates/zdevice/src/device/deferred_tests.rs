//! Deferred releases on the simulated driver, with stalls from the fault-injecting wrapper.

use std::time::Duration;

use crate::error::DeviceError;
use crate::faulty::{AsyncStall, FaultController, FaultyDriver, resource};
use crate::sim::{SimConfig, SimDriver, calls};

use super::{Device, Release};
use crate::device::DeviceConfig;

/// 1 s deadlines in virtual time; stalls of a few seconds outlast a wait.
fn device() -> (Device<FaultyDriver<SimDriver>>, FaultController) {
    let driver = FaultyDriver::new(SimDriver::new(SimConfig::with_capacity(1 << 30)));
    let ctl = driver.controller();
    ctl.set_async_stall(AsyncStall::Emulated);
    let config = DeviceConfig {
        sync_deadline: Duration::from_secs(1),
        alloc_deadline: Duration::from_secs(1),
        blas_workspace_bytes: 0,
        ..DeviceConfig::default()
    };
    (Device::open(driver, config).unwrap(), ctl)
}

fn held(ctl: &FaultController, kind: &str) -> usize {
    ctl.live_resources()
        .iter()
        .find(|(k, _)| *k == kind)
        .map_or(0, |(_, n)| *n)
}

/// Queues a memset of `ptr` that keeps the stream busy for `secs`.
fn busy(
    dev: &Device<FaultyDriver<SimDriver>>,
    ctl: &FaultController,
    ptr: crate::DevicePtr,
    secs: u64,
) {
    ctl.stall(calls::MEMSET_D8_ASYNC, 1, Duration::from_secs(secs));
    dev.memset_d8_async(ptr, 1, 256, dev.stream()).unwrap();
}

#[test]
fn a_drained_stream_releases_at_once() {
    let (dev, ctl) = device();
    let p = dev.alloc(256).unwrap();
    dev.release_after_drain(dev.stream(), vec![Release::Free(p)])
        .unwrap();
    assert_eq!(held(&ctl, resource::DEVICE_MEMORY), 0);
    assert_eq!(dev.deferred_releases(), 0);
}

#[test]
fn a_busy_stream_defers_until_a_later_synchronize_succeeds() {
    let (dev, ctl) = device();
    let p = dev.alloc(256).unwrap();
    busy(&dev, &ctl, p, 3);
    let err = dev
        .release_after_drain(dev.stream(), vec![Release::Free(p)])
        .unwrap_err();
    assert!(matches!(err, DeviceError::Timeout { .. }), "{err:?}");
    assert_eq!(dev.lost_reason(), None);
    assert_eq!(dev.deferred_releases(), 1);
    assert_eq!(held(&ctl, resource::DEVICE_MEMORY), 1, "freed early");
    // Still busy: a failed wait releases nothing.
    assert!(dev.synchronize(dev.stream()).is_err());
    assert_eq!(held(&ctl, resource::DEVICE_MEMORY), 1, "freed early");
    dev.synchronize(dev.stream()).unwrap();
    assert_eq!(held(&ctl, resource::DEVICE_MEMORY), 0);
    assert_eq!(dev.deferred_releases(), 0);
}

#[test]
fn a_pool_goes_after_its_frees_when_the_last_handle_drops() {
    let (dev, ctl) = device();
    let pool = dev.create_pool(0, u64::MAX).unwrap();
    let p = dev.alloc_from_pool(pool.pool, 4096, dev.stream()).unwrap();
    busy(&dev, &ctl, p, 2);
    let releases = vec![Release::FreeAsync(p), Release::DestroyPool(pool.pool)];
    assert!(dev.release_after_drain(dev.stream(), releases).is_err());
    assert_eq!(held(&ctl, resource::POOL), 1);
    let other = dev.clone();
    drop(other);
    assert_eq!(dev.deferred_releases(), 2, "only the last handle releases");
    drop(dev);
    assert_eq!(ctl.live_resources(), vec![]);
}

#[test]
fn a_close_that_cannot_drain_leaves_the_memory_instead_of_waiting() {
    let (dev, ctl) = device();
    let p = dev.alloc(256).unwrap();
    busy(&dev, &ctl, p, 3600);
    assert!(
        dev.release_after_drain(dev.stream(), vec![Release::Free(p)])
            .is_err()
    );
    drop(dev);
    assert_eq!(held(&ctl, resource::DEVICE_MEMORY), 1, "freed while busy");
}

#[test]
fn a_lost_device_abandons_the_releases() {
    let (dev, ctl) = device();
    let p = dev.alloc(256).unwrap();
    ctl.fail_at_next_sync(crate::driver::CuCode::ILLEGAL_ADDRESS);
    let err = dev
        .release_after_drain(dev.stream(), vec![Release::Free(p)])
        .unwrap_err();
    assert!(dev.lost_reason().is_some(), "{err:?}");
    assert_eq!(dev.deferred_releases(), 0);
}

/// After a wait on a stream that never drains (a collective aborted with its peer gone), the
/// owner abandons the device: a release then neither waits for that stream again nor is kept
/// for later; it is left to the process at once, with no time passing on the device's clock.
#[test]
fn an_abandoned_device_waits_no_more() {
    use crate::driver::Driver;
    let (dev, ctl) = device();
    let p = dev.alloc(256).unwrap();
    busy(&dev, &ctl, p, 3600);
    let err = dev.synchronize(dev.stream()).unwrap_err();
    assert!(matches!(err, DeviceError::Timeout { .. }), "{err:?}");
    dev.abandon("the communicator was aborted with a collective in flight");
    let before = dev.driver().now();
    let err = dev
        .release_after_drain(dev.stream(), vec![Release::Free(p)])
        .unwrap_err();
    assert!(matches!(err, DeviceError::DeviceLost { .. }), "{err:?}");
    assert_eq!(dev.driver().now(), before, "waited on the device's clock");
    assert_eq!(dev.deferred_releases(), 0);
    assert!(dev.lost_reason().unwrap().contains("aborted"));
}
