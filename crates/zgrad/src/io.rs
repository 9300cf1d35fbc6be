//! safetensors files on the host: read any F32/F64/BF16/F16 tensor into the element type in
//! use (16-bit ones widened exactly and refused if not finite: `file_dtype`), write in the
//! element type's own dtype or, asked, in another float format ([`write_tensors_as`]).
//! Parameter files, oracle fixtures and checkpoints all go through here.

use crate::error::{GradError, Result};
use crate::file_dtype::{FileDtype, narrow, widen};
use safetensors::{Dtype, SafeTensors, tensor::TensorView};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use zcompute::{DType, Element};

/// A dense tensor in host memory (row-major).
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor<T> {
    pub shape: Vec<usize>,
    pub data: Vec<T>,
}

/// Tensors of a file by name, plus the file's metadata.
#[derive(Clone, Debug, Default)]
pub struct TensorFile<T> {
    pub tensors: BTreeMap<String, HostTensor<T>>,
    pub metadata: HashMap<String, String>,
}

pub(crate) fn st_error(path: &Path, e: impl std::fmt::Display) -> GradError {
    GradError::SafeTensors {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

/// Decodes little-endian F32 or F64 bytes into `T`.
fn decode<T: Element>(path: &Path, name: &str, view: &TensorView<'_>) -> Result<Vec<T>> {
    decode_bytes(path, name, view.dtype(), view.data())
}

/// Decodes little-endian F32, F64, BF16 or F16 `bytes` of dtype `dtype` into `T`. Any other
/// dtype is an `UnsupportedDtype`, a NaN or infinity in a 16-bit tensor a `NonFiniteInFile`,
/// both naming the tensor.
pub(crate) fn decode_bytes<T: Element>(
    path: &Path,
    name: &str,
    dtype: Dtype,
    bytes: &[u8],
) -> Result<Vec<T>> {
    match FileDtype::of(dtype) {
        Some(FileDtype::F32) => Ok(bytes
            .chunks_exact(4)
            .map(|c| T::from_f64(f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))))
            .collect()),
        Some(FileDtype::F64) => Ok(bytes
            .chunks_exact(8)
            .map(|c| {
                let mut a = [0u8; 8];
                a.copy_from_slice(c);
                T::from_f64(f64::from_le_bytes(a))
            })
            .collect()),
        Some(reduced) => bytes
            .chunks_exact(2)
            .enumerate()
            .map(|(index, c)| {
                let value = widen(reduced, u16::from_le_bytes([c[0], c[1]]));
                if value.is_finite() {
                    Ok(T::from_f64(f64::from(value)))
                } else {
                    Err(GradError::NonFiniteInFile {
                        file: path.display().to_string(),
                        name: name.to_string(),
                        dtype,
                        index,
                        value,
                    })
                }
            })
            .collect(),
        None => Err(GradError::UnsupportedDtype {
            file: path.display().to_string(),
            name: name.to_string(),
            dtype,
        }),
    }
}

/// Reads every tensor of a safetensors file, converted to `T`.
pub fn read_tensors<T: Element>(path: &Path) -> Result<TensorFile<T>> {
    let bytes = std::fs::read(path).map_err(|source| GradError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| st_error(path, e))?;
    let file = SafeTensors::deserialize(&bytes).map_err(|e| st_error(path, e))?;
    let mut tensors = BTreeMap::new();
    for (name, view) in file.tensors() {
        let data = decode(path, &name, &view)?;
        tensors.insert(
            name,
            HostTensor {
                shape: view.shape().to_vec(),
                data,
            },
        );
    }
    Ok(TensorFile {
        tensors,
        metadata: header.metadata().clone().unwrap_or_default(),
    })
}

pub(crate) fn encode<T: Element>(data: &[T]) -> (Dtype, Vec<u8>) {
    match T::DTYPE {
        // `to_f64` of an f32 is exact and so is the cast back: the bytes are the f32's own.
        #[allow(clippy::cast_possible_truncation)]
        DType::F32 => (
            Dtype::F32,
            data.iter()
                .flat_map(|v| (v.to_f64() as f32).to_le_bytes())
                .collect(),
        ),
        DType::F64 => (
            Dtype::F64,
            data.iter().flat_map(|v| v.to_f64().to_le_bytes()).collect(),
        ),
    }
}

