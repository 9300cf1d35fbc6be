//! The `ztrain` command as a user runs it: the built binary on tiny model sizes.

use std::path::Path;
use std::process::{Command, Output};

use ztrain::checkpoint::Checkpoint;
use ztrain::data::{csv, synthetic};

/// A tiny model and data set: a run takes well under a second.
const TINY: &[&str] = &[
    "--features",
    "6",
    "--scales",
    "3",
    "--width",
    "16",
    "--heads",
    "2",
    "--ff",
    "32",
    "--samples",
    "200",
    "--batch",
    "16",
    "--epochs",
    "2",
];

fn ztrain(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ztrain"))
        .args(args)
        .env_remove("ZMEM_ARENA_BYTES")
        .output()
        .expect("runs ztrain")
}

fn tiny(extra: &[&str]) -> Output {
    let args: Vec<&str> = TINY.iter().chain(extra).copied().collect();
    ztrain(&args)
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn assert_fails_with(o: &Output, needles: &[&str]) {
    let (stdout, stderr) = text(o);
    assert_eq!(
        o.status.code(),
        Some(1),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    for n in needles {
        assert!(stderr.contains(n), "`{n}` not in stderr:\n{stderr}");
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

#[test]
fn help_explains_every_option() {
    let o = ztrain(&["--help"]);
    let (stdout, _) = text(&o);
    assert!(o.status.success());
    for opt in [
        "--device",
        "--data",
        "--schedule",
        "--capture",
        "--epochs",
        "--batch",
        "--lr",
        "--lr-schedule",
        "--clip-grad",
        "--seed",
        "--features",
        "--scales",
        "--width",
        "--heads",
        "--ff",
        "--arena-bytes",
        "--arena-cap",
        "--checkpoint",
        "--resume",
        "--memory-report",
        "--validate-fraction",
        "--samples",
        "--data-seed",
    ] {
        assert!(stdout.contains(opt), "{opt} missing from --help:\n{stdout}");
    }
}

#[test]
fn a_tiny_run_on_the_cpu_prints_epochs_and_a_summary() {
    let o = tiny(&["--device", "cpu"]);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("CPU backend"), "{stdout}");
    assert!(
        stdout.contains("epoch 1/2:") && stdout.contains("epoch 2/2:"),
        "{stdout}"
    );
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("summary:"))
        .expect("summary");
    for part in [
        "train loss",
        "validation loss",
        "acc",
        "peak host memory",
        " s;",
    ] {
        assert!(summary.contains(part), "{part}: {summary}");
    }
    assert!(stdout.contains("\narena: "), "{stdout}");
}

#[test]
fn cuda_without_a_gpu_is_a_clear_error() {
    let o = tiny(&["--device", "cuda", "--epochs", "1"]);
    if zdevice::CudaDriver::load().is_err() {
        assert_fails_with(&o, &["--device cuda: no usable GPU", "--device cpu"]);
    } else {
        // A machine with a driver library: the run trains on it.
        assert!(o.status.success(), "{:?}", text(&o));
    }
}

#[test]
fn auto_says_which_backend_it_picked() {
    let o = tiny(&["--epochs", "1"]);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    let first = stdout.lines().next().unwrap_or_default();
    assert!(
        first.contains("CPU backend (no usable GPU") || first.contains("CUDA backend on"),
        "{first}"
    );
}

#[test]
fn trains_on_a_csv_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("data.csv");
    std::fs::write(&path, csv::to_csv(&synthetic::generate(120, 3, 6, 5))).expect("write");
    let o = tiny(&[
        "--device",
        "cpu",
        "--data",
        path_str(&path),
        "--epochs",
        "1",
    ]);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("96 train / 24 validation samples"),
        "{stdout}"
    );
}

#[test]
fn bad_csv_stops_with_line_and_column() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases: [(&str, String, &[&str]); 4] = [
        (
            "empty.csv",
            String::new(),
            &["empty.csv: line 1, column 1", "empty"],
        ),
        (
            "short.csv",
            format!("{}\n{}\n", "h,".repeat(18) + "label", "0,".repeat(17) + "1"),
            &[
                "short.csv: line 2, column 19",
                "expected 19 columns (scales × features, then the label), found 18",
            ],
        ),
        (
            "nan.csv",
            format!("{}\n{}NaN,1\n", "h,".repeat(18) + "label", "0,".repeat(17)),
            &["nan.csv: line 2, column 18", "`NaN` is not a finite"],
        ),
        (
            "label.csv",
            format!("{}\n{}3\n", "h,".repeat(18) + "label", "0,".repeat(18)),
            &["label.csv: line 2, column 19", "label `3` must be 0 or 1"],
        ),
    ];
    for (name, content, needles) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, content).expect("write");
        let o = tiny(&["--device", "cpu", "--data", path_str(&path)]);
        assert_fails_with(&o, needles);
    }
}

