//! `--stream` of a Parquet table (the columns `parquet.rs` reads, one row per sample): the
//! file stays on disk and each batch's rows are read by row group. Parquet stores a row group
//! column by column, so a row's values lie in every column chunk of its group; a batch's rows
//! are sorted by row, and for each row group they fall in, each column chunk is read from its
//! start up to the last row wanted, page by page (parquet's column reader: rows between are
//! skipped, whole pages where the page says how many rows it holds), each wanted value put
//! into the batch and checked as the whole-file loader checks it. So the reader holds the
//! pages of one column chunk at a time, never a row group nor the rows a shuffled batch
//! touches: at most the largest column chunk's bytes as stored and as decoded, and parquet's
//! read buffer for the page headers ([`ParquetRows::reader_bound`], in the run's `host data
//! held` line). The price of a shuffled order is time, not memory: a batch of `B` rows reads
//! up to `B` row groups, each up to its last row wanted (small row groups, or a file sorted
//! the way it is visited, make streaming cheap).
//!
//! The values are the whole-file loader's bit for bit (the same conversions and checks, the
//! same cells named), so a streamed run trains as the run that reads the file whole. A file
//! changed under the run (another length or modification time than at open) or a page the
//! reader refuses is a typed error naming the file and the row group.

use std::fs::File;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use parquet::column::reader::{ColumnReader, ColumnReaderImpl};
use parquet::data_type::DataType;
use parquet::errors::ParquetError;
use parquet::file::reader::{FileReader, SerializedFileReader};

use super::labels::Labels;
use super::parquet::{FORMAT, check_numeric, corrupt};
use super::table::{self, Fault};
use crate::error::{DataError, DataPlace, DataProblem, Result, TrainError};

/// The buffer parquet's reader reads page headers through (`std::io::BufReader`'s, for a
/// `File`).
const HEADER_BUFFER: u64 = 8 * 1024;

/// A Parquet table of `width` feature columns and the label, left in its file.
pub struct ParquetRows {
    path: PathBuf,
    /// For the checks that the file is as opened.
    file: File,
    reader: SerializedFileReader<File>,
    names: Vec<String>,
    width: usize,
    /// What a label may be (the model's task's).
    labels: Labels,
    /// Row group `g` holds rows `starts[g]..starts[g + 1]`.
    starts: Vec<usize>,
    /// The file's length and modification time when opened.
    len: u64,
    modified: Option<SystemTime>,
    bound: u64,
}

impl std::fmt::Debug for ParquetRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParquetRows")
            .field("path", &self.path)
            .field("width", &self.width)
            .field("row_groups", &(self.starts.len() - 1))
            .field("bound", &self.bound)
            .finish_non_exhaustive()
    }
}

/// Opening `path` to stream it failed as the system says.
fn io<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(std::io::Error) -> TrainError + 'a {
    move |source| TrainError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

