//! The SVG timeline: device memory by class at each step's peak, stacked; overflow served per
//! step as a line over it; reset ticks under the axis; the high-water mark and the first
//! overflow annotated. Plain SVG with `<title>` tooltips: no script, no external resource.

use std::fmt::Write as _;

use zcompute::units::Bytes;
use zcompute::{AllocClass, StepRecord};

use super::esc;

/// Most columns drawn; longer runs are bucketed (each column shows its bucket's highest step).
/// zmem's records may already cover ranges of steps (a long run's are folded; all but the
/// newest cover the same number), so buckets group records and report the steps they cover.
pub const MAX_COLUMNS: usize = 1500;

/// Classes stacked from the bottom, with their colours.
pub const STACK: [(AllocClass, &str); 5] = [
    (AllocClass::Persistent, "#4e79a7"),
    (AllocClass::Shadow, "#76b7b2"),
    (AllocClass::Saved, "#f28e2b"),
    (AllocClass::Scratch, "#59a14f"),
    (AllocClass::Graph, "#b07aa1"),
];

/// Colour of the overflow line and the first-overflow marker.
pub const OVERFLOW_COLOUR: &str = "#e15759";

const W: f64 = 1000.0;
const H: f64 = 420.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 70.0;

/// One drawn column: the step with the highest peak in its bucket, plus bucket totals.
#[derive(Clone, Debug, PartialEq)]
pub struct Column {
    /// Steps covered (first, last).
    pub steps: (u64, u64),
    /// The record with the highest peak (its `peak_step` is the step that reached it).
    pub peak: StepRecord,
    /// Resets in the bucket.
    pub resets: u64,
    /// Most overflow bytes one step of the bucket served.
    pub overflow_bytes: u64,
}

/// Groups `steps` into at most `max` columns, in order.
#[must_use]
pub fn columns(steps: &[StepRecord], max: usize) -> Vec<Column> {
    let per = steps.len().div_ceil(max.max(1)).max(1);
    steps
        .chunks(per)
        .map(|chunk| {
            let peak = chunk
                .iter()
                .max_by_key(|r| (r.peak_bytes, std::cmp::Reverse(r.peak_step)))
                .cloned()
                .unwrap_or_default();
            Column {
                steps: (chunk[0].step, last_step(&chunk[chunk.len() - 1])),
                resets: chunk.iter().map(|r| r.resets).sum(),
                overflow_bytes: chunk
                    .iter()
                    .map(|r| r.step_overflow_bytes_max.max(per_step_overflow(r)))
                    .max()
                    .unwrap_or(0),
                peak,
            }
        })
        .collect()
}

/// The last step `r` covers (`r.step` for a record whose range was left unset).
#[must_use]
pub fn last_step(r: &StepRecord) -> u64 {
    r.step + r.span() - 1
}

/// Overflow bytes of `r`'s one step, when it covers one (ranges carry their per-step maximum
/// in `step_overflow_bytes_max`).
fn per_step_overflow(r: &StepRecord) -> u64 {
    if r.span() == 1 { r.overflow_bytes } else { 0 }
}

/// `step N`, or `steps N–M` for a record covering a range.
#[must_use]
pub fn steps_label(r: &StepRecord) -> String {
    if r.span() == 1 {
        format!("step {}", r.step)
    } else {
        format!("steps {}–{}", r.step, last_step(r))
    }
}

/// A "nice" axis maximum at or above `v`: 1, 2, 5 or 10 times a power of ten of a binary unit
/// (B, KiB, MiB, GiB), so the gridlines read as round numbers in the units they print in.
fn nice_max(v: u64) -> u64 {
    let v = v.max(1);
    let mut unit = 1u64;
    while unit < (1 << 40) && v >= unit * 1024 {
        unit *= 1024;
    }
    let scaled = v.div_ceil(unit);
    let mut pow = 1u64;
    while pow * 10 < scaled {
        pow *= 10;
    }
    let m = [1u64, 2, 5, 10]
        .into_iter()
        .map(|m| m * pow)
        .find(|c| *c >= scaled)
        .unwrap_or(10 * pow);
    m.saturating_mul(unit)
}

/// The plot area: where a column index and a byte count land in the SVG.
struct Plot {
    /// Width and height of the plot area.
    pw: f64,
    ph: f64,
    /// Columns drawn.
    n: f64,
    /// Bytes at the top of the Y axis.
    ymax: u64,
}

impl Plot {
    fn x(&self, i: f64) -> f64 {
        LEFT + self.pw * i / self.n
    }

    fn y(&self, b: u64) -> f64 {
        TOP + self.ph * (1.0 - b as f64 / self.ymax as f64)
    }
}

