//! Ending a capture: a failed end keeps the guard on for as long as the driver captures, and
//! the body plus the end are judged against the sync deadline (simulated driver's fault plan
//! and virtual clock). The deadline body also runs on the GPU (`conformance_capture_end`).

use std::time::Duration;

use zdevice::sim::calls;
use zdevice::*;

use crate::conformance::still_usable;
use crate::util::*;

fn open_with(config: DeviceConfig) -> MockDevice {
    MockDevice::open(SimDriver::default(), config).expect("the simulated device opens")
}

fn open() -> MockDevice {
    open_with(DeviceConfig::default())
}

fn fail_end(dev: &MockDevice, nth: u64) {
    dev.driver().fault(
        calls::STREAM_END_CAPTURE,
        nth,
        FaultAction::Fail(CuCode::INVALID_VALUE),
    );
}

#[test]
fn failed_end_keeps_the_guard_until_the_capture_really_ends() {
    let dev = open();
    let p = dev.alloc(256).unwrap();
    fail_end(&dev, 1);
    let cap = dev.begin_capture(dev.stream()).unwrap();
    dev.memset_d8_async(p, 3, 256, dev.stream()).unwrap();
    let err = cap.end().expect_err("the injected end failure");
    assert!(
        matches!(
            err.error(),
            DeviceError::Driver {
                call: calls::STREAM_END_CAPTURE,
                code: CuCode::INVALID_VALUE
            }
        ),
        "{err}"
    );
    assert!(err.still_capturing(), "{err}");
    assert_eq!(
        dev.driver().stream_is_capturing(dev.stream()).unwrap(),
        CaptureStatus::Active
    );
    // The driver still captures, so a synchronous copy (which it would leave out of the
    // graph and run now) stays refused.
    assert!(dev.is_capturing());
    match dev.copy_htod(p, &[1; 256]) {
        Err(DeviceError::CaptureIllegal { call, .. }) => assert_eq!(call, "cuMemcpyHtoD_v2"),
        other => panic!("copy_htod while the driver captures: {other:?}"),
    }
    // Ended for real: the graph holds the memset, and eager work runs again.
    let cap = err.into_capture().expect("the capture is handed back");
    let graph = cap.end().expect("the second end");
    assert_eq!(graph.node_count().unwrap(), 1);
    drop(graph);
    dev.copy_htod(p, &[1; 256]).unwrap();
    assert!(dev.lost_reason().is_none());
    still_usable(&dev).unwrap();
}

#[test]
fn dropping_the_capture_a_failed_end_handed_back_ends_it() {
    let dev = open();
    fail_end(&dev, 1);
    let cap = dev.begin_capture(dev.stream()).unwrap();
    let err = cap.end().expect_err("the injected end failure");
    assert!(dev.is_capturing());
    let error: DeviceError = err.into();
    assert!(matches!(error, DeviceError::Driver { .. }), "{error}");
    assert_eq!(
        dev.driver().stream_is_capturing(dev.stream()).unwrap(),
        CaptureStatus::None
    );
    assert!(dev.lost_reason().is_none());
    still_usable(&dev).unwrap();
}

/// A capture the driver will not end is never left unguarded: the device is lost instead.
#[test]
fn a_capture_that_cannot_be_ended_loses_the_device_and_keeps_the_guard() {
    let dev = open();
    let p = dev.alloc(256).unwrap();
    fail_end(&dev, 1);
    fail_end(&dev, 2);
    let cap = dev.begin_capture(dev.stream()).unwrap();
    drop(cap.end().expect_err("the first injected failure"));
    assert_eq!(
        dev.driver().stream_is_capturing(dev.stream()).unwrap(),
        CaptureStatus::Active
    );
    assert!(
        dev.is_capturing(),
        "the guard came off under a capturing stream"
    );
    let reason = dev.lost_reason().expect("the device is lost");
    assert!(reason.contains("cuStreamEndCapture"), "{reason}");
    let r = dev.copy_htod(p, &[1; 256]);
    assert!(
        matches!(
            r,
            Err(DeviceError::CaptureIllegal { .. } | DeviceError::DeviceLost { .. })
        ),
        "{r:?}"
    );
    assert!(matches!(
        dev.synchronize(dev.stream()),
        Err(DeviceError::DeviceLost { .. })
    ));
}

/// An end the driver answers with 901 has ended the capture: the guard comes off.
#[test]
fn invalidated_capture_ends_and_the_guard_comes_off() {
    let dev = open();
    let cap = dev.begin_capture(dev.stream()).unwrap();
    // A raw driver call the guard does not see invalidates the capture (900).
    let bad = dev.driver().ctx_synchronize();
    assert!(bad.is_err());
    let err = cap.end().expect_err("an invalidated capture");
    assert!(
        matches!(err.error(), DeviceError::CaptureInvalidated { .. }),
        "{err}"
    );
    assert!(!err.still_capturing());
    still_usable(&dev).unwrap();
}

