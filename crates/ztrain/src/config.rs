//! The run configuration: what a checkpoint records, and what a resumed run must match.

use std::path::PathBuf;

use serde_json::{Value, json};

use zgrad::{LrDecay, TrainSchedule, XAssetConfig};

use crate::data::formats::Format;
use crate::error::{Result, TrainError};

/// The command line's spelling of zgrad's learning-rate decays.
pub const LR_DECAY_NAMES: [(&str, LrDecay); 2] =
    [("constant", LrDecay::Constant), ("cosine", LrDecay::Cosine)];

/// How the command line (and the checkpoint's configuration) spells `decay`.
#[must_use]
pub fn lr_decay_name(decay: LrDecay) -> &'static str {
    match decay {
        LrDecay::Constant => "constant",
        LrDecay::Cosine => "cosine",
    }
}

/// The command line's spelling of zgrad's training schedules.
pub const SCHEDULE_NAMES: [(&str, TrainSchedule); 2] = [
    ("batched", TrainSchedule::Batched),
    ("per-sample", TrainSchedule::PerSample),
];

/// How the command line (and the checkpoint's configuration) spells `schedule`.
#[must_use]
pub fn schedule_name(schedule: TrainSchedule) -> &'static str {
    match schedule {
        TrainSchedule::Batched => "batched",
        TrainSchedule::PerSample => "per-sample",
    }
}

/// Every size positive and the width a multiple of the heads, named by option.
pub fn check_model(m: &XAssetConfig) -> Result<()> {
    for (name, v) in [
        ("--scales", m.scales),
        ("--features", m.features),
        ("--width", m.width),
        ("--heads", m.heads),
        ("--ff", m.ff),
        ("--layers", m.layers),
    ] {
        if v == 0 {
            return Err(TrainError::Options(format!("{name} must be at least 1")));
        }
    }
    if !m.width.is_multiple_of(m.heads) {
        return Err(TrainError::Options(format!(
            "--width {} must be a multiple of --heads {}",
            m.width, m.heads
        )));
    }
    Ok(())
}

/// Parameter count (docs/xasset.md's table, with L blocks) in checked arithmetic: sizes whose
/// count does not fit in 64 bits are a typed error, not an overflow (zgrad's
/// `parameter_count` is for sizes that were allocated).
pub fn parameters(m: &XAssetConfig) -> Result<u64> {
    let (d, f, ff, dh, l) = (
        m.width as u128,
        m.features as u128,
        m.ff as u128,
        (m.width / m.heads.max(1)) as u128,
        m.layers as u128,
    );
    let block = [
        [2, d],
        [3 * d, d],
        [3, d],
        [4, dh],
        [d, d],
        [d, 1],
        [2, d],
        [ff, d],
        [ff, 1],
        [d, ff],
        [d, 1],
    ]
    .iter()
    .try_fold(0u128, |acc, [a, b]| acc.checked_add(a.checked_mul(*b)?));
    let outer = [[d, f], [d, 1], [d, 1], [1, 1]]
        .iter()
        .try_fold(0u128, |acc, [a, b]| acc.checked_add(a.checked_mul(*b)?));
    let n = block
        .and_then(|b| b.checked_mul(l))
        .and_then(|b| b.checked_add(outer?));
    match n.and_then(|n| u64::try_from(n).ok()) {
        Some(n) => Ok(n),
        None => Err(TrainError::OutOfMemory {
            needed: format!(
                "more than 2^64 parameters (--width {}, --features {}, --ff {}, --layers {})",
                m.width, m.features, m.ff, m.layers
            ),
            available: "no machine holds that many".into(),
            advice: "lower --width, --features, --ff or --layers".into(),
        }),
    }
}

/// Where the samples come from.
#[derive(Clone, Debug, PartialEq)]
pub enum DataSource {
    Synthetic {
        samples: usize,
        seed: u64,
    },
    /// A data file (`crate::data::formats`): pre-cut samples, or with `window` a table of bars
    /// cut into windows of that many bars as training runs, validated `gap` bars after.
    File {
        path: PathBuf,
        format: Format,
        /// The labels' `.npy` beside a features `.npy`.
        labels: Option<PathBuf>,
        window: Option<usize>,
        gap: usize,
    },
}

/// Everything that determines a run's result (the device does not: it is chosen at start).
#[derive(Clone, Debug, PartialEq)]
pub struct RunConfig {
    pub model: XAssetConfig,
    pub data: DataSource,
    pub validate_fraction: f64,
    pub epochs: usize,
    pub batch: usize,
    pub lr: f64,
    pub lr_schedule: LrDecay,
    pub warmup_steps: u64,
    pub weight_decay: f64,
    /// `Some`: SGD (`--optimizer sgd`) instead of AdamW.
    pub sgd: Option<zgrad::SgdHyper>,
    pub clip_grad: Option<f64>,
    pub schedule: TrainSchedule,
    pub capture: bool,
    /// The step's precision policy (`--precision`).
    pub precision: zgrad::Precision,
    pub seed: u64,
    /// Features normalised by the training part's statistics (`--normalize`).
    pub normalize: bool,
}

