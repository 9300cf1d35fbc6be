//! The evaluation report (`EvalReport`) and the host's `f64` report of outputs read back
//! (`report_of`): the loss of each task (`Model::task`; the formula of `Tape::task_loss`:
//! weighted, the mean of `w · loss` over every target value) and its metrics, summed in sample
//! order in `f64`. The unweighted binary task (XAsset's) is reported this way from its logits
//! (one read-back a pass); every other task from statistics reduced on the device
//! (`chunk_stats.rs`), which agree with this formula to f32 rounding (the tests hold them to it).
//! Metrics count each target value by its weight (a weight of 0, a missing target, not at all).

mod chunk_stats;
mod report;

pub(crate) use chunk_stats::{chunk_stats, global_chunks, report_of_stats, stats_len};
pub use report::{EvalReport, RegressionMetrics};

use crate::task::{Target, Task};
use zcompute::Element;

/// The report of `outputs` (`[n, ..Task::output_shape]`) against targets `y`
/// (`[n, ..Task::target_shape]`), both already checked against `task`.
pub(crate) fn report_of<T: Element>(task: &Task, outputs: &[T], y: &[T]) -> EvalReport {
    let n = y.len() / task.target_len().max(1);
    if matches!(task.target, Target::Binary) && !task.weighted {
        return binary(outputs, y);
    }
    let values: usize = task.value_shape().iter().product();
    let per_target = task.target_len().max(1);
    let per_out = task.output_len().max(1);
    let mut s = Sums::default();
    for i in 0..n {
        let row = &y[i * per_target..(i + 1) * per_target];
        let out: Vec<f64> = outputs[i * per_out..(i + 1) * per_out]
            .iter()
            .map(|v| v.to_f64())
            .collect();
        let (t, w) = row.split_at(values.max(1).min(row.len()));
        let t: Vec<f64> = t.iter().map(|v| v.to_f64()).collect();
        let weight = |k: usize| w.get(k).map_or(1.0, |v| v.to_f64());
        match task.target {
            Target::Binary => {
                let (l, t, wk) = (out[0], t[0], weight(0));
                s.loss += wk * (l.max(0.0) - l * t + (-l.abs()).exp().ln_1p());
                s.right += wk * f64::from(u8::from((l > 0.0) == (t > 0.5)));
                s.weight += wk;
            }
            Target::ClassIndex { .. } => {
                let wk = weight(0);
                s.loss += wk * (log_sum_exp(&out) - out[t[0] as usize]);
                s.right += wk * f64::from(u8::from(first_max(&out) == t[0] as usize));
                s.weight += wk;
            }
            Target::Distribution { .. } => {
                let wk = weight(0);
                let lse = log_sum_exp(&out);
                s.loss -= wk * t.iter().zip(&out).map(|(t, o)| t * (o - lse)).sum::<f64>();
                s.right += wk * f64::from(u8::from(first_max(&out) == first_max(&t)));
                s.weight += wk;
            }
            Target::Regression { .. } => {
                for (k, (&p, &t)) in out.iter().zip(&t).enumerate() {
                    let (wk, d) = (weight(k), p - t);
                    s.loss += wk * d * d;
                    s.abs += wk * d.abs();
                    s.weight += wk;
                    s.p += wk * p;
                    s.t += wk * t;
                    s.pp += wk * p * p;
                    s.tt += wk * t * t;
                    s.pt += wk * p * t;
                }
            }
        }
    }
    // The loss's mean runs over every target value, as the training loss's does.
    let slots = (n * values.max(1)).max(1) as f64;
    match task.target {
        Target::Regression { .. } => {
            let w = s.weight;
            let cov = s.pt - s.p * s.t / w;
            let (vp, vt) = (s.pp - s.p * s.p / w, s.tt - s.t * s.t / w);
            EvalReport {
                loss: s.loss / slots,
                accuracy: f64::NAN,
                samples: n,
                regression: Some(RegressionMetrics {
                    mse: s.loss / w,
                    mae: s.abs / w,
                    pearson: cov / (vp * vt).sqrt(),
                }),
            }
        }
        _ => EvalReport {
            loss: s.loss / n.max(1) as f64,
            accuracy: s.right / s.weight,
            samples: n,
            regression: None,
        },
    }
}

