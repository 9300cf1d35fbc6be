//! The report's loss and metric curves, beside the memory timeline: the train loss of every
//! step read back (thin), the running train loss and the validation loss at each epoch's end
//! (points joined), and the validation accuracy on its own axis (0 to 1), over optimiser
//! steps. Plain SVG with `<title>` tooltips, as the timeline.

use std::fmt::Write as _;

use super::esc;
use crate::metrics::Metrics;

/// Most step points drawn; longer runs are thinned to every k-th step.
pub const MAX_POINTS: usize = 2000;

const W: f64 = 1000.0;
const H: f64 = 300.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 60.0;
const TOP: f64 = 20.0;
const BOTTOM: f64 = 40.0;

/// Colours: step loss, epoch train loss, validation loss, validation accuracy.
pub const COLOURS: [&str; 4] = ["#a0cbe8", "#4e79a7", "#e15759", "#59a14f"];

/// An epoch's end: (step, running train loss, validation loss, validation accuracy).
pub type EpochPoint = (u64, Option<f64>, Option<f64>, Option<f64>);

/// What the curves show.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Curves {
    /// (step, loss) of every step read back.
    pub steps: Vec<(u64, f64)>,
    /// (step, running train loss, validation loss, validation accuracy) at each epoch's end.
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
                .map(|r| (r.step, r.train_loss, r.val_loss, r.val_accuracy))
                .collect(),
        }
    }

    fn is_empty(&self) -> bool {
        self.steps.is_empty() && self.epochs.is_empty()
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
        for (name, c) in [
            "train loss (each step read back)",
            "train loss (epoch, running)",
            "validation loss",
            "validation accuracy (right axis)",
        ]
        .iter()
        .zip(COLOURS)
        {
            let _ = write!(
                s,
                "<span><i class=\"sw\" style=\"background:{c}\"></i>{}</span>",
                esc(name)
            );
        }
        s.push_str("</div>");
        s.push_str(&self.svg());
        s
    }

    /// The chart.
    #[must_use]
    pub fn svg(&self) -> String {
        let finite = |v: &f64| v.is_finite();
        let losses = self
            .steps
            .iter()
            .map(|p| p.1)
            .chain(
                self.epochs
                    .iter()
                    .flat_map(|e| [e.1, e.2].into_iter().flatten()),
            )
            .filter(finite);
        let (lo, hi) = losses.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(v), b.max(v))
        });
        let (lo, hi) = if lo.is_finite() {
            (lo.min(0.0), hi.max(lo + 1e-12))
        } else {
            (0.0, 1.0)
        };
        let last = self
            .steps
            .iter()
            .map(|p| p.0)
            .chain(self.epochs.iter().map(|e| e.0))
            .max()
            .unwrap_or(1)
            .max(1) as f64;
        let x = |step: u64| LEFT + (step as f64 / last) * (W - LEFT - RIGHT);
        let y = |v: f64| TOP + (1.0 - (v - lo) / (hi - lo)) * (H - TOP - BOTTOM);
        let ya = |a: f64| TOP + (1.0 - a) * (H - TOP - BOTTOM);
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
            let a = f64::from(k) / 4.0;
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
        let series: [Vec<(u64, f64)>; 3] = [
            self.epochs
                .iter()
                .filter_map(|e| Some((e.0, e.1?)))
                .collect(),
            self.epochs
                .iter()
                .filter_map(|e| Some((e.0, e.2?)))
                .collect(),
            self.epochs
                .iter()
                .filter_map(|e| Some((e.0, e.3?)))
                .collect(),
        ];
        for (i, pts) in series.iter().enumerate() {
            let scale = |v: f64| if i == 2 { ya(v) } else { y(v) };
            let drawn: Vec<(f64, f64)> = pts
                .iter()
                .filter(|p| p.1.is_finite())
                .map(|&(st, v)| (x(st), scale(v)))
                .collect();
            let colour = COLOURS[i + 1];
            line(&mut s, &drawn, colour, 2.0);
            for (&(st, v), &(px, py)) in pts.iter().filter(|p| p.1.is_finite()).zip(&drawn) {
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
                (5, Some(0.4), Some(0.5), Some(0.6)),
                (10, Some(0.2), Some(0.3), Some(0.8)),
            ],
        };
        let html = c.html();
        assert!(html.contains("Loss and metrics"));
        assert_eq!(html.matches("<circle").count(), 6);
        assert!(html.contains("step 10: 0.300000"), "{html}");
        assert_eq!(html.matches("<polyline").count(), 4);
    }
}
