//! GPU twins of the CLI tests (`cli.rs` runs the same on the CPU and the simulated device):
//! built only with `--features gpu` (`cargo xtask test-gpu`); a missing GPU fails them.
#![cfg(feature = "gpu")]

mod common;

use common::{path_str, resume_matches_uninterrupted, text, tiny};

#[test]
fn gpu_a_tiny_run_trains_on_the_cuda_backend() {
    let o = tiny(&["--device", "cuda"]);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("CUDA backend on"), "{stdout}");
    assert!(stdout.contains("peak device memory"), "{stdout}");
}

#[test]
fn gpu_resume_equals_an_uninterrupted_run_batched() {
    resume_matches_uninterrupted(&["--device", "cuda"], "13");
}

#[test]
fn gpu_resume_equals_an_uninterrupted_run_per_sample_captured() {
    resume_matches_uninterrupted(
        &[
            "--device",
            "cuda",
            "--schedule",
            "per-sample",
            "--capture",
            "--samples",
            "60",
        ],
        "2",
    );
}

#[test]
fn gpu_memory_report() {
    let dir = tempfile::tempdir().expect("tempdir");
    let report = dir.path().join("m.html");
    let o = tiny(&[
        "--device",
        "cuda",
        "--epochs",
        "1",
        "--memory-report",
        path_str(&report),
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    let html = std::fs::read_to_string(&report).expect("report");
    assert!(html.contains("class=\"area persistent\"") && html.contains("high-water"));
}
