//! Between zgrad's trainer and a checkpoint: what a run saves, and how a resumed run gets it
//! back (parameters, AdamW moments and step, generator, data order), with the checks that make
//! a wrong or damaged checkpoint an error instead of a silently different run.

use std::collections::BTreeMap;
use std::path::Path;

use zgrad::optim::Moments;
use zgrad::{AdamWState, Trainer};

use crate::checkpoint::{Checkpoint, HostTensor, Progress};
use crate::config::differences;
use crate::console::Console;
use crate::error::{Result, TrainError};
use crate::step::TrainBackend;

/// The checkpoint of the run as it is now.
pub fn checkpoint_of<B: TrainBackend>(
    learner: &Trainer<B>,
    progress: &Progress,
    config: &serde_json::Value,
    backend: &str,
) -> Result<Checkpoint> {
    let b = learner.backend();
    let params: BTreeMap<String, HostTensor> = learner
        .model()
        .to_host(b)?
        .into_iter()
        .map(|(name, t)| {
            (
                name,
                HostTensor {
                    shape: t.shape,
                    data: t.data,
                },
            )
        })
        .collect();
    let names: Vec<String> = zgrad::PARAMETER_NAMES
        .iter()
        .map(|s| s.to_string())
        .collect();
    let state = learner.optimizer().export(b, &names)?;
    let mut optim = BTreeMap::new();
    for mo in state.moments {
        optim.insert(
            format!("m.{}", mo.name),
            HostTensor {
                shape: mo.shape.clone(),
                data: mo.m,
            },
        );
        optim.insert(
            format!("v.{}", mo.name),
            HostTensor {
                shape: mo.shape,
                data: mo.v,
            },
        );
    }
    let mut progress = progress.clone();
    // The optimiser counts its own steps; both must agree.
    progress.step = state.step;
    Ok(Checkpoint {
        config: config.clone(),
        backend: backend.to_string(),
        progress,
        params,
        optim,
    })
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
pub fn resume<B: TrainBackend>(
    learner: &mut Trainer<B>,
    path: &Path,
    at: &ResumeAt<'_>,
    out: &mut Console<'_>,
) -> Result<Progress> {
    let (config, backend, n_train) = (at.config, at.backend, at.n_train);
    let ck = Checkpoint::load_bounded(path, at.limit)?;
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
    if world(&ck.config) != world(config) {
        return Err(TrainError::WorldMismatch {
            path: path.to_path_buf(),
            saved: world(&ck.config),
            now: world(config),
        });
    }
    let diff = differences(&ck.config, config);
    if !diff.is_empty() {
        return Err(TrainError::CheckpointMismatch {
            path: path.to_path_buf(),
            differences: diff.join("; "),
        });
    }
    let corrupt = |reason: String| TrainError::CheckpointCorrupt {
        path: path.to_path_buf(),
        reason,
    };
    let b = learner.backend().clone();
    let b = &b;
    let mut moments = Vec::new();
    for (name, var) in learner.model().named_parameters() {
        let t = ck
            .params
            .get(name)
            .ok_or_else(|| corrupt(format!("no parameter `{name}`")))?;
        if t.shape != var.shape() {
            return Err(corrupt(format!(
                "`{name}` has shape {:?}, the model {:?}",
                t.shape,
                var.shape()
            )));
        }
        var.upload(b, &t.data)?;
        let slot = |s: &str| {
            ck.optim
                .get(&format!("{s}.{name}"))
                .filter(|t| t.shape == var.shape())
                .ok_or_else(|| {
                    corrupt(format!(
                        "no optimiser state `{s}.{name}` of the parameter's shape"
                    ))
                })
        };
        moments.push(Moments {
            name: name.to_string(),
            shape: var.shape().to_vec(),
            m: slot("m")?.data.clone(),
            v: slot("v")?.data.clone(),
        });
    }
    learner.optimizer_mut().import(
        b,
        &AdamWState {
            step: ck.progress.step,
            moments,
        },
    )?;
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
        out.line(&format!("ztrain: note: checkpoint written by the {} backend, continuing on {backend} (not bitwise equal to an uninterrupted run)", ck.backend));
    }
    if p.epoch >= at.epochs {
        out.line(&format!(
            "ztrain: the run in {} is already finished ({} of {} epochs, step {}): nothing to train; raise --epochs (with --lr-schedule constant) to train further",
            path.display(),
            p.epoch,
            at.epochs,
            p.step
        ));
        return Ok(p);
    }
    out.line(&format!(
        "ztrain: resumed from {} at step {} (epoch {}, sample {} of it)",
        path.display(),
        p.step,
        p.epoch + 1,
        p.position
    ));
    Ok(p)
}
