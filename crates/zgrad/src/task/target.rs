//! The target contract's two types, [`Target`] and [`Task`]: plain values, below the errors
//! that name a task (`GradError::Target`) and the checks and shapes that `task.rs` gives them.

/// What one sample's targets are (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// One logit per sample, a label in {0, 1} (XAsset).
    Binary,
    /// `classes` logits per sample, the target a class index.
    ClassIndex { classes: usize },
    /// `classes` logits per sample, the target a distribution over the classes.
    Distribution { classes: usize },
    /// `outputs` values per sample, as many target values.
    Regression { outputs: usize },
}

/// A model's target contract: its targets and whether each value carries a weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Task {
    pub target: Target,
    /// Targets carry one weight per value after the values (0: missing).
    pub weighted: bool,
}
