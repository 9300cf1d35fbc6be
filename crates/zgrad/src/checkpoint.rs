//! Training checkpoints in one safetensors file: the parameters under XASSET.md's names (so a
//! checkpoint is also a parameter file `XAsset::load` and the PyTorch oracle read), AdamW's
//! moments as `optim.m.<name>` / `optim.v.<name>`, and the step count in the metadata
//! (`zgrad.step`) next to whatever metadata the caller adds.

use crate::error::{GradError, Result};
use crate::io::{HostTensor, TensorFile, read_tensors, take, write_tensors};
use crate::model::Model;
use crate::optim::{AdamWState, Moments};
use crate::trainer::Trainer;
use std::collections::HashMap;
use std::path::Path;
use zcompute::{Capture, Element};

/// A checkpoint's parameter values (in parameter order) and moments, checked against the model.
type Checked<T> = (Vec<Vec<T>>, Vec<Moments<T>>);

/// Metadata key holding the optimiser's step count.
pub const STEP_KEY: &str = "zgrad.step";

impl<B: Capture<T> + 'static, T: Element, M: Model<B, T>> Trainer<B, T, M> {
    /// Writes parameters, optimiser state and `metadata` (plus `zgrad.step`) to `path`.
    /// Refuses (`StateUnknown`) while a failed step left the state unknown: such a checkpoint
    /// would pass a partly applied update off as a clean step.
    pub fn save_checkpoint(&self, path: &Path, metadata: HashMap<String, String>) -> Result<()> {
        self.optimizer().check_state()?;
        let b = self.backend();
        let mut tensors = self.model().to_host(b)?;
        let names: Vec<String> = tensors.iter().map(|(n, _)| n.clone()).collect();
        let state = self.optimizer().export(b, &names)?;
        for m in state.moments {
            tensors.push((
                format!("optim.m.{}", m.name),
                HostTensor {
                    shape: m.shape.clone(),
                    data: m.m,
                },
            ));
            tensors.push((
                format!("optim.v.{}", m.name),
                HostTensor {
                    shape: m.shape,
                    data: m.v,
                },
            ));
        }
        let mut metadata = metadata;
        metadata.insert(STEP_KEY.to_string(), state.step.to_string());
        write_tensors(path, &tensors, Some(metadata))
    }

    /// Restores parameters and optimiser state saved by `save_checkpoint` into this trainer
    /// (same model sizes) and returns the file's metadata. Captured graphs keep working: the
    /// values are written into the existing tensors. A file that does not match changes
    /// nothing; a load that succeeds clears an unknown state left by a failed step
    /// (`Applied::Maybe`), and one that fails while writing leaves the state unknown.
    pub fn load_checkpoint(&mut self, path: &Path) -> Result<HashMap<String, String>> {
        let file = read_tensors::<T>(path)?;
        let step = file
            .metadata
            .get(STEP_KEY)
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| GradError::BadTensorFile {
                file: path.display().to_string(),
                name: STEP_KEY.to_string(),
                problem: "metadata entry missing or not a number".to_string(),
            })?;
        // Every tensor is checked before anything is written: a bad file changes nothing.
        let (values, moments) = self.checked_tensors(&file, path)?;
        let b = std::rc::Rc::clone(self.backend_rc());
        let written = self
            .model()
            .named_parameters()
            .iter()
            .zip(&values)
            .try_for_each(|((_, p), value)| p.upload(&*b, value));
        if let Err(e) = written {
            // Some parameters may already hold the file's values: neither the old state nor
            // the checkpoint's, until a load succeeds.
            self.optimizer_mut().mark_unknown();
            return Err(e);
        }
        self.optimizer_mut()
            .import(&b, &AdamWState { step, moments })?;
        Ok(file.metadata)
    }

    /// The file's parameter values (in parameter order) and moments, each checked against
    /// the model's shapes.
    fn checked_tensors(&self, file: &TensorFile<T>, path: &Path) -> Result<Checked<T>> {
        let mut values = Vec::new();
        let mut moments = Vec::new();
        for (name, p) in self.model().named_parameters() {
            let shape = p.shape().to_vec();
            values.push(take(file, path, &name, Some(&shape))?.data.clone());
            let m = take(file, path, &format!("optim.m.{name}"), Some(&shape))?;
            let v = take(file, path, &format!("optim.v.{name}"), Some(&shape))?;
            moments.push(Moments {
                name: name.to_string(),
                shape,
                m: m.data.clone(),
                v: v.data.clone(),
            });
        }
        Ok((values, moments))
    }
}
