use super::*;
use zcompute::AllocClass;

fn rec(step: u64, scratch: u64, saved: u64, persistent: u64, overflow: u64) -> StepRecord {
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
    r.peak_by_class.0 = [scratch, saved, persistent, 0, 0];
    r.peak_bytes = scratch + saved + persistent;
    r
}

fn report(steps: Vec<StepRecord>) -> MemoryReport {
    MemoryReport {
        title: "ztrain <memory> & \"report\"".into(),
        facts: vec![("device".into(), "sim <4 GiB>".into())],
        steps,
        diagnostics: "arena 64.0 MiB of cap <3 GiB>".into(),
        curves: Default::default(),
    }
}

/// Checks that every element of the SVG is closed in order (a small well-formedness check:
/// no XML parser in the dependencies, and the chart is generated, so tags are simple).
fn assert_balanced(svg: &str) {
    let mut stack: Vec<String> = Vec::new();
    let mut rest = svg;
    while let Some(open) = rest.find('<') {
        let close = rest[open..].find('>').expect("tag closes") + open;
        let tag = &rest[open + 1..close];
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(stack.pop().as_deref(), Some(name), "closing {name}");
        } else if !tag.ends_with('/') {
            let name = tag.split_whitespace().next().expect("name");
            stack.push(name.to_string());
        }
        rest = &rest[close + 1..];
    }
    assert!(stack.is_empty(), "unclosed: {stack:?}");
}

#[test]
fn page_is_self_contained_and_escaped() {
    let html = report(vec![rec(1, 100, 20, 50, 0), rec(2, 80, 20, 50, 0)]).html();
    assert!(html.starts_with("<!DOCTYPE html>"));
    for external in ["<script", "src=", "href=", "@import", "url("] {
        assert!(!html.contains(external), "found {external}");
    }
    assert!(html.contains("ztrain &lt;memory&gt; &amp; &quot;report&quot;"));
    assert!(html.contains("sim &lt;4 GiB&gt;"));
    assert!(html.contains("cap &lt;3 GiB&gt;"));
    assert!(!html.contains("<memory>"));
}

#[test]
fn svg_is_well_formed_with_one_area_per_class_present() {
    let html = report(vec![rec(1, 100, 20, 50, 0), rec(2, 80, 0, 50, 30)]).html();
    let start = html.find("<svg").expect("svg");
    let end = html.find("</svg>").expect("end") + "</svg>".len();
    let svg = &html[start..end];
    assert_balanced(svg);
    for class in [
        AllocClass::Scratch,
        AllocClass::Saved,
        AllocClass::Persistent,
    ] {
        assert_eq!(
            svg.matches(&format!("class=\"area {}\"", class.name()))
                .count(),
            1
        );
    }
    // No graph memory in this run: no empty polygon for it.
    assert!(!svg.contains("area graph"));
}

#[test]
fn summary_names_high_water_resets_and_first_overflow() {
    let r = report(vec![
        rec(1, 100, 20, 50, 0),
        rec(2, 400, 20, 50, 0),
        rec(3, 100, 20, 50, 512),
        rec(4, 100, 20, 50, 256),
    ]);
    let facts: std::collections::HashMap<String, String> = r.summary().into_iter().collect();
    assert_eq!(facts["steps"], "4");
    assert!(
        facts["high-water mark"].starts_with("470 B at step 2"),
        "{facts:?}"
    );
    assert_eq!(facts["arena resets"], "4");
    assert_eq!(
        facts["overflow"],
        "768 B in all; first at step 3 (1 calls, 512 B)"
    );
    let html = r.html();
    assert!(html.contains("first overflow: step 3"));
    assert!(html.contains("high-water 470 B (step 2)"));
    // One reset tick per step.
    assert_eq!(html.matches("v8").count(), 4);
}

#[test]
fn a_run_without_overflow_says_none() {
    let r = report(vec![rec(1, 1, 1, 1, 0)]);
    let facts: std::collections::HashMap<String, String> = r.summary().into_iter().collect();
    assert_eq!(facts["overflow"], "none");
}

#[test]
fn long_runs_are_bucketed_to_a_bounded_size() {
    let steps: Vec<StepRecord> = (1..=20_000).map(|i| rec(i, i % 977, 10, 100, 0)).collect();
    let html = report(steps).html();
    assert!(html.len() < 2_000_000, "{} bytes", html.len());
    let cols = html.matches("class=\"col\"").count();
    assert!(
        (chart::MAX_COLUMNS * 9 / 10..=chart::MAX_COLUMNS).contains(&cols),
        "{cols}"
    );
}

#[test]
fn write_creates_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("m.html");
    report(vec![rec(1, 1, 1, 1, 0)])
        .write(&path)
        .expect("write");
    assert!(
        std::fs::read_to_string(&path)
            .expect("read")
            .contains("</html>")
    );
    let err = report(vec![])
        .write(&dir.path().join("no/such/dir.html"))
        .expect_err("io");
    assert!(err.to_string().contains("memory report"), "{err}");
}

/// zmem folds a long run's step records into ranges: the report counts the steps they cover,
/// names the step that reached the high-water mark, and draws the whole run.
#[test]
fn folded_records_report_the_steps_they_cover() {
    let range = |first: u64, last: u64, peak_at: u64, scratch: u64, overflow: u64| {
        let mut r = rec(first, scratch, 20, 50, overflow);
        r.last_step = last;
        r.peak_step = peak_at;
        r.resets = last - first + 1;
        r.step_overflow_bytes_max = overflow / 2;
        r
    };
    let r = report(vec![
        range(1, 64, 17, 100, 0),
        range(65, 128, 100, 900, 512),
        range(129, 150, 140, 100, 0),
    ]);
    let facts: std::collections::HashMap<String, String> = r.summary().into_iter().collect();
    assert_eq!(facts["steps"], "150");
    assert!(
        facts["high-water mark"].starts_with("970 B at step 100"),
        "{facts:?}"
    );
    assert_eq!(facts["arena resets"], "150");
    assert_eq!(
        facts["overflow"],
        "512 B in all; first in steps 65–128 (1 calls, 512 B)"
    );
    let html = r.html();
    assert!(html.contains("high-water 970 B (step 100)"), "{html}");
    assert!(html.contains("first overflow: steps 65–128"), "{html}");
    assert!(html.contains("steps 129–150 (highest: 140)"), "{html}");
    let cols = chart::columns(&r.steps, chart::MAX_COLUMNS);
    assert_eq!(cols.last().map(|c| c.steps), Some((129, 150)));
    assert_eq!(
        cols[1].overflow_bytes, 256,
        "the most one step of the range served"
    );
}
