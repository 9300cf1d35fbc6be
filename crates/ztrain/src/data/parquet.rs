//! Parquet tables (pyarrow's and pandas' `to_parquet`): one row per sample (or per bar with
//! `--window`), numeric columns, the features in order and then the label; names free. Read
//! through parquet's own column readers, a row group at a time, into a [`Table`].

use std::path::Path;

use parquet::basic::Type as Physical;
use parquet::column::reader::{ColumnReader, ColumnReaderImpl};
use parquet::data_type::DataType;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::schema::types::SchemaDescriptor;

use super::labels::Labels;
use super::table::{Fault, Table};
use crate::error::{DataError, DataPlace, DataProblem, TrainError};

pub(crate) const FORMAT: &str = "Parquet";

/// Records read per call: bounds the buffers, not the result.
const CHUNK: usize = 64 * 1024;

/// The Parquet reader's refusal of `path` at `place`, while `what` (whole or streamed).
pub(super) fn corrupt(
    path: &Path,
    place: DataPlace,
    what: impl std::fmt::Display,
    e: parquet::errors::ParquetError,
) -> TrainError {
    TrainError::from(DataError {
        path: path.to_path_buf(),
        format: FORMAT,
        place,
        problem: DataProblem::Corrupt {
            detail: format!("{what}: {e}"),
        },
        source: Some(Box::new(e)),
    })
}

/// The table of `width` feature columns and the label in the Parquet `bytes` read from
/// `path`, each label one `labels` takes.
pub fn table(
    path: &Path,
    bytes: Vec<u8>,
    width: usize,
    labels: Labels,
) -> Result<Table, TrainError> {
    let fail = |f: Fault| f.in_file(path, FORMAT);
    if !(bytes.len() >= 12 && bytes.starts_with(b"PAR1") && bytes.ends_with(b"PAR1")) {
        return Err(fail(Fault::new(
            DataPlace::File,
            DataProblem::NotThisFormat { expected: FORMAT },
        )));
    }
    let reader = SerializedFileReader::new(bytes::Bytes::from(bytes))
        .map_err(|e| corrupt(path, DataPlace::File, "its footer", e))?;
    let meta = reader.metadata();
    let schema = meta.file_metadata().schema_descr();
    let names: Vec<String> = schema.columns().iter().map(|c| c.path().string()).collect();
    let rows = usize::try_from(meta.file_metadata().num_rows()).unwrap_or(0);
    super::table::check_columns(names.len(), width, labels, rows).map_err(fail)?;
    check_numeric(schema, &names).map_err(fail)?;
    let mut table = Table::new(names, width, rows, labels).map_err(fail)?;
    let mut first = 0;
    for g in 0..meta.num_row_groups() {
        let group = reader
            .get_row_group(g)
            .map_err(|e| corrupt(path, DataPlace::File, format!("row group {g}"), e))?;
        let n = usize::try_from(group.metadata().num_rows()).unwrap_or(0);
        for c in 0..table.columns() {
            let max_def = schema.column(c).max_def_level();
            let place = table.column_place(c);
            let what = format!("row group {g}");
            let reader = group
                .get_column_reader(c)
                .map_err(|e| corrupt(path, place.clone(), &what, e))?;
            let read = match reader {
                ColumnReader::FloatColumnReader(r) => {
                    column(r, &mut table, c, first, n, max_def, f64::from)
                }
                ColumnReader::DoubleColumnReader(r) => {
                    column(r, &mut table, c, first, n, max_def, |v| v)
                }
                ColumnReader::Int32ColumnReader(r) => {
                    column(r, &mut table, c, first, n, max_def, f64::from)
                }
                ColumnReader::Int64ColumnReader(r) => {
                    column(r, &mut table, c, first, n, max_def, |v| v as f64)
                }
                ColumnReader::BoolColumnReader(r) => {
                    column(r, &mut table, c, first, n, max_def, |v| {
                        f64::from(u8::from(v))
                    })
                }
                // Checked above: every column is one of the types read.
                _ => Ok(Ok(())),
            };
            read.map_err(|e| corrupt(path, place, what, e))?
                .map_err(fail)?;
        }
        first += n;
    }
    Ok(table)
}

/// Every column of `schema` (named `names`) must hold flat numbers (float, double, int32,
/// int64 or boolean): the fault names the first that does not.
pub(crate) fn check_numeric(schema: &SchemaDescriptor, names: &[String]) -> Result<(), Fault> {
    for (c, name) in names.iter().enumerate() {
        let col = schema.column(c);
        let numeric = matches!(
            col.physical_type(),
            Physical::FLOAT
                | Physical::DOUBLE
                | Physical::INT32
                | Physical::INT64
                | Physical::BOOLEAN
        );
        if !numeric || col.max_rep_level() > 0 {
            return Err(Fault::new(
                DataPlace::Column {
                    index: c + 1,
                    name: name.clone(),
                },
                DataProblem::NotNumeric {
                    found: if numeric {
                        "a nested (repeated) column".into()
                    } else {
                        format!("{} values", col.physical_type())
                    },
                },
            ));
        }
    }
    Ok(())
}

/// Reads the `n` rows of column `c` in one row group (rows `first..`) into `table`: the
/// reader's error outside, a value's fault inside.
fn column<T: DataType>(
    mut r: ColumnReaderImpl<T>,
    table: &mut Table,
    c: usize,
    first: usize,
    n: usize,
    max_def: i16,
    to_f64: impl Fn(T::T) -> f64,
) -> parquet::errors::Result<Result<(), Fault>>
where
    T::T: Copy,
{
    let (mut defs, mut values) = (Vec::new(), Vec::new());
    let mut done = 0;
    while done < n {
        defs.clear();
        values.clear();
        let (records, _, _) =
            r.read_records((n - done).min(CHUNK), Some(&mut defs), None, &mut values)?;
        if records == 0 {
            break;
        }
        let put = if max_def == 0 {
            table.put_column(c, first + done, values.iter().map(|&v| Some(to_f64(v))))
        } else {
            let mut vals = values.iter();
            table.put_column(
                c,
                first + done,
                defs.iter().map(|&d| {
                    if d == max_def {
                        vals.next().map(|&v| to_f64(v))
                    } else {
                        None
                    }
                }),
            )
        };
        if let Err(f) = put {
            return Ok(Err(f));
        }
        done += records;
    }
    Ok(Ok(()))
}
