//! Training checkpoints, one safetensors format for every model and for `ztrain`: the
//! parameters under the model's names (so a checkpoint is also a parameter file that
//! `XAsset::load` and PyTorch's `load_state_dict` read, and a PyTorch `state_dict` saved with
//! safetensors loads as parameters), AdamW's moments as `optim.m.<name>` / `optim.v.<name>`
//! or SGD's momentum buffers as `optim.momentum_buffer.<name>` (PyTorch's state names), the
//! step count and the optimiser (`zgrad.step`, `zgrad.optimizer`; `zgrad.precision` when the
//! run was not float32) in the metadata next to
//! whatever metadata the caller adds, and
//! any tensors a layer above keeps beside them (`ztrain.*` counters, stored as they are).
//!
//! The reading and writing below are free functions over named host tensors
//! ([`CheckpointFile`]); the trainer's `save_checkpoint` / `load_checkpoint` are thin calls.

use crate::error::{GradError, Result};
use crate::file_dtype::FileDtype;
use crate::io::{HostTensor, TensorFile, decode_bytes, encode, st_error, write_tensors_as};
use crate::model::Model;
use crate::optim::{AdamWState, Moments, MomentumBuffer, OptimizerKind, OptimizerState, SgdState};
use crate::precision::Precision;
use crate::trainer::Trainer;
use safetensors::{Dtype, SafeTensors, tensor::TensorView};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use zcompute::{Capture, Element};

/// Metadata key holding the optimiser's step count.
pub const STEP_KEY: &str = "zgrad.step";

/// Metadata key naming the optimiser whose state the file holds (`adamw`, `sgd`).
pub const OPTIMIZER_KEY: &str = "zgrad.optimizer";

/// Metadata key naming the precision policy a checkpoint was trained under (`tf32`, `bf16`),
/// written only when not float32 (a float32 checkpoint is as before; a file without the key
/// was trained in float32).
pub const PRECISION_KEY: &str = "zgrad.precision";

/// Refuses to resume a checkpoint whose metadata names another precision policy than
/// `requested` ([`PRECISION_KEY`]; absent: float32): the products of the steps to come would
/// differ from the run that wrote it, so the resumed run could not continue bit for bit
/// (`PrecisionMismatch`; its parameters can start a new run under any policy). An unknown
/// name is a `BadTensorFile`.
pub fn check_precision(
    metadata: &HashMap<String, String>,
    requested: Precision,
    path: &Path,
) -> Result<()> {
    let saved = match metadata.get(PRECISION_KEY) {
        None => Precision::F32,
        Some(name) => Precision::from_name(name).ok_or_else(|| GradError::BadTensorFile {
            file: path.display().to_string(),
            name: PRECISION_KEY.to_string(),
            problem: format!("metadata {name:?} is not a precision (f32, tf32, bf16)"),
        })?,
    };
    if saved != requested {
        return Err(GradError::PrecisionMismatch {
            saved: saved.name(),
            requested: requested.name(),
        });
    }
    Ok(())
}

/// The state slot of SGD's momentum buffers (`optim.momentum_buffer.<name>`).
const MOMENTUM_SLOT: &str = "momentum_buffer";

/// Prefix of the optimiser state's tensors (`optim.m.<name>`, `optim.v.<name>`).
pub const OPTIM_PREFIX: &str = "optim.";

/// One tensor as a checkpoint stores it: dtype, shape and little-endian bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct RawTensor {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

impl RawTensor {
    /// A host tensor in its element type's dtype.
    #[must_use]
    pub fn of<T: Element>(t: &HostTensor<T>) -> Self {
        let (dtype, bytes) = encode(&t.data);
        RawTensor {
            dtype,
            shape: t.shape.clone(),
            bytes,
        }
    }

