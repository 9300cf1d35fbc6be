//! The report's loss and metric curves, beside the memory timeline: the train loss of every
//! step read back (thin), the running train loss and the validation loss at each epoch's end
//! (points joined), and the validation metrics of the model's task: the accuracy of a
//! classification on its own axis (right), a regression's mean squared and absolute errors
//! on the loss axis and its Pearson correlation on the right axis; over optimiser steps. A
//! series with no point (a metric the task does not report) is neither drawn nor in the
//! legend. Plain SVG with `<title>` tooltips, as the timeline.

use std::fmt::Write as _;

use super::esc;
use crate::metrics::{MetricRow, Metrics};

/// Most step points drawn; longer runs are thinned to every k-th step.
pub const MAX_POINTS: usize = 2000;

const W: f64 = 1000.0;
const H: f64 = 300.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 60.0;
const TOP: f64 = 20.0;
const BOTTOM: f64 = 40.0;

/// Colours: step loss, epoch train loss, validation loss, validation accuracy, validation
/// MSE, validation MAE, validation Pearson correlation.
pub const COLOURS: [&str; 7] = [
    "#a0cbe8", "#4e79a7", "#e15759", "#59a14f", "#f28e2b", "#b07aa1", "#76b7b2",
];

/// The epoch series, after the step loss: legend name, whether on the right axis, and the
/// value of an epoch row.
const SERIES: [(&str, bool, Value); 6] = [
    ("train loss (epoch, running)", false, |e| e.train_loss),
    ("validation loss", false, |e| e.val_loss),
    ("validation accuracy (right axis)", true, |e| e.val_accuracy),
    ("validation MSE", false, |e| e.val_mse),
    ("validation MAE", false, |e| e.val_mae),
    ("validation Pearson r (right axis)", true, |e| e.val_pearson),
];

/// A series' value at an epoch's end (`None` where the row has none).
type Value = fn(&EpochPoint) -> Option<f64>;

/// An epoch's end: its step and the metrics its row has.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EpochPoint {
    pub step: u64,
    pub train_loss: Option<f64>,
    pub val_loss: Option<f64>,
    pub val_accuracy: Option<f64>,
    pub val_mse: Option<f64>,
    pub val_mae: Option<f64>,
    pub val_pearson: Option<f64>,
}

impl EpochPoint {
    /// The point of an epoch row.
    #[must_use]
    pub fn of(r: &MetricRow) -> EpochPoint {
        EpochPoint {
            step: r.step,
            train_loss: r.train_loss,
            val_loss: r.val_loss,
            val_accuracy: r.val_accuracy,
            val_mse: r.val_mse,
            val_mae: r.val_mae,
            val_pearson: r.val_pearson,
        }
    }
}

/// What the curves show.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Curves {
    /// (step, loss) of every step read back.
    pub steps: Vec<(u64, f64)>,
    /// Each epoch's end.
    pub epochs: Vec<EpochPoint>,
}

impl Curves {
    /// The curves of a run's metrics.
    #[must_use]
    pub fn of(m: &Metrics) -> Curves {
        Curves {
            steps: m.step_losses.clone(),
            epochs: m
                .rows
                .iter()
                .filter(|r| r.kind == "epoch")
                .map(EpochPoint::of)
                .collect(),
        }
    }

    fn is_empty(&self) -> bool {
        self.steps.is_empty() && self.epochs.is_empty()
    }

    /// The finite points of each epoch series, in `SERIES`'s order.
    fn series(&self) -> Vec<Vec<(u64, f64)>> {
        SERIES
            .iter()
            .map(|(_, _, value)| {
                self.epochs
                    .iter()
                    .filter_map(|e| Some((e.step, value(e)?)))
                    .filter(|p| p.1.is_finite())
                    .collect()
            })
            .collect()
    }

