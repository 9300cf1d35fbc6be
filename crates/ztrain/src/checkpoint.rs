//! Checkpoints: zgrad's one checkpoint format (`zgrad::checkpoint`: parameters under the
//! model's names, so the file is also a parameter file the PyTorch oracle and `--init-from`
//! read, optimiser state under `optim.<slot>.<name>`, the step as `zgrad.step`), with what a
//! run adds layered on it: the run's counters, generator state and data order as `ztrain.*`
//! integer tensors, and the configuration as JSON in the metadata. Written atomically
//! (`crate::files`), so an interrupted or failed write leaves the old checkpoint.
//!
//! Safetensors does not checksum its data, so the metadata carries an FNV-1a checksum of every
//! tensor's bytes: a flipped bit is "corrupt", not a silently different run.

use std::collections::{BTreeMap, HashMap};
use std::io::Read as _;
use std::path::Path;

use safetensors::Dtype;
use serde_json::Value;
use zgrad::HostTensor;
use zgrad::checkpoint::{CheckpointFile, RawTensor, STEP_KEY, deserialize, serialize};

use crate::config::fnv1a;
use crate::error::{Result, TrainError};

/// Version of the layout below; a reader refuses other versions.
pub const FORMAT: &str = "ztrain-checkpoint-1";

const KEY_FORMAT: &str = "ztrain.format";
const KEY_CONFIG: &str = "ztrain.config";
const KEY_CHECKSUM: &str = "ztrain.checksum";
const KEY_BACKEND: &str = "ztrain.backend";
const T_COUNTERS: &str = "ztrain.counters";
const T_RNG: &str = "ztrain.rng";
const T_ORDER: &str = "ztrain.order";

/// Where the run is: enough to continue it exactly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Progress {
    /// Optimiser steps taken.
    pub step: u64,
    /// Epochs completed.
    pub epoch: u64,
    /// Samples of the current epoch's order already trained on.
    pub position: u64,
    /// The run generator's state (after drawing the current epoch's order).
    pub rng: [u64; 4],
    /// The current epoch's sample order.
    pub order: Vec<u64>,
}

/// Everything a checkpoint holds.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    /// The run configuration (`RunConfig::to_json`).
    pub config: Value,
    /// The backend that wrote it (`cpu`, `cuda`, `cuda-sim`): bitwise resume holds on the same.
    pub backend: String,
    pub progress: Progress,
    /// Parameters by name.
    pub params: BTreeMap<String, HostTensor<f32>>,
    /// Optimiser state by `<slot>.<parameter name>` (e.g. `m.emb.weight`).
    pub optim: BTreeMap<String, HostTensor<f32>>,
}

impl Checkpoint {
    /// The zgrad checkpoint this one is, with the run's counters beside its tensors (the
    /// metadata's checksum and configuration are added by `to_bytes`).
    fn to_file(&self) -> CheckpointFile<f32> {
        let p = &self.progress;
        let other = BTreeMap::from([
            (
                T_COUNTERS.to_string(),
                RawTensor::u64s(&[p.step, p.epoch, p.position]),
            ),
            (T_RNG.to_string(), RawTensor::u64s(&p.rng)),
            (T_ORDER.to_string(), RawTensor::u64s(&p.order)),
        ]);
        CheckpointFile {
            parameters: self.params.clone(),
            optimizer: self.optim.clone(),
            other,
            metadata: HashMap::from([(STEP_KEY.to_string(), p.step.to_string())]),
        }
    }

