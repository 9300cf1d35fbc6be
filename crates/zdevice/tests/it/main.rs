//! zdevice's integration tests: the conformance suite over every driver, plus the device
//! guards' fault scenarios on the simulated driver.

mod capture_end;
mod conformance;
mod faults;
mod ipc;
mod leaks;
mod pinned;
mod priority;
mod rules;
mod session;
mod util;
mod waits;

/// Expands the conformance suite into tests for one device opener.
macro_rules! conformance_suite {
    ($open:path) => {
        use rstest::rstest;
        use zdevice::{CaptureMode, StreamKind};

        use crate::conformance as c;
        use crate::rules::{self, Row};

        #[rstest]
        fn alloc_copy_round_trip(#[values(1, 7, 255, 256, 4097, 65_537, 1_048_579)] bytes: usize) {
            c::alloc_copy_round_trip(&$open(), bytes).unwrap();
        }

        #[test]
        fn stream_ordering() {
            c::stream_ordering(&$open()).unwrap();
        }

        #[test]
        fn events() {
            c::events(&$open()).unwrap();
        }

        #[rstest]
        #[case(1, 1, 1, 1, false, false)]
        #[case(1, 7, 5, 3, false, false)]
        #[case(3, 7, 193, 33, false, true)]
        #[case(2, 65, 31, 129, true, false)]
        #[case(4, 12, 12, 64, true, true)]
        #[case(1, 256, 1025, 64, false, true)]
        fn gemm_against_f64(
            #[case] batch: usize,
            #[case] m: usize,
            #[case] n: usize,
            #[case] k: usize,
            #[case] ta: bool,
            #[case] tb: bool,
        ) {
            let g = crate::util::Gemm {
                batch,
                m,
                n,
                k,
                ta,
                tb,
            };
            c::gemm_against_f64(&$open(), g).unwrap();
        }

        #[test]
        fn capture_and_replay_with_new_inputs() {
            let dev = $open();
            let module = dev.load_module(zdevice::kernels::FILL_PTX).unwrap();
            c::capture_and_replay(&dev, &module).unwrap();
        }

        #[test]
        fn prioritized_side_stream_in_a_graph() {
            let dev = $open();
            let module = dev.load_module(zdevice::kernels::FILL_PTX).unwrap();
            c::prioritized_side_stream_in_a_graph(&dev, &module).unwrap();
        }

        #[test]
        fn guard_refuses_silent_rows() {
            c::guard_refuses_silent_rows(&$open()).unwrap();
        }

        /// Negative control: with the guard switched off, the same check must fail.
        #[test]
        fn silent_row_check_fails_without_the_guard() {
            let dev = $open();
            dev.set_capture_guard_for_tests(false);
            let r = c::guard_refuses_silent_rows(&dev);
            assert!(r.is_err(), "the silent-row check passed with the guard off");
        }

        #[test]
        fn waiter_on_another_thread_does_not_invalidate_capture() {
            c::waiter_does_not_invalidate_capture(&$open()).unwrap();
        }

        #[rstest]
        fn capture_rules_row(
            #[values(
                Row::MemAlloc,
                Row::MemAllocManaged,
                Row::MemAllocHost,
                Row::MemcpyHtoD,
                Row::MemcpyDtoH,
                Row::MemsetD8,
                Row::MemcpyHtoDAsyncPageable,
                Row::MemsetD8Async,
                Row::MemAllocAsync,
                Row::StreamSynchronize,
                Row::CtxSynchronize,
                Row::StreamQuery,
                Row::EventRecord,
                Row::EventQuery,
                Row::EventSynchronize,
                Row::MemGetInfo,
                Row::StreamCreate,
                Row::StreamCreateWithPriority,
                Row::StreamPriorityRange
            )]
            row: Row,
            #[values(CaptureMode::Global, CaptureMode::ThreadLocal, CaptureMode::Relaxed)]
            mode: CaptureMode,
        ) {
            let dev = $open();
            rules::check_row(&dev, row, mode, StreamKind::NonBlocking).unwrap();
            c::still_usable(&dev).unwrap();
        }

        /// The IPC calls a single process can make during a capture: exporting, opening its
        /// own handle and closing an address never opened (measured on the GPU; the
        /// simulator answers the same).
        #[rstest]
        fn capture_rules_ipc_row(
            #[values(Row::IpcExport, Row::IpcOpenOwn, Row::IpcCloseUnopened)] row: Row,
            #[values(CaptureMode::Global, CaptureMode::ThreadLocal, CaptureMode::Relaxed)]
            mode: CaptureMode,
        ) {
            let dev = $open();
            rules::check_row(&dev, row, mode, StreamKind::NonBlocking).unwrap();
            c::still_usable(&dev).unwrap();
        }

        /// Issue 44: where kernels see page-locked host memory, asked during a capture, and a
        /// store into it from the host (a kernel's give-up flag). Expected to answer as
        /// outside capture with no node; measured by the gpu suite's twin.
        #[rstest]
        fn capture_rules_host_flag_row(
            #[values(Row::HostDevicePtr)] row: Row,
            #[values(CaptureMode::Global, CaptureMode::ThreadLocal, CaptureMode::Relaxed)]
            mode: CaptureMode,
        ) {
            let dev = $open();
            rules::check_row(&dev, row, mode, StreamKind::NonBlocking).unwrap();
            c::still_usable(&dev).unwrap();
        }

        /// The H100 rows: synchronous calls on a blocking vs non-blocking capturing stream,
        /// frees of live memory, and cuBLAS with and without a reserved workspace.
        #[rstest]
        #[case(Row::MemsetD8, CaptureMode::Global, StreamKind::Blocking)]
        #[case(Row::MemcpyDtoD, CaptureMode::Global, StreamKind::Blocking)]
        #[case(Row::MemcpyHtoD, CaptureMode::Global, StreamKind::Blocking)]
        #[case(Row::MemcpyDtoD, CaptureMode::Global, StreamKind::NonBlocking)]
        #[case(Row::MemsetD8Async, CaptureMode::Global, StreamKind::Blocking)]
        #[case(Row::MemFreeLive, CaptureMode::Global, StreamKind::NonBlocking)]
        #[case(Row::MemFreeLive, CaptureMode::Relaxed, StreamKind::NonBlocking)]
        #[case(Row::GemmWithWorkspace, CaptureMode::Global, StreamKind::NonBlocking)]
        #[case(
            Row::GemmDefaultWorkspace,
            CaptureMode::Global,
            StreamKind::NonBlocking
        )]
        fn capture_rules_h100_row(
            #[case] row: Row,
            #[case] mode: CaptureMode,
            #[case] kind: StreamKind,
        ) {
            let dev = $open();
            rules::check_row(&dev, row, mode, kind).unwrap();
            c::still_usable(&dev).unwrap();
        }

        /// `cublasGemmStridedBatchedEx` (issue 42) with the workspace set: captured, in every
        /// mode. The node count is printed (`--nocapture`) for docs/capture-rules.md; the
        /// simulator assumes the Sgemm row's 2.
        #[rstest]
        #[allow(clippy::print_stderr)] // the measured node count belongs in the run's log
        fn capture_rules_gemm_ex_row(
            #[values(Row::GemmExTf32WithWorkspace, Row::GemmExBf16WithWorkspace)] row: Row,
            #[values(CaptureMode::Global, CaptureMode::ThreadLocal, CaptureMode::Relaxed)]
            mode: CaptureMode,
        ) {
            let dev = $open();
            let nodes = rules::check_row_nodes(&dev, row, mode, StreamKind::NonBlocking).unwrap();
            eprintln!("{row:?} in {mode:?}: {nodes:?} nodes");
            c::still_usable(&dev).unwrap();
        }

        #[rstest]
        fn pinned_lend_fill_upload_refill(#[values(1, 1023, 600_001)] words: usize) {
            crate::pinned::lend_fill_upload_refill(&$open(), words).unwrap();
        }

        /// A pinned loan while the stream is captured: measured on the GPU, mirrored here.
        #[test]
        fn pinned_lend_during_capture() {
            crate::pinned::lend_during_capture(&$open()).unwrap();
        }

        #[rstest]
        fn memory_node_relaunch(#[values(false, true)] auto_free: bool) {
            let dev = $open();
            rules::memory_node_relaunch(&dev, auto_free).unwrap();
            c::still_usable(&dev).unwrap();
        }
    };
}

