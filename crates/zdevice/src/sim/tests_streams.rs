//! Streams, events, the virtual clock, kernels, gemm, the fault plan and initialisation.

use std::time::Duration;

use super::{FaultAction, KernelArgs, KernelFault, SimConfig, SimDriver, calls};
use crate::driver::{CuCode, Driver, DriverError};
use crate::types::*;

fn sim() -> SimDriver {
    let d = SimDriver::default();
    d.init().expect("init");
    d
}

fn fill_fn(d: &SimDriver) -> Function {
    let m = d.module_load_ptx(super::BUILTIN_PTX).unwrap();
    d.module_get_function(m, "fill_f32").unwrap()
}

fn launch_fill(
    d: &SimDriver,
    f: Function,
    out: DevicePtr,
    v: f32,
    n: u64,
    s: Stream,
) -> Result<(), DriverError> {
    let args = [KernelArg::Ptr(out), KernelArg::F32(v), KernelArg::U64(n)];
    // SAFETY: the simulator checks every access.
    unsafe { d.launch_kernel(f, LaunchConfig::linear(n, 256, 1), &args, s) }
}

#[test]
fn nothing_works_before_init_and_a_missing_driver_fails_everything() {
    let d = SimDriver::default();
    assert_eq!(
        d.mem_alloc(16).unwrap_err().cuda_code(),
        Some(CuCode::NOT_INITIALIZED)
    );
    assert_eq!(
        d.driver_version().unwrap(),
        13000,
        "answered before cuInit, as the real one"
    );
    d.init().unwrap();
    assert_eq!(d.device_count().unwrap(), 1);
    assert_eq!(d.compute_capability(0).unwrap(), (9, 0));
    assert_eq!(
        d.device_name(1).unwrap_err().cuda_code(),
        Some(CuCode::INVALID_DEVICE)
    );
    let ctx = d.primary_ctx_retain(0).unwrap();
    d.ctx_set_current(ctx).unwrap();
    let gone = SimDriver::new(SimConfig {
        missing_driver: true,
        ..SimConfig::default()
    });
    for r in [
        gone.init(),
        gone.mem_alloc(16).map(drop),
        gone.driver_version().map(drop),
    ] {
        match r {
            Err(DriverError::Load(cuda_sys::LoadError::LibraryNotFound { library, tried })) => {
                assert_eq!(library, "libcuda");
                assert!(tried[0].contains("simulated: no driver"));
            }
            other => panic!("expected LibraryNotFound, got {other:?}"),
        }
    }
}

#[test]
fn async_work_runs_only_when_observed_and_sync_copies_do_not_wait_for_it() {
    let d = sim();
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    let p = d.mem_alloc(64 << 20).unwrap();
    d.memset_d8(p, 0, 64).unwrap();
    d.memset_d8_async(p, 7, 64 << 20, s).unwrap();
    let mut b = [0u8; 4];
    d.memcpy_dtoh(&mut b, p).unwrap();
    assert_eq!(b, [0; 4], "a forgotten sync reads stale data");
    assert_eq!(d.stream_query(s).unwrap(), Readiness::NotReady);
    assert_eq!(d.pending_ops(s), 1);
    d.pause(Duration::from_millis(10));
    assert_eq!(
        d.stream_query(s).unwrap(),
        Readiness::Ready,
        "its time has come"
    );
    d.memcpy_dtoh(&mut b, p).unwrap();
    assert_eq!(b, [7; 4]);
    // A blocking stream is ordered with the legacy stream: a synchronous copy waits for it.
    let blocking = d.stream_create(StreamKind::Blocking).unwrap();
    d.memset_d8_async(p, 9, 64, blocking).unwrap();
    d.memcpy_dtoh(&mut b, p).unwrap();
    assert_eq!(b, [9; 4]);
}

#[test]
fn synchronize_advances_the_virtual_clock_to_the_work() {
    let d = sim();
    assert!(d.is_virtual_time());
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    let p = d.mem_alloc(100 << 20).unwrap();
    let t0 = d.now();
    d.memset_d8_async(p, 1, 100 << 20, s).unwrap();
    assert!(
        d.now() - t0 < Duration::from_micros(10),
        "enqueueing is cheap"
    );
    d.stream_synchronize(s).unwrap();
    assert!(
        d.now() - t0 >= Duration::from_micros(100),
        "100 MB at ~1 TB/s: {:?}",
        d.now() - t0
    );
}

