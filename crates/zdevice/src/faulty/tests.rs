//! The wrapper over the simulated driver: each fault kind, the ledger, the call list.

use std::time::Duration;

use super::{FaultyDriver, resource};
use crate::driver::{CuCode, Driver, DriverError};
use crate::faults::FaultAction;
use crate::sim::{SimDriver, calls};
use crate::types::*;

fn wrapped() -> FaultyDriver<SimDriver> {
    let d = FaultyDriver::new(SimDriver::default());
    d.init().unwrap();
    d
}

#[test]
fn the_nth_call_fails_without_reaching_the_driver() {
    let d = wrapped();
    let ctl = d.controller();
    ctl.fail_nth(calls::MEM_ALLOC, 2, CuCode::OUT_OF_MEMORY);
    d.mem_alloc(256).unwrap();
    let err = d.mem_alloc(256).unwrap_err();
    assert!(matches!(
        err,
        DriverError::Cuda {
            call: calls::MEM_ALLOC,
            code: CuCode::OUT_OF_MEMORY
        }
    ));
    // The failed call never reached the simulator: one allocation there, one in the ledger.
    assert_eq!(d.inner().live_allocations().len(), 1);
    assert_eq!(ctl.live_resources(), vec![(resource::DEVICE_MEMORY, 1)]);
    assert_eq!(ctl.call_count(calls::MEM_ALLOC), 2);
    d.mem_alloc(256).unwrap();
}

#[test]
fn a_failed_blas_call_is_a_cublas_error() {
    let d = wrapped();
    d.controller()
        .fault(calls::BLAS_CREATE, 1, FaultAction::Fail(CuCode(3)));
    assert!(matches!(
        d.blas_create().unwrap_err(),
        DriverError::Cublas {
            call: calls::BLAS_CREATE,
            status: 3,
            ..
        }
    ));
}

#[test]
fn an_error_at_the_next_sync_surfaces_at_the_next_query_once() {
    let d = wrapped();
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    d.controller().fault(
        calls::MEMSET_D8_ASYNC,
        1,
        FaultAction::FailAtNextSync(CuCode::INVALID_VALUE),
    );
    let p = d.mem_alloc(256).unwrap();
    d.memset_d8_async(p, 1, 256, s).unwrap();
    d.mem_get_info().unwrap();
    assert_eq!(
        d.stream_query(s).unwrap_err().cuda_code(),
        Some(CuCode::INVALID_VALUE)
    );
    // Reported once: the stream then drains normally.
    d.stream_synchronize(s).unwrap();
    assert_eq!(d.stream_query(s).unwrap(), Readiness::Ready);
}

#[test]
fn a_sticky_error_at_the_next_sync_latches() {
    let d = wrapped();
    let e = d.event_create(false).unwrap();
    d.controller().fail_at_next_sync(CuCode::ILLEGAL_ADDRESS);
    assert_eq!(
        d.event_query(e).unwrap_err().cuda_code(),
        Some(CuCode::ILLEGAL_ADDRESS)
    );
    assert_eq!(
        d.mem_alloc(16).unwrap_err().cuda_code(),
        Some(CuCode::ILLEGAL_ADDRESS)
    );
    assert_eq!(d.controller().sticky_error(), Some(CuCode::ILLEGAL_ADDRESS));
}

#[test]
fn a_sticky_fault_fails_every_later_call_without_the_driver() {
    let d = wrapped();
    let ctl = d.controller();
    ctl.sticky(calls::STREAM_CREATE, 1, CuCode::LAUNCH_FAILED);
    assert!(d.stream_create(StreamKind::NonBlocking).is_err());
    let before = d.inner().call_count(calls::MEM_GET_INFO);
    assert_eq!(
        d.mem_get_info().unwrap_err().cuda_code(),
        Some(CuCode::LAUNCH_FAILED)
    );
    assert_eq!(d.inner().call_count(calls::MEM_GET_INFO), before);
    ctl.clear_faults();
    assert!(
        d.mem_get_info().is_err(),
        "clearing the plan keeps a raised sticky error"
    );
}

