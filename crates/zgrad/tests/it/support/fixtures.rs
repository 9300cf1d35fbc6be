//! Where the PyTorch oracle fixtures (`tests/fixtures` at the workspace root) are. Looked up at
//! run time too, because test binaries copied to another machine (the GPU bundle) do not find
//! the path known at compile time: `ZGPU_FIXTURES` if set, else `tests/fixtures` in the current
//! folder or any parent of it, else the compile-time path.

use std::path::PathBuf;

pub fn fixture(name: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os("ZGPU_FIXTURES") {
        return PathBuf::from(dir).join(name);
    }
    if let Ok(cwd) = std::env::current_dir() {
        for dir in cwd.ancestors() {
            let candidate = dir.join("tests/fixtures").join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}
