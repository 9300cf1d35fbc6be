//! A model of each task (the `Head` of `support::head`) with a data set for it, and the
//! evaluation report of its outputs computed on the host in f64 (two-pass Pearson): the
//! reference the device evaluation (issue 40 item 2) is checked against.

#![allow(dead_code)]

use crate::support::head::{Head, LossKind, classes};
use zcompute::{Capture, Element};
use zgrad::{EvalReport, Task, Trainer, TrainerConfig};

pub const F: usize = 12;
const C: usize = 5;
const K: usize = 3;

/// The tasks evaluated, by name.
pub const TASKS: [&str; 7] = [
    "binary",
    "binary_weighted",
    "class_index",
    "class_index_weighted",
    "distribution",
    "regression",
    "regression_masked",
];

/// `name`'s task, its outputs per sample, and `n` samples' features and targets.
pub fn task_data(name: &str, n: usize, seed: u64) -> (Task, usize, Vec<f32>, Vec<f32>) {
    let (x, idx) = classes(seed, n, F, C);
    let mut rng = zgrad::rng::SplitMix64::new(seed ^ 0xA5);
    // Weights: some 0 (a missing target), fractional and above 1.
    let weight = |i: usize| [0.0f32, 0.5, 1.0, 2.0, 1.0][(i * 7 + 3) % 5];
    let label = |i: usize| f32::from(x[i * F] + x[i * F + 1] > 0.0);
    match name {
        "binary" => (Task::binary(), 1, x.clone(), (0..n).map(label).collect()),
        "binary_weighted" => {
            let y = (0..n).flat_map(|i| [label(i), weight(i)]).collect();
            (Task::binary().weighted(), 1, x, y)
        }
        "class_index" => (Task::class_index(C), C, x, idx),
        "class_index_weighted" => {
            let y = (0..n).flat_map(|i| [idx[i], weight(i)]).collect();
            (Task::class_index(C).weighted(), C, x, y)
        }
        "distribution" => {
            let mut y = Vec::new();
            for _ in 0..n {
                let e: Vec<f64> = (0..C).map(|_| rng.uniform(-2.0, 2.0).exp()).collect();
                let s: f64 = e.iter().sum();
                y.extend(e.iter().map(|v| (v / s) as f32));
            }
            (Task::distribution(C), C, x, y)
        }
        "regression" => {
            let y = (0..n)
                .flat_map(|i| (0..K).map(move |k| i * F + k))
                .map(|j| x[j] + 0.5 * x[j + 1])
                .collect();
            (Task::regression(K), K, x, y)
        }
        "regression_masked" => {
            let mut y = Vec::new();
            for i in 0..n {
                let w: Vec<f32> = (0..K).map(|k| weight(i * K + k)).collect();
                // A missing target's value is absurd: it must count for nothing.
                y.extend((0..K).map(|k| {
                    if w[k] > 0.0 {
                        x[i * F + k] - x[i * F + k + 2]
                    } else {
                        1e6
                    }
                }));
                y.extend(w);
            }
            (Task::regression(K).weighted(), K, x, y)
        }
        other => panic!("no task {other}"),
    }
}

/// A trainer of `task`'s head on `b`.
pub fn task_trainer<B: Capture<f32> + 'static>(
    b: B,
    task: Task,
    outputs: usize,
    capture: bool,
    eval_batch: usize,
) -> Trainer<B, f32, Head<B, f32>> {
    let mut model = Head::new(&b, F, outputs, Some(task), LossKind::Task).expect("model");
    if outputs == 1 && matches!(task.target, zgrad::Target::Binary) {
        model = model.squeezed();
    }
    let cfg = TrainerConfig {
        capture,
        eval_batch,
        ..TrainerConfig::default()
    };
    Trainer::new(b, model, cfg).expect("trainer")
}

fn lse(x: &[f64]) -> f64 {
    let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    m + x.iter().map(|v| (v - m).exp()).sum::<f64>().ln()
}

fn first_max(x: &[f64]) -> usize {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best
}

