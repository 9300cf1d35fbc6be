//! Interprocess memory (legacy CUDA IPC) through the device: `ipc_export`, `ipc_open` and
//! `ipc_close` on the simulated device, through the fault-injecting wrapper, and (the `gpu`
//! feature) on the real driver, a second process opening what the first exported included.

use rstest::rstest;
use zdevice::sim::calls;
use zdevice::*;

use crate::conformance::still_usable;
use crate::util::{Check, ensure, s};

fn open_mock() -> MockDevice {
    MockDevice::open(SimDriver::default(), DeviceConfig::default())
        .expect("the simulated device opens")
}

/// What an export is asked for besides a live allocation's base.
#[derive(Clone, Copy, Debug)]
pub enum NotExportable {
    /// An allocation already freed.
    Freed,
    /// Stream-ordered pool memory (`cuMemAllocAsync`), not `cuMemAlloc`'s.
    Pool,
    /// The null address.
    Null,
}

/// The device refuses to export `what` with the driver's `CUDA_ERROR_INVALID_VALUE`, and stays
/// usable.
pub fn export_is_refused<D: Driver>(dev: &Device<D>, what: NotExportable) -> Check {
    let base = dev.alloc(4096).map_err(s)?;
    let stream = dev.stream();
    dev.free(base).map_err(s)?;
    let ptr = match what {
        NotExportable::Freed => base,
        NotExportable::Pool => {
            let p = dev.alloc_async(4096, stream).map_err(s)?;
            dev.synchronize(stream).map_err(s)?;
            p
        }
        NotExportable::Null => DevicePtr::NULL,
    };
    let got = dev.ipc_export(ptr);
    if matches!(what, NotExportable::Pool) {
        dev.free_async(ptr, stream).map_err(s)?;
        dev.synchronize(stream).map_err(s)?;
    }
    match got {
        Err(DeviceError::Driver {
            call: "cuIpcGetMemHandle",
            code: CuCode::INVALID_VALUE,
        }) => still_usable(dev),
        other => Err(format!(
            "export of {what:?} memory: expected cuIpcGetMemHandle's INVALID_VALUE, got {other:?}"
        )),
    }
}

/// An address inside a live allocation exports the whole allocation: its handle is the
/// base's (measured on an H200), and exporting again gives the same handle.
pub fn interior_export_names_the_allocation<D: Driver>(dev: &Device<D>) -> Check {
    let base = dev.alloc(4096).map_err(s)?;
    let whole = dev.ipc_export(base).map_err(s)?;
    let again = dev.ipc_export(base).map_err(s)?;
    let inside = dev.ipc_export(base.offset(1024)).map_err(s)?;
    let last = dev.ipc_export(base.offset(4095)).map_err(s)?;
    dev.free(base).map_err(s)?;
    ensure(
        again == whole,
        "a second export of one allocation gave another handle",
    )?;
    ensure(
        inside == whole,
        "an interior address exported another handle",
    )?;
    ensure(
        last == whole,
        "the last byte's address exported another handle",
    )
}

/// Closing an address that was never opened through IPC (a plain allocation) is the driver's
/// `CUDA_ERROR_INVALID_VALUE`; the allocation is untouched.
pub fn close_of_an_unopened_address_is_invalid_value<D: Driver>(dev: &Device<D>) -> Check {
    let p = dev.alloc(1024).map_err(s)?;
    dev.copy_htod(p, &[0x5a; 1024]).map_err(s)?;
    let got = dev.ipc_close(p);
    let mut back = vec![0u8; 1024];
    dev.copy_dtoh(&mut back, p).map_err(s)?;
    dev.free(p).map_err(s)?;
    match got {
        Err(DeviceError::Driver {
            call: "cuIpcCloseMemHandle",
            code: CuCode::INVALID_VALUE,
        }) => {}
        other => return Err(format!("expected INVALID_VALUE, got {other:?}")),
    }
    ensure(
        back.iter().all(|&b| b == 0x5a),
        "the allocation changed under a refused close",
    )?;
    still_usable(dev)
}

/// The three calls.
#[derive(Clone, Copy, Debug)]
pub enum IpcCall {
    Export,
    Open,
    Close,
}

