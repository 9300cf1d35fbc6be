//! safetensors files (`safetensors.numpy.save_file`, `safetensors.torch.save_file`): tensors
//! `x` `[N, S, F]` and `y` `[N]` or `[N, 1]` (`[N, K]` for a task of `K` target values), of any
//! integer or float32/64 type.

use std::path::Path;

use safetensors::SafeTensors;

use super::Dataset;
use super::elements::{Array, Elem, samples};
use super::labels::Labels;
use super::table::Fault;
use crate::error::{DataError, DataPlace, DataProblem, TrainError};

pub(crate) const FORMAT: &str = "safetensors";

/// Whether `bytes` start as safetensors do: an 8-byte header length that fits the file, then
/// a JSON object.
fn looks_like(bytes: &[u8]) -> bool {
    let Some(len) = bytes.get(..8) else {
        return false;
    };
    let len = u64::from_le_bytes(len.try_into().unwrap_or([0xff; 8]));
    len >= 2 && len <= (bytes.len() as u64 - 8) && bytes.get(8) == Some(&b'{')
}

/// The data set of the safetensors `bytes` read from `path`.
pub fn load(
    path: &Path,
    bytes: &[u8],
    scales: usize,
    features: usize,
    labels: Labels,
) -> Result<Dataset, TrainError> {
    let fail = |f: Fault| f.in_file(path, FORMAT);
    if !looks_like(bytes) {
        return Err(fail(Fault::new(
            DataPlace::File,
            DataProblem::NotThisFormat { expected: FORMAT },
        )));
    }
    let file = SafeTensors::deserialize(bytes).map_err(|e| {
        TrainError::from(DataError {
            path: path.to_path_buf(),
            format: FORMAT,
            place: DataPlace::File,
            problem: DataProblem::Corrupt {
                detail: e.to_string(),
            },
            source: Some(Box::new(e)),
        })
    })?;
    let array = |name: &str| -> Result<Array, TrainError> {
        let t = file.tensor(name).map_err(|_| {
            let mut found: Vec<String> = file.names().into_iter().map(str::to_string).collect();
            found.sort();
            fail(Fault::new(
                DataPlace::File,
                DataProblem::MissingArray {
                    name: name.into(),
                    found,
                },
            ))
        })?;
        let elem = Elem::from_safetensors(t.dtype()).ok_or_else(|| {
            fail(Fault::new(
                DataPlace::Array(name.into()),
                DataProblem::NotNumeric {
                    found: format!("dtype {:?}", t.dtype()),
                },
            ))
        })?;
        Ok(Array {
            elem,
            shape: t.shape().to_vec(),
            fortran: false,
            data: t.data().to_vec(),
        })
    };
    let (x, y) = (array("x")?, array("y")?);
    let (xs, ys) = samples(&x, &y, scales, features, labels).map_err(|(f, _)| fail(f))?;
    Ok(Dataset {
        scales,
        features,
        x: xs,
        y: ys,
    })
}