/// `data` in the file format `dtype`: float32 and float64 as they are (float64 to float32
/// rounded to nearest), bf16 and f16 rounded to nearest-even; a value that would not be finite
/// there (NaN, infinity, or too large: f16 ends at 65,504) is a `NotRepresentable` naming the
/// tensor, since reading the file back would refuse it.
pub(crate) fn encode_as<T: Element>(
    path: &Path,
    name: &str,
    data: &[T],
    dtype: FileDtype,
) -> Result<(Dtype, Vec<u8>)> {
    match dtype {
        // Rounding a float64 to float32 is the point of asking for float32; a float32 is
        // exact through `to_f64`.
        #[allow(clippy::cast_possible_truncation)]
        FileDtype::F32 => {
            let bytes = data
                .iter()
                .flat_map(|v| (v.to_f64() as f32).to_le_bytes())
                .collect();
            return Ok((Dtype::F32, bytes));
        }
        FileDtype::F64 => {
            let bytes = data.iter().flat_map(|v| v.to_f64().to_le_bytes()).collect();
            return Ok((Dtype::F64, bytes));
        }
        FileDtype::Bf16 | FileDtype::F16 => {}
    }
    let mut bytes = Vec::with_capacity(2 * data.len());
    for (index, v) in data.iter().enumerate() {
        let value = v.to_f64();
        let bits = narrow(dtype, value);
        if !widen(dtype, bits).is_finite() {
            return Err(GradError::NotRepresentable {
                file: path.display().to_string(),
                name: name.to_string(),
                dtype: dtype.safetensors(),
                index,
                value,
            });
        }
        bytes.extend_from_slice(&bits.to_le_bytes());
    }
    Ok((dtype.safetensors(), bytes))
}

/// Writes tensors (in `T`'s dtype) and optional metadata to a safetensors file.
pub fn write_tensors<T: Element>(
    path: &Path,
    tensors: &[(String, HostTensor<T>)],
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    let own = match T::DTYPE {
        DType::F32 => FileDtype::F32,
        DType::F64 => FileDtype::F64,
    };
    write_tensors_as(path, tensors, metadata, own)
}

/// Writes tensors and optional metadata to a safetensors file with every tensor stored as
/// `dtype`: `FileDtype::Bf16` gives the file of a PyTorch bf16 `state_dict` (values rounded to
/// nearest-even; `NotRepresentable` for a value that is not finite there, and then no file is
/// written). Reading it back gives float32 masters of the rounded values.
pub fn write_tensors_as<T: Element>(
    path: &Path,
    tensors: &[(String, HostTensor<T>)],
    metadata: Option<HashMap<String, String>>,
    dtype: FileDtype,
) -> Result<()> {
    let mut encoded: Vec<(String, Vec<usize>, Dtype, Vec<u8>)> = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let (dtype, bytes) = encode_as(path, name, &t.data, dtype)?;
        encoded.push((name.clone(), t.shape.clone(), dtype, bytes));
    }
    let mut views = Vec::with_capacity(encoded.len());
    for (name, shape, dtype, bytes) in &encoded {
        let view = TensorView::new(*dtype, shape.clone(), bytes).map_err(|e| st_error(path, e))?;
        views.push((name.clone(), view));
    }
    safetensors::serialize_to_file(views, metadata, path).map_err(|e| st_error(path, e))
}

/// Looks a tensor up by name, checking its shape when `shape` is given.
pub fn take<'f, T>(
    file: &'f TensorFile<T>,
    path: &Path,
    name: &str,
    shape: Option<&[usize]>,
) -> Result<&'f HostTensor<T>> {
    let t = file
        .tensors
        .get(name)
        .ok_or_else(|| GradError::BadTensorFile {
            file: path.display().to_string(),
            name: name.to_string(),
            problem: "missing".to_string(),
        })?;
    if let Some(shape) = shape
        && t.shape != shape
    {
        return Err(GradError::BadTensorFile {
            file: path.display().to_string(),
            name: name.to_string(),
            problem: format!("shape {:?}, expected {shape:?}", t.shape),
        });
    }
    Ok(t)
}
