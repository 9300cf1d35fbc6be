//! The device guards under faults, on the simulated driver's fault plan and virtual clock:
//! missing driver, stalls against deadlines, failures that leave the device usable, sticky
//! errors that lose it, and every call the device refuses during capture.

use std::time::Duration;

use rstest::rstest;
use zdevice::sim::calls;
use zdevice::*;

use crate::conformance::still_usable;

fn open_with(config: DeviceConfig) -> MockDevice {
    MockDevice::open(SimDriver::default(), config).expect("the simulated device opens")
}

fn open() -> MockDevice {
    open_with(DeviceConfig::default())
}

#[test]
fn missing_driver_is_a_typed_error_listing_what_was_tried() {
    let sim = SimDriver::new(SimConfig {
        missing_driver: true,
        ..SimConfig::default()
    });
    match MockDevice::open(sim, DeviceConfig::default()) {
        Err(DeviceError::Unavailable(cuda_sys::LoadError::LibraryNotFound { tried, .. })) => {
            assert!(!tried.is_empty(), "no paths listed");
        }
        other => panic!("expected Unavailable(LibraryNotFound), got {other:?}"),
    }
}

/// On this machine (no CUDA), loading the real driver from an empty folder names that folder.
#[cfg(not(feature = "gpu"))]
#[test]
fn missing_cuda_library_names_the_paths_tried() {
    let dir = std::env::temp_dir().join(format!("zgpu-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kind = cuda_sys::LibraryKind::Cuda;
    let candidates = cuda_sys::search_candidates(std::slice::from_ref(&dir), kind.sonames());
    let tried = cuda_sys::load_library::<cuda_sys::driver::Cuda>(&candidates)
        .err()
        .map(|e| e.to_string());
    let Some(message) = tried else {
        // A machine with a real driver installed finds it through the system loader.
        return;
    };
    assert!(message.contains(dir.to_str().unwrap()), "{message}");
    assert!(message.contains("libcuda.so.1"), "{message}");
}

#[test]
fn stalled_allocation_times_out_at_its_deadline_then_the_device_is_lost() {
    let deadline = Duration::from_secs(20);
    let dev = open_with(DeviceConfig {
        alloc_deadline: deadline,
        ..DeviceConfig::default()
    });
    let sim = dev.driver();
    sim.fault(
        calls::MEM_ALLOC,
        1,
        FaultAction::Stall(Duration::from_secs(100)),
    );
    let before = sim.now();
    let err = dev.alloc(4096).unwrap_err();
    let waited = sim.now() - before;
    match &err {
        DeviceError::Timeout {
            elapsed,
            deadline: d,
            waited_for,
            device_lost,
        } => {
            assert!(*device_lost && err.is_fatal(), "{err}");
            assert!(*elapsed >= deadline && *d == deadline, "{err}");
            assert!(waited_for.contains("cuMemAlloc"), "{err}");
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert!(waited >= deadline, "virtual time waited {waited:?}");
    assert!(matches!(dev.alloc(16), Err(DeviceError::DeviceLost { .. })));
    assert!(matches!(
        dev.synchronize(dev.stream()),
        Err(DeviceError::DeviceLost { .. })
    ));
}

#[test]
fn stalled_stream_work_times_out_at_the_sync_deadline_and_the_device_stays_usable() {
    let deadline = Duration::from_secs(60);
    let dev = open_with(DeviceConfig {
        sync_deadline: deadline,
        ..DeviceConfig::default()
    });
    let sim = dev.driver();
    let p = dev.alloc(1024).unwrap();
    sim.fault(
        calls::MEMSET_D8_ASYNC,
        1,
        FaultAction::Stall(Duration::from_secs(90)),
    );
    dev.memset_d8_async(p, 7, 1024, dev.stream()).unwrap();
    let before = sim.now();
    match dev.synchronize(dev.stream()) {
        Err(DeviceError::Timeout { elapsed, .. }) => assert!(elapsed >= deadline),
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert!(sim.now() - before >= deadline);
    // The work finishes later; the device was never lost.
    dev.synchronize(dev.stream()).unwrap();
    let mut back = vec![0u8; 1024];
    dev.copy_dtoh(&mut back, p).unwrap();
    assert!(back.iter().all(|&b| b == 7));
    still_usable(&dev).unwrap();
}

#[test]
fn failed_call_leaves_the_device_usable() {
    let dev = open();
    dev.driver().fault(
        calls::MEM_ALLOC,
        1,
        FaultAction::Fail(CuCode::OUT_OF_MEMORY),
    );
    assert!(matches!(
        dev.alloc(4096),
        Err(DeviceError::OutOfMemory {
            requested: 4096,
            ..
        })
    ));
    dev.driver().fault(
        calls::MEMCPY_HTOD,
        1,
        FaultAction::Fail(CuCode::INVALID_VALUE),
    );
    let p = dev.alloc(64).unwrap();
    assert!(matches!(
        dev.copy_htod(p, &[1; 64]),
        Err(DeviceError::Driver { .. })
    ));
    assert!(dev.lost_reason().is_none());
    still_usable(&dev).unwrap();
}

#[test]
fn out_of_memory_now_differs_from_never_fits() {
    let sim = SimDriver::new(SimConfig::with_capacity(64 << 20));
    let dev = MockDevice::open(
        sim,
        DeviceConfig {
            blas_workspace_bytes: 0,
            ..DeviceConfig::default()
        },
    )
    .unwrap();
    let big = dev.alloc(48 << 20).unwrap();
    match dev.alloc(32 << 20) {
        Err(DeviceError::OutOfMemory {
            requested,
            free,
            total,
            ..
        }) => {
            assert_eq!((requested, total), (32 << 20, 64 << 20));
            assert!(free < requested);
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    assert!(matches!(
        dev.alloc(65 << 20),
        Err(DeviceError::TooLarge { .. })
    ));
    dev.free(big).unwrap();
    dev.alloc(32 << 20).unwrap();
}

#[test]
fn sticky_error_loses_the_device() {
    let dev = open();
    let p = dev.alloc(64).unwrap();
    dev.driver().fault(
        calls::MEMCPY_HTOD,
        1,
        FaultAction::Sticky(CuCode::ILLEGAL_ADDRESS),
    );
    let first = dev.copy_htod(p, &[0; 64]).unwrap_err();
    assert!(
        matches!(
            first,
            DeviceError::Driver {
                code: CuCode::ILLEGAL_ADDRESS,
                ..
            }
        ),
        "{first}"
    );
    for r in [
        dev.alloc(16).map(|_| ()),
        dev.synchronize(dev.stream()),
        dev.free(p),
    ] {
        assert!(matches!(r, Err(DeviceError::DeviceLost { .. })), "{r:?}");
    }
}

#[test]
fn error_surfacing_at_the_next_sync_loses_the_device() {
    let dev = open();
    dev.driver().fail_at_next_sync(CuCode::ILLEGAL_ADDRESS);
    let err = dev.synchronize(dev.stream()).unwrap_err();
    assert!(
        matches!(
            err,
            DeviceError::Driver {
                code: CuCode::ILLEGAL_ADDRESS,
                ..
            }
        ),
        "{err}"
    );
    assert!(matches!(dev.alloc(16), Err(DeviceError::DeviceLost { .. })));
}

/// Every call the device refuses during capture: refused by name, never reaching the driver,
/// and the capture stays valid.
#[rstest]
#[case::alloc("cuMemAlloc_v2")]
#[case::free("cuMemFree_v2")]
#[case::copy_htod("cuMemcpyHtoD_v2")]
#[case::copy_dtoh("cuMemcpyDtoH_v2")]
#[case::copy_dtod("cuMemcpyDtoD_v2")]
#[case::memset_d8("cuMemsetD8_v2")]
#[case::memset_d32("cuMemsetD32_v2")]
#[case::alloc_pinned("cuMemAllocHost_v2")]
#[case::alloc_async("cuMemAllocAsync")]
#[case::pool_alloc("cuMemAllocFromPoolAsync")]
#[case::free_async("cuMemFreeAsync")]
#[case::create_pool("cuMemPoolCreate")]
#[case::load_module("cuModuleLoadData")]
#[case::create_stream("cuStreamCreate")]
#[case::create_prioritized_stream("cuStreamCreateWithPriority")]
#[case::synchronize_from_capturing_thread("cuStreamQuery")]
#[case::wait_event_from_capturing_thread("cuEventQuery")]
fn refused_during_capture(#[case] call: &'static str) {
    let dev = open();
    let p = dev.alloc(1024).unwrap();
    let pool = dev.create_pool(1 << 20, 1 << 20).unwrap();
    let event = dev.create_event(false).unwrap();
    dev.record_event(event, dev.stream()).unwrap();
    dev.synchronize(dev.stream()).unwrap();
    dev.driver().clear_op_log();
    let stream = dev.stream();
    let cap = dev.begin_capture(stream).unwrap();
    let r: Result<(), DeviceError> = match call {
        "cuMemAlloc_v2" => dev.alloc(64).map(drop),
        "cuMemFree_v2" => dev.free(p),
        "cuMemcpyHtoD_v2" => dev.copy_htod(p, &[1; 16]),
        "cuMemcpyDtoH_v2" => dev.copy_dtoh(&mut [0; 16], p),
        "cuMemcpyDtoD_v2" => dev.copy_dtod(p, p.offset(512), 16),
        "cuMemsetD8_v2" => dev.memset_d8(p, 1, 16),
        "cuMemsetD32_v2" => dev.memset_d32(p, 1, 4),
        "cuMemAllocHost_v2" => dev.alloc_pinned(64).map(drop),
        "cuMemAllocAsync" => dev.alloc_async(64, stream).map(drop),
        "cuMemAllocFromPoolAsync" => dev.alloc_from_pool(pool.pool, 64, stream).map(drop),
        "cuMemFreeAsync" => dev.free_async(p, stream),
        "cuMemPoolCreate" => dev.create_pool(0, 0).map(drop),
        "cuModuleLoadData" => dev.load_module(kernels::FILL_PTX).map(drop),
        "cuStreamCreate" => dev.create_stream().map(drop),
        "cuStreamCreateWithPriority" => dev
            .create_stream_with_priority(zdevice::StreamPriority::High)
            .map(drop),
        "cuStreamQuery" => dev.synchronize(stream),
        "cuEventQuery" => dev.wait_event(event),
        other => panic!("no case for {other}"),
    };
    match r {
        Err(DeviceError::CaptureIllegal { call: refused, .. }) => assert_eq!(refused, call),
        other => panic!("{call} during capture: expected CaptureIllegal, got {other:?}"),
    }
    let reached: Vec<_> = dev
        .driver()
        .op_log()
        .into_iter()
        .filter(|op| op.call == call)
        .collect();
    assert!(
        reached.is_empty(),
        "{call} reached the driver during capture: {reached:?}"
    );
    let graph = cap.end().expect("the capture is still valid");
    assert_eq!(graph.node_count().unwrap(), 0);
    drop(graph);
    still_usable(&dev).unwrap();
}

#[test]
fn dropping_a_capture_ends_it_and_the_device_stays_usable() {
    let dev = open();
    let p = dev.alloc(256).unwrap();
    {
        let _cap = dev.begin_capture(dev.stream()).unwrap();
        dev.memset_d8_async(p, 1, 256, dev.stream()).unwrap();
    }
    assert_eq!(
        dev.driver().stream_is_capturing(dev.stream()).unwrap(),
        CaptureStatus::None
    );
    still_usable(&dev).unwrap();
}

#[test]
fn a_second_capture_while_one_is_active_is_refused() {
    let dev = open();
    let other = dev.create_stream().unwrap();
    let cap = dev.begin_capture(dev.stream()).unwrap();
    assert!(matches!(
        dev.begin_capture(other),
        Err(DeviceError::CaptureIllegal { .. })
    ));
    cap.end().unwrap();
    still_usable(&dev).unwrap();
}

#[test]
fn ptx_newer_than_the_driver_names_the_driver_needed() {
    let sim = SimDriver::new(SimConfig {
        max_ptx_isa: (8, 4),
        driver_version: 12040,
        ..SimConfig::default()
    });
    let dev = MockDevice::open(sim, DeviceConfig::default()).unwrap();
    match dev.load_module(kernels::FILL_PTX) {
        Err(e @ DeviceError::PtxTooNew { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("580") && msg.contains("12.4"), "{msg}");
        }
        other => panic!("expected PtxTooNew, got {other:?}"),
    }
}

#[test]
fn open_fails_cleanly_when_cublas_cannot_start() {
    let sim = SimDriver::default();
    sim.fault(
        calls::BLAS_CREATE,
        1,
        FaultAction::Fail(CuCode::NOT_INITIALIZED),
    );
    match MockDevice::open(sim, DeviceConfig::default()) {
        Err(DeviceError::Blas { call, .. }) => assert_eq!(call, calls::BLAS_CREATE),
        other => panic!("expected a cuBLAS error, got {other:?}"),
    }
}

/// With a driver whose time is real, a blocking call runs on the watchdog worker: the caller
/// gets `Timeout` at the deadline while the call is still stuck, and the device is lost.
#[test]
fn watchdog_gives_up_on_a_driver_call_stuck_in_real_time() {
    let sim = SimDriver::new(SimConfig {
        real_time_stalls: true,
        ..SimConfig::default()
    });
    let deadline = Duration::from_millis(200);
    let dev = MockDevice::open(
        sim,
        DeviceConfig {
            alloc_deadline: deadline,
            ..DeviceConfig::default()
        },
    )
    .unwrap();
    // A normal allocation goes through the worker and returns.
    let p = dev.alloc(256).unwrap();
    dev.free(p).unwrap();
    dev.driver().fault(
        calls::MEM_ALLOC,
        1,
        FaultAction::Stall(Duration::from_secs(2)),
    );
    let started = std::time::Instant::now();
    let err = dev.alloc(256).unwrap_err();
    let waited = started.elapsed();
    assert!(matches!(err, DeviceError::Timeout { .. }), "{err}");
    assert!(
        waited >= deadline && waited < Duration::from_secs(2),
        "waited {waited:?}"
    );
    assert!(matches!(dev.alloc(16), Err(DeviceError::DeviceLost { .. })));
}

/// Issue 44: work held by [`FaultAction::Hang`] (a kernel waiting on the device for a peer
/// that stopped) never completes: unlike a stall, every wait for its stream ends at its
/// deadline however often it is made, and so does a wait on an event recorded behind it or on
/// another stream made to wait for it; the device is not lost. Released, all of it drains.
#[test]
fn hung_stream_work_never_drains_until_released() {
    let deadline = Duration::from_secs(5);
    let dev = open_with(DeviceConfig {
        sync_deadline: deadline,
        ..DeviceConfig::default()
    });
    let sim = dev.driver();
    let p = dev.alloc(1024).unwrap();
    sim.fault(calls::MEMSET_D8_ASYNC, 1, FaultAction::Hang);
    dev.memset_d8_async(p, 7, 1024, dev.stream()).unwrap();
    let behind = dev.create_event(false).unwrap();
    dev.record_event(behind, dev.stream()).unwrap();
    let other = dev.create_stream().unwrap();
    dev.stream_wait_event(other, behind).unwrap();
    for _ in 0..3 {
        for r in [
            dev.synchronize(dev.stream()),
            dev.wait_event(behind),
            dev.synchronize(other),
        ] {
            assert!(
                matches!(
                    r,
                    Err(DeviceError::Timeout {
                        device_lost: false,
                        ..
                    })
                ),
                "{r:?}"
            );
        }
    }
    sim.release_hangs();
    dev.synchronize(other).unwrap();
    dev.wait_event(behind).unwrap();
    let mut back = vec![0u8; 1024];
    dev.copy_dtoh(&mut back, p).unwrap();
    assert!(back.iter().all(|&b| b == 7));
    dev.destroy_event(behind).unwrap();
    still_usable(&dev).unwrap();
}

/// Issue 44: a simulated kernel that waits on the device (`KernelFault::Waiting`, what the
/// simulated collective answers while a peer does not) holds its stream until it completes;
/// waits end at their deadline meanwhile, and the device is not lost.
#[test]
fn a_kernel_waiting_on_the_device_holds_its_stream_until_it_completes() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let dev = open_with(DeviceConfig {
        sync_deadline: Duration::from_secs(5),
        ..DeviceConfig::default()
    });
    let peer_came = Arc::new(AtomicBool::new(false));
    let came = Arc::clone(&peer_came);
    dev.driver()
        .register_kernel("waits_for_a_peer", move |_, _, _| {
            if came.load(Ordering::Acquire) {
                Ok(())
            } else {
                Err(zdevice::sim::KernelFault::Waiting(
                    "the peer has not come".into(),
                ))
            }
        });
    let ptx = ".version 8.0\n.target sm_80\n.address_size 64\n\n.visible .entry waits_for_a_peer()\n{\n\tret;\n}\n";
    let module = dev.load_module(ptx).unwrap();
    let f = module.function("waits_for_a_peer").unwrap();
    let config = LaunchConfig {
        grid: (1, 1, 1),
        block: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the kernel takes no arguments and touches no memory.
    unsafe { dev.launch(f, config, &[], dev.stream()) }.unwrap();
    for _ in 0..3 {
        let r = dev.synchronize(dev.stream());
        assert!(
            matches!(
                r,
                Err(DeviceError::Timeout {
                    device_lost: false,
                    ..
                })
            ),
            "{r:?}"
        );
    }
    peer_came.store(true, Ordering::Release);
    dev.synchronize(dev.stream()).unwrap();
    still_usable(&dev).unwrap();
}

/// Issue 44: a kernel waiting on the device for a flag in page-locked host memory mapped into
/// it (`Device::pinned_device_ptr`) ends once the host stores the flag
/// (`Device::store_pinned_u32`), with no stream: its own stream is stuck behind the kernel, and
/// the device has been marked lost meanwhile (what an aborted communicator does), yet the
/// store lands and the kernel reads it at the mapped address.
#[test]
fn a_flag_stored_from_the_host_ends_a_kernel_waiting_on_it_whatever_its_stream_holds() {
    let dev = open_with(DeviceConfig {
        sync_deadline: Duration::from_secs(5),
        ..DeviceConfig::default()
    });
    dev.driver()
        .register_kernel("waits_for_the_host", move |_, args, mem| {
            let flag = zdevice::sim::KernelArgs(args).ptr(0)?;
            if mem.read_u32(flag, 1)?[0] == 7 {
                Ok(())
            } else {
                Err(zdevice::sim::KernelFault::Waiting(
                    "the host has not given up".into(),
                ))
            }
        });
    let ptx = ".version 8.0\n.target sm_80\n.address_size 64\n\n.visible .entry waits_for_the_host(\n\t.param .u64 waits_for_the_host_param_0\n)\n{\n\tret;\n}\n";
    let module = dev.load_module(ptx).unwrap();
    let f = module.function("waits_for_the_host").unwrap();
    let flag = dev.alloc_pinned(64).unwrap();
    dev.store_pinned_u32(&flag, 8, 0).unwrap();
    let at = dev.pinned_device_ptr(&flag).unwrap();
    let config = LaunchConfig {
        grid: (1, 1, 1),
        block: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the kernel reads one u32 at its argument, inside the live pinned buffer.
    unsafe { dev.launch(f, config, &[KernelArg::Ptr(at.offset(8))], dev.stream()) }.unwrap();
    let r = dev.synchronize(dev.stream());
    assert!(
        matches!(r, Err(DeviceError::Timeout { .. })),
        "the kernel waits, and its stream: {r:?}"
    );
    dev.abandon("a communicator was aborted");
    dev.store_pinned_u32(&flag, 8, 7)
        .expect("a store from the host works on a device marked lost");
    let now = dev.driver().stream_query(dev.stream());
    assert!(
        matches!(now, Ok(Readiness::Ready)),
        "the kernel read the flag and ended: {now:?}"
    );
    let misaligned = dev.store_pinned_u32(&flag, 2, 1);
    assert!(
        matches!(
            misaligned,
            Err(DeviceError::Driver { .. } | DeviceError::InvalidArgument { .. })
        ),
        "{misaligned:?}"
    );
    let outside = dev.store_pinned_u32(&flag, 64, 1);
    assert!(
        matches!(outside, Err(DeviceError::InvalidArgument { .. })),
        "{outside:?}"
    );
}

/// The mapped address goes through the fault plan as the call it is on the GPU
/// (`cuMemHostGetDevicePointer_v2`); a failure there is a typed error that loses nothing.
#[test]
fn a_failed_mapping_of_host_memory_is_a_typed_error() {
    let dev = open();
    let flag = dev.alloc_pinned(4).unwrap();
    dev.driver().fault(
        calls::MEM_HOST_GET_DEVICE_POINTER,
        1,
        FaultAction::Fail(CuCode::NOT_SUPPORTED),
    );
    let r = dev.pinned_device_ptr(&flag);
    assert!(
        matches!(
            r,
            Err(DeviceError::Driver {
                call: calls::MEM_HOST_GET_DEVICE_POINTER,
                code: CuCode::NOT_SUPPORTED,
            })
        ),
        "{r:?}"
    );
    dev.pinned_device_ptr(&flag).expect("the next call answers");
    still_usable(&dev).unwrap();
}