impl IpcCall {
    /// The CUDA function it names (the call of its errors, the key of the fault plan).
    pub fn name(self) -> &'static str {
        match self {
            IpcCall::Export => calls::IPC_GET_MEM_HANDLE,
            IpcCall::Open => calls::IPC_OPEN_MEM_HANDLE,
            IpcCall::Close => calls::IPC_CLOSE_MEM_HANDLE,
        }
    }

    /// Makes the call on `dev`, about the allocation `p` and the handle `h`.
    pub fn make<D: Driver>(
        self,
        dev: &Device<D>,
        p: DevicePtr,
        h: &IpcMemHandle,
    ) -> DeviceResult<()> {
        match self {
            IpcCall::Export => dev.ipc_export(p).map(drop),
            IpcCall::Open => dev.ipc_open(h).map(drop),
            IpcCall::Close => dev.ipc_close(p),
        }
    }
}

/// During a capture the device refuses `call` by name with `CaptureIllegal`, before the driver
/// sees it: the capture stays valid and ends with an empty graph.
pub fn refused_during_capture<D: Driver>(dev: &Device<D>, call: IpcCall) -> Check {
    let p = dev.alloc(1024).map_err(s)?;
    let h = dev.ipc_export(p).map_err(s)?;
    let cap = dev.begin_capture(dev.stream()).map_err(s)?;
    let got = call.make(dev, p, &h);
    let graph = cap
        .end()
        .map_err(|e| format!("the capture did not end cleanly: {e}"))?;
    let nodes = graph.node_count().map_err(s)?;
    drop(graph);
    dev.free(p).map_err(s)?;
    match got {
        Err(DeviceError::CaptureIllegal { call: named, .. }) if named == call.name() => {}
        other => return Err(format!("{call:?} during capture: got {other:?}")),
    }
    ensure(nodes == 0, format!("the graph holds {nodes} nodes"))?;
    still_usable(dev)
}

// --- the simulated device --------------------------------------------------------------------

#[test]
fn export_of_a_live_allocation_is_a_64_byte_handle_of_its_own() {
    assert_eq!(IPC_HANDLE_BYTES, 64);
    assert_eq!(std::mem::size_of::<IpcMemHandle>(), 64);
    let dev = open_mock();
    let a = dev.alloc(1024).unwrap();
    let b = dev.alloc(1024).unwrap();
    let ha = dev.ipc_export(a).unwrap();
    let hb = dev.ipc_export(b).unwrap();
    assert_ne!(ha, IpcMemHandle([0; IPC_HANDLE_BYTES]), "an empty handle");
    assert_ne!(ha, hb, "two allocations, one handle");
    // Exporting is repeatable and names the allocation, not the call.
    assert_eq!(dev.ipc_export(a).unwrap(), ha);
    assert_eq!(dev.driver().call_count(calls::IPC_GET_MEM_HANDLE), 3);
    dev.free(a).unwrap();
    dev.free(b).unwrap();
}

/// Addresses repeat across simulators (and a freed range is soon reissued): the handle tells
/// them apart.
#[test]
fn handles_of_the_same_address_differ_across_simulators_and_reissues() {
    let (one, two) = (open_mock(), open_mock());
    let p1 = one.alloc(1024).unwrap();
    let p2 = two.alloc(1024).unwrap();
    assert_eq!(
        p1, p2,
        "the precondition: both simulators issue the same address"
    );
    assert_ne!(one.ipc_export(p1).unwrap(), two.ipc_export(p2).unwrap());

    let old = one.ipc_export(p1).unwrap();
    one.free(p1).unwrap();
    let again = one.alloc(1024).unwrap();
    let new = one.ipc_export(again).unwrap();
    assert_ne!(old, new, "a reissued range kept its old handle");
    assert!(matches!(
        one.ipc_export(p1),
        Err(DeviceError::Driver {
            code: CuCode::INVALID_VALUE,
            ..
        })
    ));
}

#[rstest]
fn export_of_anything_but_a_live_allocation_is_invalid_value(
    #[values(NotExportable::Freed, NotExportable::Pool, NotExportable::Null)] what: NotExportable,
) {
    export_is_refused(&open_mock(), what).unwrap();
}

#[test]
fn interior_export_is_the_allocations_handle() {
    interior_export_names_the_allocation(&open_mock()).unwrap();
}