/// Renders the chart for `steps` (empty runs get a chart with a note).
#[must_use]
pub fn svg(steps: &[StepRecord]) -> String {
    let cols = columns(steps, MAX_COLUMNS);
    let mut s = String::with_capacity(4096 + cols.len() * 120);
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="device memory by class per step" font-family="sans-serif" font-size="12">"#
    );
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let _ = write!(
        s,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#ccc"/>"##
    );
    if cols.is_empty() {
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">no steps recorded</text></svg>"#,
            LEFT + pw / 2.0,
            TOP + ph / 2.0
        );
        return s;
    }
    let hwm = cols.iter().map(|c| c.peak.peak_bytes).max().unwrap_or(0);
    let top_overflow = cols.iter().map(|c| c.overflow_bytes).max().unwrap_or(0);
    let plot = Plot {
        pw,
        ph,
        n: cols.len() as f64,
        ymax: nice_max(hwm.max(top_overflow)),
    };
    y_axis(&mut s, &plot);
    class_areas(&mut s, &plot, &cols);
    if top_overflow > 0 {
        overflow_line(&mut s, &plot, &cols);
    }
    hover_columns(&mut s, &plot, &cols);
    reset_ticks(&mut s, &plot, &cols);
    high_water(&mut s, &plot, &cols, hwm);
    first_overflow(&mut s, &plot, &cols, steps);
    x_axis(&mut s, &plot, &cols);
    s
}

/// Y axis: five gridlines labelled in binary units.
fn y_axis(s: &mut String, p: &Plot) {
    for k in 0..=5u64 {
        let b = p.ymax / 5 * k;
        let yy = p.y(b);
        let _ = write!(
            s,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{}" y2="{yy:.1}" stroke="#e4e4e4"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + p.pw,
            LEFT - 6.0,
            yy + 4.0,
            Bytes(b)
        );
    }
}

/// `x,y` pairs tracing one horizontal segment per column at `levels[i]`, left to right (or
/// right to left with `rev`, for a polygon's lower edge).
fn steps_path(p: &Plot, levels: &[u64], rev: bool) -> String {
    let mut pts = String::new();
    let mut put = |i: usize, v: u64, from: f64, to: f64| {
        let _ = write!(
            pts,
            "{:.2},{:.2} {:.2},{:.2} ",
            p.x(i as f64 + from),
            p.y(v),
            p.x(i as f64 + to),
            p.y(v)
        );
    };
    if rev {
        for (i, v) in levels.iter().enumerate().rev() {
            put(i, *v, 1.0, 0.0);
        }
    } else {
        for (i, v) in levels.iter().enumerate() {
            put(i, *v, 0.0, 1.0);
        }
    }
    pts
}

/// Stacked class areas, one step-shaped polygon per class.
fn class_areas(s: &mut String, p: &Plot, cols: &[Column]) {
    let mut base = vec![0u64; cols.len()];
    for (class, colour) in STACK {
        let tops: Vec<u64> = cols
            .iter()
            .zip(&base)
            .map(|(c, b)| b + c.peak.peak_by_class.get(class))
            .collect();
        if tops == base {
            continue;
        }
        let pts = steps_path(p, &tops, false) + &steps_path(p, &base, true);
        let _ = write!(
            s,
            r#"<polygon class="area {name}" points="{}" fill="{colour}" fill-opacity="0.85"><title>{name}</title></polygon>"#,
            pts.trim_end(),
            name = class.name()
        );
        base = tops;
    }
}

/// Overflow served per step, as a line.
fn overflow_line(s: &mut String, p: &Plot, cols: &[Column]) {
    let levels: Vec<u64> = cols.iter().map(|c| c.overflow_bytes).collect();
    let pts = steps_path(p, &levels, false);
    let _ = write!(
        s,
        r#"<polyline class="overflow" points="{}" fill="none" stroke="{OVERFLOW_COLOUR}" stroke-width="2"><title>overflow served in the step</title></polyline>"#,
        pts.trim_end()
    );
}

/// Hover targets: one transparent column per drawn column with its numbers.
fn hover_columns(s: &mut String, p: &Plot, cols: &[Column]) {
    let ph = p.ph;
    for (i, c) in cols.iter().enumerate() {
        let steps = if c.steps.0 == c.steps.1 {
            format!("step {}", c.steps.0)
        } else {
            format!(
                "steps {}–{} (highest: {})",
                c.steps.0, c.steps.1, c.peak.peak_step
            )
        };
        let _ = write!(
            s,
            r#"<rect class="col" x="{:.2}" y="{TOP}" width="{:.2}" height="{ph}" fill="transparent"><title>{steps}: peak {}; {}; overflow {}; resets {}</title></rect>"#,
            p.x(i as f64),
            p.pw / p.n,
            Bytes(c.peak.peak_bytes),
            esc(&c.peak.peak_by_class.to_string()),
            Bytes(c.overflow_bytes),
            c.resets
        );
    }
}

/// Reset ticks under the plot.
fn reset_ticks(s: &mut String, p: &Plot, cols: &[Column]) {
    let tick_y = TOP + p.ph + 4.0;
    let mut ticks = String::new();
    for (i, _) in cols.iter().enumerate().filter(|(_, c)| c.resets > 0) {
        let _ = write!(ticks, "M{:.2} {tick_y}v8", p.x(i as f64 + 0.5));
    }
    if !ticks.is_empty() {
        let _ = write!(
            s,
            r##"<path class="resets" d="{ticks}" stroke="#555" stroke-width="1"><title>steps whose end reset the arena</title></path>"##
        );
    }
}

