//! NumPy's `.npy` (one array) and `.npz` (a zip of them, as `np.savez` and
//! `np.savez_compressed` write): the features `x` `[N, S, F]` and the labels `y` `[N]` or `[N, 1]`
//! (`[N, K]` for a task of `K` target values).
//!
//! The `.npy` header is read here (a magic string, a version, and a Python dict literal with
//! `descr`, `fortran_order` and `shape`): a small, fully checked reader rather than a crate
//! that parses Python literals in general. Numeric dtypes of either byte order are read
//! (`f4`, `f8`, signed and unsigned integers, `b1`), in C or Fortran order.

use std::io::Read as _;
use std::path::Path;

use super::Dataset;
use super::elements::{Array, Elem};
use super::labels::Labels;
use super::table::Fault;
use crate::error::{DataError, DataPlace, DataProblem, TrainError};

const MAGIC: &[u8] = b"\x93NUMPY";
pub(crate) const NPY: &str = "NumPy .npy";
pub(crate) const NPZ: &str = "NumPy .npz";

/// What a `.npy` header says: the element type, shape and order, where the data starts and
/// how many bytes of it the shape holds.
pub(crate) struct Header {
    pub elem: Elem,
    pub shape: Vec<usize>,
    pub fortran: bool,
    pub start: usize,
    pub bytes: usize,
}

/// The header at the start of `bytes` (of array `name`): the header alone need be there.
pub(crate) fn header(bytes: &[u8], name: &str) -> Result<Header, Fault> {
    let at = || DataPlace::Array(name.to_string());
    let corrupt = |detail: String| Fault::new(at(), DataProblem::Corrupt { detail });
    if !bytes.starts_with(MAGIC) {
        return Err(Fault::new(
            DataPlace::File,
            DataProblem::NotThisFormat { expected: NPY },
        ));
    }
    let (len, start) = match bytes.get(6) {
        Some(1) => (
            bytes
                .get(8..10)
                .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize),
            10,
        ),
        Some(2 | 3) => (
            bytes
                .get(8..12)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize),
            12,
        ),
        Some(v) => return Err(corrupt(format!("unknown .npy version {v}"))),
        None => return Err(truncated(at(), 10, bytes.len())),
    };
    let len = len.ok_or_else(|| truncated(at(), start as u64, bytes.len()))?;
    let header = bytes
        .get(start..start + len)
        .ok_or_else(|| truncated(at(), (start + len) as u64, bytes.len()))?;
    let header =
        std::str::from_utf8(header).map_err(|_| corrupt("the header is not text".into()))?;
    let descr = dict_value(header, "descr")
        .and_then(quoted)
        .ok_or_else(|| corrupt(format!("no `descr` string in the header {header:?}")))?;
    let elem = Elem::from_numpy(descr).ok_or_else(|| {
        Fault::new(
            at(),
            DataProblem::NotNumeric {
                found: format!("dtype `{descr}`"),
            },
        )
    })?;
    let fortran = match dict_value(header, "fortran_order").map(str::trim) {
        Some(v) if v.starts_with("True") => true,
        Some(v) if v.starts_with("False") => false,
        _ => {
            return Err(corrupt(format!(
                "no `fortran_order` in the header {header:?}"
            )));
        }
    };
    let shape = dict_value(header, "shape")
        .and_then(tuple)
        .ok_or_else(|| corrupt(format!("no `shape` tuple in the header {header:?}")))?;
    let count = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .and_then(|n| n.checked_mul(elem.size()))
        .ok_or_else(|| corrupt(format!("shape {shape:?} is too large")))?;
    Ok(Header {
        elem,
        shape,
        fortran,
        start: start + len,
        bytes: count,
    })
}

/// One array read from `.npy` bytes: its element type, shape, order and data.
fn parse(bytes: &[u8], name: &str) -> Result<Array, Fault> {
    let at = || DataPlace::Array(name.to_string());
    let corrupt = |detail: String| Fault::new(at(), DataProblem::Corrupt { detail });
    let Header {
        elem,
        shape,
        fortran,
        start,
        bytes: count,
    } = header(bytes, name)?;
    let data = &bytes[start..];
    if data.len() < count {
        return Err(truncated(at(), count as u64, data.len()));
    }
    if data.len() > count {
        return Err(corrupt(format!(
            "{} bytes after the {count} bytes of data its shape {shape:?} holds",
            data.len() - count
        )));
    }
    Ok(Array {
        elem,
        shape,
        fortran,
        data: data.to_vec(),
    })
}

pub(crate) fn truncated(place: DataPlace, expected: u64, found: usize) -> Fault {
    Fault::new(
        place,
        DataProblem::Truncated {
            expected,
            found: found as u64,
        },
    )
}

