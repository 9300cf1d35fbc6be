//! `--stream`: pre-cut samples left in their file and read as each batch is staged, so that
//! the host holds one batch of them whatever the file's size: by position in the formats
//! whose rows lie at known offsets, a pair of `.npy` files, an `.npz` of stored members
//! (`stream_npz`) and safetensors (`x` `[N, S, F]`, `y` `[N]`, `[N, 1]` or `[N, K]`, C
//! order); by row group in Parquet (`parquet_stream`), by record batch in Arrow IPC
//! (`arrow_stream`), and by a row index in CSV (`stream_csv`). Each row is read with `pread` (`FileExt::read_exact_at`,
//! no mmap: a file changed under a mapping would change the run's memory) and checked as the
//! loaders check it, so a streamed run trains bitwise as the same file read whole. A file
//! truncated or changed under the run (another length or modification time than at open) is
//! a typed error naming the file and the row.

use std::fs::File;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use super::arrow_stream::ArrowRows;
use super::elements::{Elem, sample_count};
use super::labels::Labels;
use super::parquet_stream::ParquetRows;
use super::stream_csv::CsvRows;
use super::table::{self, Fault};
use super::windows::Normalization;
use crate::error::{DataError, DataPlace, DataProblem, Result, TrainError};

/// The largest header read to find where the rows start.
const MAX_HEADER: u64 = 100 << 20;

/// One array in a file: where its rows start and what each holds.
#[derive(Debug)]
pub(super) struct Column {
    path: PathBuf,
    file: File,
    format: &'static str,
    elem: Elem,
    /// Byte offset of row 0, and elements per row.
    offset: u64,
    per: usize,
    /// The file's length and modification time when opened.
    len: u64,
    modified: Option<SystemTime>,
}

impl Column {
    /// Row `row`'s elements as `f64`, after checking that the file is as opened.
    fn read(&self, row: usize, out: &mut Vec<f64>) -> Result<()> {
        let fail = |problem: DataProblem, source: Option<std::io::Error>| {
            TrainError::from(DataError {
                path: self.path.clone(),
                format: self.format,
                place: DataPlace::Row(row),
                problem,
                source: source.map(|e| Box::new(e) as _),
            })
        };
        unchanged(&self.file, self.len, self.modified).map_err(|(p, e)| fail(p, e))?;
        let size = self.elem.size();
        let mut bytes = vec![0u8; self.per * size];
        let at = self.offset + (row * self.per * size) as u64;
        self.file
            .read_exact_at(&mut bytes, at)
            .map_err(|e| fail(DataProblem::Unreadable, Some(e)))?;
        out.clear();
        out.extend(bytes.chunks_exact(size).map(|b| self.elem.read(b)));
        Ok(())
    }

    /// A fault at element `index` of this array, as the run's error.
    fn fault(&self, f: Fault) -> TrainError {
        f.in_file(&self.path, self.format)
    }
}

/// A table of rows (features, then the label) left in its file, read a batch's rows at a
/// time: Parquet by row group, Arrow IPC by record batch, CSV row by row.
pub(super) trait TableRows: std::fmt::Debug {
    /// Rows `rows` (any order) into `x` (row `rows[i]`'s features at `x[i·width..]`) and `y`
    /// (its targets at `y[i·t..]`, `t = Labels::targets`), each value checked as the
    /// whole-file loader checks it.
    fn read(&self, rows: &[usize], x: &mut [f32], y: &mut [f32]) -> Result<()>;
    /// The most bytes the reader holds at a time.
    fn reader_bound(&self) -> u64;
    /// What the reader holds, for the `host data held` line.
    fn reader_holds(&self) -> &'static str;
}

impl TableRows for ParquetRows {
    fn read(&self, rows: &[usize], x: &mut [f32], y: &mut [f32]) -> Result<()> {
        ParquetRows::read(self, rows, x, y)
    }
    fn reader_bound(&self) -> u64 {
        ParquetRows::reader_bound(self)
    }
    fn reader_holds(&self) -> &'static str {
        "Parquet reader at most {} bytes (one column chunk's pages)"
    }
}

