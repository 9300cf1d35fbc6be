//! What is testable without a GPU: version rules, which drivers NCCL accepts, and the checks
//! `NcclComm::init` makes before it loads anything (capture first, then the driver).

use std::time::Duration;

use rstest::rstest;

use super::{NcclComm, NcclError, UNIQUE_ID_BYTES, check_version, supports, version_string};
use crate::device::{Device, DeviceConfig};
use crate::error::DeviceError;
use crate::sim::{SimConfig, SimDriver};
use crate::{CudaDriver, FaultyDriver};

fn sim_device() -> Device<SimDriver> {
    let config = DeviceConfig {
        sync_deadline: Duration::from_secs(1),
        blas_workspace_bytes: 0,
        ..DeviceConfig::default()
    };
    Device::open(SimDriver::new(SimConfig::with_capacity(1 << 24)), config).unwrap()
}

#[rstest]
#[case(22803, "2.28.3")]
#[case(22809, "2.28.9")]
#[case(23203, "2.32.3")]
#[case(2804, "2.8.4")]
fn version_codes_read_as_releases(#[case] code: u32, #[case] shown: &str) {
    assert_eq!(version_string(code), shown);
}

#[rstest]
#[case(22803, true)]
#[case(22809, true)]
#[case(23203, true)]
#[case(22802, false)]
#[case(22703, false)]
#[case(2804, false)]
fn a_library_older_than_the_header_is_refused(#[case] found: u32, #[case] accepted: bool) {
    match check_version(found) {
        Ok(()) => assert!(accepted, "{found} should be refused"),
        Err(NcclError::VersionTooOld {
            found: shown,
            needed,
        }) => {
            assert!(!accepted, "{found} should be accepted");
            assert_eq!(shown, version_string(found));
            assert_eq!(needed, "2.28.3");
        }
        Err(other) => panic!("expected VersionTooOld, got {other:?}"),
    }
}

#[test]
fn only_the_real_drivers_handles_reach_nccl() {
    assert!(supports::<CudaDriver>());
    assert!(supports::<FaultyDriver<CudaDriver>>());
    assert!(!supports::<SimDriver>());
    assert!(!supports::<FaultyDriver<SimDriver>>());
}

#[test]
fn init_over_the_simulator_is_not_native() {
    let dev = sim_device();
    let err = NcclComm::init(&dev, 0, 2, &[0; UNIQUE_ID_BYTES]).unwrap_err();
    assert!(matches!(err, NcclError::NotNative { .. }), "{err:?}");
    assert!(!err.aborted_communicator());
}

#[test]
fn init_during_capture_is_refused_before_anything_else() {
    let dev = sim_device();
    let cap = dev.begin_capture(dev.stream()).unwrap();
    let err = NcclComm::init(&dev, 0, 2, &[0; UNIQUE_ID_BYTES]).unwrap_err();
    assert!(
        matches!(
            err,
            NcclError::Device(DeviceError::CaptureIllegal {
                call: "ncclCommInitRankConfig",
                ..
            })
        ),
        "{err:?}"
    );
    drop(cap.end().map_err(|e| e.into_error()).unwrap());
}
