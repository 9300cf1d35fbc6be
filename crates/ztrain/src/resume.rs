//! Between zgrad's trainer and a checkpoint: what a run saves, and how a resumed run gets it
//! back (parameters, AdamW moments and step, generator, data order), with the checks that make
//! a wrong or damaged checkpoint an error instead of a silently different run.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use zgrad::{CheckpointFile, Model, XAsset, XAssetConfig};

use crate::checkpoint::{Checkpoint, Progress};
use crate::config::{differences, model_differences, with_default_layers};
use crate::console::Console;
use crate::error::{Result, TrainError};
use crate::fit::learner::Learner;
use crate::step::TrainBackend;

/// The checkpoint of the run as it is now.
pub fn checkpoint_of<B: TrainBackend, M: Model<B, f32>>(
    learner: &Learner<B, M>,
    progress: &Progress,
    config: &serde_json::Value,
    backend: &str,
) -> Result<Checkpoint> {
    let b = learner.backend();
    let params = learner.model().to_host(b)?;
    let names: Vec<String> = params.iter().map(|(n, _)| n.clone()).collect();
    let state = learner.optimizer().export(b, &names)?;
    let mut progress = progress.clone();
    // The optimiser counts its own steps; both must agree.
    progress.step = state.step();
    let file = CheckpointFile::of_state(params, state);
    Ok(Checkpoint {
        config: config.clone(),
        backend: backend.to_string(),
        progress,
        params: file.parameters,
        optim: file.optimizer,
    })
}

/// The model of `--init-from`: the parameters of the safetensors file at `path` (read no
/// further than `limit` bytes), whose sizes and depth must be `model`'s. Every problem is an
/// `InitFrom` error whose source names it: a file that is missing, a directory or not
/// safetensors; other sizes (each difference); missing, extra or misshapen tensors (all of them).
pub fn init_from<B: TrainBackend>(
    b: &B,
    path: &Path,
    model: &XAssetConfig,
    limit: u64,
) -> Result<XAsset<B>> {
    let file = parameter_file(path, limit)?;
    XAsset::from_tensors_checked(b, &file, path, model).map_err(|e| init_error(path, e))
}

/// `--init-from` of any model: `model`'s parameters set from the safetensors file at `path`
/// (read no further than `limit` bytes; a PyTorch `state_dict` of the same names, or a
/// checkpoint, whose optimiser state is left out). Every name the model has must be there in
/// its shape and nothing else: missing, extra and misshapen tensors are one `InitFrom` error
/// (`ParameterMismatch`) naming all of them, before any parameter is written.
pub fn init_parameters<B: TrainBackend, M: zgrad::Model<B, f32>>(
    b: &B,
    model: &M,
    path: &Path,
    limit: u64,
) -> Result<()> {
    let file = parameter_file(path, limit)?;
    let params = model.named_parameters();
    let (mut missing, mut misshapen) = (Vec::new(), Vec::new());
    for (name, var) in &params {
        match file.tensors.get(name) {
            None => missing.push(name.clone()),
            Some(t) if t.shape != var.shape() => {
                misshapen.push(format!(
                    "{name} {:?} (the model's {:?})",
                    t.shape,
                    var.shape()
                ));
            }
            Some(_) => {}
        }
    }
    let extra: Vec<String> = file
        .tensors
        .keys()
        .filter(|name| !params.iter().any(|(n, _)| n == *name))
        .cloned()
        .collect();
    if !(missing.is_empty() && misshapen.is_empty() && extra.is_empty()) {
        return Err(init_error(
            path,
            zgrad::GradError::ParameterMismatch {
                file: path.display().to_string(),
                missing,
                extra,
                misshapen,
            },
        ));
    }
    for (name, var) in &params {
        var.upload(b, &file.tensors[name].data)?;
    }
    Ok(())
}

fn init_error(path: &Path, source: zgrad::GradError) -> TrainError {
    TrainError::InitFrom {
        path: path.to_path_buf(),
        source: Box::new(source),
    }
}

/// The parameters of the safetensors file at `path`, read no further than `limit` bytes.
/// Every problem is an `InitFrom` error whose source names it: a file that is missing, a
/// directory or not safetensors.
fn parameter_file(path: &Path, limit: u64) -> Result<zgrad::TensorFile<f32>> {
    let wrap = |source: zgrad::GradError| init_error(path, source);
    if path.is_dir() {
        return Err(wrap(zgrad::GradError::Io {
            path: path.display().to_string(),
            source: std::io::Error::new(
                std::io::ErrorKind::IsADirectory,
                "a directory, not a parameter file",
            ),
        }));
    }
    let not_safetensors = |reason: String| {
        wrap(zgrad::GradError::SafeTensors {
            path: path.display().to_string(),
            message: reason,
        })
    };
    let bytes = crate::checkpoint::read_safetensors(
        path,
        limit,
        "reading the --init-from file",
        &not_safetensors,
    )?;
    zgrad::checkpoint::parameter_file_from_bytes::<f32>(&bytes, path).map_err(wrap)
}

