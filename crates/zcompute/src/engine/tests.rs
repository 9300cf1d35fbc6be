use super::*;
use crate::backend::{Backend, UnaryOp};
use zdevice::{SimConfig, SimDriver};

const M: u64 = 1 << 20;

fn small() -> EngineConfig {
    EngineConfig::new()
        .arena_bytes(M)
        .segment_bytes(M)
        .overflow_reserve(M)
}

#[test]
fn sim_registers_the_twins_and_runs_ops() {
    let b = small().sim(64 * M).expect("opens");
    let x = b.upload(&[0.0f32, 1.0], &[2]).expect("upload");
    let y = b.unary(UnaryOp::Tanh, &x).expect("tanh runs as its twin");
    let got = b.download(&y).expect("download");
    assert_eq!(got, vec![0.0, 1.0f32.tanh()]);
    assert_eq!(b.arena().config().initial_bytes, M);
}

#[test]
fn the_engine_stream_takes_the_configured_priority() {
    let normal = small().sim(64 * M).expect("opens");
    let dev = normal.device();
    assert_eq!(dev.driver().stream_priority(dev.stream()), Some(0));
    let high = small()
        .engine_priority(zdevice::StreamPriority::High)
        .sim(64 * M)
        .expect("opens");
    let dev = high.device();
    let greatest = dev.stream_priority_range().expect("range").greatest;
    assert_eq!(dev.driver().stream_priority(dev.stream()), Some(greatest));
}

#[test]
fn engine_sim_uses_the_environment_over_the_defaults() {
    // The test process sets no ZMEM_* variable that would refuse a 256 MiB device.
    let b = Engine::sim(256 * M).expect("opens");
    let want = EngineConfig::from_env().expect("env").merged();
    assert_eq!(b.arena().config().initial_bytes, want.initial_bytes);
}

#[test]
fn an_impossible_setting_is_refused_before_the_arena_exists() {
    match small().arena_bytes(3 * M / 2).sim(64 * M) {
        Err(ComputeError::ArenaSetting { setting, name, .. }) => {
            assert_eq!(setting, ArenaSetting::InitialBytes);
            assert_eq!(name, "EngineConfig::arena_bytes");
        }
        other => panic!("expected ArenaSetting, got {other:?}"),
    }
}

#[test]
fn a_simulator_without_twins_is_refused_by_the_backend_not_patched_up() {
    // The production constructor no longer looks for a simulator to fix up: a simulated device
    // whose twins nobody registered has no kernels, and the backend says so at construction.
    let device = Device::open(
        SimDriver::new(SimConfig::with_capacity(64 * M)),
        DeviceConfig::default(),
    )
    .expect("device");
    let err = small().on_device(device).expect_err("no twins");
    assert!(
        matches!(err, ComputeError::Device { .. }),
        "expected Device, got {err:?}"
    );
    // Registered explicitly, the same path works.
    let sim = SimDriver::new(SimConfig::with_capacity(64 * M));
    twins::register(&sim);
    let device = Device::open(sim, DeviceConfig::default()).expect("device");
    small().on_device(device).expect("twins registered");
}

#[test]
fn cuda_without_a_driver_is_device_unavailable() {
    if CudaDriver::load().is_ok() {
        return; // a driver library is present: the gpu tests cover this machine
    }
    match small().cuda(3) {
        Err(ComputeError::DeviceUnavailable { ordinal, reason }) => {
            assert_eq!(ordinal, 3);
            assert!(!reason.is_empty());
        }
        other => panic!("expected DeviceUnavailable, got {other:?}"),
    }
}

/// The GPU twins of the tests above (feature `gpu`: a missing GPU fails them).
#[cfg(feature = "gpu")]
mod gpu {
    use super::*;

    #[test]
    fn cuda_opens_the_given_ordinal_and_runs_ops() {
        let b = small().cuda(0).expect("GPU 0 opens");
        assert_eq!(b.device().info().ordinal, 0);
        let x = b.upload(&[0.0f32, 1.0], &[2]).expect("upload");
        let y = b.unary(UnaryOp::Tanh, &x).expect("tanh runs as PTX");
        let got = b.download(&y).expect("download");
        assert!((got[1] - 1.0f32.tanh()).abs() < 1e-6, "{got:?}");
        assert_eq!(b.arena().config().initial_bytes, M);
    }

    #[test]
    fn cuda_refuses_an_ordinal_past_the_last_device() {
        match small().cuda(u32::MAX) {
            Err(ComputeError::DeviceUnavailable { ordinal, .. }) => assert_eq!(ordinal, u32::MAX),
            other => panic!("expected DeviceUnavailable, got {other:?}"),
        }
    }

    #[test]
    fn cuda_refuses_a_cap_above_the_device() {
        match small().arena_cap(u64::MAX).cuda(0) {
            Err(ComputeError::ArenaSetting { setting, .. }) => {
                assert_eq!(setting, ArenaSetting::CapBytes);
            }
            other => panic!("expected ArenaSetting, got {other:?}"),
        }
    }
}
