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
pub const STACK: [(AllocClass, &str); 4] = [
    (AllocClass::Persistent, "#4e79a7"),
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
    let ymax = nice_max(hwm.max(top_overflow));
    let n = cols.len() as f64;
    let x = |i: f64| LEFT + pw * i / n;
    let y = |b: u64| TOP + ph * (1.0 - b as f64 / ymax as f64);

    // Y axis: five gridlines labelled in binary units.
    for k in 0..=5u64 {
        let b = ymax / 5 * k;
        let yy = y(b);
        let _ = write!(
            s,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{}" y2="{yy:.1}" stroke="#e4e4e4"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            yy + 4.0,
            Bytes(b)
        );
    }
    // Stacked class areas, one step-shaped polygon per class.
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
        let mut pts = String::new();
        for (i, t) in tops.iter().enumerate() {
            let _ = write!(
                pts,
                "{:.2},{:.2} {:.2},{:.2} ",
                x(i as f64),
                y(*t),
                x(i as f64 + 1.0),
                y(*t)
            );
        }
        for (i, b) in base.iter().enumerate().rev() {
            let _ = write!(
                pts,
                "{:.2},{:.2} {:.2},{:.2} ",
                x(i as f64 + 1.0),
                y(*b),
                x(i as f64),
                y(*b)
            );
        }
        let _ = write!(
            s,
            r#"<polygon class="area {name}" points="{}" fill="{colour}" fill-opacity="0.85"><title>{name}</title></polygon>"#,
            pts.trim_end(),
            name = class.name()
        );
        base = tops;
    }
    // Overflow served per step, as a line.
    if top_overflow > 0 {
        let mut pts = String::new();
        for (i, c) in cols.iter().enumerate() {
            let _ = write!(
                pts,
                "{:.2},{:.2} {:.2},{:.2} ",
                x(i as f64),
                y(c.overflow_bytes),
                x(i as f64 + 1.0),
                y(c.overflow_bytes)
            );
        }
        let _ = write!(
            s,
            r#"<polyline class="overflow" points="{}" fill="none" stroke="{OVERFLOW_COLOUR}" stroke-width="2"><title>overflow served in the step</title></polyline>"#,
            pts.trim_end()
        );
    }
    // Hover targets: one transparent column per drawn column with its numbers.
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
            x(i as f64),
            pw / n,
            Bytes(c.peak.peak_bytes),
            esc(&c.peak.peak_by_class.to_string()),
            Bytes(c.overflow_bytes),
            c.resets
        );
    }
    // Reset ticks under the plot.
    let tick_y = TOP + ph + 4.0;
    let mut ticks = String::new();
    for (i, _) in cols.iter().enumerate().filter(|(_, c)| c.resets > 0) {
        let _ = write!(ticks, "M{:.2} {tick_y}v8", x(i as f64 + 0.5));
    }
    if !ticks.is_empty() {
        let _ = write!(
            s,
            r##"<path class="resets" d="{ticks}" stroke="#555" stroke-width="1"><title>steps whose end reset the arena</title></path>"##
        );
    }
    // High-water mark.
    let hw_col = cols
        .iter()
        .position(|c| c.peak.peak_bytes == hwm)
        .unwrap_or(0);
    let _ = write!(
        s,
        r##"<line class="hwm" x1="{LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#222" stroke-dasharray="6 4"/><text class="hwm-label" x="{:.1}" y="{:.1}" text-anchor="end">high-water {} (step {})</text>"##,
        LEFT + pw,
        LEFT + pw - 4.0,
        y(hwm) - 5.0,
        Bytes(hwm),
        cols[hw_col].peak.peak_step,
        y = y(hwm),
    );
    // First overflow.
    if let Some((i, c)) = cols.iter().enumerate().find(|(_, c)| c.overflow_bytes > 0) {
        let first = steps
            .iter()
            .find(|r| r.overflow_calls > 0)
            .map_or_else(|| format!("step {}", c.steps.0), steps_label);
        let xx = x(i as f64 + 0.5);
        let anchor = if xx > LEFT + pw * 0.7 { "end" } else { "start" };
        let _ = write!(
            s,
            r#"<line class="first-overflow" x1="{xx:.2}" y1="{TOP}" x2="{xx:.2}" y2="{}" stroke="{OVERFLOW_COLOUR}" stroke-width="1.5"/><text class="first-overflow-label" x="{:.2}" y="{}" fill="{OVERFLOW_COLOUR}" text-anchor="{anchor}">first overflow: {first}</text>"#,
            TOP + ph,
            if anchor == "end" { xx - 4.0 } else { xx + 4.0 },
            TOP + 14.0,
        );
    }
    // X axis labels: first and last step, and a few between.
    let label_y = TOP + ph + 28.0;
    for k in 0..=4usize {
        let i = ((cols.len() - 1) * k / 4).min(cols.len() - 1);
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{label_y}" text-anchor="middle">{}</text>"#,
            x(i as f64 + 0.5),
            cols[i].steps.0
        );
    }
    let _ = write!(
        s,
        r#"<text x="{:.1}" y="{}" text-anchor="middle">arena step (ticks below the plot: steps whose end reset the arena)</text></svg>"#,
        LEFT + pw / 2.0,
        label_y + 22.0
    );
    s
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