    /// A `U64` tensor of `values` (shape `[len]`).
    #[must_use]
    pub fn u64s(values: &[u64]) -> Self {
        RawTensor {
            dtype: Dtype::U64,
            shape: vec![values.len()],
            bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    /// The values of a `U64` tensor (`None` for another dtype).
    #[must_use]
    pub fn to_u64s(&self) -> Option<Vec<u64>> {
        (self.dtype == Dtype::U64).then(|| {
            self.bytes
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
                .collect()
        })
    }

    fn is_float(&self) -> bool {
        FileDtype::of(self.dtype).is_some()
    }
}

/// A checkpoint in host memory.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointFile<T> {
    /// Parameters by name.
    pub parameters: BTreeMap<String, HostTensor<T>>,
    /// Optimiser state by `<slot>.<parameter name>` (`m.emb.weight`), stored under
    /// `optim.<slot>.<name>`.
    pub optimizer: BTreeMap<String, HostTensor<T>>,
    /// Tensors of other dtypes (a layer above's counters), as stored.
    pub other: BTreeMap<String, RawTensor>,
    pub metadata: HashMap<String, String>,
}

impl<T: Element> CheckpointFile<T> {
    /// The checkpoint of a model's named parameters and its optimiser's state (the step in
    /// the metadata under [`STEP_KEY`], the optimiser under [`OPTIMIZER_KEY`]).
    #[must_use]
    pub fn of_state(
        parameters: Vec<(String, HostTensor<T>)>,
        state: impl Into<OptimizerState<T>>,
    ) -> Self {
        let state = state.into();
        let mut optimizer = BTreeMap::new();
        let (step, kind) = (state.step(), state.kind());
        match state {
            OptimizerState::AdamW(s) => {
                for m in s.moments {
                    let (shape, name) = (m.shape, m.name);
                    let m_tensor = HostTensor {
                        shape: shape.clone(),
                        data: m.m,
                    };
                    optimizer.insert(format!("m.{name}"), m_tensor);
                    optimizer.insert(format!("v.{name}"), HostTensor { shape, data: m.v });
                }
            }
            OptimizerState::Sgd(s) => {
                for b in s.buffers {
                    let t = HostTensor {
                        shape: b.shape,
                        data: b.buf,
                    };
                    optimizer.insert(format!("{MOMENTUM_SLOT}.{}", b.name), t);
                }
            }
        }
        CheckpointFile {
            parameters: parameters.into_iter().collect(),
            optimizer,
            other: BTreeMap::new(),
            metadata: HashMap::from([
                (STEP_KEY.to_string(), step.to_string()),
                (OPTIMIZER_KEY.to_string(), kind.name().to_string()),
            ]),
        }
    }

    /// The optimiser whose state the file holds: its metadata's [`OPTIMIZER_KEY`], else (a
    /// file written before the key, or by a layer above that keeps its own metadata) what its
    /// state tensors are (`m.`/`v.`: AdamW; `momentum_buffer.`: SGD). `None` when neither says.
    #[must_use]
    pub fn optimizer_name(&self) -> Option<String> {
        if let Some(name) = self.metadata.get(OPTIMIZER_KEY) {
            return Some(name.clone());
        }
        let has = |slot: &str| {
            self.optimizer
                .keys()
                .any(|k| k.starts_with(&format!("{slot}.")))
        };
        if has("m") || has("v") {
            Some(OptimizerKind::AdamW.name().to_string())
        } else if has(MOMENTUM_SLOT) {
            Some(OptimizerKind::Sgd { momentum: true }.name().to_string())
        } else {
            None
        }
    }

    /// Every tensor under its name in the file, sorted by name (safetensors' order).
    #[must_use]
    pub fn entries(&self) -> BTreeMap<String, RawTensor> {
        let mut out: BTreeMap<String, RawTensor> = self
            .parameters
            .iter()
            .map(|(n, t)| (n.clone(), RawTensor::of(t)))
            .collect();
        for (n, t) in &self.optimizer {
            out.insert(format!("{OPTIM_PREFIX}{n}"), RawTensor::of(t));
        }
        for (n, t) in &self.other {
            out.insert(n.clone(), t.clone());
        }
        out
    }

