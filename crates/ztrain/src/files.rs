//! The files a run reads and writes, handled so that no option can destroy data.
//!
//! - Outputs (`--checkpoint`, `--memory-report`, `--soak-report`) are checked before any
//!   training: an output that exists and is not a regular file (a symlink, a device node, a
//!   folder, a pipe), that is the `--data` file, or that is another output is refused, and the
//!   folder of every output must take a new file (the probe creates and removes `FILE.tmp`).
//!   `--checkpoint X --resume X` is legal (the run continues its own checkpoint);
//!   `--memory-report` onto the `--resume` file is not.
//! - Every output is written atomically ([`write_atomically`]): `FILE.tmp` beside it, synced,
//!   its folder synced, then renamed over `FILE` and the folder synced again. A failed write
//!   (a full disk) removes the `.tmp` and leaves the previous `FILE` as it was.
//! - Inputs are read once, through one open file, with a bound on how much is read
//!   ([`read_bounded`]): a FIFO, `/dev/stdin` or `<(…)` works, and `/dev/zero` cannot fill
//!   memory.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use crate::error::{Result, TrainError};

/// A file named on the command line: the option that named it and its path.
#[derive(Clone, Copy, Debug)]
pub struct Named<'a> {
    pub option: &'static str,
    pub path: &'a Path,
}

/// `file.safetensors` -> `file.safetensors.tmp` in the same folder (so the rename stays on one
/// file system and is atomic).
#[must_use]
pub fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

/// The folder a path's file lives in (`.` for a bare file name).
fn folder_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// What identifies a file: (device, inode) where it exists, else its folder's canonical path
/// and its name (two outputs not yet written may still name the same file).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Identity {
    Inode(u64, u64),
    Planned(PathBuf),
}

fn identity(path: &Path) -> Option<Identity> {
    if let Ok(m) = std::fs::metadata(path) {
        use std::os::unix::fs::MetadataExt as _;
        return Some(Identity::Inode(m.dev(), m.ino()));
    }
    let folder = std::fs::canonicalize(folder_of(path)).ok()?;
    Some(Identity::Planned(folder.join(path.file_name()?)))
}

fn refuse(o: Named<'_>, reason: String) -> TrainError {
    TrainError::Output {
        option: o.option,
        path: o.path.to_path_buf(),
        reason,
    }
}

/// Checks `outputs` against each other and against `inputs` (see the module docs), and that
/// each output's folder takes a new file. `may_overwrite`: (output option, input option) pairs
/// that may name the same file (`--checkpoint`, `--resume`).
pub fn check_outputs(
    outputs: &[Named<'_>],
    inputs: &[Named<'_>],
    may_overwrite: &[(&str, &str)],
) -> Result<()> {
    for (i, o) in outputs.iter().enumerate() {
        for p in [o.path.to_path_buf(), temp_path(o.path)] {
            if let Ok(m) = std::fs::symlink_metadata(&p)
                && !m.file_type().is_file()
            {
                return Err(refuse(
                    *o,
                    format!(
                        "{} exists and is not a regular file (a symlink, device, folder or pipe is never replaced); choose another path",
                        p.display()
                    ),
                ));
            }
        }
        let me = identity(o.path);
        for input in inputs {
            if me.is_some()
                && identity(input.path) == me
                && !may_overwrite.contains(&(o.option, input.option))
            {
                return Err(refuse(
                    *o,
                    format!(
                        "is the {} file {}; writing it would destroy that input",
                        input.option,
                        input.path.display()
                    ),
                ));
            }
        }
        for other in &outputs[..i] {
            if me.is_some() && identity(other.path) == me {
                return Err(refuse(
                    *o,
                    format!(
                        "is also the {} file; give each output its own path",
                        other.option
                    ),
                ));
            }
        }
        probe_writable(*o)?;
    }
    Ok(())
}

/// Creates and removes `FILE.tmp`: the folder exists and takes a new file.
fn probe_writable(o: Named<'_>) -> Result<()> {
    let tmp = temp_path(o.path);
    let created = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp);
    match created {
        Ok(f) => {
            drop(f);
            let _ = std::fs::remove_file(&tmp);
            Ok(())
        }
        Err(e) => Err(refuse(
            o,
            format!(
                "cannot create a file in {} ({e}); nothing was trained",
                folder_of(o.path).display()
            ),
        )),
    }
}

/// Writes `bytes` to `path` atomically (see the module docs).
pub fn write_atomically(path: &Path, what: &'static str, bytes: &[u8]) -> Result<()> {
    write_atomically_with(path, what, bytes, |f, b| f.write_all(b))
}

/// [`write_atomically`] with the write itself passed in (tests inject a full disk).
pub fn write_atomically_with(
    path: &Path,
    what: &'static str,
    bytes: &[u8],
    write: impl FnOnce(&mut File, &[u8]) -> io::Result<()>,
) -> Result<()> {
    let tmp = temp_path(path);
    let err = |p: &Path| {
        let p = p.to_path_buf();
        move |source| TrainError::Io {
            what,
            path: p,
            source,
        }
    };
    let written = (|| {
        let mut f = File::create(&tmp)?;
        write(&mut f, bytes)?;
        f.sync_all()?;
        sync_folder(&tmp)
    })();
    if let Err(e) = written {
        // The previous file stays; the partial one goes.
        let _ = std::fs::remove_file(&tmp);
        return Err(err(&tmp)(e));
    }
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(err(path)(e));
    }
    sync_folder(path).map_err(err(path))
}

/// Makes the folder's entries (the new file, the rename) durable.
fn sync_folder(path: &Path) -> io::Result<()> {
    File::open(folder_of(path))?.sync_all()
}

/// Reads the whole of `path` through one open file, refusing more than `limit` bytes (the
/// error names `limit_reason`). Works on pipes and character devices.
pub fn read_bounded(
    path: &Path,
    what: &'static str,
    limit: u64,
    limit_reason: &str,
) -> Result<Vec<u8>> {
    let io = |source| TrainError::Io {
        what,
        path: path.to_path_buf(),
        source,
    };
    let f = File::open(path).map_err(io)?;
    let mut bytes = Vec::new();
    f.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > limit {
        return Err(TrainError::TooLarge {
            what,
            path: path.to_path_buf(),
            limit,
            reason: limit_reason.to_string(),
        });
    }
    Ok(bytes)
}

#[cfg(test)]
#[path = "files_tests.rs"]
mod tests;