impl RunConfig {
    /// The configuration as JSON, with the data file's fingerprint (`data_digest`: FNV-1a of
    /// its bytes) so that resuming on a changed file is caught. Floats are written exactly
    /// (serde_json prints the shortest string that parses back to the same `f64`).
    #[must_use]
    pub fn to_json(&self, data_digest: Option<u64>) -> Value {
        let m = &self.model;
        let data = match &self.data {
            DataSource::Synthetic { samples, seed } => {
                json!({"kind": "synthetic", "samples": samples, "seed": seed})
            }
            DataSource::File {
                path,
                format,
                labels,
                window,
                gap,
            } => {
                let mut d = json!({
                    "kind": format.name(),
                    "path": path.display().to_string(),
                    "digest": data_digest.map(|d| format!("{d:016x}")),
                });
                // Keys only where set: checkpoints written before they existed still match.
                if let Some(l) = labels {
                    d["labels"] = json!(l.display().to_string());
                }
                if let Some(w) = window {
                    d["window"] = json!(w);
                    d["gap"] = json!(gap);
                }
                d
            }
        };
        let mut out = json!({
            "model": {"scales": m.scales, "features": m.features, "width": m.width,
                      "heads": m.heads, "ff": m.ff, "layers": m.layers},
            "data": data,
            "validate_fraction": self.validate_fraction,
            "epochs": self.epochs,
            "batch": self.batch,
            "lr": self.lr,
            "lr_schedule": lr_decay_name(self.lr_schedule),
            "warmup_steps": self.warmup_steps,
            "weight_decay": self.weight_decay,
            "clip_grad": self.clip_grad,
            "schedule": schedule_name(self.schedule),
            "capture": self.capture,
            "seed": self.seed,
        });
        if self.normalize {
            out["normalize"] = json!(true);
        }
        // Only when not float32: a float32 run's configuration (and its checkpoints') stays as
        // it was. A resume under another precision is then a `CheckpointMismatch` naming
        // `precision` (its products differ, so it could not continue bit for bit).
        if self.precision != zgrad::Precision::F32 {
            out["precision"] = json!(self.precision.name());
        }
        // Only when not AdamW: an AdamW run's configuration (and its checkpoints') stays as
        // it was.
        if let Some(s) = &self.sgd {
            out["optimizer"] =
                json!({"name": "sgd", "momentum": s.momentum, "nesterov": s.nesterov});
        }
        out
    }
}

/// Keys whose difference is allowed on resume: the number of epochs (a run may be extended,
/// unless a decaying learning-rate schedule depends on it), capture (replay computes the same
/// values) and the data file's path (it may move; its digest must match).
fn may_differ(key: &str, saved: &Value) -> bool {
    match key {
        "capture" | "data.path" | "data.labels" => true,
        "epochs" => saved.get("lr_schedule").and_then(Value::as_str) == Some("constant"),
        _ => false,
    }
}

/// Lists the differences between a checkpoint's configuration and this run's (`key: checkpoint
/// X, now Y`), leaving out the ones a resume may change. Empty when they match.
#[must_use]
pub fn differences(saved: &Value, now: &Value) -> Vec<String> {
    let mut out = Vec::new();
    diff_into("", saved, now, saved, &mut out);
    out
}

fn diff_into(prefix: &str, a: &Value, b: &Value, root: &Value, out: &mut Vec<String>) {
    if let (Value::Object(ma), Value::Object(mb)) = (a, b) {
        let mut keys: Vec<&String> = ma.keys().chain(mb.keys()).collect();
        keys.sort();
        keys.dedup();
        for k in keys {
            let key = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            let (va, vb) = (
                ma.get(k).unwrap_or(&Value::Null),
                mb.get(k).unwrap_or(&Value::Null),
            );
            diff_into(&key, va, vb, root, out);
        }
    } else if a != b && !may_differ(prefix, root) {
        out.push(format!("{prefix}: checkpoint {a}, now {b}"));
    }
}

/// A checkpoint's configuration with `model.layers` filled in as 1 where an XAsset model (one
/// with a `width`) has none: checkpoints written before `--layers` existed are of one-block
/// models. Another model's sizes (`FitModel::config_json`) are left as they are.
#[must_use]
pub fn with_default_layers(saved: &Value) -> Value {
    let mut out = saved.clone();
    if let Some(model) = out.get_mut("model").and_then(Value::as_object_mut)
        && model.contains_key("width")
    {
        model.entry("layers").or_insert(json!(1));
    }
    out
}

