//! Failures half-way through a device method give back what the method had acquired. Found by
//! the fault matrix (tests/it/fault_matrix): each of these left a pool or an event behind.

use rstest::rstest;
use zdevice::faulty::resource;
use zdevice::{CuCode, Device, DeviceConfig, FaultAction, FaultyDriver, SimDriver, sim::calls};

fn device() -> (Device<FaultyDriver<SimDriver>>, zdevice::FaultController) {
    let driver = FaultyDriver::new(SimDriver::default());
    let ctl = driver.controller();
    let config = DeviceConfig {
        blas_workspace_bytes: 0,
        ..DeviceConfig::default()
    };
    (Device::open(driver, config).unwrap(), ctl)
}

fn count(ctl: &zdevice::FaultController, kind: &str) -> usize {
    ctl.live_resources()
        .into_iter()
        .find(|(k, _)| *k == kind)
        .map_or(0, |(_, n)| n)
}

/// Before: every failure after `cuMemPoolCreate` returned with the pool still alive (and a
/// failed `cuMemFreeAsync` also left the reservation outstanding in it).
#[rstest]
#[case(
    calls::MEM_POOL_SET_ATTRIBUTE,
    FaultAction::Fail(CuCode::INVALID_VALUE)
)]
#[case(
    calls::MEM_ALLOC_FROM_POOL_ASYNC,
    FaultAction::Fail(CuCode::OUT_OF_MEMORY)
)]
#[case(calls::MEM_FREE_ASYNC, FaultAction::Fail(CuCode::INVALID_VALUE))]
#[case(
    calls::MEM_FREE_ASYNC,
    FaultAction::FailAtNextSync(CuCode::INVALID_VALUE)
)]
#[case(
    calls::MEM_POOL_GET_ATTRIBUTE,
    FaultAction::Fail(CuCode::INVALID_VALUE)
)]
fn a_pool_that_fails_to_fill_is_destroyed(#[case] call: &'static str, #[case] action: FaultAction) {
    let (dev, ctl) = device();
    let before = ctl.live_resources();
    ctl.fault(call, 1, action);
    assert!(
        dev.create_pool(1 << 20, u64::MAX).is_err(),
        "{call}: the failure is reported"
    );
    assert_eq!(
        ctl.live_resources(),
        before,
        "{call}: nothing is left behind"
    );
    // And the device carries on: the next pool is created and destroyed normally.
    let pool = dev.create_pool(1 << 20, u64::MAX).unwrap();
    dev.destroy_pool(pool).unwrap();
    assert_eq!(ctl.live_resources(), before);
}

/// Before: an upload whose `cuEventRecord` failed kept the event it had created.
#[rstest]
#[case(calls::EVENT_RECORD)]
#[case(calls::EVENT_CREATE)]
fn an_upload_that_cannot_mark_its_buffer_leaves_no_event(#[case] call: &'static str) {
    let (dev, ctl) = device();
    let dst = dev.alloc(64).unwrap();
    let buf = dev.alloc_pinned(64).unwrap();
    dev.write_pinned(&buf, &[7; 64]).unwrap();
    ctl.fail_nth(call, 1, CuCode::INVALID_VALUE);
    assert!(dev.upload_async(dst, &buf, 64, dev.stream()).is_err());
    assert_eq!(count(&ctl, resource::EVENT), 0, "{call}");
    // The copy that was queued has run before the buffer is handed back: reusing it is safe.
    dev.write_pinned(&buf, &[9; 64]).unwrap();
    let mut out = [0u8; 64];
    dev.copy_dtoh(&mut out, dst).unwrap();
    assert_eq!(out, [7; 64]);
    dev.free_pinned(buf).unwrap();
    dev.free(dst).unwrap();
}