    /// Serialises to safetensors bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut file = self.to_file();
        let entries = file.entries();
        let config_text = self.config.to_string();
        let checksum = checksum(
            entries
                .iter()
                .map(|(n, t)| (n.as_str(), t.dtype, t.shape.as_slice(), t.bytes.as_slice())),
            &config_text,
            &self.backend,
        );
        file.metadata.extend([
            (KEY_FORMAT.to_string(), FORMAT.to_string()),
            (KEY_CONFIG.to_string(), config_text),
            (KEY_CHECKSUM.to_string(), format!("{checksum:016x}")),
            (KEY_BACKEND.to_string(), self.backend.clone()),
        ]);
        serialize(&entries, &file.metadata, Path::new("the checkpoint"))
            .map_err(|e| TrainError::Options(format!("serialising the checkpoint: {e}")))
    }

    /// Parses safetensors bytes; `path` is only for messages.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Checkpoint> {
        let corrupt = |reason: String| TrainError::CheckpointCorrupt {
            path: path.to_path_buf(),
            reason,
        };
        let (entries, meta) = deserialize(bytes, path)
            .map_err(|e| corrupt(format!("not a valid safetensors file: {e}")))?;
        // Before the format check: a bf16 parameter file is not corrupt, just not resumable.
        zgrad::checkpoint::refuse_reduced_precision(&entries, path).map_err(|source| {
            TrainError::ResumeReducedPrecision {
                path: path.to_path_buf(),
                source: Box::new(source),
            }
        })?;
        let get = |k: &str| {
            meta.get(k)
                .cloned()
                .ok_or_else(|| corrupt(format!("metadata has no `{k}`")))
        };
        let format = get(KEY_FORMAT)?;
        if format != FORMAT {
            return Err(corrupt(format!(
                "format `{format}`, this ztrain reads `{FORMAT}`"
            )));
        }
        let config_text = get(KEY_CONFIG)?;
        let backend = meta.get(KEY_BACKEND).cloned().unwrap_or_default();
        let want_sum = get(KEY_CHECKSUM)?;
        let got_sum = checksum(
            entries
                .iter()
                .map(|(n, t)| (n.as_str(), t.dtype, t.shape.as_slice(), t.bytes.as_slice())),
            &config_text,
            &backend,
        );
        if format!("{got_sum:016x}") != want_sum {
            return Err(corrupt(
                "contents do not match their checksum (the file was changed or damaged)".into(),
            ));
        }
        let config: Value = serde_json::from_str(&config_text)
            .map_err(|e| corrupt(format!("configuration is not JSON: {e}")))?;
        for (name, t) in &entries {
            let ours = matches!(name.as_str(), T_COUNTERS | T_RNG | T_ORDER);
            let expected = if ours {
                t.dtype == Dtype::U64
            } else {
                t.dtype == Dtype::F32 && !name.starts_with("ztrain.")
            };
            if !expected {
                return Err(corrupt(format!(
                    "unexpected tensor {name} of type {:?}",
                    t.dtype
                )));
            }
        }
        let mut file = CheckpointFile::<f32>::from_entries(entries, meta, path)
            .map_err(|e| corrupt(e.to_string()))?;
        let mut take = |k: &str, len: Option<usize>| {
            let v = file
                .other
                .remove(k)
                .and_then(|t| t.to_u64s())
                .ok_or_else(|| corrupt(format!("no `{k}` tensor")))?;
            match len {
                Some(l) if v.len() != l => {
                    Err(corrupt(format!("`{k}` has {} values, not {l}", v.len())))
                }
                _ => Ok(v),
            }
        };
        let counters = take(T_COUNTERS, Some(3))?;
        let rng = take(T_RNG, Some(4))?;
        let order = take(T_ORDER, None)?;
        let rng = [rng[0], rng[1], rng[2], rng[3]];
        if rng == [0; 4] {
            return Err(corrupt("generator state is all zero".into()));
        }
        Ok(Checkpoint {
            config,
            backend,
            progress: Progress {
                step: counters[0],
                epoch: counters[1],
                position: counters[2],
                rng,
                order,
            },
            params: file.parameters,
            optim: file.optimizer,
        })
    }

    /// Writes to `path` atomically (see [`crate::files::write_atomically`]).
    pub fn save(&self, path: &Path) -> Result<()> {
        let bytes = self.to_bytes()?;
        crate::files::write_atomically(path, "writing the checkpoint", &bytes)?;
        tracing::info!(target: "ztrain.checkpoint.save", path = %path.display(), bytes = bytes.len(), step = self.progress.step);
        Ok(())
    }

    /// Reads and checks the checkpoint at `path`, reading no more than its own size fields
    /// say (and at most `limit` bytes in all): `/dev/zero` or a pipe that never ends is an
    /// error, not a hang.
    pub fn load_bounded(path: &Path, limit: u64) -> Result<Checkpoint> {
        let corrupt = |reason: String| TrainError::CheckpointCorrupt {
            path: path.to_path_buf(),
            reason,
        };
        let bytes = read_safetensors(path, limit, "reading the checkpoint", &corrupt)?;
        Checkpoint::from_bytes(&bytes, path)
    }

    /// [`Checkpoint::load_bounded`] with the bound of the safetensors format itself.
    pub fn load(path: &Path) -> Result<Checkpoint> {
        Checkpoint::load_bounded(path, u64::MAX)
    }
}

