//! `--stream` of an Arrow IPC file (the columns `arrow.rs` reads): the file's footer says
//! where each record batch lies, so a batch's rows are read by decoding the one record batch
//! that holds them (arrow-ipc's `FileReader::set_index`), never the table. One pass at open
//! counts each batch's rows (a batch at a time); the reader then keeps the last batch it
//! decoded (the next rows read are often in it), so it holds at most the largest record
//! batch ([`ArrowRows::reader_bound`]). Every value is checked as the whole-file loader checks
//! it and named by the same cell; a file changed under the run is a typed error naming the
//! file and the batch.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type,
    UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrowPrimitiveType, RecordBatch};
use arrow_ipc::reader::FileReader;
use arrow_schema::DataType;

use super::arrow::FORMAT;
use super::labels::Labels;
use super::table::{self, Fault};
use crate::error::{DataError, DataPlace, DataProblem, Result, TrainError};

/// The reader and the last record batch it decoded (its index).
type Reader = (FileReader<BufReader<File>>, Option<(usize, RecordBatch)>);

/// An Arrow IPC table of `width` feature columns and the label, left in its file.
pub struct ArrowRows {
    path: PathBuf,
    /// For the checks that the file is as opened.
    file: File,
    reader: Mutex<Reader>,
    names: Vec<String>,
    width: usize,
    /// What a label may be (the model's task's).
    labels: Labels,
    /// Record batch `b` holds rows `starts[b]..starts[b + 1]`.
    starts: Vec<usize>,
    len: u64,
    modified: Option<SystemTime>,
    /// The largest record batch's bytes in memory (`batch_bytes`).
    bound: u64,
}

impl std::fmt::Debug for ArrowRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArrowRows")
            .field("path", &self.path)
            .field("width", &self.width)
            .field("batches", &(self.starts.len() - 1))
            .field("bound", &self.bound)
            .finish_non_exhaustive()
    }
}

fn corrupt(path: &Path, place: DataPlace, e: arrow_schema::ArrowError) -> TrainError {
    TrainError::from(DataError {
        path: path.to_path_buf(),
        format: FORMAT,
        place,
        problem: DataProblem::Corrupt {
            detail: e.to_string(),
        },
        source: Some(Box::new(e)),
    })
}

/// A column type the whole-file loader reads (`arrow::put`).
fn numeric(t: &DataType) -> bool {
    t.is_integer() || matches!(t, DataType::Float32 | DataType::Float64 | DataType::Boolean)
}

impl ArrowRows {
    /// Opens the Arrow IPC file `path` of `width` feature columns and the label: its footer
    /// and schema read and checked, and each record batch's rows counted.
    pub fn open(path: &Path, width: usize, labels: Labels) -> Result<ArrowRows> {
        let fail = |f: Fault| f.in_file(path, FORMAT);
        let io = |source| TrainError::Io {
            what: "opening the data file to stream it (--stream)",
            path: path.to_path_buf(),
            source,
        };
        let (file, len, modified) = super::stream::open(path)?;
        let mut magic = [0u8; 6];
        let is_arrow = std::os::unix::fs::FileExt::read_exact_at(&file, &mut magic, 0).is_ok()
            && &magic == b"ARROW1";
        if !is_arrow {
            return Err(fail(Fault::new(
                DataPlace::File,
                DataProblem::NotThisFormat { expected: FORMAT },
            )));
        }
        let reading = BufReader::new(file.try_clone().map_err(io)?);
        let mut reader =
            FileReader::try_new(reading, None).map_err(|e| corrupt(path, DataPlace::File, e))?;
        let schema = reader.schema();
        let names: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
        let (mut starts, mut bound) = (vec![0], 0u64);
        for b in 0..reader.num_batches() {
            let batch = reader
                .next()
                .unwrap_or_else(|| Err(arrow_schema::ArrowError::IpcError("no batch".into())))
                .map_err(|e| corrupt(path, DataPlace::RecordBatch { batch: b }, e))?;
            starts.push(starts[b] + batch.num_rows());
            bound = bound.max(batch_bytes(&batch));
        }
        let rows = starts.last().copied().unwrap_or(0);
        table::check_columns(names.len(), width, labels, rows).map_err(fail)?;
        for (c, f) in schema.fields().iter().enumerate() {
            if !numeric(f.data_type()) {
                return Err(fail(Fault::new(
                    DataPlace::Column {
                        index: c + 1,
                        name: f.name().clone(),
                    },
                    DataProblem::NotNumeric {
                        found: format!("{} values", f.data_type()),
                    },
                )));
            }
        }
        Ok(ArrowRows {
            path: path.to_path_buf(),
            file,
            reader: Mutex::new((reader, None)),
            names,
            width,
            labels,
            starts,
            len,
            modified,
            bound,
        })
    }

