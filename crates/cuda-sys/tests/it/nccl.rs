//! NCCL is opened like the CUDA libraries: from its own folder variable first, and a missing
//! library or symbol is a typed `LoadError`, never a panic.

use std::path::PathBuf;

use cuda_sys::{
    LibraryKind, LoadError, NCCL_LIB_DIR_ENV, load_library, nccl::Nccl, nccl_result_name,
    search_candidates,
};

#[test]
fn nccl_from_an_empty_folder_is_library_not_found() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Only the folder's candidates: the bare sonames would reach a system NCCL where one exists.
    let candidates: Vec<PathBuf> = LibraryKind::Nccl
        .sonames()
        .iter()
        .map(|s| dir.path().join(s))
        .collect();
    let err = load_library::<Nccl>(&candidates)
        .err()
        .expect("an empty folder holds no NCCL");
    let LoadError::LibraryNotFound { library, tried } = &err else {
        panic!("expected LibraryNotFound, got {err:?}");
    };
    assert_eq!(*library, "libnccl");
    assert_eq!(tried.len(), 2, "{tried:?}");
    assert!(tried[0].starts_with(&dir.path().join("libnccl.so.2").display().to_string()));
    assert!(err.to_string().contains("libnccl"), "{err}");
}

#[test]
fn a_library_without_nccl_symbols_is_missing_symbol() {
    let err = load_library::<Nccl>(&[PathBuf::from("libm.so.6")])
        .err()
        .expect("libm is not NCCL");
    match err {
        LoadError::MissingSymbol {
            library, symbol, ..
        } => {
            assert_eq!(library, "libnccl");
            assert_eq!(
                symbol, "ncclGetVersion",
                "the first symbol of the allowlist"
            );
        }
        other => panic!("expected MissingSymbol, got {other:?}"),
    }
}

#[test]
fn nccl_has_its_own_folder_variable_and_sonames() {
    assert_eq!(LibraryKind::Nccl.lib_dir_env(), NCCL_LIB_DIR_ENV);
    assert_eq!(NCCL_LIB_DIR_ENV, "ZGPU_NCCL_LIB_DIR");
    assert_eq!(LibraryKind::Cuda.lib_dir_env(), cuda_sys::LIB_DIR_ENV);
    let got = search_candidates(&[PathBuf::from("/w")], LibraryKind::Nccl.sonames());
    let want: Vec<PathBuf> = [
        "/w/libnccl.so.2",
        "/w/libnccl.so",
        "libnccl.so.2",
        "libnccl.so",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    assert_eq!(got, want);
}

#[test]
fn nccl_binds_every_call_a_communicator_makes() {
    let symbols = LibraryKind::Nccl.symbols();
    for s in [
        "ncclGetVersion",
        "ncclGetUniqueId",
        "ncclCommInitRankConfig",
        "ncclCommFinalize",
        "ncclCommDestroy",
        "ncclCommAbort",
        "ncclCommGetAsyncError",
        "ncclAllReduce",
        "ncclBroadcast",
        "ncclGetErrorString",
        "ncclGetLastError",
    ] {
        assert!(symbols.contains(&s), "{s} missing from the NCCL allowlist");
    }
    assert_eq!(
        cuda_sys::nccl::NCCL_VERSION_CODE,
        22803,
        "pinned nccl.h 2.28.3"
    );
    assert_eq!(cuda_sys::nccl::NCCL_UNIQUE_ID_BYTES, 128);
}

#[test]
fn nccl_results_keep_their_names() {
    assert_eq!(nccl_result_name(0), "ncclSuccess");
    assert_eq!(nccl_result_name(6), "ncclRemoteError");
    assert_eq!(nccl_result_name(7), "ncclInProgress");
    assert_eq!(nccl_result_name(99), "ncclResult_<unknown>");
}