#[test]
fn events_order_streams_and_time_work() {
    let d = sim();
    let (s1, s2) = (
        d.stream_create(StreamKind::NonBlocking).unwrap(),
        d.stream_create(StreamKind::NonBlocking).unwrap(),
    );
    let (start, end) = (d.event_create(true).unwrap(), d.event_create(true).unwrap());
    let never = d.event_create(true).unwrap();
    assert_eq!(
        d.event_query(never).unwrap(),
        Readiness::Ready,
        "never recorded"
    );
    let a = d.mem_alloc(1 << 20).unwrap();
    let b = d.mem_alloc(1 << 20).unwrap();
    d.event_record(start, s1).unwrap();
    d.memset_d8_async(a, 4, 1 << 20, s1).unwrap();
    d.event_record(end, s1).unwrap();
    assert_eq!(
        d.event_elapsed_ms(start, end).unwrap_err().cuda_code(),
        Some(CuCode::NOT_READY)
    );
    d.stream_wait_event(s2, end).unwrap();
    d.memcpy_dtod_async(b, a, 1 << 20, s2).unwrap();
    d.stream_synchronize(s2).unwrap();
    assert_eq!(d.peek(b, 4).unwrap(), [4; 4], "s2 ran after s1's memset");
    assert_eq!(d.event_query(end).unwrap(), Readiness::Ready);
    let ms = d.event_elapsed_ms(start, end).unwrap();
    assert!(ms > 0.0 && ms < 1.0, "{ms}");
    let untimed = d.event_create(false).unwrap();
    d.event_record(untimed, s1).unwrap();
    d.event_synchronize(untimed).unwrap();
    assert_eq!(
        d.event_elapsed_ms(start, untimed).unwrap_err().cuda_code(),
        Some(CuCode::INVALID_HANDLE)
    );
    d.event_destroy(untimed).unwrap();
    assert_eq!(
        d.event_query(untimed).unwrap_err().cuda_code(),
        Some(CuCode::INVALID_HANDLE)
    );
}

#[test]
fn kernels_run_in_stream_order_and_faults_are_sticky_700_at_the_next_sync() {
    let d = sim();
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    let f = fill_fn(&d);
    let p = d.mem_alloc(64).unwrap();
    launch_fill(&d, f, p, 1.5, 16, s).unwrap();
    d.stream_synchronize(s).unwrap();
    assert_eq!(d.peek_f32(p, 16).unwrap(), vec![1.5; 16]);
    launch_fill(&d, f, p, 1.5, 17, s).unwrap();
    assert_eq!(
        d.stream_synchronize(s).unwrap_err().cuda_code(),
        Some(CuCode::ILLEGAL_ADDRESS)
    );
    assert_eq!(
        d.mem_alloc(16).unwrap_err().cuda_code(),
        Some(CuCode::ILLEGAL_ADDRESS),
        "sticky"
    );
}

#[test]
fn a_kernel_using_freed_memory_faults_on_the_stale_generation() {
    let d = sim();
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    let f = fill_fn(&d);
    let old = d.mem_alloc(64).unwrap();
    d.mem_free(old).unwrap();
    let _new = d.mem_alloc(64).unwrap();
    launch_fill(&d, f, old, 0.0, 16, s).unwrap();
    assert_eq!(d.stream_query(s).unwrap(), Readiness::NotReady);
    d.pause(Duration::from_millis(1));
    assert_eq!(
        d.stream_query(s).unwrap_err().cuda_code(),
        Some(CuCode::ILLEGAL_ADDRESS)
    );
}