/// What a resumed run is: its configuration, backend, training samples and epochs, and the
/// most bytes its checkpoint can take.
#[derive(Clone, Copy, Debug)]
pub struct ResumeAt<'a> {
    pub config: &'a serde_json::Value,
    pub backend: &'a str,
    pub n_train: usize,
    pub epochs: u64,
    pub limit: u64,
}

/// Restores `learner` from the checkpoint at `path` and returns where the run was. Says so
/// when the checkpoint's run is already finished; `--epochs` below the checkpoint's is an
/// error.
pub fn resume<B: TrainBackend, M: Model<B, f32>>(
    learner: &mut Learner<B, M>,
    path: &Path,
    at: &ResumeAt<'_>,
    out: &mut Console<'_>,
) -> Result<Progress> {
    let (backend, n_train) = (at.backend, at.n_train);
    let ck = Checkpoint::load_bounded(path, at.limit)?;
    check_same_run(&ck, path, at)?;
    let corrupt = |reason: String| TrainError::CheckpointCorrupt {
        path: path.to_path_buf(),
        reason,
    };
    let params = learner.model().named_parameters();
    let expected: Vec<(String, Vec<usize>)> = params
        .iter()
        .map(|(n, v)| (n.clone(), v.shape().to_vec()))
        .collect();
    let file = CheckpointFile {
        parameters: ck.params,
        optimizer: ck.optim,
        other: BTreeMap::new(),
        metadata: HashMap::new(),
    };
    // Every tensor is checked (all problems named) before any is written.
    let (values, state) = file
        .training_state(
            &expected,
            ck.progress.step,
            path,
            learner.optimizer().kind(),
        )
        .map_err(|e| corrupt(e.to_string()))?;
    learner.restore(&values, &state)?;
    let p = ck.progress;
    let mut seen = vec![false; n_train];
    let valid_order = p.order.len() == n_train
        && p.order
            .iter()
            .all(|&i| (i as usize) < n_train && !std::mem::replace(&mut seen[i as usize], true));
    if !valid_order || p.position > n_train as u64 {
        return Err(corrupt(format!(
            "data order is not a permutation of the {n_train} training samples"
        )));
    }
    if !ck.backend.is_empty() && ck.backend != backend {
        out.say(&format!("note: checkpoint written by the {} backend, continuing on {backend} (not bitwise equal to an uninterrupted run)", ck.backend));
    }
    if p.epoch >= at.epochs {
        out.say(&format!(
            "the run in {} is already finished ({} of {} epochs, step {}): nothing to train; raise --epochs (with --lr-schedule constant) to train further",
            path.display(),
            p.epoch,
            at.epochs,
            p.step
        ));
        return Ok(p);
    }
    out.say(&format!(
        "resumed from {} at step {} (epoch {}, sample {} of it)",
        path.display(),
        p.step,
        p.epoch + 1,
        p.position
    ));
    Ok(p)
}

/// Refuses a checkpoint of another run: `--epochs` below the checkpoint's, another number of
/// ranks, another model (each size and the depth named), or another configuration.
fn check_same_run(ck: &Checkpoint, path: &Path, at: &ResumeAt<'_>) -> Result<()> {
    let saved_epochs = ck.config.get("epochs").and_then(serde_json::Value::as_u64);
    let trained = ck.progress.epoch;
    if let Some(saved) = saved_epochs
        && (at.epochs < saved || at.epochs < trained)
    {
        return Err(TrainError::EpochsBelowCheckpoint {
            asked: at.epochs,
            saved,
            trained,
        });
    }
    let world = |c: &serde_json::Value| {
        c.get("world")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(1) as usize
    };
    if world(&ck.config) != world(at.config) {
        return Err(TrainError::WorldMismatch {
            path: path.to_path_buf(),
            saved: world(&ck.config),
            now: world(at.config),
        });
    }
    let saved_config = with_default_layers(&ck.config);
    let model_diff = model_differences(&saved_config, at.config);
    if !model_diff.is_empty() {
        return Err(TrainError::CheckpointModel {
            path: path.to_path_buf(),
            differences: model_diff.join("; "),
        });
    }
    let diff = differences(&saved_config, at.config);
    if !diff.is_empty() {
        return Err(TrainError::CheckpointMismatch {
            path: path.to_path_buf(),
            differences: diff.join("; "),
        });
    }
    Ok(())
}