    /// Sorts stored tensors into parameters (floats outside `optim.`), optimiser state
    /// (floats under `optim.`) and the others (`U64`: a layer above's counters, the one other
    /// dtype [`RawTensor`] writes), decoding floats (F32, F64, BF16, F16) into `T`. A tensor of
    /// any other dtype (a PyTorch `int64` buffer, say) is an `UnsupportedDtype` naming it.
    pub fn from_entries(
        entries: BTreeMap<String, RawTensor>,
        metadata: HashMap<String, String>,
        path: &Path,
    ) -> Result<Self> {
        let mut file = CheckpointFile {
            parameters: BTreeMap::new(),
            optimizer: BTreeMap::new(),
            other: BTreeMap::new(),
            metadata,
        };
        for (name, raw) in entries {
            if !raw.is_float() {
                if raw.dtype != Dtype::U64 {
                    return Err(GradError::UnsupportedDtype {
                        file: path.display().to_string(),
                        name,
                        dtype: raw.dtype,
                    });
                }
                file.other.insert(name, raw);
                continue;
            }
            let t = HostTensor {
                data: decode_bytes(path, &name, raw.dtype, &raw.bytes)?,
                shape: raw.shape,
            };
            match name.strip_prefix(OPTIM_PREFIX) {
                Some(rest) => file.optimizer.insert(rest.to_string(), t),
                None => file.parameters.insert(name, t),
            };
        }
        Ok(file)
    }

    /// The file's bytes (`path` only names it in errors).
    pub fn to_bytes(&self, path: &Path) -> Result<Vec<u8>> {
        serialize(&self.entries(), &self.metadata, path)
    }

    /// Parses a checkpoint's bytes (`path` only names it in errors).
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Self> {
        let (entries, metadata) = deserialize(bytes, path)?;
        Self::from_entries(entries, metadata, path)
    }

    /// Reads the checkpoint at `path`.
    pub fn read(path: &Path) -> Result<Self> {
        Self::from_bytes(&read_file(path)?, path)
    }

    /// Reads the checkpoint at `path` to resume training from: as [`CheckpointFile::read`],
    /// but a parameter or moment stored in bf16 or f16 is a `ReducedPrecisionResume` (see
    /// [`refuse_reduced_precision`]).
    pub fn read_for_resume(path: &Path) -> Result<Self> {
        let (entries, metadata) = deserialize(&read_file(path)?, path)?;
        refuse_reduced_precision(&entries, path)?;
        Self::from_entries(entries, metadata, path)
    }

    /// Writes the checkpoint to `path`.
    pub fn write(&self, path: &Path) -> Result<()> {
        let bytes = self.to_bytes(path)?;
        std::fs::write(path, bytes).map_err(|source| GradError::Io {
            path: path.display().to_string(),
            source,
        })
    }

    /// The step count of the metadata.
    pub fn step(&self, path: &Path) -> Result<u64> {
        self.metadata
            .get(STEP_KEY)
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| GradError::BadTensorFile {
                file: path.display().to_string(),
                name: STEP_KEY.to_string(),
                problem: "metadata entry missing or not a number".to_string(),
            })
    }