impl TableRows for ArrowRows {
    fn read(&self, rows: &[usize], x: &mut [f32], y: &mut [f32]) -> Result<()> {
        ArrowRows::read(self, rows, x, y)
    }
    fn reader_bound(&self) -> u64 {
        ArrowRows::reader_bound(self)
    }
    fn reader_holds(&self) -> &'static str {
        "Arrow IPC reader at most {} bytes (one record batch)"
    }
}

impl TableRows for CsvRows {
    fn read(&self, rows: &[usize], x: &mut [f32], y: &mut [f32]) -> Result<()> {
        let width = x.len() / rows.len().max(1);
        let t = y.len() / rows.len().max(1);
        for (i, &r) in rows.iter().enumerate() {
            let (x, y) = (
                &mut x[i * width..(i + 1) * width],
                &mut y[i * t..(i + 1) * t],
            );
            CsvRows::read(self, r, x, y)?;
        }
        Ok(())
    }
    fn reader_bound(&self) -> u64 {
        CsvRows::reader_bound(self)
    }
    fn reader_holds(&self) -> &'static str {
        "CSV reader at most {} bytes (the row index and one row)"
    }
}

/// Where streamed samples are read from.
#[derive(Clone, Debug)]
enum Source {
    /// Arrays `x` and `y`, each row at a known offset.
    Arrays { x: Arc<Column>, y: Arc<Column> },
    /// A table, read a batch's rows at a time.
    Table(Arc<dyn TableRows>),
}

