//! `--stream` of a NumPy `.npz` (arrays `x` and `y`, as `npy::load_npz` reads them): a zip
//! whose members are stored as they are (`np.savez`) holds each `.npy` at a known offset of
//! the file, so its rows are read by position as a `.npy` pair's are (`stream`). A member
//! deflated (`np.savez_compressed`) has no row at a known offset: refused, saying to save it
//! with `np.savez` or drop `--stream`.

use std::path::Path;

use zip::CompressionMethod;

use super::elements::sample_count;
use super::labels::Labels;
use super::npy::NPZ;
use super::stream::{Streamed, column, fingerprint, npy_found, open, streamed};
use super::table::Fault;
use crate::error::{DataError, DataPlace, DataProblem, Result, TrainError};

/// A zip the reader refuses, at `place`.
fn corrupt(path: &Path, place: DataPlace, e: zip::result::ZipError) -> TrainError {
    TrainError::from(DataError {
        path: path.to_path_buf(),
        format: NPZ,
        place,
        problem: DataProblem::Corrupt {
            detail: e.to_string(),
        },
        source: Some(Box::new(e)),
    })
}

/// The samples of the `.npz` file `path`'s `x` and `y`, streamed; with the file's FNV-1a
/// fingerprint (the one reading it whole gives).
pub fn npz(path: &Path, scales: usize, features: usize, labels: Labels) -> Result<(Streamed, u64)> {
    let fail = |f: Fault| f.in_file(path, NPZ);
    let opened = open(path)?;
    let mut magic = [0u8; 4];
    let is_zip = std::os::unix::fs::FileExt::read_exact_at(&opened.0, &mut magic, 0).is_ok()
        && (&magic == b"PK\x03\x04" || &magic == b"PK\x05\x06");
    if !is_zip {
        return Err(fail(Fault::new(
            DataPlace::File,
            DataProblem::NotThisFormat { expected: NPZ },
        )));
    }
    let reading = opened.0.try_clone().map_err(|source| TrainError::Io {
        what: "opening the data file to stream it (--stream)",
        path: path.to_path_buf(),
        source,
    })?;
    let mut zip = zip::ZipArchive::new(std::io::BufReader::new(reading))
        .map_err(|e| corrupt(path, DataPlace::File, e))?;
    let names: Vec<String> = zip
        .file_names()
        .filter_map(|n| n.ok().map(|n| n.trim_end_matches(".npy").to_string()))
        .collect();
    // Where each member's bytes start in the file, and how many there are.
    let mut member = |name: &str| -> Result<(u64, u64)> {
        let place = || DataPlace::Array(name.to_string());
        let entry = zip.by_name(&format!("{name}.npy")).map_err(|e| match e {
            zip::result::ZipError::FileNotFound => fail(Fault::new(
                DataPlace::File,
                DataProblem::MissingArray {
                    name: name.to_string(),
                    found: names.clone(),
                },
            )),
            e => corrupt(path, place(), e),
        })?;
        if entry.compression() != CompressionMethod::Stored {
            return Err(TrainError::Options(format!(
                "--stream reads an .npz's rows where they lie; array `{name}` of {} is compressed ({}: np.savez_compressed): save it with np.savez (stored members) or drop --stream",
                path.display(),
                entry.compression()
            )));
        }
        let start = entry.data_start().ok_or_else(|| {
            fail(Fault::new(
                place(),
                DataProblem::Corrupt {
                    detail: "its member's local header was not read".into(),
                },
            ))
        })?;
        Ok((start, entry.size()))
    };
    let (x_at, y_at) = (member("x")?, member("y")?);
    drop(zip);
    let xf = npy_found(&opened.0, path, NPZ, "x", x_at)?;
    let yf = npy_found(&opened.0, path, NPZ, "y", y_at)?;
    let n =
        sample_count(&xf.shape, &yf.shape, (scales, features), labels).map_err(|(f, _)| fail(f))?;
    let digest = fingerprint(&[path])?;
    let y_file = open(path)?;
    let x = column(path, NPZ, "x", opened, xf)?;
    let y = column(path, NPZ, "y", y_file, yf)?;
    Ok((streamed(x, y, (scales, features), n, labels), digest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{npy::npy_f32, synthetic};
    use std::io::Write as _;

    /// `d` as an `.npz` of stored members (`np.savez`) at `path`.
    fn savez(d: &crate::data::Dataset, path: &Path) {
        let mut z = zip::ZipWriter::new(std::fs::File::create(path).expect("create"));
        let stored =
            zip::write::SimpleFileOptions::default().compression_method(CompressionMethod::Stored);
        let x = npy_f32(&[d.len(), d.scales, d.features], &d.x);
        for (name, bytes) in [("x.npy", x), ("y.npy", npy_f32(&[d.len()], &d.y))] {
            z.start_file(name, stored).expect("entry");
            z.write_all(&bytes).expect("bytes");
        }
        z.finish().expect("finish");
    }

    #[test]
    fn stored_members_are_read_by_position_as_the_npz_read_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = synthetic::generate(9, 2, 3, 4);
        let path = dir.path().join("d.npz");
        savez(&d, &path);
        let (s, digest) = npz(&path, 2, 3, crate::data::labels::Labels::BINARY).expect("opens");
        let bytes = std::fs::read(&path).expect("read");
        assert_eq!(digest, crate::config::fnv1a(&bytes));
        let whole =
            crate::data::npy::load_npz(&path, &bytes, 2, 3, crate::data::labels::Labels::BINARY)
                .expect("loads");
        let (mut x, mut y) = (vec![0.0; 9 * 6], vec![0.0; 9]);
        s.copy_rows(&(0..9).rev().collect::<Vec<_>>(), &mut x, &mut y)
            .expect("reads");
        let rev: Vec<usize> = (0..9).rev().collect();
        assert_eq!((x, y), whole.gather(&rev));
    }

    #[test]
    fn wrong_shapes_and_a_file_changed_under_the_run_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = synthetic::generate(9, 2, 3, 4);
        let path = dir.path().join("d.npz");
        savez(&d, &path);
        let e = npz(&path, 3, 3, crate::data::labels::Labels::BINARY).unwrap_err();
        assert!(e.to_string().contains("d.npz"), "{e}");
        let (s, _) = npz(&path, 2, 3, crate::data::labels::Labels::BINARY).expect("opens");
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        file.set_modified(std::time::SystemTime::UNIX_EPOCH)
            .expect("set mtime");
        let e = s.copy(3, &mut [0.0; 6], &mut [0.0]).unwrap_err();
        let TrainError::Data(data) = &e else {
            panic!("{e:?}")
        };
        assert_eq!(data.place, DataPlace::Row(3));
        assert!(matches!(data.problem, DataProblem::Changed { .. }), "{e}");
        assert!(e.to_string().contains("d.npz"), "{e}");
    }
}
