//! Arrow IPC files (`.arrow`, `.feather` version 2: pyarrow's `feather.write_feather` and
//! `ipc.new_file`): the columns as the Parquet table's, read batch by batch into a [`Table`].

use std::path::Path;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type,
    UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrowPrimitiveType, RecordBatch};

use super::labels::Labels;
use super::table::{Fault, Table};
use crate::error::{DataError, DataPlace, DataProblem, TrainError};

pub(crate) const FORMAT: &str = "Arrow IPC";

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

/// The table of `width` feature columns and the label in the Arrow IPC file `bytes`.
pub fn table(
    path: &Path,
    bytes: Vec<u8>,
    width: usize,
    labels: Labels,
) -> Result<Table, TrainError> {
    let fail = |f: Fault| f.in_file(path, FORMAT);
    if !bytes.starts_with(b"ARROW1") {
        return Err(fail(Fault::new(
            DataPlace::File,
            DataProblem::NotThisFormat { expected: FORMAT },
        )));
    }
    let reader = arrow_ipc::reader::FileReader::try_new(std::io::Cursor::new(bytes), None)
        .map_err(|e| corrupt(path, DataPlace::File, e))?;
    let names: Vec<String> = reader
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let batches: Vec<RecordBatch> = reader
        .collect::<Result<_, _>>()
        .map_err(|e| corrupt(path, DataPlace::File, e))?;
    let rows = batches.iter().map(RecordBatch::num_rows).sum();
    let mut table = Table::new(names, width, rows, labels).map_err(fail)?;
    let mut first = 0;
    for batch in &batches {
        for c in 0..table.columns() {
            put(&mut table, c, first, batch.column(c).as_ref()).map_err(fail)?;
        }
        first += batch.num_rows();
    }
    Ok(table)
}

/// Puts one batch's column `c` (rows `first..`) into `table`: any integer or float type, or
/// booleans; nulls are missing values.
fn put(table: &mut Table, c: usize, first: usize, a: &dyn Array) -> Result<(), Fault> {
    fn prim<T: ArrowPrimitiveType>(
        table: &mut Table,
        c: usize,
        first: usize,
        a: &dyn Array,
        f: impl Fn(T::Native) -> f64,
    ) -> Option<Result<(), Fault>> {
        let p = a.as_primitive_opt::<T>()?;
        Some(table.put_column(c, first, p.iter().map(|v| v.map(&f))))
    }
    let done = prim::<Float32Type>(table, c, first, a, f64::from)
        .or_else(|| prim::<Float64Type>(table, c, first, a, |v| v))
        .or_else(|| prim::<Int8Type>(table, c, first, a, f64::from))
        .or_else(|| prim::<Int16Type>(table, c, first, a, f64::from))
        .or_else(|| prim::<Int32Type>(table, c, first, a, f64::from))
        .or_else(|| prim::<Int64Type>(table, c, first, a, |v| v as f64))
        .or_else(|| prim::<UInt8Type>(table, c, first, a, f64::from))
        .or_else(|| prim::<UInt16Type>(table, c, first, a, f64::from))
        .or_else(|| prim::<UInt32Type>(table, c, first, a, f64::from))
        .or_else(|| prim::<UInt64Type>(table, c, first, a, |v| v as f64))
        .or_else(|| {
            let b = a.as_boolean_opt()?;
            Some(table.put_column(
                c,
                first,
                b.iter().map(|v| v.map(|v| f64::from(u8::from(v)))),
            ))
        });
    done.unwrap_or_else(|| {
        Err(Fault::new(
            table.column_place(c),
            DataProblem::NotNumeric {
                found: format!("{} values", a.data_type()),
            },
        ))
    })
}