    /// The heading, the legend and the SVG (nothing when there is nothing to draw).
    #[must_use]
    pub fn html(&self) -> String {
        if self.is_empty() {
            return String::new();
        }
        let mut s = String::from(
            "<h2 style=\"font-size:15px\">Loss and metrics</h2><div class=\"legend\">",
        );
        let series = self.series();
        let shown = std::iter::once(("train loss (each step read back)", !self.steps.is_empty()))
            .chain(
                SERIES
                    .iter()
                    .zip(&series)
                    .map(|(s, p)| (s.0, !p.is_empty())),
            );
        for ((name, drawn), c) in shown.zip(COLOURS) {
            if drawn {
                let _ = write!(
                    s,
                    "<span><i class=\"sw\" style=\"background:{c}\"></i>{}</span>",
                    esc(name)
                );
            }
        }
        s.push_str("</div>");
        s.push_str(&self.svg());
        s
    }

    /// The chart.
    #[must_use]
    pub fn svg(&self) -> String {
        let series = self.series();
        let left = |right: bool| {
            SERIES
                .iter()
                .zip(&series)
                .filter(move |(s, _)| s.1 == right)
                .flat_map(|(_, p)| p.iter().map(|p| p.1))
        };
        let losses = self
            .steps
            .iter()
            .map(|p| p.1)
            .filter(|v| v.is_finite())
            .chain(left(false));
        let (lo, hi) = losses.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(v), b.max(v))
        });
        let (lo, hi) = if lo.is_finite() {
            (lo.min(0.0), hi.max(lo + 1e-12))
        } else {
            (0.0, 1.0)
        };
        // The right axis: 0 to 1 (accuracy, a correlation), -1 to 1 when a correlation is
        // negative.
        let a_lo = if left(true).any(|v| v < 0.0) {
            -1.0
        } else {
            0.0
        };
        let last = self
            .steps
            .iter()
            .map(|p| p.0)
            .chain(self.epochs.iter().map(|e| e.step))
            .max()
            .unwrap_or(1)
            .max(1) as f64;
        let x = |step: u64| LEFT + (step as f64 / last) * (W - LEFT - RIGHT);
        let y = |v: f64| TOP + (1.0 - (v - lo) / (hi - lo)) * (H - TOP - BOTTOM);
        let ya = |a: f64| TOP + (1.0 - (a - a_lo) / (1.0 - a_lo)) * (H - TOP - BOTTOM);
        let mut s = String::new();
        let _ = write!(
            s,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" font-size=\"11\">"
        );
        // Axes and their labels.
        let _ = write!(
            s,
            "<path d=\"M{LEFT} {TOP}V{b}H{r}\" stroke=\"#888\" fill=\"none\"/>",
            b = H - BOTTOM,
            r = W - RIGHT
        );
        for k in 0..=4 {
            let v = lo + (hi - lo) * f64::from(k) / 4.0;
            let _ = write!(
                s,
                "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{v:.4}</text>",
                LEFT - 6.0,
                y(v) + 4.0
            );
            let a = a_lo + (1.0 - a_lo) * f64::from(k) / 4.0;
            let _ = write!(
                s,
                "<text x=\"{}\" y=\"{:.1}\">{a:.2}</text>",
                W - RIGHT + 6.0,
                ya(a) + 4.0
            );
        }
        let _ = write!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">optimiser step (last {})</text>",
            (LEFT + W - RIGHT) / 2.0,
            H - 10.0,
            last as u64
        );
        let per = self.steps.len().div_ceil(MAX_POINTS).max(1);
        let points: Vec<(f64, f64)> = self
            .steps
            .iter()
            .step_by(per)
            .filter(|p| p.1.is_finite())
            .map(|&(st, l)| (x(st), y(l)))
            .collect();
        line(&mut s, &points, COLOURS[0], 1.0);
        for (i, ((_, right, _), pts)) in SERIES.iter().zip(&series).enumerate() {
            let scale = |v: f64| if *right { ya(v) } else { y(v) };
            let drawn: Vec<(f64, f64)> = pts.iter().map(|&(st, v)| (x(st), scale(v))).collect();
            let colour = COLOURS[i + 1];
            line(&mut s, &drawn, colour, 2.0);
            for (&(st, v), &(px, py)) in pts.iter().zip(&drawn) {
                let _ = write!(
                    s,
                    "<circle cx=\"{px:.1}\" cy=\"{py:.1}\" r=\"3\" fill=\"{colour}\"><title>step {st}: {v:.6}</title></circle>"
                );
            }
        }
        s.push_str("</svg>");
        s
    }
}