impl PartialEq for Source {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Source::Arrays { x, y }, Source::Arrays { x: x2, y: y2 }) => {
                Arc::ptr_eq(x, x2) && Arc::ptr_eq(y, y2)
            }
            (Source::Table(a), Source::Table(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// Samples `first .. first + len` of a file, read as they are staged (and normalised, under
/// `--normalize`, by the training part's statistics: [`Streamed::statistics`]).
#[derive(Clone, Debug)]
pub struct Streamed {
    source: Source,
    norm: Option<Arc<Normalization>>,
    /// What a label may be (the model's task's; a table's reader checks its own).
    labels: Labels,
    pub scales: usize,
    pub features: usize,
    pub first: usize,
    pub len: usize,
}

impl PartialEq for Streamed {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
            && self.norm == other.norm
            && (self.first, self.len) == (other.first, other.len)
    }
}

impl Streamed {
    /// Values per sample (`S·F`).
    #[must_use]
    pub fn sample_width(&self) -> usize {
        self.scales * self.features
    }

    /// Target values a sample (`Labels::targets`).
    #[must_use]
    pub fn targets(&self) -> usize {
        self.labels.targets()
    }

    /// Reads sample `i`'s features into `x` (`S·F` values) and its targets into `y`
    /// (`targets()` values), each value checked as the loaders check it.
    pub fn copy(&self, i: usize, x: &mut [f32], y: &mut [f32]) -> Result<()> {
        let row = self.first + i;
        let (xs, ys) = match &self.source {
            Source::Arrays { x, y } => (x, y),
            Source::Table(p) => {
                p.read(&[row], x, y)?;
                self.normalize(x);
                return Ok(());
            }
        };
        let mut values = Vec::with_capacity(self.sample_width());
        xs.read(row, &mut values)?;
        for (k, (out, &v)) in x.iter_mut().zip(&values).enumerate() {
            *out = table::feature(Some(v), || DataPlace::Element {
                array: "x".into(),
                index: vec![row, k / self.features, k % self.features],
            })
            .map_err(|f| xs.fault(f))?;
        }
        self.normalize(x);
        ys.read(row, &mut values)?;
        let one = self.labels.values == 1;
        let values = values.iter().map(|&v| Some(v));
        table::targets(self.labels, values, y, |k| DataPlace::Element {
            array: "y".into(),
            // One label a sample: the row alone (as it always named it); K: the row and value.
            index: if one { vec![row] } else { vec![row, k] },
        })
        .map_err(|f| ys.fault(f))
    }

    /// Reads samples `rows` (any order) into `x` (sample `rows[i]`'s `S·F` values at
    /// `x[i·S·F..]`) and `y` (its targets at `y[i·t..]`, `t = targets()`): a table as it
    /// reads rows (a Parquet table a row group at a time, Arrow IPC a record batch), arrays
    /// row by row.
    pub fn copy_rows(&self, rows: &[usize], x: &mut [f32], y: &mut [f32]) -> Result<()> {
        let (per, t) = (self.sample_width(), self.targets());
        match &self.source {
            Source::Table(p) => {
                let file_rows: Vec<usize> = rows.iter().map(|&r| self.first + r).collect();
                let x = &mut x[..rows.len() * per];
                p.read(&file_rows, x, &mut y[..rows.len() * t])?;
                self.normalize(x);
                Ok(())
            }
            Source::Arrays { .. } => {
                for (i, &r) in rows.iter().enumerate() {
                    let (x, y) = (&mut x[i * per..(i + 1) * per], &mut y[i * t..(i + 1) * t]);
                    self.copy(r, x, y)?;
                }
                Ok(())
            }
        }
    }

    /// Applies the statistics the samples are normalised by, if any, to features read.
    fn normalize(&self, x: &mut [f32]) {
        if let Some(n) = &self.norm {
            n.apply(x);
        }
    }

    /// The same samples, normalised by `norm` as they are read.
    #[must_use]
    pub fn normalized(self, norm: Arc<Normalization>) -> Streamed {
        Streamed {
            norm: Some(norm),
            ..self
        }
    }

    /// The per-feature statistics of these samples (every scale of every sample a row of `F`
    /// values), read from the file in two passes of `chunk` samples at a time, in order:
    /// bitwise `Normalization::of_rows` of them read whole (`Normalization::of_chunks`).
    pub fn statistics(&self, chunk: usize) -> Result<Normalization> {
        let per = self.sample_width();
        let chunk = chunk.clamp(1, self.len.max(1));
        let t = self.targets();
        let (mut x, mut y) = (vec![0.0; chunk * per], vec![0.0; chunk * t]);
        Normalization::of_chunks(self.features, |visit| -> Result<()> {
            for start in (0..self.len).step_by(chunk) {
                let len = chunk.min(self.len - start);
                let rows: Vec<usize> = (start..start + len).collect();
                self.copy_rows(&rows, &mut x[..len * per], &mut y[..len * t])?;
                visit(&x[..len * per]);
            }
            Ok(())
        })
    }

    /// The most bytes the file's reader holds at a time (a table's bound, such as
    /// [`ParquetRows::reader_bound`]; arrays are read straight into the batch: 0).
    #[must_use]
    pub fn reader_bytes(&self) -> u64 {
        match &self.source {
            Source::Table(p) => p.reader_bound(),
            Source::Arrays { .. } => 0,
        }
    }

    /// What the file's reader holds, `{}` standing for its bytes (`None`: arrays, read
    /// straight into the batch).
    #[must_use]
    pub fn reader_holds(&self) -> Option<&'static str> {
        match &self.source {
            Source::Table(p) => Some(p.reader_holds()),
            Source::Arrays { .. } => None,
        }
    }

    /// The first `n - n_val` samples and the last `n_val`.
    #[must_use]
    pub fn split(self, n_val: usize) -> (Streamed, Streamed) {
        let n_train = self.len - n_val.min(self.len);
        let val = Streamed {
            first: self.first + n_train,
            len: self.len - n_train,
            ..self.clone()
        };
        (
            Streamed {
                len: n_train,
                ..self
            },
            val,
        )
    }
}

/// An array's place in its file: element type, shape, order, and the byte range of its data.
pub(super) struct Found {
    elem: Elem,
    pub(super) shape: Vec<usize>,
    fortran: bool,
    start: u64,
    bytes: u64,
}