    /// The parameter values in the order of `expected` (name and shape of each of the
    /// model's parameters) and the state at `step` of an optimiser of `kind` (the trainer's:
    /// a file of another optimiser is an `OptimizerMismatch`), every tensor checked against
    /// its shape before anything is returned: the missing, misshapen and extra ones (a
    /// parameter or moment of no parameter of the model: a checkpoint of a deeper model),
    /// moments included, all named in one `ParameterMismatch`.
    pub fn training_state(
        &self,
        expected: &[(String, Vec<usize>)],
        step: u64,
        path: &Path,
        kind: OptimizerKind,
    ) -> Result<(Vec<Vec<T>>, OptimizerState<T>)> {
        if let Some(saved) = self.optimizer_name()
            && saved != kind.name()
        {
            return Err(GradError::OptimizerMismatch {
                file: path.display().to_string(),
                saved,
                now: kind.name().to_string(),
            });
        }
        let (mut missing, mut misshapen) = (Vec::new(), Vec::new());
        let mut check = |stored: &str, t: Option<&HostTensor<T>>, shape: &[usize]| match t {
            None => missing.push(stored.to_string()),
            Some(t) if t.shape != shape => {
                misshapen.push(format!("{stored} {:?} (the model's {shape:?})", t.shape));
            }
            Some(_) => {}
        };
        for (name, shape) in expected {
            check(name, self.parameters.get(name), shape);
            for slot in kind.slots() {
                let key = format!("{slot}.{name}");
                check(
                    &format!("{OPTIM_PREFIX}{key}"),
                    self.optimizer.get(&key),
                    shape,
                );
            }
        }
        let known: std::collections::BTreeSet<&str> =
            expected.iter().map(|(n, _)| n.as_str()).collect();
        let mut extra: Vec<String> = self
            .parameters
            .keys()
            .filter(|n| !known.contains(n.as_str()))
            .cloned()
            .collect();
        extra.extend(
            self.optimizer
                .keys()
                .filter(|k| !state_of(k, kind).is_some_and(|n| known.contains(n)))
                .map(|k| format!("{OPTIM_PREFIX}{k}")),
        );
        if !(missing.is_empty() && misshapen.is_empty() && extra.is_empty()) {
            return Err(GradError::ParameterMismatch {
                file: path.display().to_string(),
                missing,
                extra,
                misshapen,
            });
        }
        let values = expected
            .iter()
            .map(|(n, _)| self.parameters[n].data.clone())
            .collect();
        let stored =
            |slot: &str, name: &str| self.optimizer[&format!("{slot}.{name}")].data.clone();
        let state = match kind {
            OptimizerKind::AdamW => AdamWState {
                step,
                moments: expected
                    .iter()
                    .map(|(name, shape)| Moments {
                        name: name.clone(),
                        shape: shape.clone(),
                        m: stored("m", name),
                        v: stored("v", name),
                    })
                    .collect(),
            }
            .into(),
            OptimizerKind::Sgd { momentum } => SgdState {
                step,
                buffers: expected
                    .iter()
                    .filter(|_| momentum)
                    .map(|(name, shape)| MomentumBuffer {
                        name: name.clone(),
                        shape: shape.clone(),
                        buf: stored(MOMENTUM_SLOT, name),
                    })
                    .collect(),
            }
            .into(),
        };
        Ok((values, state))
    }
}

/// Refuses tensors stored in bf16 or f16 (`ReducedPrecisionResume`, naming the first): a run
/// resumes from float32 master parameters and moments, and widening 16-bit values would pass a
/// rounded model off as the one that was saved (the run would not continue as it was).
pub fn refuse_reduced_precision(entries: &BTreeMap<String, RawTensor>, path: &Path) -> Result<()> {
    match entries
        .iter()
        .find(|(_, t)| FileDtype::of(t.dtype).is_some_and(FileDtype::is_reduced))
    {
        Some((name, t)) => Err(GradError::ReducedPrecisionResume {
            file: path.display().to_string(),
            name: name.clone(),
            dtype: t.dtype,
        }),
        None => Ok(()),
    }
}

/// The parameter name of an optimiser-state key of one of `kind`'s slots (`m.<name>`, ...).
fn state_of(key: &str, kind: OptimizerKind) -> Option<&str> {
    let (slot, name) = key.split_once('.')?;
    kind.slots().contains(&slot).then_some(name)
}

/// Serialises `entries` and `metadata` to safetensors bytes.
pub fn serialize(
    entries: &BTreeMap<String, RawTensor>,
    metadata: &HashMap<String, String>,
    path: &Path,
) -> Result<Vec<u8>> {
    let mut views = Vec::with_capacity(entries.len());
    for (name, t) in entries {
        let view =
            TensorView::new(t.dtype, t.shape.clone(), &t.bytes).map_err(|e| st_error(path, e))?;
        views.push((name.clone(), view));
    }
    safetensors::serialize(views, Some(metadata.clone())).map_err(|e| st_error(path, e))
}

/// Parses safetensors bytes into their tensors (as stored) and metadata.
pub fn deserialize(
    bytes: &[u8],
    path: &Path,
) -> Result<(BTreeMap<String, RawTensor>, HashMap<String, String>)> {
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(|e| st_error(path, e))?;
    let st = SafeTensors::deserialize(bytes).map_err(|e| st_error(path, e))?;
    let entries = st
        .tensors()
        .into_iter()
        .map(|(name, v)| {
            let raw = RawTensor {
                dtype: v.dtype(),
                shape: v.shape().to_vec(),
                bytes: v.data().to_vec(),
            };
            (name, raw)
        })
        .collect();
    Ok((entries, header.metadata().clone().unwrap_or_default()))
}

