//! safetensors files on the host: read any F32/F64 tensor into the element type in use, write
//! in the element type's own dtype. Parameter files, oracle fixtures and checkpoints all go
//! through here.

use crate::error::{GradError, Result};
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

/// Decodes little-endian F32 or F64 `bytes` of dtype `dtype` into `T` (other dtypes: a
/// `BadTensorFile` naming the tensor).
pub(crate) fn decode_bytes<T: Element>(
    path: &Path,
    name: &str,
    dtype: Dtype,
    bytes: &[u8],
) -> Result<Vec<T>> {
    match dtype {
        Dtype::F32 => Ok(bytes
            .chunks_exact(4)
            .map(|c| T::from_f64(f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))))
            .collect()),
        Dtype::F64 => Ok(bytes
            .chunks_exact(8)
            .map(|c| {
                let mut a = [0u8; 8];
                a.copy_from_slice(c);
                T::from_f64(f64::from_le_bytes(a))
            })
            .collect()),
        other => Err(GradError::BadTensorFile {
            file: path.display().to_string(),
            name: name.to_string(),
            problem: format!("dtype {other:?} is not supported (F32 or F64 only)"),
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

/// Writes tensors (in `T`'s dtype) and optional metadata to a safetensors file.
pub fn write_tensors<T: Element>(
    path: &Path,
    tensors: &[(String, HostTensor<T>)],
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    let encoded: Vec<(String, Vec<usize>, Dtype, Vec<u8>)> = tensors
        .iter()
        .map(|(name, t)| {
            let (dtype, bytes) = encode(&t.data);
            (name.clone(), t.shape.clone(), dtype, bytes)
        })
        .collect();
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