/// Whether `file` is as a streamed reader opened it (`len` bytes, modified at `modified`):
/// the problem (and the I/O error, if any) when it is not, for the caller to name its place.
pub(super) fn unchanged(
    file: &File,
    len: u64,
    modified: Option<SystemTime>,
) -> std::result::Result<(), (DataProblem, Option<std::io::Error>)> {
    let meta = file
        .metadata()
        .map_err(|e| (DataProblem::Unreadable, Some(e)))?;
    if meta.len() < len {
        return Err((
            DataProblem::Truncated {
                expected: len,
                found: meta.len(),
            },
            None,
        ));
    }
    if meta.len() != len || meta.modified().ok() != modified {
        return Err((
            DataProblem::Changed {
                detail: format!(
                    "{len} bytes at the start, {} now, or written to since",
                    meta.len()
                ),
            },
            None,
        ));
    }
    Ok(())
}

/// Opens `path` for streaming: the file, its length and modification time.
pub(super) fn open(path: &Path) -> Result<(File, u64, Option<SystemTime>)> {
    let io = |source| TrainError::Io {
        what: "opening the data file to stream it (--stream)",
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    Ok((file, meta.len(), meta.modified().ok()))
}

/// Bytes `at .. at + len` of `file` (at most what is there).
fn prefix(file: &File, path: &Path, at: u64, len: u64) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; len.min(MAX_HEADER) as usize];
    let n = read_up_to(file, &mut buf, at).map_err(|source| TrainError::Io {
        what: "reading the header of the data file",
        path: path.to_path_buf(),
        source,
    })?;
    out.extend_from_slice(&buf[..n]);
    Ok(out)
}

/// Reads into `buf` from `at` until it is full or the file ends; the bytes read.
fn read_up_to(file: &File, buf: &mut [u8], at: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], at + done as u64)? {
            0 => break,
            n => done += n,
        }
    }
    Ok(done)
}

/// The column of `found` in `file` (named `name`), its rows in C order and all there.
pub(super) fn column(
    path: &Path,
    format: &'static str,
    name: &'static str,
    (file, len, modified): (File, u64, Option<SystemTime>),
    found: Found,
) -> Result<Column> {
    if found.fortran && found.shape.iter().filter(|&&d| d > 1).count() > 1 {
        return Err(TrainError::Options(format!(
            "--stream reads rows in C order; array `{name}` of {} is in Fortran order: save it in C order (np.ascontiguousarray) or drop --stream",
            path.display()
        )));
    }
    let end = found.start + found.bytes;
    if len < end {
        return Err(Fault::new(
            DataPlace::Array(name.into()),
            DataProblem::Truncated {
                expected: found.bytes,
                found: len.saturating_sub(found.start),
            },
        )
        .in_file(path, format));
    }
    Ok(Column {
        path: path.to_path_buf(),
        file,
        format,
        elem: found.elem,
        offset: found.start,
        per: found.shape.iter().skip(1).product::<usize>(),
        len,
        modified,
    })
}

/// The samples of a features `.npy` and a labels `.npy`, streamed; with the FNV-1a
/// fingerprint of both files' bytes (the one reading them whole gives).
pub fn npy_pair(
    x_path: &Path,
    y_path: &Path,
    scales: usize,
    features: usize,
    labels: Labels,
) -> Result<(Streamed, u64)> {
    let npy = super::npy::NPY;
    let one = |path: &Path, name: &'static str| -> Result<(Found, (File, u64, _))> {
        let opened = open(path)?;
        let found = npy_found(&opened.0, path, npy, name, (0, opened.1))?;
        Ok((found, opened))
    };
    let (xf, xo) = one(x_path, "x")?;
    let (yf, yo) = one(y_path, "y")?;
    let n = sample_count(&xf.shape, &yf.shape, (scales, features), labels)
        .map_err(|(f, which)| f.in_file(if which == "y" { y_path } else { x_path }, npy))?;
    let digest = fingerprint(&[x_path, y_path])?;
    let x = column(x_path, npy, "x", xo, xf)?;
    let y = column(y_path, npy, "y", yo, yf)?;
    Ok((streamed(x, y, (scales, features), n, labels), digest))
}

