//! Stream priorities on the simulated driver: which priority each stream gets, the engine
//! stream's from `DeviceConfig::engine_priority`, and a failing priority call leaving nothing
//! behind. (The conformance suite's `prioritized_side_stream_in_a_graph` runs on the GPU too.)

use zdevice::{
    CuCode, Device, DeviceConfig, DeviceError, Driver, FaultyDriver, InstantiateFlags, MockDevice,
    SimDriver, StreamKind, StreamPriority,
};

fn open(engine_priority: StreamPriority) -> MockDevice {
    let config = DeviceConfig {
        engine_priority,
        ..DeviceConfig::default()
    };
    MockDevice::open(SimDriver::default(), config).expect("the simulated device opens")
}

#[test]
fn the_engine_stream_takes_the_configured_priority() {
    let normal = open(StreamPriority::Normal);
    assert_eq!(normal.driver().stream_priority(normal.stream()), Some(0));
    assert_eq!(normal.driver().call_count("cuStreamCreateWithPriority"), 0);
    let high = open(StreamPriority::High);
    let range = high.stream_priority_range().unwrap();
    assert_eq!((range.least, range.greatest), (0, -5));
    assert_eq!(high.driver().stream_priority(high.stream()), Some(-5));
}

/// The driver answers the range inside a capture and the capture goes on (measured on the GPU:
/// `capture_rules_row` with `Row::StreamPriorityRange`); the device passes the query through.
#[test]
fn the_priority_range_is_answered_during_a_capture_and_the_capture_goes_on() {
    let dev = open(StreamPriority::Normal);
    let cap = dev.begin_capture(dev.stream()).unwrap();
    let range = dev.stream_priority_range().unwrap();
    assert_eq!((range.least, range.greatest), (0, -5));
    let graph = cap.end().expect("the capture is still valid");
    assert_eq!(graph.node_count().unwrap(), 0);
    assert_eq!(dev.driver().call_count("cuCtxGetStreamPriorityRange"), 1);
}

#[test]
fn created_streams_take_the_least_or_the_greatest_priority() {
    let dev = open(StreamPriority::Normal);
    let hi = dev
        .create_stream_with_priority(StreamPriority::High)
        .unwrap();
    let lo = dev
        .create_stream_with_priority(StreamPriority::Normal)
        .unwrap();
    let plain = dev.create_stream().unwrap();
    let sim = dev.driver();
    assert_eq!(
        [hi, lo, plain].map(|s| sim.stream_priority(s)),
        [Some(-5), Some(0), Some(0)]
    );
}

#[test]
fn the_simulated_driver_clamps_a_priority_into_its_range_as_cuda_does() {
    let sim = SimDriver::default();
    sim.init().unwrap();
    let past_greatest = sim
        .stream_create_with_priority(StreamKind::NonBlocking, -40)
        .unwrap();
    let past_least = sim
        .stream_create_with_priority(StreamKind::Blocking, 7)
        .unwrap();
    assert_eq!(sim.stream_priority(past_greatest), Some(-5));
    assert_eq!(sim.stream_priority(past_least), Some(0));
}

#[test]
fn an_executable_graph_keeps_the_node_priority_flag() {
    let dev = open(StreamPriority::High);
    let p = dev.alloc(256).unwrap();
    let graph = {
        let cap = dev.begin_capture(dev.stream()).unwrap();
        dev.memset_d8_async(p, 1, 256, dev.stream()).unwrap();
        cap.end().unwrap()
    };
    let flags = InstantiateFlags {
        use_node_priority: true,
        ..InstantiateFlags::default()
    };
    let exec = graph.instantiate(flags).unwrap();
    assert_eq!(dev.driver().exec_flags(exec.raw()), Some(flags));
    let plain = graph.instantiate(InstantiateFlags::default()).unwrap();
    assert_eq!(
        dev.driver().exec_flags(plain.raw()),
        Some(InstantiateFlags::default())
    );
}

/// The priority calls failing at open: the device does not open, the failing call is named,
/// and the stream made before a failure is destroyed.
#[rstest::rstest]
#[case::range("cuCtxGetStreamPriorityRange")]
#[case::create("cuStreamCreateWithPriority")]
fn a_failed_priority_call_at_open_fails_the_open_and_leaks_nothing(#[case] call: &'static str) {
    let faulty = FaultyDriver::new(SimDriver::default());
    let ctl = faulty.controller();
    ctl.fail_nth(call, 1, CuCode::INVALID_VALUE);
    let config = DeviceConfig {
        engine_priority: StreamPriority::High,
        ..DeviceConfig::default()
    };
    match Device::open(faulty, config) {
        Err(DeviceError::Driver { call: failed, .. }) => assert_eq!(failed, call),
        Err(other) => panic!("expected the {call} failure, got {other:?}"),
        Ok(_) => panic!("the device opened although {call} failed"),
    }
    let live: Vec<_> = ctl
        .live_resources()
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .collect();
    assert!(live.is_empty(), "left behind: {live:?}");
}