/// The text after `'key':` in the header dict, up to the end of the dict.
fn dict_value<'h>(header: &'h str, key: &str) -> Option<&'h str> {
    let at = header
        .find(&format!("'{key}'"))
        .or_else(|| header.find(&format!("\"{key}\"")))?;
    let rest = &header[at + key.len() + 2..];
    Some(rest.trim_start().strip_prefix(':')?.trim_start())
}

/// The string literal at the start of `text`.
fn quoted(text: &str) -> Option<&str> {
    let q = text.chars().next().filter(|c| *c == '\'' || *c == '"')?;
    let rest = &text[1..];
    Some(&rest[..rest.find(q)?])
}

/// The tuple of integers at the start of `text`: `(3, 4)`, `(3,)`, `()`.
fn tuple(text: &str) -> Option<Vec<usize>> {
    let inner = text.strip_prefix('(')?;
    let inner = &inner[..inner.find(')')?];
    inner
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| t.trim_end_matches('L').parse().ok())
        .collect()
}

/// Reads the `.npy` array at `path` (named `name` in messages), no larger than `limit` bytes.
fn read_npy(path: &Path, name: &str, limit: u64) -> Result<(Array, Vec<u8>), TrainError> {
    let bytes = crate::files::read_bounded(
        path,
        "reading the data file",
        limit,
        super::formats::LIMIT_REASON,
    )?;
    let a = parse(&bytes, name).map_err(|f| f.in_file(path, NPY))?;
    Ok((a, bytes))
}

/// The data set of a pair of `.npy` files: features `x` and labels `y`, samples of `(scales,
/// features)`, both files together no larger than `limit` bytes (the bound of every format
/// read whole: `formats::load`). Returns it with the bytes of both (for the run's
/// fingerprint).
pub fn load_pair(
    x_path: &Path,
    y_path: &Path,
    (scales, features): (usize, usize),
    limit: u64,
    labels: Labels,
) -> Result<(Dataset, Vec<u8>), TrainError> {
    let (x, mut bytes) = read_npy(x_path, "x", limit)?;
    let left = limit.saturating_sub(bytes.len() as u64);
    let (y, y_bytes) = read_npy(y_path, "y", left)?;
    let (xs, ys) = super::elements::samples(&x, &y, scales, features, labels)
        .map_err(|(f, which)| f.in_file(if which == "y" { y_path } else { x_path }, NPY))?;
    bytes.extend_from_slice(&y_bytes);
    Ok((
        Dataset {
            scales,
            features,
            x: xs,
            y: ys,
        },
        bytes,
    ))
}

/// The data set of the `.npz` `bytes` read from `path`: arrays `x` and `y`.
pub fn load_npz(
    path: &Path,
    bytes: &[u8],
    scales: usize,
    features: usize,
    labels: Labels,
) -> Result<Dataset, TrainError> {
    let fail = |f: Fault| f.in_file(path, NPZ);
    if !(bytes.starts_with(b"PK\x03\x04") || bytes.starts_with(b"PK\x05\x06")) {
        return Err(fail(Fault::new(
            DataPlace::File,
            DataProblem::NotThisFormat { expected: NPZ },
        )));
    }
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(bytes))
        .map_err(|e| corrupt_with(path, DataPlace::File, e))?;
    let names: Vec<String> = zip
        .file_names()
        .filter_map(|n| n.ok().map(std::borrow::Cow::into_owned))
        .collect();
    let mut array = |name: &str| -> Result<Array, TrainError> {
        let entry = format!("{name}.npy");
        let mut file = zip.by_name(&entry).map_err(|e| match e {
            zip::result::ZipError::FileNotFound => fail(Fault::new(
                DataPlace::File,
                DataProblem::MissingArray {
                    name: name.to_string(),
                    found: names
                        .iter()
                        .map(|n| n.trim_end_matches(".npy").to_string())
                        .collect(),
                },
            )),
            e => corrupt_with(path, DataPlace::Array(name.to_string()), e),
        })?;
        let mut data = Vec::new();
        file.read_to_end(&mut data)
            .map_err(|e| corrupt_with(path, DataPlace::Array(name.to_string()), e))?;
        parse(&data, name).map_err(fail)
    };
    let x = array("x")?;
    let y = array("y")?;
    let (xs, ys) =
        super::elements::samples(&x, &y, scales, features, labels).map_err(|(f, _)| fail(f))?;
    Ok(Dataset {
        scales,
        features,
        x: xs,
        y: ys,
    })
}