fn read_file(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| GradError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// A parameter file's float tensors as a [`TensorFile`]: a PyTorch `state_dict` saved with
/// safetensors, an oracle input (`x`, `y` beside the parameters) or a checkpoint, whose
/// optimiser state (`optim.*`) and other-dtype tensors (`ztrain.*`) it leaves out.
pub fn parameter_file_from_bytes<T: Element>(bytes: &[u8], path: &Path) -> Result<TensorFile<T>> {
    let file = CheckpointFile::<T>::from_bytes(bytes, path)?;
    Ok(TensorFile {
        tensors: file.parameters,
        metadata: file.metadata,
    })
}

/// [`parameter_file_from_bytes`] of the file at `path`.
pub fn read_parameter_file<T: Element>(path: &Path) -> Result<TensorFile<T>> {
    parameter_file_from_bytes(&read_file(path)?, path)
}

impl<B: Capture<T> + 'static, T: Element, M: Model<B, T>> Trainer<B, T, M> {
    /// Writes parameters, optimiser state and `metadata` (plus `zgrad.step`) to `path`.
    /// Refuses (`StateUnknown`) while a failed step left the state unknown: such a checkpoint
    /// would pass a partly applied update off as a clean step.
    pub fn save_checkpoint(&self, path: &Path, metadata: HashMap<String, String>) -> Result<()> {
        self.optimizer().check_state()?;
        let b = self.backend();
        let tensors = self.model().to_host(b)?;
        let names: Vec<String> = tensors.iter().map(|(n, _)| n.clone()).collect();
        let mut file = CheckpointFile::of_state(tensors, self.optimizer().export(b, &names)?);
        let precision = self.config().precision;
        if precision != Precision::F32 {
            file.metadata
                .insert(PRECISION_KEY.to_string(), precision.name().to_string());
        }
        for (k, v) in metadata {
            file.metadata.entry(k).or_insert(v);
        }
        file.write(path)
    }

    /// Writes the model's parameters alone (no optimiser state, no step) to `path` with every
    /// tensor stored as `dtype`: with `FileDtype::Bf16` the file of a PyTorch bf16
    /// `state_dict` (rounded to nearest-even; a value not finite in bf16 is a
    /// `NotRepresentable` and nothing is written). Such a file starts a model
    /// (`XAsset::load`, `ztrain --init-from`), never resumes one (`load_checkpoint` refuses it).
    pub fn export_parameters(&self, path: &Path, dtype: FileDtype) -> Result<()> {
        let tensors = self.model().to_host(self.backend())?;
        write_tensors_as(path, &tensors, None, dtype)
    }

    /// Restores parameters and optimiser state saved by `save_checkpoint` into this trainer
    /// (same model sizes) and returns the file's metadata. A checkpoint trained under another
    /// precision policy is refused (`PrecisionMismatch`, [`check_precision`]). A file whose tensors are bf16 or
    /// f16 is refused (`ReducedPrecisionResume`): resuming needs float32 masters. Captured graphs keep working: the
    /// values are written into the existing tensors. A file that does not match changes
    /// nothing; a load that succeeds clears an unknown state left by a failed step
    /// (`Applied::Maybe`), and one that fails while writing leaves the state unknown.
    pub fn load_checkpoint(&mut self, path: &Path) -> Result<HashMap<String, String>> {
        let file = CheckpointFile::<T>::read_for_resume(path)?;
        let step = file.step(path)?;
        check_precision(&file.metadata, self.config().precision, path)?;
        let params = self.model().named_parameters();
        let expected: Vec<(String, Vec<usize>)> = params
            .iter()
            .map(|(n, p)| (n.clone(), p.shape().to_vec()))
            .collect();
        // Every tensor is checked before anything is written: a bad file changes nothing.
        let kind = self.optimizer().kind();
        let (values, state) = file.training_state(&expected, step, path, kind)?;
        self.restore(&values, &state)?;
        Ok(file.metadata)
    }
}