/// How the model of a checkpoint's configuration differs from this run's, one phrase per
/// size: `checkpoint has 3 layers, the options 2`, `width 256 vs 128 (--width)`.
#[must_use]
pub fn model_differences(saved: &Value, now: &Value) -> Vec<String> {
    let (a, b) = (&saved["model"], &now["model"]);
    ["layers", "features", "scales", "width", "heads", "ff"]
        .into_iter()
        .filter(|k| a[*k] != b[*k])
        .map(|k| match k {
            "layers" => format!(
                "checkpoint has {} layers, the options {} (--layers)",
                a[k], b[k]
            ),
            _ => format!("{k} {} vs {} (--{k})", a[k], b[k]),
        })
        .collect()
}

/// FNV-1a over `bytes`: a cheap fingerprint of the data file (not a security measure).
#[must_use]
pub fn fnv1a(bytes: &[u8]) -> u64 {
    fnv1a_from(FNV1A_START, bytes)
}

/// FNV-1a's state before any byte.
pub const FNV1A_START: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a from the state `h` over `bytes`: `fnv1a` of bytes read in pieces, piece by piece.
#[must_use]
pub fn fnv1a_from(h: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(h, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> RunConfig {
        RunConfig {
            model: XAssetConfig::default(),
            data: DataSource::Synthetic {
                samples: 100,
                seed: 1,
            },
            validate_fraction: 0.2,
            epochs: 3,
            batch: 256,
            lr: 1e-3,
            lr_schedule: LrDecay::Constant,
            warmup_steps: 0,
            weight_decay: 0.01,
            sgd: None,
            clip_grad: None,
            schedule: TrainSchedule::Batched,
            capture: false,
            precision: zgrad::Precision::F32,
            seed: 0,
            normalize: false,
        }
    }

    #[test]
    fn default_size_has_xasset_parameter_count() {
        assert_eq!(parameters(&base().model).expect("fits"), 839_937);
        assert_eq!(XAssetConfig::default().parameter_count(), 839_937);
    }

    #[test]
    fn three_blocks_at_the_default_size_have_the_documented_count() {
        let m = XAssetConfig {
            layers: 3,
            ..XAssetConfig::default()
        };
        assert_eq!(parameters(&m).expect("fits"), 2_419_969);
        assert_eq!(m.parameter_count(), 2_419_969);
    }

    #[test]
    fn model_differences_name_the_depth_and_sizes() {
        let mut b = base();
        b.model.layers = 2;
        let mut a = base();
        a.model.layers = 3;
        a.model.width = 256;
        b.model.width = 128;
        b.model.heads = 4;
        let d = model_differences(&a.to_json(None), &b.to_json(None));
        assert_eq!(
            d,
            vec![
                "checkpoint has 3 layers, the options 2 (--layers)".to_string(),
                "width 256 vs 128 (--width)".to_string()
            ]
        );
    }

    #[test]
    fn a_checkpoint_from_before_layers_is_a_one_block_model() {
        let mut old = base().to_json(None);
        old["model"]
            .as_object_mut()
            .expect("model")
            .remove("layers");
        let now = base().to_json(None);
        assert_eq!(differences(&old, &now).len(), 1, "layers: null vs 1");
        let old = with_default_layers(&old);
        assert!(differences(&old, &now).is_empty());
        assert!(model_differences(&old, &now).is_empty());
    }

    #[test]
    fn equal_configs_have_no_differences_and_json_round_trips() {
        let a = base().to_json(None);
        let text = a.to_string();
        let back: Value = serde_json::from_str(&text).expect("json");
        assert!(differences(&back, &base().to_json(None)).is_empty());
    }

    #[test]
    fn differences_name_the_key_and_both_values() {
        let mut b = base();
        b.batch = 128;
        b.model.width = 128;
        b.capture = true;
        let d = differences(&base().to_json(None), &b.to_json(None));
        assert_eq!(
            d,
            vec![
                "batch: checkpoint 256, now 128".to_string(),
                "model.width: checkpoint 256, now 128".to_string()
            ]
        );
    }

    #[test]
    fn epochs_may_grow_only_with_a_constant_lr() {
        let mut b = base();
        b.epochs = 5;
        assert!(differences(&base().to_json(None), &b.to_json(None)).is_empty());
        let mut a = base();
        a.lr_schedule = LrDecay::Cosine;
        b.lr_schedule = LrDecay::Cosine;
        assert_eq!(differences(&a.to_json(None), &b.to_json(None)).len(), 1);
    }

    #[test]
    fn a_changed_data_file_is_a_difference_a_moved_one_is_not() {
        let mut a = base();
        let file = |p: &str| DataSource::File {
            path: p.into(),
            format: Format::Csv,
            labels: None,
            window: None,
            gap: 0,
        };
        a.data = file("a.csv");
        let mut b = a.clone();
        b.data = file("b.csv");
        assert_eq!(a.to_json(Some(1))["data"]["kind"], "csv");
        assert_eq!(a.to_json(Some(1))["data"].get("window"), None);
        assert!(differences(&a.to_json(Some(1)), &b.to_json(Some(1))).is_empty());
        assert_eq!(
            differences(&a.to_json(Some(1)), &b.to_json(Some(2))).len(),
            1
        );
    }
}