#[test]
fn registered_closures_see_only_their_arguments_and_checked_memory() {
    let d = sim();
    d.register_kernel("double_it", |_cfg, args, mem| {
        let a = KernelArgs(args);
        let (p, n) = (a.ptr(0)?, a.u64(1)?);
        let v: Vec<f32> = mem.read_f32(p, n)?.iter().map(|x| x * 2.0).collect();
        mem.write_f32(p, &v)
    });
    let ptx = ".version 8.0\n.target sm_90\n.visible .entry double_it(\n.param .u64 a)\n{ ret; }\n";
    let m = d.module_load_ptx(ptx).unwrap();
    assert_eq!(
        d.module_get_function(m, "fill_f32")
            .unwrap_err()
            .cuda_code(),
        Some(CuCode::NOT_FOUND)
    );
    let f = d.module_get_function(m, "double_it").unwrap();
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    let p = d.mem_alloc(8).unwrap();
    d.memset_d32(p, 3.0f32.to_bits(), 2).unwrap();
    // SAFETY: checked accessor.
    unsafe {
        d.launch_kernel(
            f,
            LaunchConfig::linear(2, 32, 1),
            &[KernelArg::Ptr(p), KernelArg::U64(2)],
            s,
        )
    }
    .unwrap();
    d.stream_synchronize(s).unwrap();
    assert_eq!(d.peek_f32(p, 2).unwrap(), [6.0, 6.0]);
    // A mistyped argument is a fault, not a panic.
    // SAFETY: checked accessor.
    unsafe { d.launch_kernel(f, LaunchConfig::linear(2, 32, 1), &[KernelArg::U32(1)], s) }.unwrap();
    assert_eq!(
        d.stream_synchronize(s).unwrap_err().cuda_code(),
        Some(CuCode::ILLEGAL_ADDRESS)
    );
    let _ = KernelFault::HostUnmapped(0);
}

#[test]
fn ptx_is_checked_for_entries_and_version() {
    let d = SimDriver::new(SimConfig {
        max_ptx_isa: (8, 4),
        ..SimConfig::default()
    });
    d.init().unwrap();
    assert_eq!(
        d.module_load_ptx("").unwrap_err().cuda_code(),
        Some(CuCode::INVALID_PTX)
    );
    assert_eq!(
        d.module_load_ptx("garbage").unwrap_err().cuda_code(),
        Some(CuCode::INVALID_PTX)
    );
    let new = super::BUILTIN_PTX.replace(".version 8.0", ".version 9.0");
    assert_eq!(
        d.module_load_ptx(&new).unwrap_err().cuda_code(),
        Some(CuCode::UNSUPPORTED_PTX_VERSION)
    );
    let m = d.module_load_ptx(super::BUILTIN_PTX).unwrap();
    let f = d.module_get_function(m, "axpy_f32").unwrap();
    d.module_unload(m).unwrap();
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    // SAFETY: the function is gone; the simulator says so.
    let r = unsafe { d.launch_kernel(f, LaunchConfig::linear(1, 32, 1), &[], s) };
    assert_eq!(r.unwrap_err().cuda_code(), Some(CuCode::INVALID_HANDLE));
}

#[test]
fn gemm_runs_on_the_handle_stream_and_rejects_bad_shapes() {
    let d = sim();
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    let h = d.blas_create().unwrap();
    d.blas_set_stream(h, s).unwrap();
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (a, b, c) = (
        d.mem_alloc(16).unwrap(),
        d.mem_alloc(16).unwrap(),
        d.mem_alloc(16).unwrap(),
    );
    d.memcpy_htod(a, &bytes(&[1.0, 3.0, 2.0, 4.0])).unwrap();
    d.memcpy_htod(b, &bytes(&[5.0, 7.0, 6.0, 8.0])).unwrap();
    let g = GemmF32 {
        transa: Transpose::No,
        transb: Transpose::No,
        m: 2,
        n: 2,
        k: 2,
        alpha: 1.0,
        a,
        lda: 2,
        stride_a: 0,
        b,
        ldb: 2,
        stride_b: 0,
        beta: 0.0,
        c,
        ldc: 2,
        stride_c: 0,
        batch: 1,
    };
    // SAFETY: checked accessor.
    unsafe { d.gemm_strided_batched_f32(h, &g) }.unwrap();
    d.stream_synchronize(s).unwrap();
    assert_eq!(d.peek_f32(c, 4).unwrap(), [19.0, 43.0, 22.0, 50.0]);
    // SAFETY: rejected before anything runs.
    let bad = unsafe { d.gemm_strided_batched_f32(h, &GemmF32 { ldc: 1, ..g }) };
    match bad {
        Err(DriverError::Cublas {
            status: 7, name, ..
        }) => assert_eq!(name, "CUBLAS_STATUS_INVALID_VALUE"),
        other => panic!("{other:?}"),
    }
    d.blas_destroy(h).unwrap();
    // SAFETY: the handle is gone.
    let gone = unsafe { d.gemm_strided_batched_f32(h, &g) };
    assert!(
        matches!(gone, Err(DriverError::Cublas { status: 1, .. })),
        "{gone:?}"
    );
}