/// The `.npy` array `name` whose bytes are `at.1` bytes from offset `at.0` of `file` (a
/// `.npy` file: all of it; an `.npz` member stored as it is): its header read and checked,
/// and nothing after the data its shape holds.
pub(super) fn npy_found(
    file: &File,
    path: &Path,
    format: &'static str,
    name: &'static str,
    (base, avail): (u64, u64),
) -> Result<Found> {
    let head = prefix(file, path, base, 12.min(avail))?;
    let len = match head.get(6) {
        Some(1) => head
            .get(8..10)
            .map(|b| u64::from(u16::from_le_bytes([b[0], b[1]])) + 10),
        _ => head
            .get(8..12)
            .map(|b| u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])) + 12),
    }
    .unwrap_or(12);
    let head = prefix(file, path, base, len.min(avail))?;
    let h = super::npy::header(&head, name).map_err(|f| f.in_file(path, format))?;
    let there = (avail as usize).saturating_sub(h.start);
    if there < h.bytes {
        return Err(Fault::new(
            DataPlace::Array(name.into()),
            DataProblem::Truncated {
                expected: h.bytes as u64,
                found: there as u64,
            },
        )
        .in_file(path, format));
    }
    if there > h.bytes {
        return Err(Fault::new(
            DataPlace::Array(name.into()),
            DataProblem::Corrupt {
                detail: format!(
                    "{} bytes after the {} bytes of data its shape {:?} holds",
                    avail as usize - h.start - h.bytes,
                    h.bytes,
                    h.shape
                ),
            },
        )
        .in_file(path, format));
    }
    Ok(Found {
        elem: h.elem,
        shape: h.shape,
        fortran: h.fortran,
        start: base + h.start as u64,
        bytes: h.bytes as u64,
    })
}

/// The samples of a safetensors file's `x` and `y`, streamed; with the file's FNV-1a
/// fingerprint.
pub fn safetensors(
    path: &Path,
    scales: usize,
    features: usize,
    labels: Labels,
) -> Result<(Streamed, u64)> {
    let format = super::tensors::FORMAT;
    let fail = |f: Fault| f.in_file(path, format);
    let not_this = || {
        fail(Fault::new(
            DataPlace::File,
            DataProblem::NotThisFormat { expected: format },
        ))
    };
    let opened = open(path)?;
    let head = prefix(&opened.0, path, 0, 8)?;
    let n = head
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0xff; 8])))
        .filter(|&n| n >= 2 && n <= opened.1.saturating_sub(8) && n <= MAX_HEADER)
        .ok_or_else(not_this)?;
    let head = prefix(&opened.0, path, 8, n)?;
    let corrupt =
        |detail: String| fail(Fault::new(DataPlace::File, DataProblem::Corrupt { detail }));
    let meta: serde_json::Map<String, serde_json::Value> = match serde_json::from_slice(&head) {
        Ok(m) => m,
        Err(_) if head.first() != Some(&b'{') => return Err(not_this()),
        Err(e) => return Err(corrupt(format!("the header is not JSON: {e}"))),
    };
    let data_start = 8 + n;
    let find = |name: &str| -> Result<Found> {
        let Some(t) = meta.get(name) else {
            let mut found: Vec<String> = meta
                .keys()
                .filter(|k| *k != "__metadata__")
                .cloned()
                .collect();
            found.sort();
            return Err(fail(Fault::new(
                DataPlace::File,
                DataProblem::MissingArray {
                    name: name.into(),
                    found,
                },
            )));
        };
        let bad = || {
            corrupt(format!(
                "tensor `{name}`'s entry {t} is not dtype, shape and data_offsets"
            ))
        };
        let dtype: safetensors::Dtype =
            serde_json::from_value(t["dtype"].clone()).map_err(|_| bad())?;
        let shape: Vec<usize> = serde_json::from_value(t["shape"].clone()).map_err(|_| bad())?;
        let offsets: [u64; 2] =
            serde_json::from_value(t["data_offsets"].clone()).map_err(|_| bad())?;
        let elem = Elem::from_safetensors(dtype).ok_or_else(|| {
            fail(Fault::new(
                DataPlace::Array(name.into()),
                DataProblem::NotNumeric {
                    found: format!("dtype {dtype:?}"),
                },
            ))
        })?;
        let count = shape
            .iter()
            .try_fold(elem.size() as u64, |a, &d| a.checked_mul(d as u64));
        if offsets[1] < offsets[0] || count != Some(offsets[1] - offsets[0]) {
            return Err(corrupt(format!(
                "tensor `{name}`: data_offsets {offsets:?} do not hold its shape {shape:?}"
            )));
        }
        Ok(Found {
            elem,
            shape,
            fortran: false,
            start: data_start + offsets[0],
            bytes: offsets[1] - offsets[0],
        })
    };
    let (xf, yf) = (find("x")?, find("y")?);
    let rows =
        sample_count(&xf.shape, &yf.shape, (scales, features), labels).map_err(|(f, _)| fail(f))?;
    let digest = fingerprint(&[path])?;
    let y_file = open(path)?;
    let x = column(path, format, "x", opened, xf)?;
    let y = column(path, format, "y", y_file, yf)?;
    Ok((streamed(x, y, (scales, features), rows, labels), digest))
}