fn corrupt_with(
    path: &Path,
    place: DataPlace,
    e: impl std::error::Error + Send + Sync + 'static,
) -> TrainError {
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

/// `.npy` bytes of a C-order float32 array (what `np.save` writes): for tests and the
/// example files.
#[must_use]
pub fn npy_f32(shape: &[usize], values: &[f32]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let shape_text = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape_text}, }}");
    // Data starts at a multiple of 64 bytes; the header ends with a newline.
    let total = (10 + header.len() + 1).div_ceil(64) * 64;
    header.push_str(&" ".repeat(total - 10 - header.len() - 1));
    header.push('\n');
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::synthetic;

    fn pair(d: &Dataset) -> (Vec<u8>, Vec<u8>) {
        (
            npy_f32(&[d.len(), d.scales, d.features], &d.x),
            npy_f32(&[d.len()], &d.y),
        )
    }

    #[test]
    fn a_pair_of_npy_files_is_the_csv_data_set() {
        let d = synthetic::generate(9, 2, 3, 4);
        let dir = tempfile::tempdir().expect("tempdir");
        let (x, y) = pair(&d);
        std::fs::write(dir.path().join("x.npy"), x).expect("x");
        std::fs::write(dir.path().join("y.npy"), y).expect("y");
        let (back, _) = load_pair(
            &dir.path().join("x.npy"),
            &dir.path().join("y.npy"),
            (2, 3),
            u64::MAX,
            crate::data::labels::Labels::BINARY,
        )
        .expect("loads");
        assert_eq!(back, d);
    }

    /// The pair is bounded as every format read whole is: both files together, the file
    /// that passes the bound named.
    #[test]
    fn a_pair_larger_than_the_limit_is_refused_naming_the_file() {
        let d = synthetic::generate(9, 2, 3, 4);
        let dir = tempfile::tempdir().expect("tempdir");
        let (x, y) = pair(&d);
        let (xn, yn) = (x.len() as u64, y.len() as u64);
        let (xp, yp) = (dir.path().join("x.npy"), dir.path().join("y.npy"));
        std::fs::write(&xp, x).expect("x");
        std::fs::write(&yp, y).expect("y");
        assert!(
            load_pair(
                &xp,
                &yp,
                (2, 3),
                xn + yn,
                crate::data::labels::Labels::BINARY
            )
            .is_ok(),
            "exactly the limit"
        );
        // (the limit, the file refused, the bound it was read under: what the first left)
        for (limit, named, bound) in [(xn - 1, &xp, xn - 1), (xn + yn - 1, &yp, yn - 1)] {
            let e = load_pair(&xp, &yp, (2, 3), limit, crate::data::labels::Labels::BINARY)
                .unwrap_err();
            let TrainError::TooLarge { path, limit: l, .. } = &e else {
                panic!("{e:?}")
            };
            assert_eq!((path, *l), (named, bound), "{e}");
            assert!(e.to_string().contains("available memory"), "{e}");
        }
    }

    #[test]
    fn headers_of_numpy_versions_and_orders_parse() {
        assert_eq!(tuple("(3, 4), }"), Some(vec![3, 4]));
        assert_eq!(tuple("(3,), }"), Some(vec![3]));
        assert_eq!(tuple("()"), Some(vec![]));
        assert_eq!(quoted("'<f4', 'x'"), Some("<f4"));
        let h = "{'descr': '>f8', 'fortran_order': True, 'shape': (2, 3), }";
        assert_eq!(dict_value(h, "descr").and_then(quoted), Some(">f8"));
        assert!(dict_value(h, "fortran_order").is_some_and(|v| v.starts_with("True")));
    }

    #[test]
    fn a_fortran_order_array_is_read_in_its_order() {
        // [[1, 2, 3], [4, 5, 6]] stored column-major: 1 4 2 5 3 6.
        let mut fixed = npy_f32(&[2, 3], &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
        let at = fixed
            .windows(5)
            .position(|w| w == b"False")
            .expect("header");
        fixed[at..at + 5].copy_from_slice(b"True ");
        let a = parse(&fixed, "x").expect("parses");
        assert!(a.fortran);
        let values: Vec<f64> = (0..6).map(|i| a.get_c(i).unwrap_or(f64::NAN)).collect();
        assert_eq!(values, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    }

    #[test]
    fn a_truncated_npy_says_how_much_is_missing() {
        let bytes = npy_f32(&[4, 2], &[0.0; 8]);
        let cut = &bytes[..bytes.len() - 5];
        let e = parse(cut, "x").unwrap_err();
        assert_eq!(
            e.problem,
            DataProblem::Truncated {
                expected: 32,
                found: 27
            }
        );
        let e = parse(&bytes[..9], "x").unwrap_err();
        assert!(matches!(e.problem, DataProblem::Truncated { .. }), "{e:?}");
        let e = parse(b"x,y\n1,0\n", "x").unwrap_err();
        assert_eq!(e.problem, DataProblem::NotThisFormat { expected: NPY });
    }
}
