//! Opening the CUDA libraries at run time, with typed errors instead of panics.

use std::path::PathBuf;
use std::sync::OnceLock;

use crate::names::{CUBLAS_SYMBOLS, CUBLASLT_SYMBOLS, DRIVER_SYMBOLS, NCCL_SYMBOLS, NVRTC_SYMBOLS};
use crate::{cublas::Cublas, cublaslt::CublasLt, driver::Cuda, nccl::Nccl, nvrtc::Nvrtc};

/// Environment variable naming a folder searched before the system loader's paths.
pub const LIB_DIR_ENV: &str = "ZGPU_CUDA_LIB_DIR";

/// Environment variable naming a folder searched for NCCL before the system loader's paths
/// (NCCL ships apart from the toolkit: a PyTorch wheel's `nvidia/nccl/lib`, say).
pub const NCCL_LIB_DIR_ENV: &str = "ZGPU_NCCL_LIB_DIR";

/// A CUDA library or symbol could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// No candidate path could be opened.
    #[error("could not load {library}: tried {}", tried.join(", "))]
    LibraryNotFound {
        /// Which library (e.g. `libcuda`).
        library: &'static str,
        /// Every path tried, with the loader's reason.
        tried: Vec<String>,
    },
    /// The library opened but lacks a symbol.
    #[error("{library} at {path} has no symbol {symbol}")]
    MissingSymbol {
        /// Which library.
        library: &'static str,
        /// The path that was opened.
        path: String,
        /// The missing symbol.
        symbol: String,
    },
}

/// The libraries this crate binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LibraryKind {
    /// The driver API, `libcuda`.
    Cuda,
    /// The run-time compiler, `libnvrtc`.
    Nvrtc,
    /// `libcublas`.
    Cublas,
    /// `libcublasLt`.
    CublasLt,
    /// The collective library, `libnccl`.
    Nccl,
}

impl LibraryKind {
    /// The library's name in errors (`libcuda`).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            LibraryKind::Cuda => "libcuda",
            LibraryKind::Nvrtc => "libnvrtc",
            LibraryKind::Cublas => "libcublas",
            LibraryKind::CublasLt => "libcublasLt",
            LibraryKind::Nccl => "libnccl",
        }
    }

    /// File names to look for, most specific first (the CUDA 13 soname, then the dev symlink).
    #[must_use]
    pub fn sonames(self) -> &'static [&'static str] {
        match self {
            LibraryKind::Cuda => &["libcuda.so.1", "libcuda.so"],
            LibraryKind::Nvrtc => &["libnvrtc.so.13", "libnvrtc.so"],
            LibraryKind::Cublas => &["libcublas.so.13", "libcublas.so"],
            LibraryKind::CublasLt => &["libcublasLt.so.13", "libcublasLt.so"],
            LibraryKind::Nccl => &["libnccl.so.2", "libnccl.so"],
        }
    }

    /// Every symbol the bindings resolve from this library.
    #[must_use]
    pub fn symbols(self) -> &'static [&'static str] {
        match self {
            LibraryKind::Cuda => DRIVER_SYMBOLS,
            LibraryKind::Nvrtc => NVRTC_SYMBOLS,
            LibraryKind::Cublas => CUBLAS_SYMBOLS,
            LibraryKind::CublasLt => CUBLASLT_SYMBOLS,
            LibraryKind::Nccl => NCCL_SYMBOLS,
        }
    }

    /// The environment variable naming the folder searched first for this library.
    #[must_use]
    pub fn lib_dir_env(self) -> &'static str {
        match self {
            LibraryKind::Nccl => NCCL_LIB_DIR_ENV,
            _ => LIB_DIR_ENV,
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A generated library struct ([`Cuda`], [`Nvrtc`], [`Cublas`], [`CublasLt`]).
pub trait Api: sealed::Sealed + Sized + Send + Sync + 'static {
    /// Which library it binds.
    const KIND: LibraryKind;
    /// Resolves every symbol from an opened library.
    #[doc(hidden)]
    fn resolve(library: libloading::Library) -> Result<Self, libloading::Error>;
}

macro_rules! api {
    ($ty:ty, $kind:expr) => {
        impl sealed::Sealed for $ty {}
        impl Api for $ty {
            const KIND: LibraryKind = $kind;
            fn resolve(library: libloading::Library) -> Result<Self, libloading::Error> {
                // SAFETY: the generated struct types each symbol with the signature from the pinned
                // 13.0 header; the library is the one named by KIND, whose exports keep those
                // signatures across 13.x (NVIDIA versions changed signatures as `_v2` symbols).
                unsafe { <$ty>::from_library(library) }
            }
        }
    };
}
api!(Cuda, LibraryKind::Cuda);
api!(Nvrtc, LibraryKind::Nvrtc);
api!(Cublas, LibraryKind::Cublas);
api!(CublasLt, LibraryKind::CublasLt);

