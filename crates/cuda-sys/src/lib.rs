//! Raw CUDA bindings (placeholder while the generated bindings land).

/// A CUDA library or symbol could not be loaded.
#[derive(Debug, Clone, thiserror::Error)]
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

/// The CUDA name of a `CUresult`.
pub fn cu_result_name(code: u32) -> &'static str {
    match code {
        0 => "CUDA_SUCCESS",
        _ => "CUDA_ERROR_<unknown>",
    }
}