impl ParquetRows {
    /// Opens the Parquet file `path` of `width` feature columns and the label: its footer
    /// read and checked (the columns, their types, the row groups' rows), no row read.
    pub fn open(path: &Path, width: usize, labels: Labels) -> Result<ParquetRows> {
        let fail = |f: Fault| f.in_file(path, FORMAT);
        let what = "opening the data file to stream it (--stream)";
        let file = File::open(path).map_err(io(path, what))?;
        let meta = file.metadata().map_err(io(path, what))?;
        let len = meta.len();
        let (mut head, mut tail) = ([0u8; 4], [0u8; 4]);
        let magic = len >= 12
            && file.read_exact_at(&mut head, 0).is_ok()
            && file.read_exact_at(&mut tail, len - 4).is_ok()
            && &head == b"PAR1"
            && &tail == b"PAR1";
        if !magic {
            return Err(fail(Fault::new(
                DataPlace::File,
                DataProblem::NotThisFormat { expected: FORMAT },
            )));
        }
        let reader = SerializedFileReader::new(file.try_clone().map_err(io(path, what))?)
            .map_err(|e| corrupt(path, DataPlace::File, "its footer", e))?;
        let m = reader.metadata();
        let schema = m.file_metadata().schema_descr();
        let names: Vec<String> = schema.columns().iter().map(|c| c.path().string()).collect();
        let rows = usize::try_from(m.file_metadata().num_rows()).unwrap_or(0);
        table::check_columns(names.len(), width, labels, rows).map_err(fail)?;
        check_numeric(schema, &names).map_err(fail)?;
        let mut starts = vec![0];
        let mut bound = 0u64;
        for g in m.row_groups() {
            let n = usize::try_from(g.num_rows()).unwrap_or(0);
            starts.push(starts.last().copied().unwrap_or(0) + n);
            for c in g.columns() {
                let size = |b: i64| u64::try_from(b).unwrap_or(0);
                bound = bound.max(size(c.compressed_size()) + size(c.uncompressed_size()));
            }
        }
        if starts.last() != Some(&rows) {
            return Err(fail(Fault::new(
                DataPlace::File,
                DataProblem::Corrupt {
                    detail: format!(
                        "its row groups hold {} rows, its footer announces {rows}",
                        starts.last().copied().unwrap_or(0)
                    ),
                },
            )));
        }
        Ok(ParquetRows {
            path: path.to_path_buf(),
            file,
            reader,
            names,
            width,
            labels,
            starts,
            len,
            modified: meta.modified().ok(),
            bound: bound + HEADER_BUFFER,
        })
    }

    /// The table's rows.
    #[must_use]
    pub fn rows(&self) -> usize {
        self.starts.last().copied().unwrap_or(0)
    }

    /// The most bytes the reader holds at a time besides the file's footer: the largest
    /// column chunk as stored and as decoded (it reads one column chunk's pages at a time,
    /// each dropped for the next) and the page headers' read buffer.
    #[must_use]
    pub fn reader_bound(&self) -> u64 {
        self.bound
    }

    /// Reads the rows `rows` of the table (any order) into `x` (row `rows[i]`'s features at
    /// `x[i·width..]`) and `y` (its targets at `y[i·t..]`, `t = Labels::targets`), each value
    /// checked as the whole-file loader checks it.
    pub fn read(&self, rows: &[usize], x: &mut [f32], y: &mut [f32]) -> Result<()> {
        let mut order: Vec<(usize, usize)> = rows.iter().copied().zip(0..).collect();
        order.sort_unstable();
        let mut rest = &order[..];
        while let Some(&(first, _)) = rest.first() {
            // The row group of `first`: the last one starting at or before it.
            let g = self
                .starts
                .partition_point(|&s| s <= first)
                .saturating_sub(1);
            if g + 1 >= self.starts.len() {
                return Err(Fault::new(
                    DataPlace::Row(first + 1),
                    DataProblem::Corrupt {
                        detail: format!("no row {} in a table of {} rows", first + 1, self.rows()),
                    },
                )
                .in_file(&self.path, FORMAT));
            }
            let end = self.starts[g + 1];
            let n = rest.partition_point(|&(r, _)| r < end);
            self.check_unchanged(g)?;
            self.read_group(g, &rest[..n], x, y)?;
            rest = &rest[n..];
        }
        Ok(())
    }

    /// The file is as the run opened it (length and modification time), else a typed error
    /// naming it and the row group about to be read.
    fn check_unchanged(&self, g: usize) -> Result<()> {
        let fail = |problem: DataProblem, source: Option<std::io::Error>| {
            TrainError::from(DataError {
                path: self.path.clone(),
                format: FORMAT,
                place: DataPlace::RowGroup { group: g },
                problem,
                source: source.map(|e| Box::new(e) as _),
            })
        };
        super::stream::unchanged(&self.file, self.len, self.modified).map_err(|(p, e)| fail(p, e))
    }