// NCCL's own impl: its exports keep their signatures across 2.x (new behaviour comes as new
// symbols or config fields), which is what makes resolving them from a newer 2.28 sound.
impl sealed::Sealed for Nccl {}
impl Api for Nccl {
    const KIND: LibraryKind = LibraryKind::Nccl;
    fn resolve(library: libloading::Library) -> Result<Self, libloading::Error> {
        // SAFETY: the generated struct types each symbol with the signature from the pinned
        // nccl.h 2.28.3; NCCL keeps the C signatures of these calls stable across 2.x.
        unsafe { Nccl::from_library(library) }
    }
}

/// Paths to try, in order: each of `search_dirs` joined with each soname, then the bare sonames
/// (which the system loader resolves through its own search path).
#[must_use]
pub fn search_candidates(search_dirs: &[PathBuf], sonames: &[&str]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = search_dirs
        .iter()
        .flat_map(|d| sonames.iter().map(move |s| d.join(s)))
        .collect();
    out.extend(sonames.iter().map(PathBuf::from));
    out
}

/// Opens the first candidate that loads and resolves every symbol of `A` from it.
///
/// A library that opens but lacks a symbol is reported at once rather than skipped: an old driver
/// found first is a problem to fix, not to hide behind another copy.
pub fn load_library<A: Api>(candidates: &[PathBuf]) -> Result<A, LoadError> {
    let kind = A::KIND;
    let mut tried = Vec::with_capacity(candidates.len());
    for path in candidates {
        // SAFETY: opening a shared library runs its initialisers. The candidates are the CUDA
        // libraries named by `kind` (or a folder the user chose for them), whose initialisers
        // have no preconditions on the caller.
        let library = match unsafe { libloading::Library::new(path) } {
            Ok(lib) => lib,
            Err(e) => {
                tried.push(format!("{} ({e})", path.display()));
                continue;
            }
        };
        let shown = path.display().to_string();
        for symbol in kind.symbols() {
            // SAFETY: only the symbol's presence is checked; the pointer is not called or read.
            let found = unsafe { library.get::<*const std::ffi::c_void>(symbol.as_bytes()) };
            if found.is_err() {
                return Err(LoadError::MissingSymbol {
                    library: kind.name(),
                    path: shown,
                    symbol: (*symbol).to_string(),
                });
            }
        }
        tracing::debug!(library = kind.name(), path = %shown, "loaded");
        return A::resolve(library).map_err(|e| LoadError::MissingSymbol {
            library: kind.name(),
            path: shown,
            symbol: e.to_string(),
        });
    }
    Err(LoadError::LibraryNotFound {
        library: kind.name(),
        tried,
    })
}

/// The candidates for `kind` in the standard order: the folder in its variable
/// ([`LibraryKind::lib_dir_env`]) first, then the sonames.
fn default_candidates(kind: LibraryKind) -> Vec<PathBuf> {
    let dirs: Vec<PathBuf> = std::env::var_os(kind.lib_dir_env())
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .into_iter()
        .collect();
    search_candidates(&dirs, kind.sonames())
}

fn memoised<A: Api>(
    cell: &'static OnceLock<Result<A, LoadError>>,
) -> Result<&'static A, LoadError> {
    cell.get_or_init(|| load_library::<A>(&default_candidates(A::KIND)))
        .as_ref()
        .map_err(Clone::clone)
}

/// The driver API, opened once per process.
pub fn cuda() -> Result<&'static Cuda, LoadError> {
    static CELL: OnceLock<Result<Cuda, LoadError>> = OnceLock::new();
    memoised(&CELL)
}

/// NVRTC, opened once per process.
pub fn nvrtc() -> Result<&'static Nvrtc, LoadError> {
    static CELL: OnceLock<Result<Nvrtc, LoadError>> = OnceLock::new();
    memoised(&CELL)
}

/// cuBLAS, opened once per process.
pub fn cublas() -> Result<&'static Cublas, LoadError> {
    static CELL: OnceLock<Result<Cublas, LoadError>> = OnceLock::new();
    memoised(&CELL)
}

/// cuBLASLt, opened once per process.
pub fn cublas_lt() -> Result<&'static CublasLt, LoadError> {
    static CELL: OnceLock<Result<CublasLt, LoadError>> = OnceLock::new();
    memoised(&CELL)
}

/// NCCL, opened once per process (`$ZGPU_NCCL_LIB_DIR` first, then `libnccl.so.2`).
pub fn nccl() -> Result<&'static Nccl, LoadError> {
    static CELL: OnceLock<Result<Nccl, LoadError>> = OnceLock::new();
    memoised(&CELL)
}