/// The report of `outputs` against `y` in f64 on the host, in sample order: the task's loss
/// (weighted mean over every target value), the weighted accuracy, and for a regression the
/// weighted MSE, MAE and a two-pass Pearson correlation.
pub fn reference<E: Element>(task: &Task, outputs: &[E], y: &[E]) -> EvalReport {
    let per_y = task.target_len();
    let per_o = task.output_len();
    let values: usize = task.value_shape().iter().product::<usize>().max(1);
    let n = y.len() / per_y;
    let (mut loss, mut right, mut wsum) = (0.0, 0.0, 0.0);
    let mut points = Vec::new();
    for i in 0..n {
        let o: Vec<f64> = outputs[i * per_o..(i + 1) * per_o]
            .iter()
            .map(|v| v.to_f64())
            .collect();
        let row: Vec<f64> = y[i * per_y..(i + 1) * per_y]
            .iter()
            .map(|v| v.to_f64())
            .collect();
        let (t, w) = row.split_at(values);
        let weight = |k: usize| w.get(k).copied().unwrap_or(1.0);
        match task.target {
            zgrad::Target::Binary => {
                let (l, t) = (o[0], t[0]);
                loss += weight(0) * (l.max(0.0) - l * t + (-l.abs()).exp().ln_1p());
                right += weight(0) * f64::from(u8::from((l > 0.0) == (t > 0.5)));
                wsum += weight(0);
            }
            zgrad::Target::ClassIndex { .. } => {
                loss += weight(0) * (lse(&o) - o[t[0] as usize]);
                right += weight(0) * f64::from(u8::from(first_max(&o) == t[0] as usize));
                wsum += weight(0);
            }
            zgrad::Target::Distribution { .. } => {
                let l = lse(&o);
                loss -= t.iter().zip(&o).map(|(t, o)| t * (o - l)).sum::<f64>();
                right += f64::from(u8::from(first_max(&o) == first_max(t)));
                wsum += 1.0;
            }
            zgrad::Target::Regression { .. } => {
                for k in 0..values {
                    let d = o[k] - t[k];
                    loss += weight(k) * d * d;
                    points.push((o[k], t[k], weight(k)));
                }
            }
        }
    }
    if !matches!(task.target, zgrad::Target::Regression { .. }) {
        return EvalReport {
            loss: loss / n as f64,
            accuracy: right / wsum,
            samples: n,
            regression: None,
        };
    }
    let w: f64 = points.iter().map(|p| p.2).sum();
    let mp = points.iter().map(|p| p.2 * p.0).sum::<f64>() / w;
    let mt = points.iter().map(|p| p.2 * p.1).sum::<f64>() / w;
    let (mut vp, mut vt, mut c, mut ae) = (0.0, 0.0, 0.0, 0.0);
    for &(p, t, wk) in &points {
        vp += wk * (p - mp) * (p - mp);
        vt += wk * (t - mt) * (t - mt);
        c += wk * (p - mp) * (t - mt);
        ae += wk * (p - t).abs();
    }
    EvalReport {
        loss: loss / (n * values) as f64,
        accuracy: f64::NAN,
        samples: n,
        regression: Some(zgrad::RegressionMetrics {
            mse: loss / w,
            mae: ae / w,
            pearson: c / (vp * vt).sqrt(),
        }),
    }
}

/// Every number of a report as bits (NaN included), for bitwise comparisons.
pub fn report_bits(r: &EvalReport) -> Vec<u64> {
    let mut v = vec![r.loss.to_bits(), r.accuracy.to_bits(), r.samples as u64];
    if let Some(m) = r.regression {
        v.extend([m.mse.to_bits(), m.mae.to_bits(), m.pearson.to_bits()]);
    }
    v
}

/// `got` within `tol` of `want`, relative to `max(1, |want|)`, for every number (NaN where
/// the other is NaN); the sample counts equal.
pub fn assert_report_close(what: &str, got: &EvalReport, want: &EvalReport, tol: f64) {
    let close = |name: &str, a: f64, b: f64| {
        assert!(
            (a.is_nan() && b.is_nan()) || (a - b).abs() <= tol * b.abs().max(1.0),
            "{what}: {name} {a} against {b} (tolerance {tol:e})"
        );
    };
    assert_eq!(got.samples, want.samples, "{what}: samples");
    close("loss", got.loss, want.loss);
    close("accuracy", got.accuracy, want.accuracy);
    match (got.regression, want.regression) {
        (Some(g), Some(w)) => {
            close("mse", g.mse, w.mse);
            close("mae", g.mae, w.mae);
            close("pearson", g.pearson, w.pearson);
        }
        (None, None) => {}
        other => panic!("{what}: regression metrics {other:?}"),
    }
}