/// A polyline through `points` (nothing for none).
fn line(s: &mut String, points: &[(f64, f64)], colour: &str, width: f64) {
    if points.is_empty() {
        return;
    }
    s.push_str("<polyline fill=\"none\" stroke=\"");
    s.push_str(colour);
    let _ = write!(s, "\" stroke-width=\"{width}\" points=\"");
    for (px, py) in points {
        let _ = write!(s, "{px:.1},{py:.1} ");
    }
    s.push_str("\"/>");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_to_draw_draws_nothing() {
        assert_eq!(Curves::default().html(), "");
    }

    #[test]
    fn every_epoch_point_is_drawn_with_its_value() {
        let c = Curves {
            steps: (1..=10).map(|s| (s, 1.0 / s as f64)).collect(),
            epochs: vec![
                classification(5, 0.4, 0.5, 0.6),
                classification(10, 0.2, 0.3, 0.8),
            ],
        };
        let html = c.html();
        assert!(html.contains("Loss and metrics"));
        assert_eq!(html.matches("<circle").count(), 6);
        assert!(html.contains("step 10: 0.300000"), "{html}");
        assert_eq!(html.matches("<polyline").count(), 4);
        assert!(html.contains("validation accuracy"), "{html}");
        assert!(!html.contains("MSE") && !html.contains("Pearson"), "{html}");
    }

    fn classification(step: u64, train: f64, val: f64, acc: f64) -> EpochPoint {
        EpochPoint {
            step,
            train_loss: Some(train),
            val_loss: Some(val),
            val_accuracy: Some(acc),
            ..EpochPoint::default()
        }
    }

    #[test]
    fn a_regressions_curves_are_its_errors_and_correlation_and_no_accuracy() {
        let point = |step, mse: f64, pearson| EpochPoint {
            step,
            train_loss: Some(mse * 1.5),
            val_loss: Some(mse),
            val_mse: Some(mse),
            val_mae: Some(mse.sqrt()),
            val_pearson: Some(pearson),
            ..EpochPoint::default()
        };
        let c = Curves {
            steps: Vec::new(),
            epochs: vec![point(4, 0.25, -0.5), point(8, 0.0625, 0.75)],
        };
        let html = c.html();
        // Train loss, validation loss, MSE, MAE and Pearson r: 5 series of 2 points.
        assert_eq!(html.matches("<polyline").count(), 5, "{html}");
        assert_eq!(html.matches("<circle").count(), 10, "{html}");
        for name in ["validation MSE", "validation MAE", "validation Pearson r"] {
            assert!(html.contains(name), "{name}: {html}");
        }
        assert!(!html.contains("accuracy"), "{html}");
        assert!(html.contains("step 4: -0.500000"), "{html}");
        assert!(html.contains("step 4: 0.500000"), "the MAE: {html}");
        // A negative correlation: the right axis runs from -1.
        assert!(html.contains(">-1.00</text>"), "{html}");
    }

    #[test]
    fn an_epoch_row_gives_its_point() {
        let row = MetricRow {
            kind: "epoch",
            step: 6,
            val_mse: Some(0.5),
            val_pearson: Some(0.25),
            ..MetricRow::default()
        };
        let p = EpochPoint::of(&row);
        assert_eq!(
            (p.step, p.val_mse, p.val_pearson),
            (6, Some(0.5), Some(0.25))
        );
        assert_eq!(p.val_accuracy, None);
    }
}