    /// Reads the rows `wanted` (file rows sorted, with their places in the batch) of row
    /// group `g`, one column chunk after the other.
    fn read_group(
        &self,
        g: usize,
        wanted: &[(usize, usize)],
        x: &mut [f32],
        y: &mut [f32],
    ) -> Result<()> {
        let group = self
            .reader
            .get_row_group(g)
            .map_err(|e| corrupt(&self.path, DataPlace::RowGroup { group: g }, "reading", e))?;
        let schema = self.reader.metadata().file_metadata().schema_descr();
        let first = self.starts[g];
        let (width, t) = (self.width, self.labels.targets());
        for c in 0..width + self.labels.values {
            let place = DataPlace::RowGroupColumn {
                group: g,
                index: c + 1,
                name: self.names[c].clone(),
            };
            let reader = group
                .get_column_reader(c)
                .map_err(|e| corrupt(&self.path, place.clone(), "reading", e))?;
            let names = &self.names;
            let mut put =
                |row: usize, slot: usize, v: Option<f64>| -> std::result::Result<(), Fault> {
                    let at = || table::cell_place(names, row, c);
                    if c < width {
                        x[slot * width + c] = table::feature(v, at)?;
                    } else {
                        let out = &mut y[slot * t..(slot + 1) * t];
                        table::put_label(self.labels, (c - width, v), out, at)?;
                    }
                    Ok(())
                };
            let max_def = schema.column(c).max_def_level();
            let ask = Ask {
                wanted,
                first,
                max_def,
            };
            let read = match reader {
                ColumnReader::FloatColumnReader(r) => ask.pick(r, f64::from, &mut put),
                ColumnReader::DoubleColumnReader(r) => ask.pick(r, |v| v, &mut put),
                ColumnReader::Int32ColumnReader(r) => ask.pick(r, f64::from, &mut put),
                ColumnReader::Int64ColumnReader(r) => ask.pick(r, |v| v as f64, &mut put),
                ColumnReader::BoolColumnReader(r) => {
                    ask.pick(r, |v| f64::from(u8::from(v)), &mut put)
                }
                // `open` checked every column is one of the types read.
                _ => Ok(Ok(())),
            };
            read.map_err(|e| corrupt(&self.path, place, "reading", e))?
                .map_err(|f| f.in_file(&self.path, FORMAT))?;
        }
        Ok(())
    }
}

/// The rows one column chunk is asked for: file rows sorted (with their places in the
/// batch), the chunk's first row, and the column's definition level of a value (0: never
/// null).
struct Ask<'a> {
    wanted: &'a [(usize, usize)],
    first: usize,
    max_def: i16,
}

impl Ask<'_> {
    /// Reads the wanted rows from `r`, skipping the rows between, and gives each value to
    /// `put` (`None`: a null): the reader's error outside, a value's fault inside.
    fn pick<T: DataType>(
        &self,
        mut r: ColumnReaderImpl<T>,
        to_f64: impl Fn(T::T) -> f64,
        put: &mut dyn FnMut(usize, usize, Option<f64>) -> std::result::Result<(), Fault>,
    ) -> parquet::errors::Result<std::result::Result<(), Fault>>
    where
        T::T: Copy,
    {
        let (mut defs, mut values) = (Vec::new(), Vec::new());
        // The next row of the chunk the reader gives, and the last row read with its value.
        let mut at = 0;
        let mut last: Option<(usize, Option<f64>)> = None;
        for &(row, slot) in self.wanted {
            let local = row - self.first;
            let value = match last {
                Some((r, v)) if r == row => v,
                _ => {
                    if local > at {
                        let skipped = r.skip_records(local - at)?;
                        if skipped < local - at {
                            return Err(short(at + skipped, local));
                        }
                    }
                    defs.clear();
                    values.clear();
                    let (records, _, _) = r.read_records(1, Some(&mut defs), None, &mut values)?;
                    if records != 1 {
                        return Err(short(local, local));
                    }
                    at = local + 1;
                    let present = self.max_def == 0 || defs.first() == Some(&self.max_def);
                    let v = values.first().filter(|_| present).map(|&v| to_f64(v));
                    last = Some((row, v));
                    v
                }
            };
            if let Err(f) = put(row, slot, value) {
                return Ok(Err(f));
            }
        }
        Ok(Ok(()))
    }
}

