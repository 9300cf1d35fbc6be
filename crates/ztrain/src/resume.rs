//! Between zgrad's trainer and a checkpoint: what a run saves, and how a resumed run gets it
//! back (parameters, AdamW moments and step, generator, data order), with the checks that make
//! a wrong or damaged checkpoint an error instead of a silently different run.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use zgrad::optim::Moments;
use zgrad::{AdamWState, Trainer};

use crate::checkpoint::{Checkpoint, HostTensor, Progress};
use crate::config::differences;
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

/// Restores `learner` from the checkpoint at `path` and returns where the run was.
pub fn resume<B: TrainBackend>(
    learner: &mut Trainer<B>,
    path: &Path,
    config: &serde_json::Value,
    backend: &str,
    n_train: usize,
    out: &mut dyn Write,
) -> Result<Progress> {
    let ck = Checkpoint::load(path)?;
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
    let w = |source| TrainError::Io {
        what: "writing to",
        path: "standard output".into(),
        source,
    };
    if !ck.backend.is_empty() && ck.backend != backend {
        writeln!(out, "ztrain: note: checkpoint written by the {} backend, continuing on {backend} (not bitwise equal to an uninterrupted run)", ck.backend).map_err(&w)?;
    }
    writeln!(
        out,
        "ztrain: resumed from {} at step {} (epoch {}, sample {} of it)",
        path.display(),
        p.step,
        p.epoch + 1,
        p.position
    )
    .map_err(&w)?;
    Ok(p)
}