/// The samples of the Parquet table `path` (`S·F` feature columns, then the label), streamed
/// by row group; with the file's FNV-1a fingerprint.
pub fn parquet(
    path: &Path,
    scales: usize,
    features: usize,
    labels: Labels,
) -> Result<(Streamed, u64)> {
    let rows = ParquetRows::open(path, scales * features, labels)?;
    let len = rows.rows();
    table(path, Arc::new(rows), len, (scales, features), labels)
}

/// The samples of the Arrow IPC table `path` (the Parquet table's columns), streamed by
/// record batch; with the file's FNV-1a fingerprint.
pub fn arrow(
    path: &Path,
    scales: usize,
    features: usize,
    labels: Labels,
) -> Result<(Streamed, u64)> {
    let rows = ArrowRows::open(path, scales * features, labels)?;
    let len = rows.rows();
    table(path, Arc::new(rows), len, (scales, features), labels)
}

/// The samples of the CSV file `path`, streamed row by row through an index of where each
/// starts; with the file's FNV-1a fingerprint.
pub fn csv(path: &Path, scales: usize, features: usize, labels: Labels) -> Result<(Streamed, u64)> {
    let rows = CsvRows::open(path, scales * features, labels)?;
    let len = rows.rows();
    table(path, Arc::new(rows), len, (scales, features), labels)
}

/// The `len` samples of the table `rows` in `path`, with the file's fingerprint.
fn table(
    path: &Path,
    rows: Arc<dyn TableRows>,
    len: usize,
    (scales, features): (usize, usize),
    labels: Labels,
) -> Result<(Streamed, u64)> {
    let digest = fingerprint(&[path])?;
    Ok((
        Streamed {
            source: Source::Table(rows),
            norm: None,
            labels,
            scales,
            features,
            first: 0,
            len,
        },
        digest,
    ))
}

pub(super) fn streamed(
    x: Column,
    y: Column,
    (scales, features): (usize, usize),
    len: usize,
    labels: Labels,
) -> Streamed {
    Streamed {
        source: Source::Arrays {
            x: Arc::new(x),
            y: Arc::new(y),
        },
        norm: None,
        labels,
        scales,
        features,
        first: 0,
        len,
    }
}

