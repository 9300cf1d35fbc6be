//! The loader reports what it tried instead of panicking.

use std::path::PathBuf;

use cuda_sys::{LibraryKind, LoadError, driver::Cuda, load_library, search_candidates};

#[test]
fn missing_library_lists_every_path_tried() {
    let dir = tempfile::tempdir().expect("temp dir");
    let sonames = ["libcuda-does-not-exist.so.99", "libcuda-does-not-exist.so"];
    let candidates = search_candidates(&[dir.path().to_path_buf()], &sonames);
    assert_eq!(
        candidates.len(),
        4,
        "two in the folder, then two bare sonames"
    );

    let err = load_library::<Cuda>(&candidates)
        .err()
        .expect("nothing can load");
    let LoadError::LibraryNotFound { library, tried } = &err else {
        panic!("expected LibraryNotFound, got {err:?}");
    };
    assert_eq!(*library, "libcuda");
    assert_eq!(tried.len(), 4);
    for (entry, candidate) in tried.iter().zip(&candidates) {
        assert!(
            entry.starts_with(&candidate.display().to_string()),
            "{entry} should name {}",
            candidate.display()
        );
        assert!(
            entry.contains('('),
            "{entry} should carry the loader's reason"
        );
    }
    assert!(err.to_string().contains("libcuda-does-not-exist.so.99"));
}

#[test]
fn a_library_without_the_symbols_is_missing_symbol() {
    // libm opens everywhere glibc does, and exports no cu* symbol.
    let candidates = [PathBuf::from("libm.so.6")];
    let err = load_library::<Cuda>(&candidates)
        .err()
        .expect("libm is not libcuda");
    match err {
        LoadError::MissingSymbol {
            library,
            path,
            symbol,
        } => {
            assert_eq!(library, "libcuda");
            assert_eq!(path, "libm.so.6");
            assert_eq!(symbol, LibraryKind::Cuda.symbols()[0]);
        }
        other => panic!("expected MissingSymbol, got {other:?}"),
    }
}

#[test]
fn candidates_search_folders_before_the_system_loader() {
    let dirs = [PathBuf::from("/a"), PathBuf::from("/b")];
    let got = search_candidates(&dirs, LibraryKind::Cublas.sonames());
    let want: Vec<PathBuf> = [
        "/a/libcublas.so.13",
        "/a/libcublas.so",
        "/b/libcublas.so.13",
        "/b/libcublas.so",
        "libcublas.so.13",
        "libcublas.so",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    assert_eq!(got, want);
}

#[test]
fn every_kind_binds_the_calls_the_workspace_makes() {
    let driver = LibraryKind::Cuda.symbols();
    for s in [
        "cuInit",
        "cuMemAlloc_v2",
        "cuStreamBeginCapture_v2",
        "cuGraphInstantiateWithFlags",
        "cuIpcGetMemHandle",
        "cuIpcOpenMemHandle_v2",
        "cuIpcCloseMemHandle",
    ] {
        assert!(driver.contains(&s), "{s} missing from the driver allowlist");
    }
    assert!(
        LibraryKind::Cublas
            .symbols()
            .contains(&"cublasSgemmStridedBatched")
    );
    assert!(
        LibraryKind::Nvrtc
            .symbols()
            .contains(&"nvrtcCompileProgram")
    );
    assert!(LibraryKind::CublasLt.symbols().contains(&"cublasLtCreate"));
}

/// Legacy CUDA IPC: the handle is the header's 64 bytes, and the one open flag its value.
#[test]
fn ipc_types_match_the_header() {
    use cuda_sys::driver::{CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, CUipcMemHandle};
    assert_eq!(std::mem::size_of::<CUipcMemHandle>(), 64);
    assert!(
        CUipcMemHandle::default().reserved.iter().all(|&b| b == 0),
        "a default handle is zeroed"
    );
    assert_eq!(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, 1);
}
