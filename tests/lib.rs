//! Cross-crate scenario tests live in `it/`.