/// Weighted sums of one pass.
#[derive(Default)]
struct Sums {
    loss: f64,
    right: f64,
    weight: f64,
    abs: f64,
    p: f64,
    t: f64,
    pp: f64,
    tt: f64,
    pt: f64,
}

/// The binary report of XAsset (unweighted), exactly as before tasks existed: the mean BCE
/// with logits and the fraction of logits with the label's sign.
fn binary<T: Element>(logits: &[T], y: &[T]) -> EvalReport {
    let mut sums = BinarySums::default();
    sums.add(logits, y);
    sums.report()
}

/// The unweighted binary task's running sums: BCE with logits and the logits with the
/// label's sign, added in sample order in `f64`, so that a set summed chunk by chunk in
/// order gives the sums of it whole, bit for bit.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct BinarySums {
    pub(crate) loss: f64,
    pub(crate) correct: usize,
    pub(crate) samples: usize,
}

impl BinarySums {
    /// Adds the samples of `logits` against labels `y`, in order.
    pub(crate) fn add<T: Element>(&mut self, logits: &[T], y: &[T]) {
        for (&l, &t) in logits.iter().zip(y) {
            let (l, t) = (l.to_f64(), t.to_f64());
            self.loss += l.max(0.0) - l * t + (-l.abs()).exp().ln_1p();
            if (l > 0.0) == (t > 0.5) {
                self.correct += 1;
            }
        }
        self.samples += y.len();
    }

    /// The mean loss and the fraction right of the samples added.
    pub(crate) fn report(&self) -> EvalReport {
        let denom = self.samples.max(1) as f64;
        EvalReport {
            loss: self.loss / denom,
            accuracy: self.correct as f64 / denom,
            samples: self.samples,
            regression: None,
        }
    }
}

fn log_sum_exp(x: &[f64]) -> f64 {
    let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    m + x.iter().map(|v| (v - m).exp()).sum::<f64>().ln()
}

/// The index of the first largest value.
fn first_max(x: &[f64]) -> usize {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::report_of;
    use crate::task::Task;

    #[test]
    fn class_index_report_is_cross_entropy_and_argmax_accuracy() {
        // Two samples of 3 classes: right (class 2), wrong (class 0 predicted 1).
        let out = [0.0f64, 1.0, 3.0, 0.0, 2.0, 1.0];
        let r = report_of(&Task::class_index(3), &out, &[2.0, 0.0]);
        let lse = |a: f64, b: f64, c: f64| (a.exp() + b.exp() + c.exp()).ln();
        let want = ((lse(0.0, 1.0, 3.0) - 3.0) + (lse(0.0, 2.0, 1.0) - 0.0)) / 2.0;
        assert!((r.loss - want).abs() < 1e-12, "{} {want}", r.loss);
        assert_eq!(r.accuracy, 0.5);
        assert_eq!(r.samples, 2);
    }

    #[test]
    fn weighted_regression_leaves_missing_targets_out_of_the_metrics() {
        // One sample, 3 outputs; the third target missing (weight 0) and wildly off.
        let out = [1.0f64, 2.0, 100.0];
        let y = [1.5, 1.0, 0.0, 1.0, 1.0, 0.0];
        let r = report_of(&Task::regression(3).weighted(), &out, &y);
        let m = r.regression.unwrap();
        assert!((m.mse - (0.25 + 1.0) / 2.0).abs() < 1e-12);
        assert!((m.mae - 0.75).abs() < 1e-12);
        assert!((r.loss - (0.25 + 1.0) / 3.0).abs() < 1e-12);
        assert!(r.accuracy.is_nan());
        // Two points: perfectly anti-correlated.
        assert!((m.pearson + 1.0).abs() < 1e-12, "{}", m.pearson);
    }
}
