//! The memory report: one self-contained HTML file (inline CSS and SVG, no script, nothing
//! fetched) with the timeline of device memory by class over the whole run, from zmem's
//! per-step aggregates (`Arena::timeline().steps`; a long run's cover ranges of steps).

pub mod chart;
pub mod curves;

use std::fmt::Write as _;
use std::path::Path;

use zcompute::StepRecord;
use zcompute::units::Bytes;

use crate::error::Result;

/// What the page shows.
#[derive(Clone, Debug, Default)]
pub struct MemoryReport {
    /// Page heading.
    pub title: String,
    /// Key facts shown as a table (device, model, schedule, ...).
    pub facts: Vec<(String, String)>,
    /// Per-step aggregates of the whole run, oldest first (a long run's cover ranges of steps).
    pub steps: Vec<StepRecord>,
    /// The arena's one-line diagnostics at the end of the run.
    pub diagnostics: String,
    /// The loss and metric curves (drawn above the memory timeline when there are any).
    pub curves: curves::Curves,
}

/// Escapes text for HTML and SVG.
#[must_use]
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "body{font-family:sans-serif;margin:24px;color:#222;max-width:1040px}\
h1{font-size:20px;margin:0 0 12px}table{border-collapse:collapse;margin:8px 0 16px}\
td{padding:2px 12px 2px 0;vertical-align:top}td:first-child{color:#666}\
.legend span{display:inline-block;margin-right:16px}.sw{display:inline-block;width:12px;\
height:12px;margin-right:4px;vertical-align:-1px}code{font-size:12px;word-break:break-all}\
p.note{color:#555;font-size:13px}";

impl MemoryReport {
    /// Derived facts: steps, high-water mark and where, overflow and where it began, resets.
    #[must_use]
    pub fn summary(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let covered: u64 = self.steps.iter().map(StepRecord::span).sum();
        out.push(("steps".to_string(), covered.to_string()));
        if let Some(hw) = self
            .steps
            .iter()
            .max_by_key(|r| (r.peak_bytes, std::cmp::Reverse(r.peak_step)))
        {
            out.push((
                "high-water mark".into(),
                format!(
                    "{} at step {} ({})",
                    Bytes(hw.peak_bytes),
                    hw.peak_step,
                    hw.peak_by_class
                ),
            ));
        }
        let resets: u64 = self.steps.iter().map(|r| r.resets).sum();
        out.push(("arena resets".into(), resets.to_string()));
        let overflow: u64 = self.steps.iter().map(|r| r.overflow_bytes).sum();
        let first = self.steps.iter().find(|r| r.overflow_calls > 0);
        out.push((
            "overflow".into(),
            match first {
                Some(r) => format!(
                    "{} in all; first {} {} ({} calls, {})",
                    Bytes(overflow),
                    if r.span() == 1 { "at" } else { "in" },
                    chart::steps_label(r),
                    r.overflow_calls,
                    Bytes(r.overflow_bytes)
                ),
                None => "none".into(),
            },
        ));
        out
    }

    /// The page.
    #[must_use]
    pub fn html(&self) -> String {
        let mut s = String::with_capacity(16 * 1024);
        let _ = write!(
            s,
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title><style>{STYLE}</style></head><body><h1>{t}</h1><table>",
            t = esc(&self.title)
        );
        for (k, v) in self.facts.iter().chain(self.summary().iter()) {
            let _ = write!(s, "<tr><td>{}</td><td>{}</td></tr>", esc(k), esc(v));
        }
        s.push_str("</table><div class=\"legend\">");
        for (class, colour) in chart::STACK {
            let _ = write!(
                s,
                "<span><i class=\"sw\" style=\"background:{colour}\"></i>{}</span>",
                class.name()
            );
        }
        let _ = write!(
            s,
            "<span><i class=\"sw\" style=\"background:{}\"></i>overflow (served by the pool in the step)</span></div>",
            chart::OVERFLOW_COLOUR
        );
        s.push_str(&self.curves.html());
        s.push_str(&chart::svg(&self.steps));
        s.push_str(
            "<p class=\"note\">Each column is one arena step: a step scope of the trainer (one per batch; one per \
             sample and one for the update with the per-sample schedule; one per validation batch). Long runs \
             are bucketed: a column shows its bucket's highest step (zmem keeps at most a few thousand step \
             records, folding a long run's into ranges of steps, so its columns cover ranges either way). The stack is device memory held at the step's peak, by allocation class: \
             persistent (parameters, gradients, optimiser state), saved (tensors kept for backward), scratch \
             (the step's temporaries, reclaimed at its end), graph (memory owned by captured graphs). \
             The red line is memory the overflow pool served in the step (already counted in its class). \
             Ticks under the axis mark steps whose end reset the arena. Hover a column for its numbers.</p>",
        );
        let _ = writeln!(
            s,
            "<h2 style=\"font-size:15px\">Arena diagnostics at the end</h2><p><code>{}</code></p></body></html>",
            esc(&self.diagnostics)
        );
        s
    }

    /// Writes the page to `path`.
    pub fn write(&self, path: &Path) -> Result<()> {
        crate::files::write_atomically(path, "writing the memory report", self.html().as_bytes())
    }
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