#[test]
fn a_stalled_async_call_keeps_its_stream_and_later_events_busy() {
    let d = wrapped();
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    let other = d.stream_create(StreamKind::NonBlocking).unwrap();
    let e = d.event_create(false).unwrap();
    let p = d.mem_alloc(256).unwrap();
    d.controller()
        .stall(calls::MEMSET_D8_ASYNC, 1, Duration::from_secs(2));
    d.memset_d8_async(p, 1, 256, s).unwrap();
    d.event_record(e, s).unwrap();
    d.stream_wait_event(other, e).unwrap();
    assert_eq!(d.stream_query(s).unwrap(), Readiness::NotReady);
    assert_eq!(d.event_query(e).unwrap(), Readiness::NotReady);
    assert_eq!(d.stream_query(other).unwrap(), Readiness::NotReady);
    let start = d.now();
    d.stream_synchronize(s).unwrap();
    assert!(d.now() - start >= Duration::from_millis(1900));
    assert_eq!(d.stream_query(s).unwrap(), Readiness::Ready);
    assert_eq!(d.event_query(e).unwrap(), Readiness::Ready);
    assert_eq!(d.stream_query(other).unwrap(), Readiness::Ready);
}

#[test]
fn a_stalled_sync_call_returns_late() {
    let d = wrapped();
    d.controller()
        .stall(calls::MEM_ALLOC, 1, Duration::from_secs(3));
    let start = d.now();
    d.mem_alloc(256).unwrap();
    assert!(d.now() - start >= Duration::from_secs(3));
}

#[test]
fn a_missing_driver_fails_every_call_as_a_load_error() {
    let d = FaultyDriver::new(SimDriver::default());
    d.controller().set_missing_driver(true);
    assert!(matches!(d.init().unwrap_err(), DriverError::Load(_)));
    assert!(matches!(
        d.driver_version().unwrap_err(),
        DriverError::Load(_)
    ));
    d.controller().set_missing_driver(false);
    d.init().unwrap();
}

#[test]
fn the_ledger_follows_acquire_and_release_and_the_call_list_is_in_order() {
    let d = wrapped();
    let ctl = d.controller();
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    let e = d.event_create(false).unwrap();
    let h = d.mem_alloc_host(64).unwrap();
    let p = d.mem_alloc_async(512, s).unwrap();
    assert_eq!(ctl.live_resources().len(), 4);
    d.mem_free_async(p, s).unwrap();
    d.mem_free_host(h).unwrap();
    d.event_destroy(e).unwrap();
    d.stream_destroy(s).unwrap();
    assert_eq!(ctl.live_resources(), vec![]);
    let names: Vec<_> = ctl.calls_seen().into_iter().map(|(c, _)| c).collect();
    assert_eq!(
        names[..4],
        [
            calls::INIT,
            calls::STREAM_CREATE,
            calls::EVENT_CREATE,
            calls::MEM_ALLOC_HOST
        ]
    );
}

/// The simulator has no twin of `spin_ns`: the spinning-kernel mode falls back to emulation
/// there, and a stall still keeps the stream busy.
#[test]
fn without_the_spinning_kernel_a_stall_is_emulated() {
    let d = FaultyDriver::new(SimDriver::default());
    d.controller()
        .set_async_stall(super::AsyncStall::SpinKernel);
    d.init().unwrap();
    let ctx = d.primary_ctx_retain(0).unwrap();
    d.ctx_set_current(ctx).unwrap();
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    let p = d.mem_alloc(256).unwrap();
    d.controller()
        .stall(calls::MEMSET_D8_ASYNC, 1, Duration::from_secs(2));
    d.memset_d8_async(p, 1, 256, s).unwrap();
    assert_eq!(d.stream_query(s).unwrap(), Readiness::NotReady);
    d.stream_synchronize(s).unwrap();
    assert_eq!(d.stream_query(s).unwrap(), Readiness::Ready);
    d.primary_ctx_release(0).unwrap();
}