    /// The table's rows.
    #[must_use]
    pub fn rows(&self) -> usize {
        self.starts.last().copied().unwrap_or(0)
    }

    /// The most bytes the reader holds at a time: the largest record batch decoded.
    #[must_use]
    pub fn reader_bound(&self) -> u64 {
        self.bound
    }

    /// Reads the rows `rows` of the table (any order) into `x` (row `rows[i]`'s features at
    /// `x[i·width..]`) and `y` (its targets at `y[i·t..]`), a record batch at a time, each value
    /// checked as the whole-file loader checks it.
    pub fn read(&self, rows: &[usize], x: &mut [f32], y: &mut [f32]) -> Result<()> {
        let mut order: Vec<(usize, usize)> = rows.iter().copied().zip(0..).collect();
        order.sort_unstable();
        let mut guard = self.reader.lock().map_err(|_| {
            self.fail(
                DataPlace::File,
                DataProblem::Corrupt {
                    detail: "a read of it failed in another thread".into(),
                },
                None,
            )
        })?;
        let (reader, last) = &mut *guard;
        let mut rest = &order[..];
        while let Some(&(first, _)) = rest.first() {
            let b = self
                .starts
                .partition_point(|&s| s <= first)
                .saturating_sub(1);
            if b + 1 >= self.starts.len() {
                return Err(self.fail(
                    DataPlace::Row(first + 1),
                    DataProblem::Corrupt {
                        detail: format!("no row {} in a table of {} rows", first + 1, self.rows()),
                    },
                    None,
                ));
            }
            let place = DataPlace::RecordBatch { batch: b };
            super::stream::unchanged(&self.file, self.len, self.modified)
                .map_err(|(p, e)| self.fail(place.clone(), p, e))?;
            if last.as_ref().is_none_or(|(i, _)| *i != b) {
                *last = None;
                reader
                    .set_index(b)
                    .map_err(|e| corrupt(&self.path, place.clone(), e))?;
                let batch = reader
                    .next()
                    .unwrap_or_else(|| Err(arrow_schema::ArrowError::IpcError("no batch".into())))
                    .map_err(|e| corrupt(&self.path, place.clone(), e))?;
                *last = Some((b, batch));
            }
            let Some((_, batch)) = last.as_ref() else {
                continue;
            };
            let end = self.starts[b + 1];
            let n = rest.partition_point(|&(r, _)| r < end);
            for &(row, slot) in &rest[..n] {
                self.put(batch, row, row - self.starts[b], slot, x, y)
                    .map_err(|f| f.in_file(&self.path, FORMAT))?;
            }
            rest = &rest[n..];
        }
        Ok(())
    }

    /// Row `row` of the table (row `local` of `batch`) into place `slot` of `x` and `y`.
    fn put(
        &self,
        batch: &RecordBatch,
        row: usize,
        local: usize,
        slot: usize,
        x: &mut [f32],
        y: &mut [f32],
    ) -> std::result::Result<(), Fault> {
        let (width, t) = (self.width, self.labels.targets());
        for c in 0..width + self.labels.values {
            let at = || table::cell_place(&self.names, row, c);
            let v = cell(batch.column(c).as_ref(), local).ok_or_else(|| {
                Fault::new(
                    DataPlace::Column {
                        index: c + 1,
                        name: self.names[c].clone(),
                    },
                    DataProblem::NotNumeric {
                        found: format!("{} values", batch.column(c).data_type()),
                    },
                )
            })?;
            if c < width {
                x[slot * width + c] = table::feature(v, at)?;
            } else {
                let out = &mut y[slot * t..(slot + 1) * t];
                table::put_label(self.labels, (c - width, v), out, at)?;
            }
        }
        Ok(())
    }

    fn fail(
        &self,
        place: DataPlace,
        problem: DataProblem,
        source: Option<std::io::Error>,
    ) -> TrainError {
        TrainError::from(DataError {
            path: self.path.clone(),
            format: FORMAT,
            place,
            problem,
            source: source.map(|e| Box::new(e) as _),
        })
    }
}

