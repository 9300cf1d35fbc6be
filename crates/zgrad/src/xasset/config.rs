//! XAsset's sizes ([`XAssetConfig`]): the model's shapes and names at any size, read from a
//! file or checked against one; a leaf below `xasset.rs` (the model) and `xasset_init.rs`
//! (its initial values).

use crate::error::{GradError, Result};
use crate::io::TensorFile;
use crate::nn::{BLOCK_PARAMETER_NAMES, block_shapes};
use std::path::Path;

/// The model's sizes. `scales` (S) is the data's, not a parameter's: the model runs on any S.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XAssetConfig {
    /// F: features per scale.
    pub features: usize,
    /// S: time scales per sample.
    pub scales: usize,
    /// D: model width.
    pub width: usize,
    /// H: attention heads (D must be divisible by H).
    pub heads: usize,
    /// FF: feed-forward width.
    pub ff: usize,
    /// L: encoder blocks (docs/xasset.md "Depth"; 1 is the reference model).
    pub layers: usize,
}

impl Default for XAssetConfig {
    fn default() -> Self {
        XAssetConfig {
            features: 193,
            scales: 12,
            width: 256,
            heads: 4,
            ff: 1024,
            layers: 1,
        }
    }
}

impl XAssetConfig {
    /// Refuses zero sizes and a width not divisible by the heads.
    pub fn validate(&self) -> Result<()> {
        let sizes = [
            self.features,
            self.scales,
            self.width,
            self.heads,
            self.ff,
            self.layers,
        ];
        if sizes.contains(&0) {
            return Err(GradError::Config(format!("zero size in {self:?}")));
        }
        if !self.width.is_multiple_of(self.heads) {
            return Err(GradError::Config(format!(
                "width {} is not divisible by {} heads",
                self.width, self.heads
            )));
        }
        Ok(())
    }

    /// Number of trainable parameters (839,937 at the default size, 2,419,969 with three
    /// blocks).
    #[must_use]
    pub fn parameter_count(&self) -> usize {
        self.shapes()
            .iter()
            .map(|s| s.iter().product::<usize>())
            .sum()
    }

    /// The parameters' shapes in [`XAssetConfig::parameter_names`] order, PyTorch's
    /// `[out, in]` layout.
    #[must_use]
    pub fn shapes(&self) -> Vec<Vec<usize>> {
        let (f, d) = (self.features, self.width);
        let mut shapes = vec![vec![d, f], vec![d]];
        for _ in 0..self.layers {
            shapes.extend(block_shapes(d, self.heads, self.ff));
        }
        shapes.extend([vec![1, d], vec![1]]);
        shapes
    }

    /// The parameter names in order: docs/xasset.md's table when `layers` is 1, else `emb.*`,
    /// `blocks.{i}.<name>` for every block, `head.*` (PyTorch's `state_dict` names).
    #[must_use]
    pub fn parameter_names(&self) -> Vec<String> {
        let prefixes: Vec<String> = if self.layers == 1 {
            vec![String::new()]
        } else {
            (0..self.layers).map(|i| format!("blocks.{i}.")).collect()
        };
        let mut names = vec!["emb.weight".to_string(), "emb.bias".to_string()];
        for p in &prefixes {
            names.extend(BLOCK_PARAMETER_NAMES.iter().map(|n| format!("{p}{n}")));
        }
        names.extend(["head.weight".to_string(), "head.bias".to_string()]);
        names
    }

    /// The sizes of the model `file` holds: D and F from emb.weight, FF from the first block's
    /// f1.weight, dh from its qn.weight, H = D / dh, L from the `blocks.{i}` names (1 without
    /// them), S from `x` when the file has it (else `scales`'s default). A file whose sizes
    /// cannot be read is a `ParameterMismatch` naming the tensors that are missing.
    pub fn of_file<T>(file: &TensorFile<T>, path: &Path) -> Result<(Self, bool)> {
        let blocks: std::collections::BTreeSet<usize> = file
            .tensors
            .keys()
            .filter_map(|n| n.strip_prefix("blocks.")?.split('.').next()?.parse().ok())
            .collect();
        let layers = blocks.last().map_or(1, |last| last + 1);
        let prefix = if blocks.is_empty() { "" } else { "blocks.0." };
        let shape = |name: &str| file.tensors.get(name).map(|t| t.shape.clone());
        let (emb, f1, qn) = (
            shape("emb.weight"),
            shape(&format!("{prefix}f1.weight")),
            shape(&format!("{prefix}qn.weight")),
        );
        let mismatch =
            |missing: Vec<String>, misshapen: Vec<String>| GradError::ParameterMismatch {
                file: path.display().to_string(),
                missing,
                extra: Vec::new(),
                misshapen,
            };
        let missing: Vec<String> = [
            ("emb.weight".to_string(), &emb),
            (format!("{prefix}f1.weight"), &f1),
            (format!("{prefix}qn.weight"), &qn),
        ]
        .into_iter()
        .filter(|(_, s)| s.is_none())
        .map(|(n, _)| n)
        .collect();
        if !missing.is_empty() {
            return Err(mismatch(missing, Vec::new()));
        }
        let (emb, f1, qn) = (
            emb.unwrap_or_default(),
            f1.unwrap_or_default(),
            qn.unwrap_or_default(),
        );
        let (&[d, f], &[ff, _], &[dh]) = (&emb[..], &f1[..], &qn[..]) else {
            return Err(mismatch(
                Vec::new(),
                vec![format!(
                    "emb.weight {emb:?}, {prefix}f1.weight {f1:?}, {prefix}qn.weight {qn:?} \
                     (expected [D, F], [FF, D], [dh])"
                )],
            ));
        };
        let scales = shape("x").and_then(|x| x.get(1).copied());
        let config = XAssetConfig {
            features: f,
            scales: scales.unwrap_or(XAssetConfig::default().scales),
            width: d,
            heads: d.checked_div(dh).unwrap_or(0),
            ff,
            layers,
        };
        config.validate()?;
        if dh * config.heads != d {
            return Err(GradError::Config(format!(
                "{}: {prefix}qn.weight width {dh} does not divide D = {d}",
                path.display()
            )));
        }
        Ok((config, scales.is_some()))
    }

    /// What differs between `self` (a file's sizes) and `asked` (the caller's), one
    /// `"<size>: file X, asked Y"` each; `scales` only when `compare_scales`.
    #[must_use]
    pub fn differences(&self, asked: &XAssetConfig, compare_scales: bool) -> Vec<String> {
        let sizes = [
            ("layers", self.layers, asked.layers),
            ("features", self.features, asked.features),
            ("width", self.width, asked.width),
            ("heads", self.heads, asked.heads),
            ("ff", self.ff, asked.ff),
            ("scales", self.scales, asked.scales),
        ];
        sizes
            .into_iter()
            .filter(|(name, a, b)| a != b && (compare_scales || *name != "scales"))
            .map(|(name, a, b)| format!("{name}: file {a}, asked {b}"))
            .collect()
    }
}
