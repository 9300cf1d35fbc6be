//! The evaluation report's types, a leaf below `metrics.rs` (which computes it on the host)
//! and `chunk_stats.rs` (which computes it from statistics reduced on the device).

/// A model's loss and metrics over a data set.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EvalReport {
    /// The task's mean loss (`Tape::task_loss`'s formula): BCE with logits, softmax
    /// cross-entropy, or MSE.
    pub loss: f64,
    /// Classification tasks (binary: `logit > 0` predicts 1; classes: the first largest
    /// logit, against the class index or the target distribution's first largest value): the
    /// weighted fraction right. Regression: `NaN` (see `mse`, `mae`, `pearson`).
    pub accuracy: f64,
    /// Samples evaluated.
    pub samples: usize,
    /// Regression: the weighted mean squared error, mean absolute error and Pearson
    /// correlation over every target value (all outputs together); `None` otherwise.
    pub regression: Option<RegressionMetrics>,
}

/// A regression's metrics (`EvalReport::regression`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RegressionMetrics {
    pub mse: f64,
    pub mae: f64,
    /// `NaN` when the predictions or the targets do not vary.
    pub pearson: f64,
}