/// Another simulator's allocation, at an address this one never issued.
#[test]
fn export_of_a_foreign_pointer_is_invalid_value() {
    let (mine, other) = (open_mock(), open_mock());
    let _first = other.alloc(4096).unwrap();
    let foreign = other.alloc(4096).unwrap();
    assert!(
        !mine
            .driver()
            .live_allocations()
            .iter()
            .any(|(p, _)| *p == foreign),
        "the precondition: the address is not one of this simulator's"
    );
    let _own = mine.alloc(4096).unwrap();
    match mine.ipc_export(foreign) {
        Err(DeviceError::Driver {
            call: "cuIpcGetMemHandle",
            code: CuCode::INVALID_VALUE,
        }) => {}
        other => panic!("expected INVALID_VALUE, got {other:?}"),
    }
    other.ipc_export(foreign).unwrap();
}

/// The simulator has no peer process: opening a handle of this process is CUDA's
/// `CUDA_ERROR_INVALID_CONTEXT` (as on the GPU, `gpu::opening_its_own_handle_is_a_typed_error`),
/// any other the typed "not supported" driver error; nothing is mapped.
#[rstest]
#[case::own_handle(true)]
#[case::arbitrary_bytes(false)]
fn open_is_not_supported_on_the_simulator(#[case] own: bool) {
    let dev = open_mock();
    let p = dev.alloc(1024).unwrap();
    let h = if own {
        dev.ipc_export(p).unwrap()
    } else {
        IpcMemHandle([0xa5; IPC_HANDLE_BYTES])
    };
    let live = dev.driver().live_allocations();
    let (want, name) = if own {
        (CuCode::INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT")
    } else {
        (CuCode::NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED")
    };
    match dev.ipc_open(&h) {
        Err(
            e @ DeviceError::Driver {
                call: "cuIpcOpenMemHandle_v2",
                code,
            },
        ) if code == want => assert!(e.to_string().contains(name), "{e}"),
        other => panic!("expected {name}, got {other:?}"),
    }
    assert_eq!(
        dev.driver().live_allocations(),
        live,
        "something was mapped"
    );
    still_usable(&dev).unwrap();
}

#[test]
fn close_of_an_address_never_opened_is_invalid_value() {
    close_of_an_unopened_address_is_invalid_value(&open_mock()).unwrap();
}

#[rstest]
fn refused_during_capture_before_the_driver_is_called(
    #[values(IpcCall::Export, IpcCall::Open, IpcCall::Close)] call: IpcCall,
) {
    let dev = open_mock();
    let before = dev.driver().call_count(call.name());
    refused_during_capture(&dev, call).unwrap();
    // The setup exported once; the refused call itself never reached the driver.
    let setup = u64::from(matches!(call, IpcCall::Export));
    assert_eq!(
        dev.driver().call_count(call.name()),
        before + setup,
        "{call:?}"
    );
}

/// Negative control: with the guard off, the calls reach the driver and the check fails.
#[rstest]
fn the_capture_check_fails_without_the_guard(
    #[values(IpcCall::Export, IpcCall::Open, IpcCall::Close)] call: IpcCall,
) {
    let dev = open_mock();
    dev.set_capture_guard_for_tests(false);
    assert!(
        refused_during_capture(&dev, call).is_err(),
        "{call:?}: the capture check passed with the guard off"
    );
}

// --- the fault-injecting wrapper -------------------------------------------------------------

/// A fault injected on each call is what the device returns, and the call never reached the
/// driver underneath.
#[rstest]
fn an_injected_fault_is_returned(
    #[values(IpcCall::Export, IpcCall::Open, IpcCall::Close)] call: IpcCall,
    #[values(CuCode(205), CuCode::INVALID_HANDLE)] code: CuCode,
) {
    let driver = FaultyDriver::new(SimDriver::default());
    let ctl = driver.controller();
    let dev = Device::open(driver, DeviceConfig::default()).unwrap();
    let held = ctl.live_resources();
    let p = dev.alloc(1024).unwrap();
    let h = dev.ipc_export(p).unwrap();
    let reached = dev.driver().inner().call_count(call.name());
    ctl.fail_nth(call.name(), 1, code);
    match call.make(&dev, p, &h) {
        Err(DeviceError::Driver {
            call: named,
            code: got,
        }) if named == call.name() => {
            assert_eq!(got, code, "{call:?}");
        }
        other => panic!("{call:?}: expected the injected {code}, got {other:?}"),
    }
    assert_eq!(
        dev.driver().inner().call_count(call.name()),
        reached,
        "{call:?}: the failed call reached the driver"
    );
    // The fault was for one call: the next export passes again.
    assert_eq!(dev.ipc_export(p).unwrap(), h);
    dev.free(p).unwrap();
    assert_eq!(ctl.live_resources(), held, "{call:?}: something leaked");
}

/// The GPU twins, and the cross-process case the simulator cannot run.
#[cfg(feature = "gpu")]
mod gpu {
    use std::process::Command;

    use rstest::rstest;
    use zdevice::faulty::resource;
    use zdevice::*;

    use super::{IpcCall, NotExportable};
    use crate::conformance::still_usable;

    /// Set in the peer process: the handle to open, as hex.
    const HANDLE_ENV: &str = "ZDEVICE_IPC_TEST_HANDLE";
    const BYTES: usize = 1 << 20;

    fn open() -> Device<CudaDriver> {
        let driver = CudaDriver::load().expect("the CUDA driver loads on a GPU machine");
        Device::open(driver, DeviceConfig::default()).expect("CUDA device 0 opens")
    }

    #[test]
    fn export_of_a_real_allocation_succeeds() {
        let dev = open();
        let a = dev.alloc(BYTES as u64).unwrap();
        let b = dev.alloc(BYTES as u64).unwrap();
        let ha = dev.ipc_export(a).unwrap();
        let hb = dev.ipc_export(b).unwrap();
        assert_ne!(ha, IpcMemHandle([0; IPC_HANDLE_BYTES]), "an empty handle");
        assert_ne!(ha, hb, "two allocations, one handle");
        dev.free(a).unwrap();
        dev.free(b).unwrap();
        still_usable(&dev).unwrap();
    }

    /// CUDA refuses to open, in the process that exported it, a handle of its own.
    #[test]
    fn opening_its_own_handle_is_a_typed_error() {
        let dev = open();
        let p = dev.alloc(BYTES as u64).unwrap();
        let h = dev.ipc_export(p).unwrap();
        match dev.ipc_open(&h) {
            Err(DeviceError::Driver {
                call: "cuIpcOpenMemHandle_v2",
                code,
            }) => assert_eq!(code, CuCode(201), "CUDA_ERROR_INVALID_CONTEXT, got {code}"),
            other => panic!("expected cuIpcOpenMemHandle_v2's error, got {other:?}"),
        }
        dev.free(p).unwrap();
        still_usable(&dev).unwrap();
    }

    #[rstest]
    fn export_of_anything_but_a_live_allocation_is_invalid_value(
        #[values(NotExportable::Freed, NotExportable::Pool, NotExportable::Null)]
        what: NotExportable,
    ) {
        super::export_is_refused(&open(), what).unwrap();
    }

    #[test]
    fn interior_export_is_the_allocations_handle() {
        super::interior_export_names_the_allocation(&open()).unwrap();
    }

    #[test]
    fn close_of_an_address_never_opened_is_invalid_value() {
        super::close_of_an_unopened_address_is_invalid_value(&open()).unwrap();
    }

    #[rstest]
    fn refused_during_capture(
        #[values(IpcCall::Export, IpcCall::Open, IpcCall::Close)] call: IpcCall,
    ) {
        super::refused_during_capture(&open(), call).unwrap();
    }

    fn hex(h: &IpcMemHandle) -> String {
        h.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn unhex(text: &str) -> IpcMemHandle {
        let mut h = [0u8; IPC_HANDLE_BYTES];
        assert_eq!(text.len(), 2 * IPC_HANDLE_BYTES, "{text}");
        for (i, b) in h.iter_mut().enumerate() {
            *b = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).expect("hex");
        }
        IpcMemHandle(h)
    }

    fn ipc_mappings(ctl: &FaultController) -> usize {
        ctl.live_resources()
            .into_iter()
            .find(|(k, _)| *k == resource::IPC_MAPPING)
            .map_or(0, |(_, n)| n)
    }

    /// Runs `test` of this binary again in a second process, `env` set to `handle` (hex): the
    /// peer's role; asserts that it ran and passed.
    fn in_peer_process(test: &str, env: &str, handle: &IpcMemHandle) {
        let exe = std::env::current_exe().expect("the test binary");
        let out = Command::new(exe)
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(env, hex(handle))
            .output()
            .expect("the peer process starts");
        let log = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "the peer failed:\n{log}");
        assert!(log.contains("1 passed"), "the peer ran no test:\n{log}");
    }

    /// The peer's half: open the handle (twice: one mapping, counted twice), check what the
    /// exporter wrote, overwrite it, close both opens; the ledger follows the mapping.
    fn peer(handle: &IpcMemHandle) {
        let driver = FaultyDriver::new(CudaDriver::load().expect("the CUDA driver loads"));
        let ctl = driver.controller();
        let dev = Device::open(driver, DeviceConfig::default()).expect("CUDA device 0 opens");
        let p = dev.ipc_open(handle).expect("the peer opens the handle");
        assert_eq!(ipc_mappings(&ctl), 1);
        let q = dev.ipc_open(handle).expect("a second open");
        assert_eq!(p, q, "CUDA maps a handle once per context");
        assert_eq!(ipc_mappings(&ctl), 1);
        let mut seen = vec![0u8; BYTES];
        dev.copy_dtoh(&mut seen, p).unwrap();
        assert!(
            seen.iter().all(|&b| b == 0x3c),
            "the peer reads the exporter's bytes"
        );
        dev.copy_htod(p, &vec![0xc3; BYTES]).unwrap();
        // A synchronous read-back completes the write before the mapping goes.
        dev.copy_dtoh(&mut seen, p).unwrap();
        assert!(seen.iter().all(|&b| b == 0xc3));
        dev.ipc_close(q).unwrap();
        assert_eq!(ipc_mappings(&ctl), 1, "the first close keeps the mapping");
        dev.ipc_close(p).unwrap();
        assert_eq!(ipc_mappings(&ctl), 0, "the last close releases it");
        assert!(dev.ipc_close(p).is_err(), "a third close of two opens");
    }

    /// One process exports, a second (this test binary again, in the peer role) opens, reads
    /// and overwrites; the exporter sees the peer's bytes.
    #[test]
    fn a_peer_process_reads_and_writes_the_exported_allocation() {
        if let Ok(text) = std::env::var(HANDLE_ENV) {
            peer(&unhex(&text));
            return;
        }
        let dev = open();
        let p = dev.alloc(BYTES as u64).unwrap();
        dev.copy_htod(p, &vec![0x3c; BYTES]).unwrap();
        let h = dev.ipc_export(p).unwrap();
        in_peer_process(
            "ipc::gpu::a_peer_process_reads_and_writes_the_exported_allocation",
            HANDLE_ENV,
            &h,
        );
        let mut back = vec![0u8; BYTES];
        dev.copy_dtoh(&mut back, p).unwrap();
        assert!(
            back.iter().all(|&b| b == 0xc3),
            "the peer's write is not seen"
        );
        dev.free(p).unwrap();
        still_usable(&dev).unwrap();
    }

    /// Set in the peer process of the capture rows: the handle to open, as hex.
    const CAPTURE_HANDLE_ENV: &str = "ZDEVICE_IPC_CAPTURE_HANDLE";

    /// What the driver answers, during a capture in each mode, to opening another process's
    /// handle and to closing a mapping of it (`rules::expected_foreign`); the peer process
    /// runs every row and reports all that differ.
    #[test]
    fn a_peer_process_opens_and_closes_during_capture() {
        use crate::rules::{Foreign, check_foreign};
        if let Ok(text) = std::env::var(CAPTURE_HANDLE_ENV) {
            let handle = unhex(&text);
            let dev = open();
            let mut wrong = Vec::new();
            for call in [Foreign::Open, Foreign::CloseMapped] {
                for mode in [
                    CaptureMode::Global,
                    CaptureMode::ThreadLocal,
                    CaptureMode::Relaxed,
                ] {
                    if let Err(e) = check_foreign(&dev, call, mode, &handle) {
                        wrong.push(e);
                    }
                }
            }
            still_usable(&dev).unwrap();
            assert!(wrong.is_empty(), "{}", wrong.join("\n"));
            return;
        }
        let dev = open();
        let p = dev.alloc(BYTES as u64).unwrap();
        let h = dev.ipc_export(p).unwrap();
        in_peer_process(
            "ipc::gpu::a_peer_process_opens_and_closes_during_capture",
            CAPTURE_HANDLE_ENV,
            &h,
        );
        dev.free(p).unwrap();
        still_usable(&dev).unwrap();
    }
}