/// A column chunk that ends after `rows` rows, before row `wanted` (both from 0).
fn short(rows: usize, wanted: usize) -> ParquetError {
    ParquetError::General(format!(
        "the column chunk ends after {rows} rows, before its row {wanted} that the footer announces"
    ))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use parquet::data_type::FloatType;
    use parquet::file::writer::SerializedFileWriter;

    use super::*;

    /// Writes `rows` rows of `columns` float columns (`value(row, column)`; `None` a null, the
    /// columns then optional) as row groups of `group` rows; the rows' values as written.
    fn write(
        path: &Path,
        rows: usize,
        columns: usize,
        group: usize,
        value: impl Fn(usize, usize) -> Option<f32>,
    ) {
        let fields: String = (0..columns)
            .map(|c| format!("optional float c{c};"))
            .collect();
        let schema =
            parquet::schema::parser::parse_message_type(&format!("message m {{ {fields} }}"))
                .expect("schema");
        let file = File::create(path).expect("create");
        let mut w =
            SerializedFileWriter::new(file, Arc::new(schema), Default::default()).expect("writer");
        for start in (0..rows).step_by(group) {
            let end = (start + group).min(rows);
            let mut rg = w.next_row_group().expect("row group");
            let mut c = 0;
            while let Some(mut col) = rg.next_column().expect("column") {
                let cells: Vec<Option<f32>> = (start..end).map(|r| value(r, c)).collect();
                let defs: Vec<i16> = cells.iter().map(|v| i16::from(v.is_some())).collect();
                let values: Vec<f32> = cells.iter().flatten().copied().collect();
                col.typed::<FloatType>()
                    .write_batch(&values, Some(&defs), None)
                    .expect("values");
                col.close().expect("close column");
                c += 1;
            }
            rg.close().expect("close row group");
        }
        w.close().expect("close");
    }

    /// Row `r`'s feature `c` (of 3) and its label, distinct in every cell.
    fn cell(r: usize, c: usize) -> Option<f32> {
        Some(if c == 3 {
            (r % 2) as f32
        } else {
            r as f32 * 0.25 + c as f32
        })
    }

    #[test]
    fn rows_in_any_order_across_row_groups_are_the_rows_read_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.parquet");
        write(&path, 23, 4, 5, cell);
        let whole = crate::data::parquet::table(
            &path,
            std::fs::read(&path).expect("read"),
            3,
            Labels::BINARY,
        )
        .expect("whole")
        .into_dataset(1, 3)
        .expect("data set");
        let p = ParquetRows::open(&path, 3, crate::data::labels::Labels::BINARY).expect("opens");
        assert_eq!(p.rows(), 23);
        // Shuffled, across every row group, one row twice, the last row of a group and the
        // first of the next.
        let rows = [22, 4, 5, 0, 17, 9, 9, 10, 3, 21];
        let (mut x, mut y) = (vec![0.0; rows.len() * 3], vec![0.0; rows.len()]);
        p.read(&rows, &mut x, &mut y).expect("reads");
        let (wx, wy) = whole.gather(&rows);
        assert_eq!(x, wx);
        assert_eq!(y, wy);
    }

    #[test]
    fn a_null_is_refused_at_the_cell_the_whole_file_loader_names() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.parquet");
        write(&path, 12, 4, 5, |r, c| {
            if (r, c) == (7, 1) { None } else { cell(r, c) }
        });
        let p = ParquetRows::open(&path, 3, crate::data::labels::Labels::BINARY).expect("opens");
        let (mut x, mut y) = (vec![0.0; 6], vec![0.0; 2]);
        p.read(&[1, 6], &mut x, &mut y)
            .expect("rows without the null");
        let e = p.read(&[7, 1], &mut x, &mut y).unwrap_err();
        let whole = crate::data::parquet::table(
            &path,
            std::fs::read(&path).expect("read"),
            3,
            Labels::BINARY,
        )
        .and_then(|t| t.into_dataset(1, 3).map_err(|f| f.in_file(&path, FORMAT)))
        .unwrap_err();
        let (TrainError::Data(streamed), TrainError::Data(whole)) = (&e, &whole) else {
            panic!("{e:?} / {whole:?}")
        };
        assert_eq!(streamed.place, whole.place);
        assert_eq!(streamed.place.to_string(), ", row 8, column 2 (`c1`)");
        assert_eq!(streamed.problem, whole.problem);
    }

    /// The file offset of the first page of column `c` in row group `g`.
    fn first_page(path: &Path, g: usize, c: usize) -> u64 {
        let r = SerializedFileReader::new(File::open(path).expect("open")).expect("footer");
        let chunk = r.metadata().row_group(g).column(c);
        let at = chunk
            .dictionary_page_offset()
            .unwrap_or(chunk.data_page_offset());
        u64::try_from(at).expect("offset")
    }

    #[test]
    fn a_corrupt_page_names_the_file_and_its_row_group() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.parquet");
        write(&path, 15, 4, 5, cell);
        // Row group 1's third column: its first page header overwritten.
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        file.write_all_at(&[0xff; 16], first_page(&path, 1, 2))
            .expect("corrupt");
        drop(file);
        let p = ParquetRows::open(&path, 3, crate::data::labels::Labels::BINARY)
            .expect("the footer is intact");
        let (mut x, mut y) = (vec![0.0; 6], vec![0.0; 2]);
        p.read(&[0, 14], &mut x, &mut y)
            .expect("row groups 0 and 2 read");
        let e = p.read(&[3, 6], &mut x, &mut y).unwrap_err();
        let TrainError::Data(d) = &e else {
            panic!("{e:?}")
        };
        assert_eq!(
            d.place,
            DataPlace::RowGroupColumn {
                group: 1,
                index: 3,
                name: "c2".into()
            }
        );
        assert!(matches!(d.problem, DataProblem::Corrupt { .. }), "{e}");
        let message = e.to_string();
        assert!(
            message.contains("t.parquet") && message.contains("row group 1"),
            "{message}"
        );
    }

    #[test]
    fn a_file_written_to_under_the_run_is_refused_naming_the_row_group() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.parquet");
        write(&path, 15, 4, 5, cell);
        let p = ParquetRows::open(&path, 3, crate::data::labels::Labels::BINARY).expect("opens");
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        // Same length, another modification time (set, so no clock is involved).
        file.set_modified(SystemTime::UNIX_EPOCH)
            .expect("set mtime");
        let (mut x, mut y) = (vec![0.0; 3], vec![0.0; 1]);
        let e = p.read(&[11], &mut x, &mut y).unwrap_err();
        let TrainError::Data(d) = &e else {
            panic!("{e:?}")
        };
        assert_eq!(d.place, DataPlace::RowGroup { group: 2 });
        assert!(matches!(d.problem, DataProblem::Changed { .. }), "{e}");
        assert!(e.to_string().contains("t.parquet"), "{e}");
    }

    #[test]
    fn the_reader_bound_is_the_largest_column_chunk_both_ways_and_the_header_buffer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.parquet");
        write(&path, 40, 4, 16, cell);
        let r = SerializedFileReader::new(File::open(&path).expect("open")).expect("footer");
        let largest = r
            .metadata()
            .row_groups()
            .iter()
            .flat_map(|g| g.columns())
            .map(|c| c.compressed_size() + c.uncompressed_size())
            .max()
            .expect("chunks");
        let p = ParquetRows::open(&path, 3, crate::data::labels::Labels::BINARY).expect("opens");
        assert_eq!(p.reader_bound(), largest as u64 + HEADER_BUFFER);
        // Less than the file's data: a column chunk, not a row group nor the table.
        let all: i64 = r
            .metadata()
            .row_groups()
            .iter()
            .map(|g| g.compressed_size())
            .sum();
        assert!((largest as u64) < all as u64, "{largest} of {all}");
    }

    #[test]
    fn a_table_of_another_width_or_not_parquet_is_refused_at_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.parquet");
        write(&path, 6, 4, 5, cell);
        let e = ParquetRows::open(&path, 4, crate::data::labels::Labels::BINARY).unwrap_err();
        assert!(e.to_string().contains("label column is missing"), "{e}");
        let not = dir.path().join("not.parquet");
        std::fs::write(&not, b"a,b,label\n1,2,0\n").expect("csv");
        let e = ParquetRows::open(&not, 2, crate::data::labels::Labels::BINARY).unwrap_err();
        assert!(e.to_string().contains("not a Parquet file"), "{e}");
    }
}