#[test]
fn fault_plan_fails_stalls_and_sticks_by_call_name() {
    let d = sim();
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    d.fail_nth(calls::MEM_ALLOC, 2, CuCode::OUT_OF_MEMORY);
    let used = d.used_bytes();
    let first = d.mem_alloc(256).unwrap();
    assert_eq!(
        d.mem_alloc(256).unwrap_err().cuda_code(),
        Some(CuCode::OUT_OF_MEMORY)
    );
    assert_eq!(d.used_bytes(), used + 256, "the failed call had no effect");
    d.mem_alloc(256).unwrap();
    // A stalled synchronous call returns late; a stalled async call makes its stream late.
    d.stall(calls::MEM_GET_INFO, 1, Duration::from_secs(5));
    let t = d.now();
    d.mem_get_info().unwrap();
    assert!(d.now() - t >= Duration::from_secs(5));
    d.fault(
        calls::MEMSET_D8_ASYNC,
        1,
        FaultAction::Stall(Duration::from_secs(30)),
    );
    d.memset_d8_async(first, 1, 256, s).unwrap();
    d.pause(Duration::from_secs(29));
    assert_eq!(d.stream_query(s).unwrap(), Readiness::NotReady);
    d.pause(Duration::from_secs(2));
    assert_eq!(d.stream_query(s).unwrap(), Readiness::Ready);
    // cuBLAS calls fail with a cuBLAS status.
    d.fail_nth(calls::BLAS_CREATE, 1, CuCode(3));
    assert!(matches!(
        d.blas_create(),
        Err(DriverError::Cublas { status: 3, .. })
    ));
    // An error surfacing at the next sync; a non-sticky one is reported once.
    d.fail_at_next_sync(CuCode::LAUNCH_FAILED);
    d.mem_alloc(16).unwrap();
    assert_eq!(
        d.stream_synchronize(s).unwrap_err().cuda_code(),
        Some(CuCode::LAUNCH_FAILED)
    );
    assert_eq!(
        d.mem_alloc(16).unwrap_err().cuda_code(),
        Some(CuCode::LAUNCH_FAILED),
        "719 is sticky"
    );
    let log = d.op_log();
    assert!(
        log.iter()
            .any(|r| r.call == calls::MEMSET_D8_ASYNC && r.code() == 0)
    );
    assert_eq!(log.last().map(|r| r.code()), Some(719));
    // The call refused by the sticky error never reached the fault plan.
    assert_eq!(d.call_count(calls::MEM_ALLOC), 4);
}

#[test]
fn a_non_sticky_error_at_the_next_sync_is_reported_once() {
    let d = sim();
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    d.fail_at_next_sync(CuCode::INVALID_VALUE);
    assert_eq!(
        d.stream_query(s).unwrap_err().cuda_code(),
        Some(CuCode::INVALID_VALUE)
    );
    assert_eq!(d.stream_query(s).unwrap(), Readiness::Ready);
    d.sticky(calls::STREAM_CREATE, 1, CuCode::ILLEGAL_ADDRESS);
    assert!(d.stream_create(StreamKind::NonBlocking).is_err());
    assert_eq!(
        d.stream_query(s).unwrap_err().cuda_code(),
        Some(CuCode::ILLEGAL_ADDRESS)
    );
}