/// The bytes a decoded record batch holds: each column's values and validity (as sliced,
/// not the shared body they are views of), each padded to 64 bytes as the IPC writer pads
/// them in the file's body.
fn batch_bytes(batch: &RecordBatch) -> u64 {
    batch
        .columns()
        .iter()
        .map(|c| {
            let slice = c.to_data().get_slice_memory_size().unwrap_or(0) as u64;
            slice.div_ceil(64) * 64 + 64
        })
        .sum()
}

/// Element `i` of `a` as `arrow::put` converts it (`Some(None)`: a null; `None`: a type it
/// does not read).
fn cell(a: &dyn Array, i: usize) -> Option<Option<f64>> {
    fn prim<T: ArrowPrimitiveType>(
        a: &dyn Array,
        i: usize,
        f: impl Fn(T::Native) -> f64,
    ) -> Option<Option<f64>> {
        let p = a.as_primitive_opt::<T>()?;
        Some(p.is_valid(i).then(|| f(p.value(i))))
    }
    prim::<Float32Type>(a, i, f64::from)
        .or_else(|| prim::<Float64Type>(a, i, |v| v))
        .or_else(|| prim::<Int8Type>(a, i, f64::from))
        .or_else(|| prim::<Int16Type>(a, i, f64::from))
        .or_else(|| prim::<Int32Type>(a, i, f64::from))
        .or_else(|| prim::<Int64Type>(a, i, |v| v as f64))
        .or_else(|| prim::<UInt8Type>(a, i, f64::from))
        .or_else(|| prim::<UInt16Type>(a, i, f64::from))
        .or_else(|| prim::<UInt32Type>(a, i, f64::from))
        .or_else(|| prim::<UInt64Type>(a, i, |v| v as f64))
        .or_else(|| {
            let b = a.as_boolean_opt()?;
            Some(b.is_valid(i).then(|| f64::from(u8::from(b.value(i)))))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Float32Array;
    use arrow_schema::{Field, Schema};
    use std::sync::Arc;

    /// A table of `rows` rows of two features and a label, in record batches of `batch`.
    fn write(path: &Path, rows: usize, batch: usize) {
        let schema = Arc::new(Schema::new(
            ["a", "b", "label"]
                .map(|n| Field::new(n, DataType::Float32, false))
                .to_vec(),
        ));
        let file = File::create(path).expect("create");
        let mut w = arrow_ipc::writer::FileWriter::try_new(file, &schema).expect("writer");
        for start in (0..rows).step_by(batch) {
            let r: Vec<usize> = (start..(start + batch).min(rows)).collect();
            let col = |f: &dyn Fn(usize) -> f32| {
                Arc::new(Float32Array::from(
                    r.iter().map(|&i| f(i)).collect::<Vec<_>>(),
                )) as arrow_array::ArrayRef
            };
            let cols = vec![
                col(&|i| i as f32),
                col(&|i| -(i as f32)),
                col(&|i| (i % 2) as f32),
            ];
            w.write(&RecordBatch::try_new(Arc::clone(&schema), cols).expect("batch"))
                .expect("write");
        }
        w.finish().expect("finish");
    }

    #[test]
    fn rows_are_read_from_their_record_batch_in_any_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("d.arrow");
        write(&path, 10, 4);
        let t = ArrowRows::open(&path, 2, crate::data::labels::Labels::BINARY).expect("opens");
        assert_eq!(t.rows(), 10);
        let (mut x, mut y) = ([0.0; 6], [0.0; 3]);
        t.read(&[9, 0, 5], &mut x, &mut y).expect("reads");
        assert_eq!(x, [9.0, -9.0, 0.0, -0.0, 5.0, -5.0]);
        assert_eq!(y, [1.0, 0.0, 1.0]);
    }

    #[test]
    fn a_file_changed_under_the_run_names_the_file_and_the_record_batch() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("d.arrow");
        write(&path, 10, 4);
        let t = ArrowRows::open(&path, 2, crate::data::labels::Labels::BINARY).expect("opens");
        write(&path, 12, 4);
        let e = t.read(&[5], &mut [0.0; 2], &mut [0.0]).unwrap_err();
        let TrainError::Data(d) = &e else {
            panic!("{e:?}")
        };
        assert_eq!(d.place, DataPlace::RecordBatch { batch: 1 });
        assert!(matches!(d.problem, DataProblem::Changed { .. }), "{e}");
        assert!(e.to_string().contains("d.arrow"), "{e}");
    }
}