#[test]
fn stalled_end_times_out_naming_the_end_and_loses_the_device() {
    let deadline = Duration::from_secs(60);
    let dev = open_with(DeviceConfig {
        sync_deadline: deadline,
        ..DeviceConfig::default()
    });
    dev.driver().fault(
        calls::STREAM_END_CAPTURE,
        1,
        FaultAction::Stall(Duration::from_secs(600)),
    );
    let cap = dev.begin_capture(dev.stream()).unwrap();
    let err = cap.end().expect_err("a stalled end");
    match err.error() {
        DeviceError::Timeout {
            waited_for,
            deadline: d,
            elapsed,
            device_lost,
        } => {
            assert!(waited_for.contains("cuStreamEndCapture"), "{err}");
            assert!(*device_lost && err.error().is_fatal(), "{err}");
            assert_eq!(*d, deadline);
            assert!(*elapsed >= Duration::from_secs(600), "{err}");
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    // The driver did return (late): it no longer captures, and the device is lost.
    assert!(!err.still_capturing());
    assert!(!dev.is_capturing());
    assert!(matches!(dev.alloc(16), Err(DeviceError::DeviceLost { .. })));
}

/// Body and end share one deadline: each alone fits, together they do not.
#[rstest::rstest]
#[case::together_late(40, 30, false)]
#[case::together_in_time(40, 10, true)]
fn body_and_end_are_judged_together(
    #[case] body_s: u64,
    #[case] end_s: u64,
    #[case] in_time: bool,
) {
    let dev = open_with(DeviceConfig {
        sync_deadline: Duration::from_secs(60),
        ..DeviceConfig::default()
    });
    dev.driver().fault(
        calls::STREAM_END_CAPTURE,
        1,
        FaultAction::Stall(Duration::from_secs(end_s)),
    );
    let cap = dev.begin_capture(dev.stream()).unwrap();
    dev.driver().pause(Duration::from_secs(body_s));
    let r = cap.end();
    if in_time {
        r.expect("within the deadline");
        still_usable(&dev).unwrap();
    } else {
        let err = r.expect_err("past the deadline");
        assert!(
            matches!(err.error(), DeviceError::Timeout { waited_for, .. } if waited_for.contains("cuStreamEndCapture")),
            "{err}"
        );
        assert!(dev.lost_reason().is_some());
    }
}

/// On any driver: a capture ends from its own thread and returns its graph; one whose body
/// plus end outlast the sync deadline gives `Timeout` naming `cuStreamEndCapture` and loses
/// the device. `open` opens a fresh device with the given configuration.
pub fn end_deadline_counts_body_and_end<D: Driver>(
    open: impl Fn(DeviceConfig) -> Device<D>,
) -> Check {
    let deadline = Duration::from_millis(300);
    let config = DeviceConfig {
        sync_deadline: deadline,
        ..DeviceConfig::default()
    };
    let dev = open(config.clone());
    let p = dev.alloc(256).map_err(s)?;
    let cap = dev.begin_capture(dev.stream()).map_err(s)?;
    dev.memset_d8_async(p, 1, 256, dev.stream()).map_err(s)?;
    let graph = cap.end().map_err(s)?;
    ensure(
        graph.node_count().map_err(s)? == 1,
        "the graph lost its node",
    )?;
    drop(graph);
    dev.free(p).map_err(s)?;
    still_usable(&dev)?;

    let dev = open(config);
    let cap = dev.begin_capture(dev.stream()).map_err(s)?;
    // The body outlasts the deadline (a real sleep on the GPU, virtual time on the mock).
    dev.driver().pause(deadline + Duration::from_millis(200));
    match cap.end() {
        Ok(_) => Err("a capture longer than the sync deadline ended Ok".into()),
        Err(e) => match e.error() {
            DeviceError::Timeout {
                waited_for,
                elapsed,
                ..
            } if waited_for.contains("cuStreamEndCapture") && *elapsed > deadline => {
                ensure(!e.still_capturing(), "the driver still captures")?;
                ensure(
                    dev.lost_reason().is_some(),
                    "the device was not marked lost",
                )
            }
            other => Err(format!(
                "expected Timeout naming cuStreamEndCapture, got {other}"
            )),
        },
    }
}

#[test]
fn end_deadline_counts_body_and_end_on_the_mock() {
    end_deadline_counts_body_and_end(open_with).unwrap();
}