/// CUDA maps a handle once per context and counts its opens: the ledger keeps the mapping
/// until the last open is closed. (The simulator opens nothing; the GPU suite's peer-process
/// test drives this through real opens.)
#[test]
fn an_ipc_mapping_is_live_until_its_last_open_is_closed() {
    let d = wrapped();
    let ctl = d.controller();
    let mapping = || {
        ctl.live_resources()
            .into_iter()
            .find(|(k, _)| *k == resource::IPC_MAPPING)
            .map_or(0, |(_, n)| n)
    };
    d.track_ipc(0x7000, true);
    d.track_ipc(0x7000, true);
    d.track_ipc(0x9000, true);
    assert_eq!(mapping(), 2);
    d.track_ipc(0x7000, false);
    assert_eq!(mapping(), 2, "one open of 0x7000 is left");
    d.track_ipc(0x7000, false);
    assert_eq!(mapping(), 1);
    // A close the driver refused is never tracked; a stray one cannot go below zero.
    d.track_ipc(0x7000, false);
    d.track_ipc(0x9000, false);
    assert_eq!(mapping(), 0);
    d.track_ipc(0x7000, true);
    assert_eq!(mapping(), 1, "a stray close left a debt behind");
}

/// Through the wrapper, the simulator's answers pass unchanged and nothing is tracked.
#[test]
fn ipc_calls_pass_through_to_the_simulator() {
    let d = wrapped();
    let p = d.mem_alloc(256).unwrap();
    let h = d.ipc_get_mem_handle(p).unwrap();
    assert_eq!(d.inner().call_count(calls::IPC_GET_MEM_HANDLE), 1);
    assert_eq!(
        d.ipc_open_mem_handle(&h).unwrap_err().cuda_code(),
        Some(CuCode::INVALID_CONTEXT),
        "a handle of this process"
    );
    assert_eq!(
        d.ipc_open_mem_handle(&IpcMemHandle([0x5a; IPC_HANDLE_BYTES]))
            .unwrap_err()
            .cuda_code(),
        Some(CuCode::NOT_SUPPORTED),
        "any other"
    );
    assert_eq!(
        d.ipc_close_mem_handle(p).unwrap_err().cuda_code(),
        Some(CuCode::INVALID_VALUE)
    );
    assert!(
        !d.controller()
            .live_resources()
            .iter()
            .any(|(k, _)| *k == resource::IPC_MAPPING)
    );
    d.mem_free(p).unwrap();
}

/// Issue 44: [`FaultAction::Hang`] over any driver. An asynchronous call's stream, an event
/// recorded behind it and a stream made to wait for that event never complete (queries
/// `NotReady`, synchronizes refused) until released; a synchronous call does not return until
/// released (an abort behind a kernel that waits for a stopped peer).
#[test]
fn a_hang_holds_its_work_or_its_caller_until_released() {
    use std::sync::mpsc;
    let d = std::sync::Arc::new(wrapped());
    let ctl = d.controller();
    let ctx = d.primary_ctx_retain(0).unwrap();
    d.ctx_set_current(ctx).unwrap();
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    let other = d.stream_create(StreamKind::NonBlocking).unwrap();
    let p = d.mem_alloc(256).unwrap();
    ctl.fault(calls::MEMSET_D8_ASYNC, 1, FaultAction::Hang);
    d.memset_d8_async(p, 1, 256, s).unwrap();
    let e = d.event_create(false).unwrap();
    d.event_record(e, s).unwrap();
    d.stream_wait_event(other, e).unwrap();
    for _ in 0..3 {
        assert_eq!(d.stream_query(s).unwrap(), Readiness::NotReady);
        assert_eq!(d.event_query(e).unwrap(), Readiness::NotReady);
        assert_eq!(d.stream_query(other).unwrap(), Readiness::NotReady);
        assert!(d.stream_synchronize(s).is_err());
        assert!(d.ctx_synchronize().is_err());
    }
    ctl.release_hangs();
    assert_eq!(d.stream_query(s).unwrap(), Readiness::Ready);
    assert_eq!(d.event_query(e).unwrap(), Readiness::Ready);
    d.stream_synchronize(other).unwrap();

    ctl.fault(calls::MEM_GET_INFO, 1, FaultAction::Hang);
    let (tx, rx) = mpsc::channel();
    let caller = std::sync::Arc::clone(&d);
    let t = std::thread::spawn(move || {
        let _ = tx.send(caller.mem_get_info());
    });
    // Not returned while held (it cannot return before the release, however slow the machine).
    assert!(matches!(
        rx.recv_timeout(Duration::from_millis(50)),
        Err(mpsc::RecvTimeoutError::Timeout)
    ));
    ctl.release_hangs();
    assert!(rx.recv().unwrap().is_ok());
    t.join().unwrap();
}
