//! The capture session: the one owner of capture state. Its phase follows the session, the
//! routed reservation and the stream capture; one of each at a time; a failed end keeps the
//! phase `Capturing` for as long as the driver captures.

use std::sync::Arc;

use zdevice::sim::calls;
use zdevice::*;

fn open() -> MockDevice {
    MockDevice::open(SimDriver::default(), DeviceConfig::default()).expect("the simulated device")
}

#[test]
fn the_phase_follows_the_session_the_reservation_and_the_stream_capture() {
    let dev = open();
    let watch = dev.capture_watch();
    assert_eq!(dev.capture_phase(), CapturePhase::Idle);
    let session = dev.open_capture_session().unwrap();
    assert_eq!(dev.capture_phase(), CapturePhase::WarmUp);
    let routed = dev.route_capture_memory(7, Arc::new(42_u32)).unwrap();
    assert_eq!(dev.capture_phase(), CapturePhase::Reserved);
    assert!(watch.routes_to(7) && !watch.routes_to(8) && !watch.routes_to(0));
    let cap = dev.begin_capture(dev.stream()).unwrap();
    assert_eq!(watch.phase(), CapturePhase::Capturing);
    assert!(dev.is_capturing() && watch.capturing());
    cap.end().unwrap();
    assert_eq!(dev.capture_phase(), CapturePhase::Reserved);
    drop(routed);
    assert_eq!(dev.capture_phase(), CapturePhase::WarmUp);
    assert!(!watch.routes_to(7));
    drop(session);
    assert_eq!(dev.capture_phase(), CapturePhase::Idle);
}

#[test]
fn the_routed_memory_is_handed_to_its_owner_only() {
    let dev = open();
    assert!(dev.capture_memory(7).is_none());
    let routed = dev.route_capture_memory(7, Arc::new(42_u32)).unwrap();
    let mem = dev.capture_memory(7).expect("the owner gets its memory");
    assert_eq!(mem.downcast_ref::<u32>(), Some(&42));
    assert!(
        dev.capture_memory(8).is_none(),
        "another owner gets nothing"
    );
    drop(routed);
    assert!(dev.capture_memory(7).is_none());
}

#[rstest::rstest]
#[case::session_while_one_is_open(|d: &MockDevice| { let _s = d.open_capture_session().unwrap(); d.open_capture_session().map(drop) })]
#[case::session_while_a_reservation_is_routed(|d: &MockDevice| { let _r = d.route_capture_memory(1, Arc::new(())).unwrap(); d.open_capture_session().map(drop) })]
#[case::session_while_a_stream_captures(|d: &MockDevice| { let _c = d.begin_capture(d.stream()).unwrap(); d.open_capture_session().map(drop) })]
#[case::second_reservation(|d: &MockDevice| { let _r = d.route_capture_memory(1, Arc::new(())).unwrap(); d.route_capture_memory(2, Arc::new(())).map(drop) })]
fn one_at_a_time(#[case] second: fn(&MockDevice) -> DeviceResult<()>) {
    let dev = open();
    match second(&dev) {
        Err(DeviceError::CaptureIllegal { .. }) => {}
        other => panic!("expected CaptureIllegal, got {other:?}"),
    }
    assert_eq!(
        dev.capture_phase(),
        CapturePhase::Idle,
        "all guards dropped"
    );
}

#[test]
fn the_owner_tag_zero_is_refused() {
    let dev = open();
    assert!(matches!(
        dev.route_capture_memory(0, Arc::new(())),
        Err(DeviceError::InvalidArgument { .. })
    ));
}

#[test]
fn a_failed_end_keeps_the_phase_capturing_until_the_driver_stops() {
    let dev = open();
    dev.driver().fault(
        calls::STREAM_END_CAPTURE,
        1,
        FaultAction::Fail(CuCode::INVALID_VALUE),
    );
    let session = dev.open_capture_session().unwrap();
    let cap = dev.begin_capture(dev.stream()).unwrap();
    let err = cap.end().expect_err("the injected end failure");
    assert!(err.still_capturing());
    assert_eq!(dev.capture_phase(), CapturePhase::Capturing);
    err.into_capture().unwrap().end().unwrap();
    assert_eq!(dev.capture_phase(), CapturePhase::WarmUp);
    drop(session);
    assert_eq!(dev.capture_phase(), CapturePhase::Idle);
}