/// FNV-1a of the files' bytes one after the other (`config::fnv1a` of them read whole),
/// read a MiB at a time.
pub(super) fn fingerprint(paths: &[&Path]) -> Result<u64> {
    let mut h = crate::config::FNV1A_START;
    let mut buf = vec![0u8; 1 << 20];
    for path in paths {
        let io = |source| TrainError::Io {
            what: "reading the data file",
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let mut at = 0u64;
        loop {
            let n = read_up_to(&file, &mut buf, at).map_err(io)?;
            h = crate::config::fnv1a_from(h, &buf[..n]);
            at += n as u64;
            if n < buf.len() {
                break;
            }
        }
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{npy::npy_f32, synthetic};

    /// A `.npy` pair of 9 samples of 2 × 3 in `dir`, streamed.
    fn pair(dir: &Path) -> (Streamed, crate::data::Dataset) {
        let d = synthetic::generate(9, 2, 3, 4);
        std::fs::write(dir.join("x.npy"), npy_f32(&[9, 2, 3], &d.x)).expect("x");
        std::fs::write(dir.join("y.npy"), npy_f32(&[9], &d.y)).expect("y");
        let (s, _) = npy_pair(
            &dir.join("x.npy"),
            &dir.join("y.npy"),
            2,
            3,
            crate::data::labels::Labels::BINARY,
        )
        .expect("opens");
        (s, d)
    }

    #[test]
    fn streamed_rows_are_the_rows_read_whole_and_the_fingerprint_theirs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (s, d) = pair(dir.path());
        let (train, val) = s.split(3);
        assert_eq!((train.len, val.first, val.len), (6, 6, 3));
        let mut x = [0.0; 6];
        let mut y = [0.0];
        val.copy(1, &mut x, &mut y).expect("reads");
        assert_eq!(y[0], d.y[7]);
        assert_eq!(&x[..], &d.x[7 * 6..8 * 6]);
        let mut bytes = std::fs::read(dir.path().join("x.npy")).expect("x");
        bytes.extend(std::fs::read(dir.path().join("y.npy")).expect("y"));
        let (_, digest) = npy_pair(
            &dir.path().join("x.npy"),
            &dir.path().join("y.npy"),
            2,
            3,
            crate::data::labels::Labels::BINARY,
        )
        .expect("opens");
        assert_eq!(digest, crate::config::fnv1a(&bytes));
    }

    #[test]
    fn a_file_truncated_under_the_run_names_the_file_and_the_row() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (s, _) = pair(dir.path());
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.path().join("x.npy"))
            .expect("open");
        let len = file.metadata().expect("meta").len();
        file.set_len(len - 10).expect("truncate");
        let mut x = [0.0; 6];
        let e = s.copy(4, &mut x, &mut [0.0]).unwrap_err();
        let TrainError::Data(d) = &e else {
            panic!("{e:?}")
        };
        assert_eq!(d.place, DataPlace::Row(4));
        assert_eq!(
            d.problem,
            DataProblem::Truncated {
                expected: len,
                found: len - 10
            }
        );
        assert!(e.to_string().contains("x.npy"), "{e}");
    }

    #[test]
    fn a_file_written_to_under_the_run_is_refused_not_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (s, _) = pair(dir.path());
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.path().join("y.npy"))
            .expect("open");
        // Same length, another modification time (set, so no clock is involved).
        file.set_modified(SystemTime::UNIX_EPOCH)
            .expect("set mtime");
        let mut x = [0.0; 6];
        let e = s.copy(2, &mut x, &mut [0.0]).unwrap_err();
        let TrainError::Data(d) = &e else {
            panic!("{e:?}")
        };
        assert_eq!(d.place, DataPlace::Row(2));
        assert!(matches!(d.problem, DataProblem::Changed { .. }), "{e}");
        assert!(e.to_string().contains("y.npy"), "{e}");
    }

    #[test]
    fn a_nan_read_from_the_file_is_refused_by_element() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut v = vec![0.5f32; 4 * 6];
        v[2 * 6 + 4] = f32::NAN;
        std::fs::write(dir.path().join("x.npy"), npy_f32(&[4, 2, 3], &v)).expect("x");
        std::fs::write(dir.path().join("y.npy"), npy_f32(&[4], &[0.0; 4])).expect("y");
        let (s, _) = npy_pair(
            &dir.path().join("x.npy"),
            &dir.path().join("y.npy"),
            2,
            3,
            crate::data::labels::Labels::BINARY,
        )
        .expect("opens");
        let e = s.copy(2, &mut [0.0; 6], &mut [0.0]).unwrap_err();
        let TrainError::Data(d) = &e else {
            panic!("{e:?}")
        };
        assert_eq!(
            d.place,
            DataPlace::Element {
                array: "x".into(),
                index: vec![2, 1, 1]
            }
        );
    }
}