/// The high-water mark `hwm`, labelled with the step that reached it.
fn high_water(s: &mut String, p: &Plot, cols: &[Column], hwm: u64) {
    let hw_col = cols
        .iter()
        .position(|c| c.peak.peak_bytes == hwm)
        .unwrap_or(0);
    let _ = write!(
        s,
        r##"<line class="hwm" x1="{LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#222" stroke-dasharray="6 4"/><text class="hwm-label" x="{:.1}" y="{:.1}" text-anchor="end">high-water {} (step {})</text>"##,
        LEFT + p.pw,
        LEFT + p.pw - 4.0,
        p.y(hwm) - 5.0,
        Bytes(hwm),
        cols[hw_col].peak.peak_step,
        y = p.y(hwm),
    );
}

/// The first overflow, marked at its column and named by its step (or range).
fn first_overflow(s: &mut String, p: &Plot, cols: &[Column], steps: &[StepRecord]) {
    let Some((i, c)) = cols.iter().enumerate().find(|(_, c)| c.overflow_bytes > 0) else {
        return;
    };
    let first = steps
        .iter()
        .find(|r| r.overflow_calls > 0)
        .map_or_else(|| format!("step {}", c.steps.0), steps_label);
    let xx = p.x(i as f64 + 0.5);
    let anchor = if xx > LEFT + p.pw * 0.7 {
        "end"
    } else {
        "start"
    };
    let _ = write!(
        s,
        r#"<line class="first-overflow" x1="{xx:.2}" y1="{TOP}" x2="{xx:.2}" y2="{}" stroke="{OVERFLOW_COLOUR}" stroke-width="1.5"/><text class="first-overflow-label" x="{:.2}" y="{}" fill="{OVERFLOW_COLOUR}" text-anchor="{anchor}">first overflow: {first}</text>"#,
        TOP + p.ph,
        if anchor == "end" { xx - 4.0 } else { xx + 4.0 },
        TOP + 14.0,
    );
}

/// X axis labels: first and last step, and a few between; the axis title closes the SVG.
fn x_axis(s: &mut String, p: &Plot, cols: &[Column]) {
    let label_y = TOP + p.ph + 28.0;
    for k in 0..=4usize {
        let i = ((cols.len() - 1) * k / 4).min(cols.len() - 1);
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{label_y}" text-anchor="middle">{}</text>"#,
            p.x(i as f64 + 0.5),
            cols[i].steps.0
        );
    }
    let _ = write!(
        s,
        r#"<text x="{:.1}" y="{}" text-anchor="middle">arena step (ticks below the plot: steps whose end reset the arena)</text></svg>"#,
        LEFT + p.pw / 2.0,
        label_y + 22.0
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn rec(step: u64, scratch: u64, persistent: u64, overflow: u64) -> StepRecord {
        let mut r = StepRecord {
            step,
            last_step: step,
            peak_step: step,
            resets: 1,
            overflow_bytes: overflow,
            step_overflow_bytes_max: overflow,
            overflow_calls: u64::from(overflow > 0),
            ..StepRecord::default()
        };
        r.peak_by_class.0[0] = scratch;
        r.peak_by_class.0[2] = persistent;
        r.peak_bytes = scratch + persistent;
        r
    }

    #[test]
    fn bucketing_keeps_the_highest_step_and_sums_resets() {
        let steps: Vec<StepRecord> = (1..=10).map(|i| rec(i, i * 10, 0, 0)).collect();
        let cols = columns(&steps, 3);
        assert_eq!(cols.len(), 3);
        assert_eq!(cols[0].steps, (1, 4));
        assert_eq!(cols[0].peak.step, 4);
        assert_eq!(cols[0].resets, 4);
        assert_eq!(cols[2].steps, (9, 10));
        assert_eq!(columns(&steps, 100).len(), 10);
    }

    #[test]
    fn nice_max_rounds_up() {
        assert_eq!(nice_max(0), 1);
        assert_eq!(nice_max(7), 10);
        assert_eq!(nice_max(130), 200);
        assert_eq!(nice_max(624 * 1024 + 512), 1000 * 1024);
        assert_eq!(nice_max(3 << 20), 5 << 20);
        assert_eq!(nice_max(1 << 20), 1 << 20);
    }

    #[test]
    fn first_overflow_names_the_first_step_that_overflowed() {
        let steps = vec![
            rec(1, 100, 50, 0),
            rec(2, 300, 50, 0),
            rec(3, 100, 50, 40),
            rec(4, 10, 50, 90),
        ];
        let svg = svg(&steps);
        assert!(svg.contains("first overflow: step 3"), "{svg}");
        assert!(svg.contains("high-water 350 B (step 2)"), "{svg}");
        assert_eq!(svg.matches("class=\"overflow\"").count(), 1);
    }

    #[test]
    fn no_overflow_draws_no_overflow_marks_and_empty_runs_say_so() {
        let svg = svg(&[rec(1, 100, 50, 0)]);
        assert!(!svg.contains("first-overflow") && !svg.contains("class=\"overflow\""));
        assert!(super::svg(&[]).contains("no steps recorded"));
    }
}