#[test]
fn op_log_records_calls_with_capture_state() {
    let d = sim();
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    d.clear_op_log();
    d.stream_begin_capture(s, CaptureMode::Global).unwrap();
    let _ = d.mem_alloc(16);
    let _ = d.stream_end_capture(s);
    let log = d.op_log();
    assert_eq!(log.len(), 3);
    let alloc = &log[1];
    assert_eq!(alloc.call, calls::MEM_ALLOC);
    assert_eq!(alloc.code(), 900);
    assert_eq!(
        alloc.capture.map(|c| (c.stream, c.status)),
        Some((s, CaptureStatus::Active))
    );
    assert_eq!(
        log[2].capture.map(|c| c.status),
        Some(CaptureStatus::Invalidated)
    );
}

#[test]
fn a_call_failing_at_the_next_sync_itself_succeeds_even_when_it_syncs() {
    let d = sim();
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    d.fault(
        calls::STREAM_QUERY,
        1,
        FaultAction::FailAtNextSync(CuCode::INVALID_VALUE),
    );
    assert_eq!(d.stream_query(s).unwrap(), Readiness::Ready);
    assert_eq!(
        d.stream_query(s).unwrap_err().cuda_code(),
        Some(CuCode::INVALID_VALUE)
    );
    assert_eq!(d.stream_query(s).unwrap(), Readiness::Ready);
}

/// Issue 44: a GPU's launch queue is bounded. Past [`SimConfig::launch_queue_depth`] ordinary
/// work only makes the host wait for the device (the clock moves, the oldest work runs); behind
/// a kernel that never completes (one waiting for a peer that died) the launch blocks the
/// calling thread, a release of the fault plan's hangs (an abort) does not end it while the
/// kernel still waits, and it returns once the kernel can complete.
#[test]
fn a_launch_onto_a_queue_full_behind_a_kernel_that_never_completes_blocks_until_it_does() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let d = Arc::new(SimDriver::new(SimConfig {
        launch_queue_depth: 4,
        ..SimConfig::default()
    }));
    d.init().expect("init");
    let f = fill_fn(&d);
    let out = d.mem_alloc(64).unwrap();
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    for v in 0..10 {
        launch_fill(&d, f, out, v as f32, 16, s).expect("ordinary work never blocks");
    }
    assert!(d.pending_ops(s) <= 4, "{} queued", d.pending_ops(s));
    d.stream_synchronize(s).unwrap();
    let came = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&came);
    d.register_kernel("waits_for_a_dead_peer", move |_, _, _| {
        if seen.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(KernelFault::Waiting("the peer died".into()))
        }
    });
    let m = d
        .module_load_ptx(".version 8.0\n.target sm_80\n.address_size 64\n\n.visible .entry waits_for_a_dead_peer()\n{\n\tret;\n}\n")
        .unwrap();
    let waits = d.module_get_function(m, "waits_for_a_dead_peer").unwrap();
    // SAFETY: the kernel takes no arguments.
    unsafe { d.launch_kernel(waits, LaunchConfig::linear(1, 1, 1), &[], s) }.unwrap();
    for v in 0..3 {
        launch_fill(&d, f, out, v as f32, 16, s).expect("room left");
    }
    let (done, returned) = std::sync::mpsc::channel();
    let blocked = {
        let d = Arc::clone(&d);
        std::thread::spawn(move || {
            let r = launch_fill(&d, f, out, 9.0, 16, s);
            done.send(()).ok();
            r
        })
    };
    // It cannot have returned: the kernel in front never completes until `came` is set. (A
    // wrong return shows up here unless the machine is slow; it never fails a correct one.)
    assert!(
        returned.recv_timeout(Duration::from_millis(100)).is_err(),
        "the launch behind a kernel that never completes returned"
    );
    d.release_hangs();
    assert!(
        returned.recv_timeout(Duration::from_millis(100)).is_err(),
        "a release (an abort) ended a launch behind a kernel that still waits"
    );
    came.store(true, Ordering::Release);
    returned
        .recv_timeout(Duration::from_secs(60))
        .expect("the launch did not return once the kernel could complete");
    blocked.join().unwrap().unwrap();
    d.stream_synchronize(s).unwrap();
}