/// The safetensors format's own bound on its JSON header.
const MAX_HEADER: u64 = 100_000_000;

/// Reads one safetensors file: the 8-byte header length, the header, then exactly the data the
/// header's offsets cover, and checks nothing follows. `what` names the reading in I/O errors;
/// `corrupt` makes the error for a file that is not safetensors.
pub(crate) fn read_safetensors(
    path: &Path,
    limit: u64,
    what: &'static str,
    corrupt: &dyn Fn(String) -> TrainError,
) -> Result<Vec<u8>> {
    let io = |source| TrainError::Io {
        what,
        path: path.to_path_buf(),
        source,
    };
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mut take = |n: u64, bytes: &mut Vec<u8>| -> Result<()> {
        let before = bytes.len() as u64;
        (&mut f).take(n).read_to_end(bytes).map_err(io)?;
        if bytes.len() as u64 - before < n {
            return Err(corrupt(format!(
                "the file ends after {} bytes; its header promises {}",
                bytes.len(),
                before + n
            )));
        }
        Ok(())
    };
    let mut bytes = Vec::new();
    take(8, &mut bytes)?;
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap_or_default());
    if n == 0 || n > MAX_HEADER || n > limit {
        return Err(corrupt(format!(
            "header length {n} is outside 1..={}",
            MAX_HEADER.min(limit)
        )));
    }
    take(n, &mut bytes)?;
    let header: Value = serde_json::from_slice(&bytes[8..])
        .map_err(|e| corrupt(format!("not a valid safetensors file: header: {e}")))?;
    let data_len = header
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.as_str() != "__metadata__")
        .filter_map(|(_, v)| v.get("data_offsets")?.get(1)?.as_u64())
        .max()
        .unwrap_or(0);
    let total = 8 + n + data_len;
    if total > limit {
        return Err(TrainError::TooLarge {
            what,
            path: path.to_path_buf(),
            limit,
            reason: format!("its header claims {total} bytes; a file of this model is smaller"),
        });
    }
    take(data_len, &mut bytes)?;
    let mut extra = [0u8; 1];
    if f.read(&mut extra).map_err(io)? != 0 {
        return Err(corrupt("bytes follow the data its header describes".into()));
    }
    Ok(bytes)
}

/// FNV-1a over every tensor's name, dtype, shape and bytes, the configuration text and the
/// backend name: any change to what the run would read back is caught.
fn checksum<'a>(
    tensors: impl Iterator<Item = (&'a str, Dtype, &'a [usize], &'a [u8])>,
    config: &str,
    backend: &str,
) -> u64 {
    let mut all = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        all.extend_from_slice(format!("{name}\0{dtype:?}{shape:?}\0").as_bytes());
        all.extend_from_slice(&fnv1a(bytes).to_le_bytes());
    }
    all.extend_from_slice(config.as_bytes());
    all.push(0);
    all.extend_from_slice(backend.as_bytes());
    fnv1a(&all)
}

#[cfg(test)]
#[path = "checkpoint_tests.rs"]
mod tests;