/// The suite on the simulated driver (always).
mod mock {
    fn open() -> zdevice::MockDevice {
        zdevice::MockDevice::open(
            zdevice::SimDriver::default(),
            zdevice::DeviceConfig::default(),
        )
        .expect("the simulated device opens")
    }
    conformance_suite!(open);
}

/// The suite on the real CUDA device (the `gpu` feature; fails when there is no GPU).
#[cfg(feature = "gpu")]
mod gpu {
    #[allow(clippy::print_stderr)] // the device name belongs in the GPU run's log
    fn open() -> zdevice::Device<zdevice::CudaDriver> {
        let driver = zdevice::CudaDriver::load().expect("the CUDA driver loads on a GPU machine");
        let dev = zdevice::Device::open(driver, zdevice::DeviceConfig::default())
            .expect("CUDA device 0 opens");
        eprintln!("device: {}", dev.info().name);
        dev
    }
    conformance_suite!(open);

    /// A capture ends from its own thread on the real driver, and body plus end are judged
    /// against the sync deadline (the mock twin is `capture_end::end_deadline_counts_body_and_end_on_the_mock`).
    #[test]
    fn capture_end_deadline_counts_body_and_end() {
        crate::capture_end::end_deadline_counts_body_and_end(|config| {
            let driver = zdevice::CudaDriver::load().expect("the CUDA driver loads");
            zdevice::Device::open(driver, config).expect("CUDA device 0 opens")
        })
        .unwrap();
    }
}