#[test]
fn a_corrupt_checkpoint_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ck.safetensors");
    std::fs::write(&path, b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":").expect("write");
    let o = tiny(&["--device", "cpu", "--resume", path_str(&path)]);
    assert_fails_with(
        &o,
        &["ck.safetensors is corrupt or not a ztrain checkpoint"],
    );
}

#[test]
fn a_checkpoint_of_another_configuration_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ck = dir.path().join("ck.safetensors");
    let o = tiny(&[
        "--device",
        "cpu",
        "--epochs",
        "1",
        "--checkpoint",
        path_str(&ck),
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    let o = tiny(&["--device", "cpu", "--batch", "8", "--resume", path_str(&ck)]);
    assert_fails_with(
        &o,
        &["different configuration", "batch: checkpoint 16, now 8"],
    );
}

/// Trains the tiny run once straight through and once stopped at `stop` and resumed; the
/// final checkpoints (parameters, optimiser state, counters, generator, order) are equal.
fn resume_matches_uninterrupted(extra: &[&str], stop: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (full, split) = (dir.path().join("full.st"), dir.path().join("split.st"));
    let run = |args: &[&str]| {
        let o = tiny(&[extra, args].concat());
        assert!(o.status.success(), "{:?}", text(&o));
        text(&o).0
    };
    run(&["--checkpoint", path_str(&full)]);
    let first = run(&["--checkpoint", path_str(&split), "--stop-after", stop]);
    assert!(
        first.contains(&format!("stopped after step {stop}")),
        "{first}"
    );
    let partial = Checkpoint::load(&split).expect("partial checkpoint");
    assert_eq!(partial.progress.step.to_string(), stop);
    let second = run(&[
        "--checkpoint",
        path_str(&split),
        "--resume",
        path_str(&split),
    ]);
    assert!(
        second.contains(&format!("resumed from {} at step {stop}", split.display())),
        "{second}"
    );
    let (a, b) = (
        Checkpoint::load(&full).expect("full"),
        Checkpoint::load(&split).expect("split"),
    );
    assert_eq!(a.progress, b.progress);
    for (name, t) in &a.params {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&t.data),
            bits(&b.params[name].data),
            "parameter {name} differs"
        );
    }
    assert_eq!(a.optim, b.optim);
}

#[test]
fn resume_mid_epoch_equals_an_uninterrupted_run_on_the_cpu() {
    // 160 training samples in batches of 16: step 13 is in the middle of the second epoch.
    resume_matches_uninterrupted(&["--device", "cpu"], "13");
}

#[test]
fn resume_at_an_epoch_end_equals_an_uninterrupted_run_on_the_cpu() {
    resume_matches_uninterrupted(&["--device", "cpu", "--lr-schedule", "cosine"], "10");
}

#[test]
fn resume_equals_an_uninterrupted_run_on_the_simulated_device_per_sample() {
    resume_matches_uninterrupted(
        &[
            "--device",
            "sim",
            "--sim-memory",
            "256M",
            "--schedule",
            "per-sample",
            "--samples",
            "60",
        ],
        "2",
    );
}

#[test]
fn memory_report_from_the_simulated_device() {
    let dir = tempfile::tempdir().expect("tempdir");
    let report = dir.path().join("m.html");
    let o = tiny(&[
        "--device",
        "sim",
        "--sim-memory",
        "256M",
        "--epochs",
        "1",
        "--memory-report",
        path_str(&report),
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    let html = std::fs::read_to_string(&report).expect("report");
    assert!(html.contains("<svg") && html.contains("class=\"area persistent\""));
    assert!(html.contains("high-water"));
    assert!(html.contains("simulated driver"));
}

#[test]
fn memory_report_needs_a_device_arena() {
    let o = tiny(&[
        "--device",
        "cpu",
        "--memory-report",
        "/tmp/never-written.html",
    ]);
    assert_fails_with(&o, &["--memory-report", "--device sim"]);
}
